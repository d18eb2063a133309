"""torch_neuronx.utils: NxD imports get_platform_target from here (parallel_state.py:15 at v2.28.0)
and from torch_neuronx.utils.utils (trace/model_builder.py:32)."""

from .utils import SUPPORTED_TYPES, get_platform_target  # noqa: F401

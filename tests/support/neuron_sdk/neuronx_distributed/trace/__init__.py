"""trace/__init__.py at v2.28.0 also exports parallel_model_trace/save/load; Neuron 2.27 ended their
support (aws-neuron-sdk about-neuron/announcements/neuron2.x/
announcement-end-of-support-parallel-model-trace.rst), so the stand-in leaves them out: code
that still imports them fails here."""

from .model_builder import ModelBuilder  # noqa: F401
from .spmd import NxDModel  # noqa: F401

"""Tensor-parallel state, as ModelBuilder sets it while it traces and shards.

parallel_layers/parallel_state.py: get_tensor_model_parallel_rank/size read the module's values
and otherwise assert on a missing process group; ModelBuilder (trace/model_builder.py, trace and
shard_checkpoint) initialises them under `mock_distributed` as rank 0 of `tp_degree`.

initialize_model_parallel first asks the platform, with no compiler flags, and keeps it as the
hardware type (parallel_state.py:558-560): on a host with no Neuron device that raises unless
NEURON_PLATFORM_TARGET_OVERRIDE names one (torch_neuronx/utils/utils.py here), whatever `--target`
the graphs' flags give. The rank is the stand-in's own argument (the source takes it from the mocked
torch.distributed)."""

from torch_neuronx.utils import get_platform_target

from ..utils.utils import hardware

_size: int | None = None
_rank: int | None = None
_HARDWARE_TYPE: hardware = hardware.TRN1  # the source's default before initialisation (parallel_state.py:95)


def initialize_model_parallel(tensor_model_parallel_size: int = 1, rank: int = 0) -> None:
    global _size, _rank, _HARDWARE_TYPE
    _HARDWARE_TYPE = hardware(get_platform_target())
    _size, _rank = tensor_model_parallel_size, rank


def destroy_model_parallel() -> None:
    global _size, _rank
    _size = _rank = None


def model_parallel_is_initialized() -> bool:
    return _size is not None


def _require() -> None:
    if _size is None:
        raise AssertionError("tensor model parallel group is not initialized (outside a ModelBuilder trace)")


def get_tensor_model_parallel_size() -> int:
    _require()
    return _size


def get_tensor_model_parallel_rank() -> int:
    _require()
    return _rank

"""ColumnParallelLinear and RowParallelLinear as the project uses them (no bias, the column output
left split, the row input already split).

parallel_layers/layers.py: ColumnParallelLinear holds (output_size / tp, input_size) with the
weight's partition_dim 0, RowParallelLinear (output_size, input_size / tp) with partition_dim 1;
both mark the weight with parallel_layers/utils.py set_tensor_model_parallel_attributes
(tensor_model_parallel, partition_dim, partition_stride, num_partitions), which the checkpoint
sharder reads. RowParallelLinear._rpl_maybe_reduce_output casts to reduce_dtype (float32 by
default), all-reduces (mappings.py `_reduce`: skipped on one rank) and casts back. Other options
(bias, gather_output, scatter of a whole input, padding, sequence parallel) are not modelled."""

import torch
import torch.nn.functional as F
import torch_neuronx  # noqa: F401 - the runtime whose all_reduce the row layer records
from torch import nn

from . import parallel_state


def _parallel_weight(shape, dtype, dim: int, tp: int) -> nn.Parameter:
    weight = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
    weight.tensor_model_parallel, weight.partition_dim, weight.partition_stride, weight.num_partitions = (
        True,
        dim,
        1,
        tp,
    )
    return weight


def _divide(size: int, tp: int, what: str) -> int:
    if size % tp:
        raise ValueError(f"{what} {size} is not divisible by the tensor parallel size {tp}")
    return size // tp


def _refuse(**options) -> None:
    used = [name for name, on in options.items() if on]
    if used:
        raise NotImplementedError(f"the stand-in does not model {used}")


class ColumnParallelLinear(nn.Module):
    def __init__(self, input_size, output_size, bias=True, gather_output=True, dtype=torch.float32, **other):
        super().__init__()
        _refuse(bias=bias, gather_output=gather_output, **other)
        tp = parallel_state.get_tensor_model_parallel_size()
        self.weight = _parallel_weight((_divide(output_size, tp, "output_size"), input_size), dtype, 0, tp)

    def forward(self, x):
        return F.linear(x, self.weight)


class RowParallelLinear(nn.Module):
    def __init__(
        self,
        input_size,
        output_size,
        bias=True,
        input_is_parallel=False,
        dtype=torch.float32,
        reduce_dtype=torch.float32,
        **other,
    ):
        super().__init__()
        _refuse(bias=bias, scatter_input=not input_is_parallel, **other)
        tp = parallel_state.get_tensor_model_parallel_size()
        self.tp, self.reduce_dtype = tp, reduce_dtype
        self.weight = _parallel_weight((output_size, _divide(input_size, tp, "input_size")), dtype, 1, tp)

    def forward(self, x):
        out = F.linear(x, self.weight)
        if self.tp == 1:
            return out
        return torch.ops.nxd_standin.all_reduce(out.to(self.reduce_dtype)).to(out.dtype)

"""Tensor parallelism on the CPU: one process per rank (runtime.model.ranks.RankGroup).

Each rank process holds only its shard of the weights (inside its own TorchScript graphs) and its
own KV buffers. The row-parallel projections (o_proj, down_proj) sum their partial outputs with
`gemma4_tp::all_reduce`, an op recorded in the traced graphs themselves. The driver (`build.py
verify`, the server) sends every call's inputs to all ranks and takes the logits from rank 0: the
lm_head is replicated, so every rank computes all of them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from contract.artifact import ArtifactMeta
from contract.graph_key import GraphKey
from runtime.model.cpu import CpuBackend
from runtime.model.ranks import CALL_TIMEOUT_S, RankGroup


class _Rank(CpuBackend):
    """One rank's own graphs and KV. Only rank 0 sends its rows back: every rank has the same ones."""

    def __init__(self, rank: int, tp: int, folder: Path, meta: ArtifactMeta):
        super().__init__(folder, meta, prefix=f"rank{rank}/")
        self.rank = rank

    def _run(self, graph: GraphKey, inputs):
        rows = super()._run(graph, inputs)
        return rows if self.rank == 0 else None

    def encode(self, graph: GraphKey, inputs):
        """The encoders are replicated, not split: rank 0 holds and runs them (compile traces them there)."""
        return super().encode(graph, inputs) if self.rank == 0 else None


class CpuTensorParallelBackend:
    """The runner's Backend for a `tp > 1` CPU artifact: the same calls, fanned out to the ranks."""

    def __init__(self, folder: Path, meta: ArtifactMeta, timeout: float = CALL_TIMEOUT_S):
        self.group = RankGroup(meta.geometry.tp, _Rank, (Path(folder), meta), timeout)

    def prefill(self, bucket: int, keys: int, inputs) -> torch.Tensor:
        return self.group.call("prefill", bucket, keys, inputs)[0]

    def decode(self, keys: int, inputs) -> torch.Tensor:
        return self.group.call("decode", keys, inputs)[0]

    def copy(self, keys: int, inputs) -> None:
        self.group.call("copy", keys, inputs)  # each rank copies its own heads

    def encode(self, graph: GraphKey, inputs) -> torch.Tensor:
        return self.group.call("encode", graph, inputs)[0]

    def verify(self, keys: int, inputs) -> torch.Tensor:
        return self.group.call("verify", keys, inputs)[0]

    def draft(self, keys: int, inputs) -> torch.Tensor:
        return self.group.call("draft", keys, inputs)[0]

    def reset(self) -> None:
        self.group.call("reset")

    def close(self) -> None:
        self.group.close()

"""The CPU backend: the TorchScript graphs in this process, which also owns their KV tensors."""

from __future__ import annotations

from pathlib import Path

import torch

from contract.artifact import ArtifactMeta
from contract.dtypes import DTYPES
from contract.graph_key import GraphKey


class CpuBackend:
    """TorchScript graphs on the CPU. KV tensors go in and come back updated each call."""

    def __init__(self, folder: Path, meta: ArtifactMeta, prefix: str = ""):
        """`prefix` picks one tensor-parallel rank's graphs ("rank1/"); its KV shapes are per rank."""
        geo = meta.geometry
        torch.set_grad_enabled(False)
        mine = {name.removeprefix(prefix): rel for name, rel in meta.graphs.items() if name.startswith(prefix)}
        # The graphs are methods of one module per file, sharing its weights: load each file once.
        modules = {
            rel: torch.jit.load(str(Path(folder) / rel), map_location="cpu").eval() for rel in set(mine.values())
        }
        self.graphs = {name: getattr(modules[rel], name) for name, rel in mine.items()}
        self.kv_shapes = geo.kv_shapes
        self.verify_tokens = geo.verify
        self.dtype = DTYPES[geo.dtype]
        self.reset()

    def reset(self) -> None:
        self.kv = [torch.zeros(s, dtype=self.dtype) for s in self.kv_shapes]

    def _run(self, graph: GraphKey, inputs) -> torch.Tensor:
        rows, *self.kv = self.graphs[str(graph)](*inputs, *self.kv)
        return rows

    def prefill(self, bucket: int, keys: int, inputs) -> torch.Tensor:
        return self._run(GraphKey.prefill(bucket, keys), inputs)

    def decode(self, keys: int, inputs) -> torch.Tensor:
        return self._run(GraphKey.decode(keys), inputs)

    def copy(self, keys: int, inputs) -> None:
        self._run(GraphKey.copy(keys), inputs)

    def encode(self, graph: GraphKey, inputs) -> torch.Tensor:
        """An encoder graph (vision_<N>): no KV, its output only."""
        return self.graphs[str(graph)](*inputs)

    def verify(self, keys: int, inputs) -> torch.Tensor:
        return self._run(GraphKey.verify(self.verify_tokens, keys), inputs)

    def draft(self, keys: int, inputs) -> torch.Tensor:
        return self._run(GraphKey.draft(keys), inputs)  # its KV outputs are its inputs, unchanged

    def close(self) -> None:
        self.graphs.clear()

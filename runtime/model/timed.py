"""A Backend that times its encoder graphs: each image's or clip's encoder run is reported (its kind
and seconds) to an observer, the server's /metrics histogram, so an image prompt's time to first
token splits into encoding and prefill. Every other call goes to the backend as it is."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from contract.graph_key import GraphKey
from runtime.model.backend import Backend

KINDS = {"vision": "image", "audio": "audio"}  # an encoder graph's kind -> the media kind it encodes


class TimedEncoders:
    def __init__(self, backend: Backend, observe: Callable[[str, float], None]):
        self.backend, self.observe = backend, observe

    def encode(self, graph: GraphKey, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        began = time.perf_counter()
        out = self.backend.encode(graph, inputs)  # the CPU and tp backends return when it has run
        self.observe(KINDS.get(graph.kind, graph.kind), time.perf_counter() - began)
        return out

    def prefill(self, bucket: int, keys: int, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return self.backend.prefill(bucket, keys, inputs)

    def decode(self, keys: int, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return self.backend.decode(keys, inputs)

    def copy(self, keys: int, inputs: tuple[torch.Tensor, ...]) -> None:
        self.backend.copy(keys, inputs)

    def verify(self, keys: int, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return self.backend.verify(keys, inputs)

    def draft(self, keys: int, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return self.backend.draft(keys, inputs)

    def reset(self) -> None:
        self.backend.reset()

    def close(self) -> None:
        self.backend.close()

    def __getattr__(self, name: str):
        return getattr(self.backend, name)  # a backend's own state (kv, group, cores) as without the timing

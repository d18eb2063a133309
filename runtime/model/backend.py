"""The compiled graphs as the runner calls them (runtime.model.cpu, tp, neuron implement it): each call
takes a graph's host inputs without the KV tensors, which the backend keeps resident, and returns the
graph's rows (Geometry.rows: the logits, then the last hidden state)."""

from __future__ import annotations

from typing import Protocol

import torch

from contract.graph_key import GraphKey


class Backend(Protocol):
    """Compiled graphs with device-resident KV state. Inputs come without KV tensors."""

    def prefill(self, bucket: int, keys: int, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor: ...
    def decode(self, keys: int, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor: ...
    def copy(self, keys: int, inputs: tuple[torch.Tensor, ...]) -> None: ...  # a fork's KV copy: copy_<keys>
    def encode(self, graph: GraphKey, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor: ...  # vision_/audio_<N>
    def verify(self, keys: int, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor: ...  # verify_<N>_<keys>
    def draft(self, keys: int, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor: ...  # draft_<keys>: no KV write
    def reset(self) -> None: ...
    def close(self) -> None: ...

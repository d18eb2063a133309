"""The model as the engine sees it: prefill a prompt into a slot, decode one token for every busy
slot. It owns the slots and their state; the backend owns the graphs and the KV buffers."""

from __future__ import annotations

from typing import Protocol

import torch

from contract.artifact import Geometry
from contract.errors import Gemma4Error
from contract.greedy import argmax
from contract.hostside import HostInputs

from .slots import Slot, SlotState


class Backend(Protocol):
    """Compiled graphs with device-resident KV state. Inputs come without KV tensors."""

    def prefill(self, bucket: int, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor: ...
    def decode(self, keys: int, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor: ...
    def reset(self) -> None: ...
    def close(self) -> None: ...


class PromptTooLong(Gemma4Error, ValueError):
    pass


class ContextFull(Gemma4Error, RuntimeError):
    pass


class ModelRunner:
    def __init__(self, geo: Geometry, host: HostInputs, backend: Backend):
        self.geo = geo
        self.host = host
        self.backend = backend
        self.slots = [Slot(i) for i in range(geo.batch)]

    @property
    def max_prompt(self) -> int:
        return self.geo.buckets[-1]

    def bucket_for(self, n: int) -> int:
        for b in self.geo.buckets:
            if n <= b:
                return b
        raise PromptTooLong(f"prompt has {n} tokens; the largest prefill bucket is {self.max_prompt}")

    def keys_for(self, position: int) -> int:
        """The smallest decode bucket whose keys include `position` (below kv_max: checked by the caller)."""
        return next(t for t in self.geo.decode_buckets if position < t)

    def prefill(self, slot: int, ids: list[int]) -> torch.Tensor:
        """Raw logits (V,) at the graph dtype after the prompt; the slot's old KV is wholly replaced."""
        bucket = self.bucket_for(len(ids))
        s = self.slots[slot]
        s.state = SlotState.PREFILLING
        logits = self.backend.prefill(bucket, self.host.prefill(ids, bucket, slot))
        s.state, s.position = SlotState.DECODING, len(ids)
        return logits[0]

    def decode(self, tokens: dict[int, int]) -> dict[int, torch.Tensor]:
        """Feed `tokens[slot]` at each busy slot's position; raw logits (V,) per slot, at the graph dtype
        (converting a 262,144-wide bf16 row costs ~50 us, and greedy decoding never needs it)."""
        row: list[int | None] = [None] * self.geo.batch
        for slot, tok in tokens.items():
            s = self.slots[slot]
            if s.state is not SlotState.DECODING:
                raise RuntimeError(f"slot {slot} has no prompt ({s.state.value})")
            if s.position >= self.geo.kv_max:
                raise ContextFull(f"slot {slot} reached kv_max={self.geo.kv_max}")
            row[slot] = tok
        positions = [s.position for s in self.slots]
        keys = self.keys_for(max(self.slots[slot].position for slot in tokens))
        logits = self.backend.decode(keys, self.host.decode(row, positions, keys=keys))
        for slot in tokens:
            self.slots[slot].position += 1
        return {slot: logits[slot] for slot in tokens}

    def free(self, slot: int) -> None:
        self.slots[slot].release()

    def greedy(self, ids: list[int], steps: int, slot: int = 0) -> tuple[list[int], list[torch.Tensor]]:
        """Greedy continuation of one prompt: tokens and the raw logits (float32) that chose each."""
        logits = self.prefill(slot, ids)
        tokens, seen = [], []
        for i in range(steps):
            seen.append(logits.float())
            tokens.append(argmax(logits))
            if i + 1 < steps:
                logits = self.decode({slot: tokens[-1]})[slot]
        self.free(slot)
        return tokens, seen

"""What every step on the runner's slots shares: a graph's rows split into logits and hidden states,
the key bucket a position needs, and the check that a slot is decoding with room for the positions a
step writes (ContextFull at kv_max). ModelRunner's prefill and decode steps and its speculative steps
(runtime.model.speculative_steps) build on it."""

from __future__ import annotations

import torch

from contract.artifact import Geometry
from contract.errors import Gemma4Error
from contract.hostside import HostInputs
from runtime.model.backend import Backend
from runtime.model.slots import Slot, SlotState


class ContextFull(Gemma4Error, RuntimeError):
    pass


class SlotSteps:
    geo: Geometry
    host: HostInputs
    backend: Backend
    slots: list[Slot]

    def _split(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A graph's rows (..., V + H) -> logits (..., V) and last hidden states (..., H), as views."""
        return rows[..., : self.geo.vocab], rows[..., self.geo.vocab :]

    def keys_for(self, position: int) -> int:
        """The smallest key bucket whose keys include `position` (below kv_max: checked by the caller)."""
        return next(t for t in self.geo.key_buckets if position < t)

    def _decoding(self, slot: int, n: int) -> Slot:
        """A decoding slot with room for `n` more positions; refused by name otherwise."""
        s = self.slots[slot]
        if s.state is not SlotState.DECODING:
            raise RuntimeError(f"slot {slot} has no prompt ({s.state.value})")
        if s.position + n > self.geo.kv_max:
            raise ContextFull(
                f"slot {slot} reached kv_max={self.geo.kv_max}"
                if s.position >= self.geo.kv_max
                else f"slot {slot} holds {s.position} positions: {n} more exceed kv_max={self.geo.kv_max}"
            )
        s.verified = None  # any step past a verify settles it
        return s

"""The runner's speculative decoding steps (mixed into ModelRunner): verify a run of tokens per slot in
one target pass, keep the accepted part, and step the drafter from a slot's stored hidden state. A
drafter step writes no KV and moves no position; a verify writes its tokens' KV like a prefill chunk,
and `accept` cuts the slot back to the kept prefix (the KV past it is never read)."""

from __future__ import annotations

import torch

from runtime.model.slot_steps import SlotSteps


class SpeculativeSteps(SlotSteps):
    draft_order: torch.Tensor | None  # a centroid head's logits back in token order (ModelRunner's)
    # The draft steps of a round all sit at one position per slot: ((positions, key bucket), their
    # rows and rope), built at a round's first step and reused by the rest.
    _round: tuple[tuple[list[int | None], int], dict[str, torch.Tensor]] | None = None

    @property
    def verify_max(self) -> int:
        """The most tokens one verify takes per slot (the artifact's k + 1); 0 when it has no verify graphs."""
        return self.geo.verify

    @property
    def draft_k(self) -> int | None:
        """Draft steps per round the drafter was built for (the manifest's k); None without a drafter
        (verify still works, for drafts from elsewhere such as prompt lookup)."""
        return self.geo.drafter.k if self.geo.drafter else None

    def verify(self, tokens: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        """One target pass over up to `verify_max` tokens per slot, each slot's at its own position
        (its next token, then the drafted ones): their KV is written and the slot's length advances
        by their number. Returns per slot the raw logits rows (len, V) at the graph dtype, row i the
        target's prediction after token i, as decode returns its row. `accept` then keeps a prefix;
        without it every token stays."""
        row: list[list[int] | None] = [None] * self.geo.batch
        for slot, run in tokens.items():
            if not 0 < len(run) <= self.geo.verify:
                raise ValueError(f"a verify takes 1 to {self.geo.verify} tokens per slot, not {len(run)}")
            self._decoding(slot, len(run))
            row[slot] = list(run)
        positions = [s.position for s in self.slots]
        keys = self.keys_for(max(self.slots[slot].position + len(run) - 1 for slot, run in tokens.items()))
        rows = self.backend.verify(keys, self.host.verify_inputs(row, positions, keys=keys))
        logits, hidden = self._split(rows.view(self.geo.batch, self.geo.verify, -1))  # (B, N, V), (B, N, H)
        out = {}
        for slot, run in tokens.items():
            s = self.slots[slot]
            s.verified = (s.position, hidden[slot, : len(run)])
            s.wrote(run)
            s.hidden = hidden[slot, len(run) - 1]
            out[slot] = logits[slot, : len(run)]
        return out

    def accept(self, slot: int, n: int) -> None:
        """Keep only the first `n` (1 ..) of the tokens the slot's last verify fed: its length
        becomes the verify's start + n, and the drafter's next step starts from the hidden state of
        row n - 1. The KV written past it is never read (every mask row ends at its own position)."""
        s = self.slots[slot]
        if s.verified is None:
            raise RuntimeError(f"slot {slot} has no verify to accept from (or stepped on since)")
        start, hidden = s.verified
        if not 0 < n <= len(hidden):
            raise ValueError(f"slot {slot}'s last verify fed {len(hidden)} tokens: keep 1 to {len(hidden)}, not {n}")
        s.tokens, s.position, s.hidden = s.tokens[: start + n], start + n, hidden[n - 1]
        s.verified = None

    def draft(self, tokens: dict[int, int]) -> dict[int, torch.Tensor]:
        """One drafter step per slot: `tokens[slot]` (the latest, not yet in the target's cache: the
        target's next token, then each drafted one) with the slot's stored hidden state, at the slot's
        position, attending to the target's KV before it. Returns per slot the drafter's raw logits
        (V,) in token order (no softcap: the drafter has none) and stores its hidden state for the
        next step. Writes no KV and moves no position."""
        if self.geo.drafter is None:
            raise RuntimeError("this artifact has no drafter (its manifest's `speculative` names none)")
        row: list[int | None] = [None] * self.geo.batch
        for slot, tok in tokens.items():
            if self._decoding(slot, 1).hidden is None:
                raise RuntimeError(f"slot {slot} has no hidden state to draft from")
            row[slot] = tok
        idle = torch.zeros(self.geo.hidden, dtype=self.host.dtype)
        hidden = torch.stack([s.hidden if t is not None else idle for s, t in zip(self.slots, row)])  # (B, H)
        at = [s.position if t is not None else None for s, t in zip(self.slots, row)]
        keys = self.keys_for(max(p for p in at if p is not None) - 1)
        if self._round is None or self._round[0] != (at, keys):  # a new round: its position's rows and rope
            self._round = ((at, keys), self.host.draft_positions(at, keys))
        inputs = self.host.draft_inputs(row, hidden, at, keys=keys, at=self._round[1])
        logits, out = self._split(self.backend.draft(keys, inputs))
        if self.draft_order is not None:
            logits = logits.index_select(-1, self.draft_order)
        for slot in tokens:
            self.slots[slot].hidden = out[slot]
        return {slot: logits[slot] for slot in tokens}

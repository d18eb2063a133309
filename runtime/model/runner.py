"""The model as the engine sees it: prefill a prompt into a slot chunk by chunk (any length up to
Geometry.max_prompt, from any position the slot already holds), decode one token for every busy slot, and
for speculative decoding verify a run of tokens per slot in one target pass, keep the accepted part, and
step the drafter. It owns the slots and their state; the backend owns the graphs and the KV buffers.

Every graph returns rows of the logits then the last hidden state (Geometry.rows); the runner keeps each
slot's latest hidden state (the target's after prefill, decode and accept, the drafter's after a draft
step): a drafter step starts from it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from contract.artifact import Geometry
from contract.errors import Gemma4Error
from contract.graph_key import GraphKey
from contract.greedy import argmax
from contract.hostside import HostInputs
from contract.media_inputs import AudioInputs, VisionInputs
from runtime.model.media import MediaError, MediaInput, blocks, check_media, keyed, outside_blocks
from runtime.model.prefix import reusable_prefix, ring_holds
from runtime.model.slots import Slot, SlotState


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


class PromptTooLong(Gemma4Error, ValueError):
    pass


class ContextFull(Gemma4Error, RuntimeError):
    pass


def chunks(
    start: int, end: int, buckets: tuple[int, ...], whole: Sequence[tuple[int, int]] = ()
) -> list[tuple[int, int, int]]:
    """Positions start .. end-1 of a prompt as prefill chunks (start, length, bucket): chunks of the
    largest bucket, then the rest in the smallest bucket that holds it. A chunk never ends inside a
    block of `whole` (its queries see the block's later keys, which must be in the cache with them):
    its end moves back to the block's start, so the block is in the next chunk whole."""
    out, big = [], buckets[-1]
    while start < end:
        n = min(big, end - start)
        for a, b in whole:
            if a < start + n < b:
                if a <= start:
                    raise MediaError(f"a block of {b - a} soft tokens does not fit the largest prefill bucket ({big})")
                n = a - start
        out.append((start, n, next(b for b in buckets if n <= b)))
        start += n
    return out


class ModelRunner:
    def __init__(
        self,
        geo: Geometry,
        host: HostInputs,
        backend: Backend,
        vision: VisionInputs | None = None,
        audio: AudioInputs | None = None,
        draft_order: torch.Tensor | None = None,
    ):
        """`draft_order`: for a drafter whose logits come in its centroid head's order, the index
        that puts them back in token order (HostTables.draft_order)."""
        self.geo = geo
        self.host = host
        self.backend = backend
        self.vision, self.audio = vision, audio  # the encoders' host inputs, on a model with them
        self.slots = [Slot(i) for i in range(geo.batch)]
        self.encoders = ("image",) * (vision is not None) + ("audio",) * (audio is not None)
        self.draft_order = draft_order

    def _split(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A graph's rows (..., V + H) -> logits (..., V) and last hidden states (..., H), as views."""
        return rows[..., : self.geo.vocab], rows[..., self.geo.vocab :]

    def keys_for(self, position: int) -> int:
        """The smallest key bucket whose keys include `position` (below kv_max: checked by the caller)."""
        return next(t for t in self.geo.key_buckets if position < t)

    def start(self, slot: int, ids: list[int], reused: int = 0, media: Sequence[MediaInput] = ()) -> None:
        """Make a free slot prefill `ids`, keeping the KV of its first `reused` positions (a prefix the
        slot holds and may keep, by the reuse rule; cut back to the start of an image whose soft
        tokens see each other both ways). `media`: the prompt's images, in order; each one not wholly
        in the kept prefix is encoded now and its soft tokens go in with the chunks that hold them."""
        s = self.slots[slot]
        if not s.free:
            raise RuntimeError(f"slot {slot} is {s.state.value}, not free")
        if not 0 < len(ids) <= self.geo.max_prompt:
            raise PromptTooLong(
                f"prompt has {len(ids)} tokens; this model holds at most {self.geo.max_prompt} "
                f"(kv_max {self.geo.kv_max} less one position to generate into)"
            )
        check_media(ids, media, self.geo.placeholders, self.encoders)
        whole = blocks(media, self.geo.bidirectional_vision)
        reused = outside_blocks(reused, whole)
        if reused and self.reusable(slot, ids, media) < reused:
            raise ValueError(
                f"slot {slot} cannot keep {reused} positions for this prompt: it holds "
                f"{self.reusable(slot, ids, media)} of them"
            )
        soft = [(max(m.offset, reused), self.encode(m)[max(0, reused - m.offset) :]) for m in media if m.end > reused]
        s.start(ids, reused, chunks(reused, len(ids), self.geo.buckets, whole), keyed(ids, media), soft, whole)

    def encode(self, m: MediaInput) -> torch.Tensor:
        """One item's soft tokens (length, H) at the graph dtype, from its encoder graph."""
        if m.kind == "image" and self.vision is not None and self.geo.vision is not None:
            n = self.vision.soft_tokens(m.features["image_position_ids"])
            self._placeholders_match(m, n)
            bucket = self.geo.vision.bucket_for(n)
            return self.backend.encode(GraphKey.vision(bucket), self.vision(m.features, bucket))[0, :n]
        if m.kind == "audio" and self.audio is not None and self.geo.audio is not None:
            n = self.audio.soft_tokens(m.features["input_features_mask"])
            self._placeholders_match(m, n)
            bucket = self.geo.audio.bucket_for(n)
            return self.backend.encode(GraphKey.audio(bucket), self.audio(m.features, bucket))[0, :n]
        raise MediaError(f"this model has no {m.kind} encoder")

    @staticmethod
    def _placeholders_match(m: MediaInput, n: int) -> None:
        if n != m.length:
            raise MediaError(f"{m.kind} features that make {n} soft tokens have {m.length} placeholders")

    def prefill_step(self, slot: int) -> torch.Tensor | None:
        """The next chunk of a prefilling slot: None, or after the prompt's last chunk its raw logits
        (V,) at the graph dtype, and the slot is decoding."""
        s = self.slots[slot]
        if s.state is not SlotState.PREFILLING:
            raise RuntimeError(f"slot {slot} is {s.state.value}, not prefilling")
        first, n, bucket = s.plan[s.chunk]
        ids = s.prompt[first : first + n]
        keys = self.geo.keys_for_chunk(bucket, first + n)  # the chunk's cost follows the prompt, not kv_max
        end = first + n
        soft = [
            (max(at, first) - first, rows[max(at, first) - at : end - at])
            for at, rows in s.soft
            if at < end and at + len(rows) > first
        ]
        whole = [(a, b) for a, b in s.blocks if first <= a and b <= end]
        inputs = self.host.prefill_inputs(ids, bucket, slot, start=first, keys=keys, soft=soft, blocks=whole)
        rows = self.backend.prefill(bucket, keys, inputs)
        s.wrote(s.keys[first:end])
        s.chunk += 1
        if s.chunk < len(s.plan):
            return None
        s.state, s.keys, s.soft, s.blocks = SlotState.DECODING, [], [], []
        logits, s.hidden = self._split(rows[0])
        return logits

    def prefill_prompt(
        self, slot: int, ids: list[int], reused: int = 0, media: Sequence[MediaInput] = ()
    ) -> torch.Tensor:
        """A whole prompt, chunk after chunk; raw logits (V,) after its last token."""
        self.start(slot, ids, reused, media)
        while (logits := self.prefill_step(slot)) is None:
            pass
        return logits

    def fork(self, src: int, dst: int, keep: int | None = None, hidden: torch.Tensor | None = None) -> None:
        """Make free slot `dst` decode on from the first `keep` positions (default: all) that slot
        `src` holds, without a prefill: the copy graph over the smallest key bucket holding them copies
        src's KV into dst (nothing to copy when they are the same retained slot). src must have
        finished its prefill, and a src that went on past `keep` only as far as its sliding ring still
        holds the positions dst reads (the reuse rule). `hidden`: the target's hidden state (H,) at
        position keep - 1, which a drafter step starts from (kept aside with the prompt's logits); by
        default src's own when the fork keeps every position, else none (dst's first step is plain)."""
        s, d = self.slots[src], self.slots[dst]
        if s.state is SlotState.PREFILLING or not s.tokens:
            raise RuntimeError(f"slot {src} cannot be forked: it has not finished a prefill ({s.state.value})")
        if not d.free:
            raise RuntimeError(f"slot {dst} is {d.state.value}, not free")
        held = len(s.tokens)
        keep = held if keep is None else keep
        if not (0 < keep <= held and ring_holds(self.geo, s.reach, keep)):
            ring = self.geo.ring < self.geo.kv_max
            raise ValueError(
                f"slot {src} holds {held} positions; a fork keeps 1 to {held} of them"
                + (
                    f", ending at most {self.geo.ring - self.geo.sliding_window} before the furthest position "
                    f"written there ({s.reach - 1}: its sliding ring of {self.geo.ring} has overwritten older keys)"
                    if ring
                    else ""
                )
                + f", not {keep}"
            )
        if src != dst:
            keys = self.keys_for(keep - 1)
            self.backend.copy(keys, self.host.copy_inputs(src, dst, keep, keys))
        d.forked(s.tokens[:keep], s.reach)
        d.hidden = hidden if hidden is not None else s.hidden if keep == held else None

    def reusable(self, slot: int, ids: list[int], media: Sequence[MediaInput] = ()) -> int:
        """Leading positions of `ids` whose KV the slot holds and may keep (the reuse rule; an image
        matches by its digest, and a kept prefix ends outside any bidirectional block)."""
        s = self.slots[slot]
        shared = reusable_prefix(self.geo, s.tokens, keyed(ids, media), s.reach)
        return outside_blocks(shared, blocks(media, self.geo.bidirectional_vision))

    def decode(self, tokens: dict[int, int]) -> dict[int, torch.Tensor]:
        """Feed `tokens[slot]` at each busy slot's position; raw logits (V,) per slot, at the graph dtype
        (converting a 262,144-wide bf16 row costs ~50 us, and greedy decoding never needs it)."""
        row: list[int | None] = [None] * self.geo.batch
        for slot, tok in tokens.items():
            self._decoding(slot, 1)
            row[slot] = tok
        positions = [s.position for s in self.slots]
        keys = self.keys_for(max(self.slots[slot].position for slot in tokens))
        logits, hidden = self._split(self.backend.decode(keys, self.host.decode_inputs(row, positions, keys=keys)))
        for slot, tok in tokens.items():
            self.slots[slot].wrote([tok])
            self.slots[slot].hidden = hidden[slot]
        return {slot: logits[slot] for slot in tokens}

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

    # -- speculative decoding ------------------------------------------------------------------

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
        hidden = torch.zeros(self.geo.batch, self.geo.hidden, dtype=self.host.dtype)
        for slot, tok in tokens.items():
            s = self._decoding(slot, 1)
            if s.hidden is None:
                raise RuntimeError(f"slot {slot} has no hidden state to draft from")
            row[slot], hidden[slot] = tok, s.hidden
        positions = [s.position for s in self.slots]
        keys = self.keys_for(max(self.slots[slot].position - 1 for slot in tokens))
        logits, out = self._split(self.backend.draft(keys, self.host.draft_inputs(row, hidden, positions, keys=keys)))
        if self.draft_order is not None:
            logits = logits.index_select(-1, self.draft_order)
        for slot in tokens:
            self.slots[slot].hidden = out[slot]
        return {slot: logits[slot] for slot in tokens}

    def free(self, slot: int) -> None:
        self.slots[slot].release()

    def greedy(
        self, ids: list[int], steps: int, slot: int = 0, reused: int = 0, media: Sequence[MediaInput] = ()
    ) -> tuple[list[int], list[torch.Tensor]]:
        """Greedy continuation of one prompt (keeping the KV of its first `reused` positions, which
        the slot holds): tokens and the raw logits (float32) that chose each. The slot retains its KV."""
        return self.greedy_on(slot, self.prefill_prompt(slot, ids, reused, media), steps)

    def greedy_on(self, slot: int, logits: torch.Tensor, steps: int) -> tuple[list[int], list[torch.Tensor]]:
        """Greedy decoding of a decoding slot from the logits of its last position (a prefill's, or a
        fork's source's); then the slot retains its KV."""
        tokens, seen = [], []
        for i in range(steps):
            seen.append(logits.float())
            tokens.append(argmax(logits))
            if i + 1 < steps:
                logits = self.decode({slot: tokens[-1]})[slot]
        self.free(slot)
        return tokens, seen

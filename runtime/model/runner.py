"""The model as the engine sees it: prefill a prompt into a slot chunk by chunk (any length up to
Geometry.max_prompt, from any position the slot already holds), decode one token for every busy slot, and
for speculative decoding verify a run of tokens per slot in one target pass, keep the accepted part, and
step the drafter. It owns the slots and their state; the backend owns the graphs and the KV buffers.

Every graph returns rows of the logits then the last hidden state (Geometry.rows); the runner keeps each
slot's latest hidden state (the target's after prefill, decode and accept, the drafter's after a draft
step): a drafter step starts from it."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from contract.artifact import Geometry
from contract.errors import Gemma4Error
from contract.graph_key import GraphKey
from contract.greedy import argmax
from contract.hostside import HostInputs
from contract.media_inputs import AudioInputs, VisionInputs
from runtime.model.backend import Backend
from runtime.model.media import MediaError, MediaInput, blocks, check_media, keyed, outside_blocks
from runtime.model.prefix import reusable_prefix, ring_holds
from runtime.model.prompt_chunks import chunks
from runtime.model.slots import Slot, SlotState
from runtime.model.speculative_steps import SpeculativeSteps


class PromptTooLong(Gemma4Error, ValueError):
    pass


class ModelRunner(SpeculativeSteps):
    """Prefill, decode and forks over the slots (SpeculativeSteps adds verify, accept and draft)."""

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

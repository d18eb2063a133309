"""A batch slot of the compiled graphs and its state, kept in one place (the runner's `slots`).

    free --start--> prefilling (chunk k of its prompt next) --last chunk--> decoding --release--> retained
    retained --start (reusing a prefix of `tokens`, or none)--> prefilling
    free or retained --fork (a copy of another slot's KV, that slot decoding or retained)--> decoding

A retained slot takes a new request like a free one, but still holds the KV of `tokens`: a prompt
that shares a long enough prefix with them prefills only past it (runtime/model/prefix.py). Its
masks never reach past the new prompt's positions, so the rest of the old KV is never read. A fork
skips the prefill: the slot gets a copy of another slot's KV and decodes on from the end of the
prompt they share (another choice of the same request). The engine hangs the request it serves on
`request`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class SlotState(Enum):
    FREE = "free"  # holds nothing worth keeping
    PREFILLING = "prefilling"  # chunk `chunk` of `plan` is next
    DECODING = "decoding"  # its KV holds `position` tokens and the next one goes there
    RETAINED = "retained"  # free, and its KV still holds `tokens`


@dataclass
class Slot:
    index: int
    state: SlotState = SlotState.FREE
    position: int = 0  # the next KV write position
    request: Any = None  # what the engine serves in this slot
    # The tokens whose KV it holds, at positions 0, 1, ...; an image's soft tokens as media.keyed makes them.
    tokens: list[int] = field(default_factory=list)
    # How far writes into its rows reached since a prompt was last written from position 0: a sliding
    # ring still holds positions past a `tokens` that a later request cut short (or that a fork copied
    # from a slot that had gone further). From position 0 every key a later prompt can keep is rewritten.
    reach: int = 0
    prompt: list[int] = field(default_factory=list)  # while prefilling: the whole prompt
    keys: list[int] = field(default_factory=list)  # while prefilling: the prompt as `tokens` holds it (media.keyed)
    soft: list = field(default_factory=list)  # while prefilling: (position, soft token rows (m, H)) per image
    blocks: list[tuple[int, int]] = field(default_factory=list)  # while prefilling: bidirectional [a, b)
    plan: list[tuple[int, int, int]] = field(default_factory=list)  # while prefilling: (start, length, bucket)
    chunk: int = 0  # while prefilling: the index of the next chunk in `plan`
    released: float = 0.0  # when it last became free: a request with no prefix to reuse takes the oldest
    hidden: Any = None  # the last hidden state (H,) a drafter step starts from: the target's, or the drafter's
    verified: Any = None  # after a verify, until the next step: (its start position, its hidden rows (n, H))

    @property
    def free(self) -> bool:
        return self.state in (SlotState.FREE, SlotState.RETAINED)

    def start(
        self, prompt: list[int], reused: int, plan: list[tuple[int, int, int]], keys=None, soft=(), blocks=()
    ) -> None:
        """keys: the prompt as `tokens` will hold it (an image's soft tokens keyed by its digest;
        default the ids); soft and blocks: its images' soft tokens and bidirectional spans."""
        self.state, self.prompt, self.plan, self.chunk = SlotState.PREFILLING, list(prompt), plan, 0
        self.keys = list(prompt if keys is None else keys)
        self.soft, self.blocks = list(soft), list(blocks)
        self.tokens, self.position = self.tokens[:reused], reused
        self.reach = self.reach if reused else 0
        self.hidden = self.verified = None

    def forked(self, tokens: list[int], reach: int) -> None:
        """Its KV is now a copy of rows that hold `tokens` and were written up to `reach`: decode on."""
        self.state, self.prompt, self.plan, self.chunk = SlotState.DECODING, [], [], 0
        self.keys, self.soft, self.blocks = [], [], []
        self.tokens, self.position, self.reach = list(tokens), len(tokens), reach

    def wrote(self, tokens: list[int]) -> None:
        """`tokens` now have their KV at the next positions."""
        self.tokens += tokens
        self.position += len(tokens)
        self.reach = max(self.reach, self.position)

    def release(self) -> None:
        """Done with the request; the KV stays for a later prompt that shares its tokens."""
        self.state = SlotState.RETAINED if self.tokens else SlotState.FREE
        self.request, self.prompt, self.plan, self.chunk = None, [], [], 0
        self.keys, self.soft, self.blocks = [], [], []
        self.hidden = self.verified = None
        self.released = time.monotonic()

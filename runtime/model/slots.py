"""A batch slot of the compiled graphs and its state, kept in one place (the runner's `slots`).

A slot is free, prefilling (a prompt is being written into its KV rows) or decoding (its KV holds
`position` tokens and the next one goes there). The engine hangs the request it serves on `request`.
New states (a retained prefix, a prompt prefilled in chunks) are new members of SlotState."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class SlotState(Enum):
    FREE = "free"
    PREFILLING = "prefilling"
    DECODING = "decoding"


@dataclass
class Slot:
    index: int
    state: SlotState = SlotState.FREE
    position: int = 0  # the next KV write position while decoding
    request: Any = None  # what the engine serves in this slot

    @property
    def free(self) -> bool:
        return self.state is SlotState.FREE

    def release(self) -> None:
        self.state, self.position, self.request = SlotState.FREE, 0, None

"""Bounded memory and log volume where clients choose what is logged.

`SeenOnce` remembers the keys it reported (unknown request field names, say) up to a capacity, so each
is reported once while a client cannot grow it without bound: past the capacity a key is not
remembered, and reported again only as the gate lets it. `LogGate` lets through at most `burst` lines,
then one per `every_s` seconds, counting the ones it held back so the next line can say so."""

from __future__ import annotations

import threading
import time

MAX_KEY_CHARS = 64  # of a client's key in a log line


def shown(key: str) -> str:
    """A client's key as a log line shows it: quoted, and cut if long."""
    return repr(key if len(key) <= MAX_KEY_CHARS else key[:MAX_KEY_CHARS] + "…")


class LogGate:
    def __init__(self, burst: int = 10, every_s: float = 10.0):
        self.burst, self.every_s = burst, every_s
        self._tokens, self._last = float(burst), time.monotonic()
        self.held_back = 0
        self._lock = threading.Lock()

    def allow(self) -> tuple[bool, int]:
        """(may this line be written, how many were held back since the last one that was)."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) / self.every_s)
            self._last = now
            if self._tokens < 1:
                self.held_back += 1
                return False, 0
            self._tokens -= 1
            held, self.held_back = self.held_back, 0
            return True, held


class SeenOnce:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def new(self, keys: list[str]) -> list[str]:
        """The keys not reported before, remembered while there is room."""
        with self._lock:
            fresh = [k for k in dict.fromkeys(keys) if k not in self._seen]
            room = max(0, self.capacity - len(self._seen))
            self._seen.update(fresh[:room])
            return fresh

    def __len__(self) -> int:
        return len(self._seen)

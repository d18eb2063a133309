"""Prefix reuse: which free slot a new request goes to, and how much of that slot's retained KV it
keeps. Pure functions of token lists and the geometry; the engine owns the slots."""

from __future__ import annotations

from contract.artifact import Geometry


def reusable_prefix(geo: Geometry, retained: list[int], prompt: list[int]) -> int:
    """How many leading positions of a slot that holds the KV of `retained` a new `prompt` can keep:
    the shared prefix, less one so that at least the last prompt token is prefilled (its logits give
    the first new token). A sliding ring smaller than kv_max has kept only its last `ring` positions:
    it holds every key the new prompt's first token sees, and no older key its mask could take for a
    newer one, only while the retained KV ends at most ring - window positions past the prefix."""
    shared = 0
    for a, b in zip(retained, prompt):
        if a != b:
            break
        shared += 1
    shared = min(shared, len(prompt) - 1)
    if geo.ring < geo.kv_max and (len(retained) - 1) - shared > geo.ring - geo.sliding_window:
        return 0
    return shared


def choose_slot(geo: Geometry, free: dict[int, list[int] | None], prompt: list[int]) -> tuple[int, int]:
    """(slot, positions reused) for a new prompt among the free slots, each with the tokens whose KV
    it retains (None: nothing worth keeping), in the caller's order of preference. The slot with the
    longest reusable prefix wins if that prefix is at least the smallest prefill bucket (less is not
    worth giving up another request's KV for); otherwise the first slot that retains nothing, else
    the first one."""
    best, reused = None, 0
    for slot, retained in free.items():
        n = reusable_prefix(geo, retained, prompt) if retained else 0
        if n > reused:
            best, reused = slot, n
    if best is not None and reused >= geo.buckets[0]:
        return best, reused
    empty = [slot for slot, retained in free.items() if not retained]
    return (empty or list(free))[0], 0

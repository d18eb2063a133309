"""Prefix reuse: which free slot a new request goes to, how much of that slot's retained KV it keeps,
and whether a slot's KV can be copied for another choice of the same prompt. Pure functions of
token lists and the geometry; the engine owns the slots."""

from __future__ import annotations

from contract.artifact import Geometry


def reusable_prefix(geo: Geometry, retained: list[int], prompt: list[int], reach: int | None = None) -> int:
    """How many leading positions of a slot that holds the KV of `retained` a new `prompt` can keep:
    the shared prefix, less one so that at least the last prompt token is prefilled (its logits give
    the first new token), as far as the slot's sliding ring still holds it (ring_holds; `reach`: how
    far writes into the slot ever reached, by default the end of `retained`)."""
    shared = 0
    for a, b in zip(retained, prompt):
        if a != b:
            break
        shared += 1
    shared = min(shared, len(prompt) - 1)
    return shared if ring_holds(geo, len(retained) if reach is None else reach, shared) else 0


def ring_holds(geo: Geometry, reach: int, kept: int) -> bool:
    """Whether a slot whose writes reached position `reach` - 1 may keep its first `kept` positions
    and write on from there. A sliding ring smaller than kv_max holds, for each of its `ring` keys,
    the last position written there; every key the next position sees, and no older key its mask
    could take for a newer one, survive only while no write ever went more than ring - window
    positions past `kept` (a later, shorter request does not undo an earlier write that went further)."""
    return geo.ring >= geo.kv_max or (reach - 1) - kept <= geo.ring - geo.sliding_window


def forkable(geo: Geometry, held: list[int], prompt: list[int], reach: int) -> bool:
    """Whether a copy of a slot that holds the KV of `held`, written up to `reach`, can serve another
    choice of `prompt`, decoding on from the prompt's end (its first token comes from the prompt's
    logits, kept aside): the slot holds the whole prompt, and its ring what the next positions read."""
    return bool(prompt) and held[: len(prompt)] == prompt and ring_holds(geo, reach, len(prompt))


def choose_slot(
    geo: Geometry, free: dict[int, list[int] | None], prompt: list[int], reach: dict[int, int] | None = None
) -> tuple[int, int]:
    """(slot, positions reused) for a new prompt among the free slots, each with the tokens whose KV
    it retains (None: nothing worth keeping) and how far its writes reached (reusable_prefix), in the
    caller's order of preference. The slot with the
    longest reusable prefix wins if that prefix is at least the smallest prefill bucket (less is not
    worth giving up another request's KV for); otherwise the first slot that retains nothing, else
    the first one."""
    best, reused = None, 0
    for slot, retained in free.items():
        n = reusable_prefix(geo, retained, prompt, None if reach is None else reach[slot]) if retained else 0
        if n > reused:
            best, reused = slot, n
    if best is not None and reused >= geo.buckets[0]:
        return best, reused
    return spare_slot(free), 0


def spare_slot(free: dict[int, list[int] | None]) -> int:
    """The free slot whose KV is least worth keeping: the first that retains nothing, else the first."""
    empty = [slot for slot, retained in free.items() if not retained]
    return (empty or list(free))[0]

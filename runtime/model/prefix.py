"""Prefix reuse: which free slot a new request goes to, how much of that slot's retained KV it keeps,
and whether a slot's KV can be copied for another choice of the same prompt. Pure functions of
token lists and the geometry; the engine owns the slots."""

from __future__ import annotations

from contract.artifact import Geometry


def reusable_prefix(geo: Geometry, retained: list[int], prompt: list[int]) -> int:
    """How many leading positions of a slot that holds the KV of `retained` a new `prompt` can keep:
    the shared prefix, less one so that at least the last prompt token is prefilled (its logits give
    the first new token), as far as the slot's sliding ring still holds it (ring_holds)."""
    shared = 0
    for a, b in zip(retained, prompt):
        if a != b:
            break
        shared += 1
    shared = min(shared, len(prompt) - 1)
    return shared if ring_holds(geo, len(retained), shared) else 0


def ring_holds(geo: Geometry, held: int, kept: int) -> bool:
    """Whether a slot whose KV holds `held` positions may keep its first `kept` and write on from
    there: a sliding ring smaller than kv_max has kept only its last `ring` positions, which hold
    every key the next position sees, and no older key its mask could take for a newer one, only
    while the KV ends at most ring - window positions past `kept`."""
    return geo.ring >= geo.kv_max or (held - 1) - kept <= geo.ring - geo.sliding_window


def forkable(geo: Geometry, held: list[int], prompt: list[int]) -> bool:
    """Whether a copy of a slot that holds the KV of `held` can serve another choice of `prompt`,
    decoding on from the prompt's end (its first token comes from the prompt's logits, kept aside):
    the slot holds the whole prompt, and its ring still holds what the next positions read."""
    return bool(prompt) and held[:len(prompt)] == prompt and ring_holds(geo, len(held), len(prompt))


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
    return spare_slot(free), 0


def spare_slot(free: dict[int, list[int] | None]) -> int:
    """The free slot whose KV is least worth keeping: the first that retains nothing, else the first."""
    empty = [slot for slot, retained in free.items() if not retained]
    return (empty or list(free))[0]

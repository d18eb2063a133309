"""The prompts verify runs: the golden ones, random ones per bucket and across the window and the sliding ring,
past each key bucket, and, with several slots, the groups that run together and the forks."""

from __future__ import annotations

import random

from gemma4_port.verify.agreement import Case

SHORT_STEPS = 8


def build_cases(meta, long: bool) -> list[Case]:
    geo = meta.geometry
    rng = random.Random(f"{meta.name}/{meta.variant}")

    def tokens(n: int) -> list[int]:
        return [rng.randrange(8, geo.vocab) for _ in range(n)]

    cases = [Case(f"golden:{g.name}", list(g.ids), len(g.tokens), g) for g in meta.golden]
    cases.append(Case("random:short", tokens(3), SHORT_STEPS))
    cases += [Case(f"random:bucket-{b}", tokens(b), SHORT_STEPS) for b in geo.buckets]
    window_len = min(geo.buckets[-1], geo.sliding_window + 2)
    cases.append(
        Case("random:cross-window", tokens(window_len), min(geo.sliding_window + 4, geo.kv_max - window_len + 1))
    )
    if long:
        n = geo.buckets[-1]
        cases.append(Case("random:to-kv_max", tokens(n), geo.kv_max - n + 1))
    cases += [
        Case(f"random:{label}", tokens(n), min(SHORT_STEPS, geo.kv_max - n + 1)) for label, n in long_prompts(geo, long)
    ]
    return cases


def long_prompts(geo, long: bool) -> list[tuple[str, int]]:
    """Prompts longer than every bucket, prefilled in chunks across the window and the sliding ring,
    and prompts 3 tokens past each key bucket T but the last: a chunk ending at or below T runs over
    T keys, the chunk past it over the next key bucket (every T >= the largest bucket has one)."""
    big, most = geo.buckets[-1], geo.kv_max - 8
    sizes = [("1.5x-bucket", big * 3 // 2), ("3x-bucket", 3 * big)] + ([("kv_max-8", most)] if long else [])
    across = [(f"keys-{t}+3", t + 3) for t in geo.key_buckets[:-1] if big <= t]
    return [(label, n) for label, n in sizes if big < n <= most] + [(label, n) for label, n in across if n <= most]


def fork_cases(cases: list[Case], geo) -> list[Case]:
    """One prompt per fork copy graph: the first case whose prompt the copy over each key bucket holds."""
    out = []
    for t in geo.key_buckets:
        case = next(
            (c for c in cases if not c.reused and next(k for k in geo.key_buckets if len(c.ids) <= k) == t), None
        )
        if case is not None:
            out.append(Case(f"fork:{case.name}", case.ids, min(case.steps, SHORT_STEPS)))
    return out


def slot_groups(cases: list[Case], geo) -> list[list[Case]]:
    """With several slots: the first prompts together in different slots, and a short prompt decoding while
    the longest prompts arrive a step apart, each one chunk per step."""
    together = [Case(f"slots:{c.name}", c.ids, c.steps) for c in cases[: geo.batch]]
    longest = sorted(
        (c for c in cases if c.name.startswith("random:") and len(c.ids) > geo.buckets[-1] and c.steps <= SHORT_STEPS),
        key=lambda c: -len(c.ids),
    )
    short = [c for c in cases if c.name == "random:short"]
    stages = [Case(f"stages:{c.name}", c.ids, c.steps) for c in (short + longest)[: geo.batch]]
    return [together, stages]


def continuation_prompt(meta) -> tuple[list[int], int, list[int]]:
    """A second turn's parts: a first prompt longer than the largest bucket, how many tokens of reply it
    gets, and the new turn's tokens after it (longer than half the smallest bucket)."""
    geo = meta.geometry
    rng = random.Random(f"{meta.name}/{meta.variant}/turns")
    replies, follow = 4, [rng.randrange(8, geo.vocab) for _ in range(geo.buckets[0] // 2 + 1)]
    first_len = min(geo.buckets[-1] * 3 // 2, geo.kv_max - replies - len(follow) - SHORT_STEPS)
    return [rng.randrange(8, geo.vocab) for _ in range(first_len)], replies, follow

"""`build.py verify`: the artifact, loaded as the server loads it, against transformers in float32.

A green SEQ_MATCH counts only if it tests what ships (the saved artifact, through runtime.model.loader),
the way it is loaded (a fresh process), against an independent oracle (transformers' Gemma-4)."""

from __future__ import annotations

import random
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from contract.artifact import ArtifactError, check_files, load_meta
from contract.greedy import argmax
from runtime.model.loader import load_artifact

from .agreement import Case, compare
from .reference import load_reference, reference_greedy

SHORT_STEPS = 8


def build_cases(meta, long: bool) -> list[Case]:
    geo = meta.geometry
    rng = random.Random(f"{meta.name}/{meta.variant}")

    def tokens(n: int) -> list[int]:
        return [rng.randrange(8, geo.vocab) for _ in range(n)]

    cases = [Case(f"golden:{g.name}", list(g.ids), len(g.tokens), g.tokens[:g.checked]) for g in meta.golden]
    cases.append(Case("random:short", tokens(3), SHORT_STEPS))
    cases += [Case(f"random:bucket-{b}", tokens(b), SHORT_STEPS) for b in geo.buckets]
    window_len = min(geo.buckets[-1], geo.sliding_window + 2)
    cases.append(Case("random:cross-window", tokens(window_len), min(geo.sliding_window + 4, geo.kv_max - window_len + 1)))
    if long:
        n = geo.buckets[-1]
        cases.append(Case("random:to-kv_max", tokens(n), geo.kv_max - n + 1))
    cases += [Case(f"random:{label}", tokens(n), min(SHORT_STEPS, geo.kv_max - n + 1))
              for label, n in long_prompts(geo, long)]
    return cases


def long_prompts(geo, long: bool) -> list[tuple[str, int]]:
    """Prompts longer than every bucket, prefilled in chunks across the window and the sliding ring."""
    big, most = geo.buckets[-1], geo.kv_max - 8
    sizes = [("1.5x-bucket", big * 3 // 2), ("3x-bucket", 3 * big)] + ([("kv_max-8", most)] if long else [])
    return [(label, n) for label, n in sizes if big < n <= most]


def run_continuation(runner, first: list[int], replies: int, follow: list[int], steps: int):
    """A second turn that reuses the first turn's KV: the first prompt and its greedy reply, then a
    prompt of both plus `follow`, prefilled only past the positions the slot still holds."""
    reply, _ = runner.greedy(first, replies)
    ids = first + reply + follow
    reused = runner.reusable(0, ids)
    return Case("turns:reuse-prefix", ids, steps, reused=reused), runner.greedy(ids, steps, reused=reused)


def run_slots_together(runner, cases: list[Case]) -> list[tuple[list[int], list[torch.Tensor]]]:
    """Prompts admitted into different slots one step apart, prefilled one chunk per step (round-robin
    over the slots still prefilling) while the slots already decoding decode together: long prompts
    are at different chunk stages at once, as the server runs them."""
    out = [([], []) for _ in cases]
    waiting = list(range(len(cases)))  # slots not yet admitted, then prefilling
    live: dict[int, torch.Tensor] = {}
    step = 0
    while waiting or live:
        if step < len(cases):
            runner.start(step, cases[step].ids)
        prefilling = [slot for slot in waiting if slot <= step]
        if prefilling:
            slot = prefilling[step % len(prefilling)]
            logits = runner.prefill_step(slot)
            if logits is not None:
                waiting.remove(slot)
                live[slot] = logits
        for slot, logits in list(live.items()):
            toks, seen = out[slot]
            toks.append(argmax(logits))
            seen.append(logits.float())
            if len(toks) == cases[slot].steps:
                del live[slot]
                runner.free(slot)
        if live:
            live.update(runner.decode({slot: out[slot][0][-1] for slot in live}))
        step += 1
    return out


def verify_artifact(folder: Path, long: bool = True, console: Console | None = None) -> int:
    console = console or Console()
    meta = load_meta(folder)
    problems = check_files(folder, meta)
    if problems:
        raise ArtifactError("verify failed: " + "; ".join(f"{folder}/{p}" for p in problems))
    if not Path(meta.checkpoint).is_dir():
        raise ArtifactError(f"the float reference needs the checkpoint at {meta.checkpoint}, which is missing")
    model = load_artifact(folder, check_sha256=False)
    reference = load_reference(Path(meta.checkpoint))
    geo = meta.geometry
    cases = build_cases(meta, long)
    results = []
    for case in cases:
        results.append(model.runner.greedy(case.ids, case.steps))
    rng = random.Random(f"{meta.name}/{meta.variant}/turns")
    replies, follow = 4, [rng.randrange(8, geo.vocab) for _ in range(geo.buckets[0] // 2 + 1)]
    first_len = min(geo.buckets[-1] * 3 // 2, geo.kv_max - replies - len(follow) - SHORT_STEPS)
    case, result = run_continuation(model.runner, [rng.randrange(8, geo.vocab) for _ in range(first_len)],
                                    replies, follow, SHORT_STEPS)
    cases.append(case)
    results.append(result)
    if geo.batch > 1:
        together = [Case(f"slots:{c.name}", c.ids, c.steps) for c in cases[: geo.batch]]
        # A short prompt decoding while the longest prompts arrive a step apart, each one chunk per step.
        long = sorted((c for c in cases if c.name.startswith("random:") and len(c.ids) > geo.buckets[-1]
                       and c.steps <= SHORT_STEPS), key=lambda c: -len(c.ids))
        short = [c for c in cases if c.name == "random:short"]
        stages = [Case(f"stages:{c.name}", c.ids, c.steps) for c in (short + long)[: geo.batch]]
        for group in (together, stages):
            cases += group
            results += run_slots_together(model.runner, group)
    rows = []
    for case, (dev_tokens, dev_logits) in zip(cases, results):
        ref_tokens, ref_logits = reference_greedy(reference, case.ids, case.steps)
        rows.append(compare(case, dev_tokens, dev_logits, ref_tokens, ref_logits, geo.softcap, geo.dtype))
    table = Table(title=f"verify {folder} ({meta.name}/{meta.variant}, {geo.dtype}, tp={geo.tp}, batch={geo.batch})")
    for col in ("prompt", "prompt len", "tokens compared", "SEQ_MATCH", "first divergence", "max |logit diff|", "note"):
        table.add_column(col)
    for r in rows:
        length = f"{len(r.case.ids)} ({r.case.reused} reused)" if r.case.reused else str(len(r.case.ids))
        table.add_row(r.case.name, length, f"{r.compared}/{r.case.steps}",
                      {"MATCH": "True", "NEAR-TIE": "near-tie"}.get(r.verdict, "False"),
                      "-" if r.first_divergence is None else str(r.first_divergence), f"{r.max_diff:.3g}", r.note)
    console.print(table)
    failed = [r for r in rows if not r.ok]
    console.print(f"{len(rows) - len(failed)} passed, {len(failed)} failed")
    model.close()
    return 1 if failed else 0

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
    return cases


def run_slots_together(runner, cases: list[Case]) -> list[tuple[list[int], list[torch.Tensor]]]:
    """Prefill prompts into different slots at staggered times and decode them in one batch."""
    out = [([], []) for _ in cases]
    live: dict[int, torch.Tensor] = {}
    pending = list(enumerate(cases))
    while pending or live:
        if pending:
            slot, case = pending.pop(0)
            live[slot] = runner.prefill(slot, case.ids)
        for slot, logits in list(live.items()):
            toks, seen = out[slot]
            toks.append(argmax(logits))
            seen.append(logits.float())
            if len(toks) == cases[slot].steps:
                del live[slot]
                runner.free(slot)
        if live:
            live.update(runner.decode({slot: out[slot][0][-1] for slot in live}))
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
    if geo.batch > 1:
        together = [Case(f"slots:{c.name}", c.ids, c.steps) for c in cases[: geo.batch]]
        cases += together
        results += run_slots_together(model.runner, together)
    rows = []
    for case, (dev_tokens, dev_logits) in zip(cases, results):
        ref_tokens, ref_logits = reference_greedy(reference, case.ids, case.steps)
        rows.append(compare(case, dev_tokens, dev_logits, ref_tokens, ref_logits, geo.softcap, geo.dtype))
    table = Table(title=f"verify {folder} ({meta.name}/{meta.variant}, {geo.dtype}, tp={geo.tp}, batch={geo.batch})")
    for col in ("prompt", "prompt len", "tokens compared", "SEQ_MATCH", "first divergence", "max |logit diff|", "note"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.case.name, str(len(r.case.ids)), f"{r.compared}/{r.case.steps}",
                      {"MATCH": "True", "NEAR-TIE": "near-tie"}.get(r.verdict, "False"),
                      "-" if r.first_divergence is None else str(r.first_divergence), f"{r.max_diff:.3g}", r.note)
    console.print(table)
    failed = [r for r in rows if not r.ok]
    console.print(f"{len(rows) - len(failed)} passed, {len(failed)} failed")
    model.close()
    return 1 if failed else 0

"""`build.py verify`: the artifact, loaded as the server loads it, against transformers in float32.

A green SEQ_MATCH counts only if it tests what ships (the saved artifact, through runtime.loader),
the way it is loaded (a fresh process), against an independent oracle (transformers' Gemma-4)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from runtime.artifact import ArtifactError, check_files, load_meta
from runtime.loader import load_artifact
from runtime.sampling import argmax, softcap

from .reference import load_reference, reference_greedy

# A divergence counts as a near-tie only when the device's own logit error at that step is a small
# fraction of the reference's logit range (garbage has errors as large as the range itself, so it
# never passes as a "tie") and the reference's gap between the two tokens is within twice that error.
NEAR_TIE_MAX_RELATIVE_ERROR = {"float32": 1e-3, "bfloat16": 0.08}
SHORT_STEPS = 8


@dataclass
class Case:
    name: str
    ids: list[int]
    steps: int
    golden: tuple[int, ...] | None = None  # the artifact's self-test tokens, which must match too


@dataclass
class Row:
    case: Case
    compared: int
    first_divergence: int | None
    max_diff: float
    verdict: str  # MATCH | NEAR-TIE | MISMATCH
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict in ("MATCH", "NEAR-TIE")


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


def compare(case: Case, dev_tokens, dev_logits, ref_tokens, ref_logits, cap, dtype: str) -> Row:
    diffs = []
    first = None
    for i, (d, r) in enumerate(zip(dev_tokens, ref_tokens)):
        diffs.append(float((softcap(dev_logits[i], cap) - ref_logits[i]).abs().max()))
        if d != r:
            first = i
            break
    max_diff = max(diffs) if diffs else 0.0
    if first is None:
        if case.golden is not None and tuple(dev_tokens[:len(case.golden)]) != tuple(case.golden):
            return Row(case, len(dev_tokens), None, max_diff, "MISMATCH", "matches the live reference, not artifact.json")
        return Row(case, len(dev_tokens), None, max_diff, "MATCH")
    ref_step = ref_logits[first]
    gap = float(ref_step[ref_tokens[first]] - ref_step[dev_tokens[first]])
    err = diffs[-1]
    bound = NEAR_TIE_MAX_RELATIVE_ERROR[dtype] * float(ref_step.abs().max())
    if err <= bound and gap <= 2 * err:
        note = f"reference gap {gap:.3g} <= 2 x device error {err:.3g} (bound {bound:.3g}) at step {first}"
        return Row(case, first + 1, first, max_diff, "NEAR-TIE", note)
    return Row(case, first + 1, first, max_diff, "MISMATCH",
               f"device {dev_tokens[first]} vs reference {ref_tokens[first]} (gap {gap:.3g})")


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

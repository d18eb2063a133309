"""`build.py verify`: the artifact, loaded as the server loads it, against transformers in float32.

A green SEQ_MATCH counts only if it tests what ships (the saved artifact, through runtime.model.loader),
the way it is loaded (a fresh process), against an independent oracle (transformers' Gemma-4)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console

from contract.artifact import ArtifactError, check_files, load_meta
from gemma4_port.console import console as build_console
from gemma4_port.verify.agreement import compare
from gemma4_port.verify.bf16_noise import bf16_noise, reference_bf16_error
from gemma4_port.verify.cases import SHORT_STEPS, build_cases, continuation_prompt, fork_cases, slot_groups
from gemma4_port.verify.media_cases import MediaPrompts, by_kind
from gemma4_port.verify.reference import load_reference, reference_greedy
from gemma4_port.verify.report import report_json, report_table
from gemma4_port.verify.runner_paths import run_continuation, run_fork, run_slots_together
from gemma4_port.verify.speculative import speculative_rows
from runtime.model.loader import load_artifact


def verify_artifact(
    folder: Path, long: bool = True, console: Console | None = None, json_out: Path | None = None
) -> int:
    started = time.perf_counter()
    console = console or build_console()
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
    images = MediaPrompts(folder, meta, model.tokenizer) if geo.vision or geo.audio else None
    cases += images.cases() if images else []
    results = []
    for case in cases:
        results.append(model.runner.greedy(case.ids, case.steps, media=case.media))
    for case, result in images.run_reuse(model.runner) if images else ():
        cases.append(case)
        results.append(result)
    case, result = run_continuation(model.runner, *continuation_prompt(meta), SHORT_STEPS)
    cases.append(case)
    results.append(result)
    if geo.batch > 1:
        for group in slot_groups(cases, geo):
            cases += group
            results += run_slots_together(model.runner, group)
        forks = fork_cases(cases, geo)
        cases += forks
        results += [run_fork(model.runner, case) for case in forks]
    spec_cases = [c for c in cases if not c.reused and not c.name.startswith(("slots:", "stages:", "fork:"))]
    spec_rows = speculative_rows(model.runner, meta, reference, spec_cases) if geo.verify else []
    model.close()
    rows, ref_logits = [], []
    for case, (dev_tokens, dev_logits) in zip(cases, results):
        ref_tokens, logits = reference_greedy(reference, case.ids, case.steps, *by_kind(case.media))
        rows.append(compare(case, dev_tokens, dev_logits, ref_tokens, logits, geo.softcap, geo.dtype))
        ref_logits.append(logits)
    noise = bf16_noise(rows, reference_bf16_error(reference, rows, ref_logits)) if geo.dtype == "bfloat16" else None
    rows += spec_rows  # after the bf16 yardstick, which re-runs the plain greedy cases only
    title = f"verify {folder} ({meta.name}/{meta.variant}, {geo.dtype}, tp={geo.tp}, batch={geo.batch})"
    console.print(report_table(title, rows, noise))
    failed = [r for r in rows if not r.ok] + ([noise] if noise and not noise["passed"] else [])
    console.print(f"{len(rows) + bool(noise) - len(failed)} passed, {len(failed)} failed")
    if json_out is not None:
        report = report_json(folder, meta, rows, noise, not failed, time.perf_counter() - started)
        Path(json_out).write_text(json.dumps(report, indent=1) + "\n")
    return 1 if failed else 0

"""A target's steps, each in its own process, in the report folder: compile (its wall time, the peak
RSS of its process tree, its whole log and the compiler's), verify, serve (one request for a tiny
layout; TTFT and tok/s against the roofline for a real one) and, for one tiny layout, bench.
neuron-monitor is sampled through every step that holds the cores. A step that fails stops its
target's later steps and no other target's."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from gemma4_port.ops.doctor.measure import measure, versus_roofline
from gemma4_port.ops.doctor.monitor import Sampler
from gemma4_port.ops.doctor.steps import TIMEOUT_S, Step, copy_logs, run_cli, tail
from gemma4_port.ops.doctor.targets import Target, folder, manifest_yaml

# The runtime's own log at INFO (NEURON_RT_LOG_LEVEL, aws-neuron-sdk neuron-runtime configuration
# docs) into each step's log, unless the user chose a level.
RUNTIME_LOG = {"NEURON_RT_LOG_LEVEL": "INFO"}


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {"value": data}


def compile_step(t: Target, work: Path, env: dict) -> Step:
    from gemma4_port.compile.neuron import compiler_workdir

    here = folder(work, t)
    here.mkdir(parents=True, exist_ok=True)
    manifest = here / "manifest.yaml"
    manifest.write_text(manifest_yaml(t.manifest))
    args = ["compile", manifest, "--variant", t.variant, "--backend", "neuron", "--out", here / "artifact"]
    step = run_cli(t.name, "compile", args, env, work, here / "compile.log")
    logs = copy_logs(compiler_workdir(t.manifest.name, t.variant), here / "compiler")
    step.data["compiler_logs"] = [f"{t.name}/compiler/{name}" for name in logs]
    return step


def verify_step(t: Target, work: Path, env: dict) -> Step:
    here = folder(work, t)
    report = here / "verify.json"
    with Sampler(here / "neuron-monitor-verify.jsonl") as sampler:
        step = run_cli(
            t.name, "verify", ["verify", here / "artifact", "--quick", "--json", report], env, work, here / "verify.log"
        )
    step.data = _read_json(report)
    summary = [ln for ln in (work / (step.log or "")).read_text(errors="replace").splitlines() if "passed," in ln]
    if summary:
        step.data["summary"] = summary[-1].strip()
    step.data["neuron_monitor"] = sampler.summary()
    return step


def serve_step(t: Target, work: Path, env: dict) -> Step:
    """`build.py serve` in its own process; streamed requests through the OpenAI API."""
    from gemma4_port.bench.server import Server
    from gemma4_port.ops.model_sizes import ModelSizes
    from gemma4_port.source.configs import text_config_for

    here = folder(work, t)
    variant = t.manifest.variant(t.variant)
    extra = {k: v for k, v in env.items() if os.environ.get(k) != v}
    start = time.perf_counter()
    logs = here / "serve"
    with Sampler(here / "neuron-monitor-serve.jsonl") as sampler:
        try:
            with Server(here / "artifact", logs, ready_timeout_s=TIMEOUT_S["serve"], env=extra) as server:
                measured = measure(
                    server.url,
                    server.model,
                    env.get("GEMMA4_API_KEY", "none"),
                    batch=variant.batch,
                    runs=3 if t.real else 1,
                    max_tokens=64 if t.real else 8,
                )
                data = {"load_s": round(server.load_s, 1), "peak_rss": server.peak_rss(), **measured}
        except Exception as exc:  # noqa: BLE001 - the report says what failed; the other targets still run
            err = next(iter(sorted(logs.glob("*.err"))), None)
            detail = f"{type(exc).__name__}: {exc}" + (f" (server log: {tail(err)})" if err else "")
            return Step(t.name, "serve", False, round(time.perf_counter() - start, 1), detail)
    if t.real:
        data["versus_roofline"] = versus_roofline(measured, ModelSizes(text_config_for(t.manifest)), variant)
    data["neuron_monitor"] = sampler.summary()
    data["server_logs"] = sorted(str(p.relative_to(work)) for p in logs.glob("*"))
    return Step(t.name, "serve", True, round(time.perf_counter() - start, 1), data=data)


def bench_step(t: Target, work: Path, env: dict) -> Step:
    here = folder(work, t)
    out = here / "bench.json"
    with Sampler(here / "neuron-monitor-bench.jsonl") as sampler:
        step = run_cli(t.name, "bench", ["bench", here / "artifact", "--json", out], env, work, here / "bench.log")
    step.data = _read_json(out) | {"neuron_monitor": sampler.summary()}
    return step


def run_target(t: Target, work: Path, env: dict) -> list[Step]:
    env = RUNTIME_LOG | env
    steps = [compile_step(t, work, env)]
    if steps[-1].ok:
        steps.append(verify_step(t, work, env))
    if steps[-1].ok and t.serve:
        steps.append(serve_step(t, work, env))
    if steps[-1].ok and t.bench:
        steps.append(bench_step(t, work, env))
    return steps

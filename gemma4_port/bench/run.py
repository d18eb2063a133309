"""`build.py bench`: every measurement in its order (see the package's docstring), their targets, the report."""

from __future__ import annotations

import datetime
import multiprocessing
import os
import platform
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

import torch
from rich.console import Console

from contract.artifact import load_meta
from contract.tokenizer import load_tokenizer
from gemma4_port.bench import batching, constrained, host_overhead, longctx, media, memory, report, targets, throughput
from gemma4_port.bench.artifacts import artifacts
from gemma4_port.bench.bench_error import BenchError
from gemma4_port.bench.settings import SCALES, BenchSettings
from gemma4_port.bench.side_by_side import serve_side_by_side
from gemma4_port.console import console as build_console


def in_child(fn, *args):
    """`fn(*args)` in a spawned process of its own, for the measurements that load an artifact: the
    Neuron runtime keeps the NeuronCores a process opened until that process exits, and the servers
    need them next."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def run_bench(
    folder: Path,
    b1: Path,
    b4: Path,
    settings: BenchSettings,
    work: Path,
    console: Console | None = None,
    image: Path | None = None,
) -> dict:
    """Every measurement in turn; `image`: an artifact with an image budget (None: no image prompts)."""
    console = console or Console()
    meta = load_meta(folder)
    if not Path(meta.checkpoint).is_dir():
        raise BenchError(
            f"{folder} was compiled from {meta.checkpoint}, which is gone: transformers needs that "
            "checkpoint for the comparison (recompile the artifact)"
        )
    result: dict = {
        "meta": {
            "scale": settings.scale,
            "settings": asdict(settings),
            "artifact": str(folder),
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "load_average_start": os.getloadavg(),
        }
    }
    console.log(f"throughput: {meta.name}/{meta.variant}, ours vs transformers, {settings.repeats} interleaved repeats")
    result["throughput"], token_ms = in_child(
        throughput.measure, folder, settings.new_tokens, settings.repeats, settings.warmup_calls
    )
    console.log(f"host overhead: {settings.host_steps} steps per sampler at the real vocabulary")
    result["host_overhead"] = host_overhead.measure(load_tokenizer(folder / "tokenizer"), settings.host_steps)
    console.log(f"constrained decoding and logprobs: {settings.host_steps} steps each at the real vocabulary")
    result["constrained"] = constrained.measure(settings.host_steps)
    console.log(f"batching: batch 1 and batch 4 in process, every slot busy, {settings.batching_rounds} rounds each")
    result["batching"] = in_child(batching.measure, b1, b4, settings.max_tokens, settings.batching_rounds)
    servers, gaps = serve_side_by_side({"b1": b1, "b4": b4}, settings, work / "logs", console)
    samples = {"ours (in-process)": token_ms["ours"], "transformers generate": token_ms["transformers"]}
    samples |= {f"server {label} (chunk gaps)": g for label, g in gaps.items()}
    result["concurrency"] = {
        "max_tokens": settings.max_tokens,
        "requests_per_stream": settings.requests_per_stream,
        "server_passes": settings.server_passes,
        "servers": servers,
        "b4_over_b1_at_4_streams": targets.batching_ratio({"servers": servers}),
    }
    console.log(f"long prompts: prefix reuse (batch 1) and chunked prefill (batch 4), {settings.long_rounds} rounds")
    result["long_context"] = longctx.measure(
        b1, b4, work / "logs" / "long", settings.long_rounds, settings.ready_timeout_s
    )
    if image is not None:
        console.log(f"images: a new image and the same again, {settings.long_rounds} rounds on {image}")
        result["images"] = media.measure(
            image, work / "logs" / "images", settings.long_rounds, settings.ready_timeout_s
        )
    else:
        console.log("images: skipped, no variant of this manifest has an image budget")
    console.log("memory: a process that loads the checkpoint with transformers")
    b1_meta = load_meta(b1)
    mem = memory.measure(b1, b1_meta)
    mem |= {
        "server_artifact": str(b1),
        "server_rss_mb": servers["b1"]["rss_mb"],
        "server_peak_rss_mb": servers["b1"]["peak_rss_mb"],
        "server_model_module_imported": servers["b1"]["imports"]["transformers_model_module_imported"],
        "budget_mb": mem["host_tables_mb"] + mem["graph_files_mb"] + targets.MEMORY_SLACK_MB,
    }
    result["memory"] = mem
    result["meta"]["load_average_end"] = os.getloadavg()
    result["samples"] = {"token_ms": {k: [round(x, 3) for x in v] for k, v in samples.items()}}
    return targets.with_targets(result)


def bench_main(args) -> int:
    console = build_console()
    if args.speculative:
        from gemma4_port.bench.speculative_report import SpecSettings, speculative_main

        folder, json_out = (Path(a) if a else None for a in (args.dir, args.json_out))
        return speculative_main(folder, json_out, console, SpecSettings())
    settings = SCALES[args.model_scale]
    if "OMP_NUM_THREADS" not in os.environ and torch.get_num_threads() > 1:
        console.log(
            f"note: torch uses {torch.get_num_threads()} threads here and so will the servers; on a small or "
            "busy host its thread pool stalls (measured up to 10x slower): try OMP_NUM_THREADS=1"
        )
    json_out = Path(args.json_out or f"artifacts/bench-{settings.scale}.json")
    with tempfile.TemporaryDirectory(prefix="gemma4-bench-") as tmp:
        work = Path(tmp)
        folder, b1, b4, image = artifacts(Path(args.dir) if args.dir else None, settings.scale, work, console)
        result = run_bench(folder, b1, b4, settings, work, console, image)
    png = report.write(result, json_out)
    report.print_report(result, console)
    console.print(f"wrote {json_out} and {png}")
    return 0

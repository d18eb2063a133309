"""`build.py bench [DIR] [--model-scale tiny|small] [--json OUT]`: speed and memory side by side.

One run measures, on this machine and in this order: our compiled graphs against transformers'
`generate` (throughput), the host's work per decode step at the real vocabulary (host_overhead),
what batch 4 can buy over batch 1 on this backend before any server work (batching), the real
servers of a batch-1 and a batch-4 artifact, side by side, under 1..8 concurrent streams
(concurrency), long prompts (a reused prefix's time to first token, and the running streams' gaps
while long prompts arrive, chunked or whole: longctx), image prompts on an artifact with an image
budget (a new image's time to first token and its encoder's share, a repeated image's cache hit:
media), and the memory of each way of loading the model (memory). Ratios come from numbers
measured side by side; targets.py turns them into PASS/MISS verdicts, report.py into tables, JSON and a plot."""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import os
import platform
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.console import Console

from contract.artifact import load_meta
from contract.tokenizer import load_tokenizer
from gemma4_port import MANIFESTS
from gemma4_port.bench import (
    batching,
    concurrency,
    constrained,
    host_overhead,
    longctx,
    media,
    memory,
    report,
    targets,
    throughput,
)
from gemma4_port.bench.bench_error import BenchError
from gemma4_port.bench.server import Server
from gemma4_port.console import console as build_console
from gemma4_port.source.manifest import Manifest, load_manifest, parse_manifest
from gemma4_port.source.variant import Variant

SCALE_MANIFEST = {"tiny": MANIFESTS / "tiny-e2b.yaml", "small": MANIFESTS / "small-e2b.yaml"}
MB = 1 << 20


@dataclass(frozen=True)
class Settings:
    scale: str
    new_tokens: int  # per throughput run
    repeats: int  # interleaved runs per prompt and side
    warmup_calls: int  # untimed runs per prompt first: TorchScript optimises a graph on its second call
    host_steps: int  # decode steps timed per sampler
    streams: tuple[int, ...]
    requests_per_stream: int
    server_passes: int  # passes per concurrency level and server, alternating between the servers
    max_tokens: int  # per server request, and per request of the in-process batching rounds
    batching_rounds: int  # interleaved in-process rounds per artifact, every slot busy
    long_rounds: int  # alternating rounds per pair of long-prompt servers (reuse or not, chunked or not)
    ready_timeout_s: float = 900.0


SCALES = {
    "tiny": Settings(
        "tiny",
        new_tokens=32,
        repeats=5,
        warmup_calls=3,
        host_steps=1000,
        streams=(1, 2, 4, 8),
        requests_per_stream=4,
        server_passes=3,
        max_tokens=24,
        batching_rounds=6,
        long_rounds=6,
    ),
    "small": Settings(
        "small",
        new_tokens=24,
        repeats=3,
        warmup_calls=3,
        host_steps=1000,
        streams=(1, 2, 4, 8),
        requests_per_stream=2,
        server_passes=2,
        max_tokens=16,
        batching_rounds=3,
        long_rounds=3,
    ),
}


def _compile(manifest: Manifest, variant: Variant, work: Path, backend: str, console: Console) -> Path:
    from gemma4_port.compile.backends import compile_artifact

    console.log(f"compiling {manifest.name}/{variant.name} (batch {variant.batch}, {backend}) into {work}")
    return compile_artifact(manifest, variant, work / f"{manifest.name}-{variant.name}", backend=backend)


def _variant(manifest: Manifest, batch: int, like: Variant) -> Variant:
    """The manifest's single-rank variant with `batch` slots, preferring `like`'s dtype."""
    found = sorted(
        (v for v in manifest.variants if v.batch == batch and v.tp == 1), key=lambda v: v.dtype != like.dtype
    )
    if not found:
        raise BenchError(
            f"manifest {manifest.name} has no tp=1 variant with batch {batch}; the concurrency "
            f"benchmark needs one (variants: {[v.name for v in manifest.variants]})"
        )
    return found[0]


def artifacts(folder: Path | None, scale: str, work: Path, console: Console) -> tuple[Path, Path, Path, Path | None]:
    """(measured artifact, batch-1 artifact, batch-4 artifact, an artifact with an image budget: the
    measured one if it has one, else the manifest's first tp-1 variant with one, None if none has),
    compiling what is not given."""
    if folder is None:
        manifest = load_manifest(SCALE_MANIFEST[scale])
        folder = _compile(manifest, manifest.variants[0], work, "cpu", console)
    meta = load_meta(folder)
    manifest = parse_manifest(meta.manifest, f"{folder}/artifact.json")
    variant = manifest.variant(meta.variant)

    def with_batch(batch: int) -> Path:
        if (variant.batch, variant.tp) == (batch, 1):
            return folder
        return _compile(manifest, _variant(manifest, batch, variant), work, meta.backend, console)

    images = [v for v in manifest.variants if v.tp == 1 and v.media is not None and v.media.image is not None]
    if meta.geometry.vision is not None:
        image: Path | None = folder
    else:
        image = _compile(manifest, images[0], work, meta.backend, console) if images else None
    return folder, with_batch(1), with_batch(4), image


def in_child(fn, *args):
    """`fn(*args)` in a spawned process of its own, for the measurements that load an artifact: the
    Neuron runtime keeps the NeuronCores a process opened until that process exits, and the servers
    need them next."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def server_env(backend: str, index: int) -> dict[str, str]:
    """The servers run at once: on inf2 each takes a NeuronCore of its own (both artifacts are tp 1)."""
    return {"NEURON_RT_VISIBLE_CORES": str(index)} if backend == "neuron" else {}


def _serve(paths: dict[str, Path], settings: Settings, logs: Path, console: Console) -> tuple[dict, dict]:
    """Every server up at once (an idle one only waits on its queue), each concurrency level driven
    `server_passes` times, alternating which server goes first: a drift of the machine hits both
    alike. -> (per label: load, memory, levels, imports; per label: chunk gaps in ms)."""
    metas = {label: load_meta(path) for label, path in paths.items()}
    servers = {
        label: Server(path, logs, settings.ready_timeout_s, server_env(metas[label].backend, i))
        for i, (label, path) in enumerate(paths.items())
    }
    out: dict[str, dict] = {}
    gaps: dict[str, list[float]] = {label: [] for label in servers}
    with contextlib.ExitStack() as stack:
        for label, server in servers.items():
            console.log(f"server {label}: starting `build.py serve {server.folder}`")
            stack.callback(server.stop)
            server.start()
        for label, server in servers.items():
            server.wait_ready()
            out[label] = {
                "artifact": str(server.folder),
                "batch": metas[label].geometry.batch,
                "load_s": server.load_s,
                "rss_mb": server.rss() / MB,
                "peak_rss_mb": server.peak_rss() / MB,
                "master_rss_mb": server.master_rss() / MB,
                "levels": [],
            }
        for n in settings.streams:
            runs: dict[str, list[concurrency.Run]] = {label: [] for label in servers}
            for p in range(settings.server_passes):
                for label in list(servers) if p % 2 == 0 else list(reversed(servers)):
                    server = servers[label]
                    runs[label].append(
                        concurrency.drive(
                            server.url, server.model, n, settings.requests_per_stream, settings.max_tokens
                        )
                    )
            for label, passes in runs.items():
                row, g = concurrency.level(passes)
                console.log(
                    f"server {label}: {n} stream(s): {row['tok_s']:.1f} tok/s over {len(passes)} passes "
                    f"{row['pass_tok_s']}, {row['rejected_503']} rejected"
                )
                out[label]["levels"].append(row)
                gaps[label] += g
        for label, server in servers.items():
            out[label]["rss_after_run_mb"] = server.rss() / MB
            out[label]["imports"] = server.imports()
    return out, gaps


def run_bench(
    folder: Path,
    b1: Path,
    b4: Path,
    settings: Settings,
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
    servers, gaps = _serve({"b1": b1, "b4": b4}, settings, work / "logs", console)
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

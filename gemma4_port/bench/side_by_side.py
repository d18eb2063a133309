"""The real servers of a batch-1 and a batch-4 artifact up at once, each concurrency level driven in turn on
both: a drift of the machine hits both alike."""

from __future__ import annotations

import contextlib
from pathlib import Path

from rich.console import Console

from contract.artifact import load_meta
from gemma4_port.bench import concurrency
from gemma4_port.bench.server import Server
from gemma4_port.bench.settings import BenchSettings

MB = 1 << 20


def server_env(backend: str, index: int) -> dict[str, str]:
    """The servers run at once: on inf2 each takes a NeuronCore of its own (both artifacts are tp 1)."""
    return {"NEURON_RT_VISIBLE_CORES": str(index)} if backend == "neuron" else {}


def serve_side_by_side(
    paths: dict[str, Path], settings: BenchSettings, logs: Path, console: Console
) -> tuple[dict, dict]:
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
            runs: dict[str, list[concurrency.StreamsPass]] = {label: [] for label in servers}
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

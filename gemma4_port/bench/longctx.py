"""Long prompts through real servers, side by side.

- Prefix reuse: the time to first token of a request that shares a long prefix with the request
  before it (a second turn of a chat), with the first request's KV reused vs prefilled again.
- Chunked prefill: the gaps between the tokens of 3 running streams while long prompts keep
  arriving in the fourth slot, with one prefill chunk between decode steps vs whole prompts.

Each pair is two servers of the same artifact that differ in one setting, up at once and driven
alternately, so a drift of the machine hits both alike; the first round is a warm-up (TorchScript
optimises a graph on its second call). Prompts are token ids, so their lengths are exact."""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from pathlib import Path

import requests

from contract.artifact import load_meta
from gemma4_port.bench.bench_error import BenchError
from gemma4_port.bench.server import Server
from gemma4_port.bench.stats import ratio, summary

STREAMS = 3
TIMEOUT_S = 600.0


def _stream(url: str, model: str, prompt: list[int], max_tokens: int) -> tuple[float, list[float]]:
    """One greedy streamed completion: (seconds to the first text, seconds between text chunks)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    stamps = []
    with requests.post(url + "/v1/completions", json=body, stream=True, timeout=TIMEOUT_S) as r:
        if r.status_code != 200:
            raise BenchError(f"{url}: a benchmark request got {r.status_code}: {r.text[:200]}")
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    stamps.append(time.perf_counter())
    if not stamps:
        raise BenchError(f"{url}: a benchmark request streamed no text")
    return stamps[0] - t0, [b - a for a, b in zip(stamps, stamps[1:])]


def _metric(url: str, name: str) -> float:
    for line in requests.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


@contextlib.contextmanager
def _servers(folder: Path, logs: Path, settings: dict[str, dict[str, str]], ready_timeout_s: float):
    servers = {label: Server(folder, logs / label, ready_timeout_s, env) for label, env in settings.items()}
    with contextlib.ExitStack() as stack:
        for server in servers.values():
            stack.callback(server.stop)
            server.start()
        for server in servers.values():
            server.wait_ready()
        yield servers


def _alternate(rounds: int, labels: list[str]):
    """(round, label) pairs, the order flipping every round; round 0 is the warm-up."""
    for r in range(rounds + 1):
        yield from ((r, label) for label in (labels if r % 2 == 0 else labels[::-1]))


def reuse_ttft(folder: Path, logs: Path, rounds: int, ready_timeout_s: float) -> dict:
    """Prompt A (3/4 of the context), then A plus a short follow-up: TTFT of the second, reused or not."""
    geo = load_meta(folder).geometry
    rng = random.Random(0)
    n = geo.kv_max * 3 // 4
    turns = [[rng.randrange(8, geo.vocab) for _ in range(n)] for _ in range(rounds + 1)]
    follow = [rng.randrange(8, geo.vocab) for _ in range(geo.buckets[0] // 2)]
    ttft: dict[str, list[float]] = {"reuse": [], "no_reuse": []}
    env = {"reuse": {"GEMMA4_PREFIX_REUSE": "true"}, "no_reuse": {"GEMMA4_PREFIX_REUSE": "false"}}
    with _servers(folder, logs, env, ready_timeout_s) as servers:
        for r, label in _alternate(rounds, list(servers)):
            s = servers[label]
            _stream(s.url, s.model, turns[r], 2)  # its KV stays in the slot
            seconds, _ = _stream(s.url, s.model, turns[r] + follow, 1)
            if r:
                ttft[label].append(seconds)
        reused = {label: _metric(s.url, "gemma4_prefix_tokens_reused_total") for label, s in servers.items()}
    out = {"prompt_tokens": n + len(follow), "shared_tokens": n, "rounds": rounds, "reused_tokens": reused}
    out |= {label: {"ttft_ms": summary(t, 1e3)} for label, t in ttft.items()}
    out["ttft_no_reuse_over_reuse"] = ratio(out["no_reuse"]["ttft_ms"]["p50"], out["reuse"]["ttft_ms"]["p50"])
    return out


def _streams_beside_long_prompts(
    server: Server, short: list[list[int]], long: list[list[int]], max_tokens: int
) -> list[float]:
    """STREAMS greedy streams of `max_tokens` while the long prompts arrive one after another in the
    remaining slot; the gaps between the streams' tokens."""
    gaps: list[float] = []
    lock = threading.Lock()
    done = threading.Event()
    errors: list[Exception] = []

    def guarded(fn):
        def run():
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - re-raised in the driver: a benchmark never hides a failure
                errors.append(exc)
                done.set()

        return run

    def stream(prompt):
        _, g = _stream(server.url, server.model, prompt, max_tokens)
        with lock:
            gaps.extend(g)

    def arrivals():
        i = 0
        while not done.is_set():
            _stream(server.url, server.model, long[i % len(long)], 1)
            i += 1

    threads = [threading.Thread(target=guarded(lambda p=p: stream(p)), daemon=True) for p in short]
    feeder = threading.Thread(target=guarded(arrivals), daemon=True)
    feeder.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    feeder.join()
    if errors:
        raise errors[0]
    return gaps


def chunked_itl(b4: Path, logs: Path, rounds: int, ready_timeout_s: float) -> dict:
    """Inter-token latency of STREAMS streams while prompts of kv_max - 8 tokens keep arriving."""
    geo = load_meta(b4).geometry
    if geo.batch < STREAMS + 1:
        raise BenchError(f"{b4} has {geo.batch} slots; the chunked-prefill benchmark needs {STREAMS + 1}")
    rng = random.Random(1)
    short = [[rng.randrange(8, geo.vocab) for _ in range(4)] for _ in range(STREAMS)]
    long = [[rng.randrange(8, geo.vocab) for _ in range(geo.kv_max - 8)] for _ in range(3)]
    max_tokens = geo.kv_max // 2
    itl: dict[str, list[float]] = {"chunked": [], "whole_prompt": []}
    env = {
        label: {"GEMMA4_PREFIX_REUSE": "false", "GEMMA4_PREFILL_CHUNKS_PER_STEP": chunks}
        for label, chunks in (("chunked", "1"), ("whole_prompt", "0"))
    }
    with _servers(b4, logs, env, ready_timeout_s) as servers:
        for r, label in _alternate(rounds, list(servers)):
            gaps = _streams_beside_long_prompts(servers[label], short, long, max_tokens)
            if r:
                itl[label] += gaps
    out = {
        "streams": STREAMS,
        "stream_tokens": max_tokens,
        "long_prompt_tokens": geo.kv_max - 8,
        "buckets": list(geo.buckets),
        "rounds": rounds,
    }
    out |= {label: {"itl_ms": summary(g, 1e3)} for label, g in itl.items()}
    for q in ("p50", "p99"):
        out[f"itl_{q}_whole_over_chunked"] = ratio(out["whole_prompt"]["itl_ms"][q], out["chunked"]["itl_ms"][q])
    return out


def measure(folder: Path, b4: Path, logs: Path, rounds: int, ready_timeout_s: float) -> dict:
    return {
        "reuse": reuse_ttft(folder, logs / "reuse", rounds, ready_timeout_s),
        "interleave": chunked_itl(b4, logs / "interleave", rounds, ready_timeout_s),
    }

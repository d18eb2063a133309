"""Long prompts through the engine, in process, side by side.

- Prefix reuse: the time to first token of a request that shares a long prefix with the request
  before it (a second turn of a chat), with the first request's KV reused vs prefilled again.
- Chunked prefill: the gaps between the tokens of 3 running streams while long prompts keep
  arriving in the fourth slot, with one prefill chunk between decode steps vs whole prompts.

Each pair is two engines on the same artifact that differ in one setting, driven alternately so a
drift of the machine hits both alike; the first round of each is a warm-up (TorchScript optimises a
graph on its second call)."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

from runtime.engine import Delta, Engine, Job, State
from runtime.sampling import SamplingParams
from runtime.settings import Settings

from .errors import BenchError
from .stats import ratio, summary

GREEDY = SamplingParams(temperature=0)
STREAMS = 3


def _engine(folder: Path, **settings) -> Engine:
    engine = Engine(Settings(artifact=folder, **settings)).start()
    if engine.wait(900) is not State.READY:
        engine.close()
        raise BenchError(f"the engine on {folder} did not come up: {engine.reason}")
    return engine


def _request(engine: Engine, prompt: list[int], max_tokens: int) -> tuple[float, list[float]]:
    """One greedy request: (seconds to its first token, seconds between its streamed tokens)."""
    job = engine.submit(Job(list(prompt), max_tokens, GREEDY))
    stamps = [time.perf_counter() for event in job.events() if isinstance(event, Delta)]
    if not stamps:
        raise BenchError("a benchmark request produced no text")
    return stamps[0] - job.accepted, [b - a for a, b in zip(stamps, stamps[1:])]


def _reused(engine: Engine) -> float:
    return engine.metrics.registry.get_sample_value("gemma4_prefix_tokens_reused_total") or 0.0


def _alternate(rounds: int, labels: list[str]):
    """(round, label) pairs, the order flipping every round; round 0 is the warm-up."""
    for r in range(rounds + 1):
        for label in (labels if r % 2 == 0 else labels[::-1]):
            yield r, label


def reuse_ttft(folder: Path, rounds: int) -> dict:
    """Prompt A (3/4 of the context), then A plus a short follow-up: TTFT of the second, reused or not."""
    engines = {"reuse": _engine(folder, prefix_reuse=True), "no_reuse": _engine(folder, prefix_reuse=False)}
    try:
        geo = engines["reuse"].geometry
        rng = random.Random(0)
        n = geo.kv_max * 3 // 4
        turns = [[rng.randrange(8, geo.vocab) for _ in range(n)] for _ in range(rounds + 1)]
        follow = [rng.randrange(8, geo.vocab) for _ in range(geo.buckets[0] // 2)]
        ttft: dict[str, list[float]] = {label: [] for label in engines}
        before = {label: _reused(e) for label, e in engines.items()}
        for r, label in _alternate(rounds, list(engines)):
            engine, first = engines[label], turns[r]
            _request(engine, first, 2)  # its KV stays in the slot, with its prompt and first token
            seconds, _ = _request(engine, first + follow, 1)
            if r:
                ttft[label].append(seconds)
        reused = {label: _reused(e) - before[label] for label, e in engines.items()}
    finally:
        for engine in engines.values():
            engine.close()
    out = {"prompt_tokens": n + len(follow), "shared_tokens": n, "rounds": rounds,
           "reused_tokens": reused} | {label: {"ttft_ms": summary(t, 1e3)} for label, t in ttft.items()}
    out["ttft_no_reuse_over_reuse"] = ratio(out["no_reuse"]["ttft_ms"]["p50"], out["reuse"]["ttft_ms"]["p50"])
    return out


def _streams_beside_long_prompts(engine: Engine, short: list[list[int]], long: list[list[int]],
                                 max_tokens: int) -> list[float]:
    """STREAMS greedy streams of `max_tokens` while the long prompts arrive one after another in
    the remaining slot; the gaps between the streams' tokens."""
    gaps: list[float] = []
    lock = threading.Lock()
    done = threading.Event()

    def stream(prompt):
        _, g = _request(engine, prompt, max_tokens)
        with lock:
            gaps.extend(g)

    def arrivals():
        i = 0
        while not done.is_set():
            _request(engine, long[i % len(long)], 1)
            i += 1

    threads = [threading.Thread(target=stream, args=(p,), daemon=True) for p in short]
    feeder = threading.Thread(target=arrivals, daemon=True)
    feeder.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    feeder.join()
    return gaps


def chunked_itl(b4: Path, rounds: int) -> dict:
    """Inter-token latency of STREAMS streams while prompts of kv_max - 8 tokens keep arriving."""
    engines = {"chunked": _engine(b4, prefix_reuse=False, prefill_chunks_per_step=1),
               "whole_prompt": _engine(b4, prefix_reuse=False, prefill_chunks_per_step=0)}
    try:
        geo = engines["chunked"].geometry
        if geo.batch < STREAMS + 1:
            raise BenchError(f"{b4} has {geo.batch} slots; the chunked-prefill benchmark needs {STREAMS + 1}")
        rng = random.Random(1)
        short = [[rng.randrange(8, geo.vocab) for _ in range(4)] for _ in range(STREAMS)]
        long = [[rng.randrange(8, geo.vocab) for _ in range(geo.kv_max - 8)] for _ in range(3)]
        max_tokens = geo.kv_max - 8
        itl: dict[str, list[float]] = {label: [] for label in engines}
        for r, label in _alternate(rounds, list(engines)):
            gaps = _streams_beside_long_prompts(engines[label], short, long, max_tokens)
            if r:
                itl[label] += gaps
    finally:
        for engine in engines.values():
            engine.close()
    out = {"streams": STREAMS, "stream_tokens": max_tokens, "long_prompt_tokens": geo.kv_max - 8,
           "buckets": list(geo.buckets), "rounds": rounds}
    out |= {label: {"itl_ms": summary(g, 1e3)} for label, g in itl.items()}
    for q in ("p50", "p99"):
        out[f"itl_{q}_whole_over_chunked"] = ratio(out["whole_prompt"]["itl_ms"][q], out["chunked"]["itl_ms"][q])
    return out


def measure(folder: Path, b4: Path, rounds: int) -> dict:
    return {"reuse": reuse_ttft(folder, rounds), "interleave": chunked_itl(b4, rounds)}

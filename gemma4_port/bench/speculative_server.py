"""Speculative decoding on our own server: the tiny-chat artifact compiled with its drafter and verify
graphs, served twice at once (`GEMMA4_SPEC_METHOD` drafter and lookup), each driven with the same
held-out prompts with speculation and without (`disable_spec_decode` per request), alternating, so a
drift of the machine hits both alike. Acceptance comes from the server's own /metrics counters
(proposed and accepted drafted tokens, read before and after each side); tokens per target step from
the identity each pass emits one token of its own besides those it accepts."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from gemma4_port.bench.concurrency import sse_chunks
from gemma4_port.bench.server import Server
from gemma4_port.bench.stats import ratio, summary

COUNTERS = ("gemma4_spec_proposed_tokens", "gemma4_spec_accepted_tokens")


def counters(url: str) -> dict[str, float]:
    """The speculative counters summed over methods, from /metrics."""
    out = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(requests.get(url + "/metrics", timeout=10).text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in out:
                out[name] += sample.value
    return out


def stream_chat(url: str, model: str, body: dict, disable: bool, timeout_s: float = 300) -> tuple[int, list[float]]:
    """One greedy streamed chat completion -> (completion tokens, chunk arrival times in s)."""
    request = body | {
        "model": model,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "disable_spec_decode": disable,
    }
    stamps, tokens = [], 0
    with requests.post(url + "/v1/chat/completions", json=request, stream=True, timeout=timeout_s) as r:
        r.raise_for_status()
        for chunk in sse_chunks(r):
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and (chunk["choices"][0].get("delta") or {}):
                stamps.append(time.perf_counter())
    return tokens, stamps


def side(server: Server, bodies: list[dict], disable: bool) -> dict:
    before = counters(server.url)
    start = time.perf_counter()
    runs = [stream_chat(server.url, server.model, b, disable) for b in bodies]
    wall = time.perf_counter() - start
    after = counters(server.url)
    proposed, accepted = (after[c] - before[c] for c in COUNTERS)
    tokens = sum(t for t, _ in runs)
    gaps = [b - a for _, s in runs for a, b in zip(s, s[1:], strict=False)]
    # A verify pass may stream several tokens in one chunk: the inter-token latency is the time from
    # a stream's first chunk to its last over the tokens that came after the first.
    decode_s, after_first = sum(s[-1] - s[0] for _, s in runs if s), sum(max(t - 1, 0) for t, _ in runs)
    return {
        "new_tokens": tokens,
        "proposed": proposed,
        "accepted": accepted,
        "acceptance": ratio(accepted, proposed),
        "tokens_per_target_step": ratio(tokens, tokens - accepted),
        "tok_s": ratio(tokens, wall),
        "itl_ms": ratio(decode_s * 1e3, after_first),
        "chunk_gap_ms": summary(gaps, 1e3),
    }


PLAN = {"drafter": "chat", "lookup": "code edit"}  # each way of drafting, on the workload it is for


def measure(
    artifact: Path, bodies: dict[str, list[dict]], logs: Path, rounds: int, plan: dict[str, str] = PLAN
) -> dict:
    """Per method (by default the drafter on the chat prompts, lookup on the code edits): with and
    without speculation, `rounds` alternating rounds each, on servers of one artifact up at once."""
    servers = {m: Server(artifact, logs, env={"GEMMA4_SPEC_METHOD": m}) for m in plan}
    out: dict = {}
    try:
        for server in servers.values():
            server.start()
        for server in servers.values():
            server.wait_ready()
        for method, workload in plan.items():
            # Each side's first request runs its graphs for the first time (TorchScript optimises a
            # graph on its first calls): one unmeasured request each, so neither side pays it.
            for disable in (True, False):
                stream_chat(servers[method].url, servers[method].model, bodies[workload][0], disable)
            rows: dict[str, list[dict]] = {"without": [], "with": []}
            for i in range(rounds):
                for label in ("with", "without") if i % 2 else ("without", "with"):
                    rows[label].append(side(servers[method], bodies[workload], disable=label == "without"))
            out[f"{workload}, {method}"] = {label: _merge(r) for label, r in rows.items()}
    finally:
        for server in servers.values():
            server.stop()
    return out


def _merge(rounds: list[dict]) -> dict:
    """Rounds summed (counts) and their medians (rates)."""
    keys = ("new_tokens", "proposed", "accepted")
    total = {k: sum(r[k] for r in rounds) for k in keys}
    return total | {
        "acceptance": ratio(total["accepted"], total["proposed"]),
        "tokens_per_target_step": ratio(total["new_tokens"], total["new_tokens"] - total["accepted"]),
        "tok_s": statistics.median(r["tok_s"] for r in rounds),
        "itl_ms": statistics.median(r["itl_ms"] for r in rounds),
        "chunk_gap_ms_p50": statistics.median(r["chunk_gap_ms"]["p50"] for r in rounds),
    }

"""What batching buys on this backend before any server work: the batch-1 and the batch-4 artifact
loaded side by side in one process, every slot busy, decoded through ModelRunner exactly as the
engine drives it (greedy), rounds interleaved so drift hits both alike.

`step_ratio` = 4 x step(b1) / step(b4) is what the server's batch-4 / batch-1 tok/s would be if
HTTP, sampling, detokenization and prefills cost nothing; `ratio_with_prefills` adds one prefill
per request of the benchmark's length, which stalls every other slot (a static-shape prefill graph
fills one slot at a time). Both are medians of a noisy machine: estimates, not bounds. A
memory-bound device runs 4 rows for about the price of 1; a CPU GEMM over 4 rows can cost several
times one row.
"""

from __future__ import annotations

import time
from pathlib import Path

from contract.greedy import argmax
from gemma4_port.bench.concurrency import PROMPTS
from gemma4_port.bench.stats import ratio, summary
from runtime.model.loader import load_artifact

# TorchScript profiles a graph on its first call and optimises it on the second; a batch-1 artifact
# prefills once per round.
WARMUP_ROUNDS = 2


def _rounds(runner, ids: list[int], tokens: int) -> tuple[float, list[float]]:
    """Prefill every slot, then `tokens - 1` decode steps with all slots busy: (one prefill's
    seconds, each step's seconds)."""
    batch = runner.geo.batch
    t0 = time.perf_counter()
    last = {0: argmax(runner.prefill_prompt(0, ids))}
    prefill_s = time.perf_counter() - t0
    for slot in range(1, batch):
        last[slot] = argmax(runner.prefill_prompt(slot, ids))
    steps = []
    for _ in range(tokens - 1):
        t0 = time.perf_counter()
        last = {slot: argmax(row) for slot, row in runner.decode(last).items()}
        steps.append(time.perf_counter() - t0)
    for slot in range(batch):
        runner.free(slot)
    return prefill_s, steps


def measure(b1: Path, b4: Path, tokens: int, rounds: int) -> dict:
    """`rounds` interleaved rounds per artifact of one request length (`tokens` new tokens)."""
    loaded = {"b1": load_artifact(b1), "b4": load_artifact(b4)}
    try:
        ids = loaded["b1"].tokenizer(PROMPTS[0]).input_ids
        tokens = min(tokens, min(m.meta.geometry.kv_max for m in loaded.values()) - len(ids))
        samples = {label: ([], []) for label in loaded}
        for r in range(WARMUP_ROUNDS + rounds):
            order = list(loaded) if r % 2 == 0 else list(reversed(loaded))
            for label in order:
                prefill_s, steps = _rounds(loaded[label].runner, ids, tokens)
                if r >= WARMUP_ROUNDS:
                    samples[label][0].append(prefill_s)
                    samples[label][1].extend(steps)
        out = {"prompt_tokens": len(ids), "new_tokens": tokens, "rounds": rounds}
        for label, (prefills, steps) in samples.items():
            out[label] = {
                "batch": loaded[label].meta.geometry.batch,
                "step_ms": summary(steps, 1e3),
                "prefill_ms": summary(prefills, 1e3),
            }
    finally:
        for m in loaded.values():
            m.close()
    s1, s4 = out["b1"]["step_ms"]["p50"], out["b4"]["step_ms"]["p50"]
    p1, p4 = out["b1"]["prefill_ms"]["p50"], out["b4"]["prefill_ms"]["p50"]
    batch = out["b4"]["batch"]
    out["step_cost_b4_over_b1"] = ratio(s4, s1)
    out["step_ratio"] = ratio(batch * s1, s4)
    # Tokens per ms of each, with one prefill per request of `tokens` tokens (the first comes from it).
    per_ms_b1 = ratio(tokens, p1 + (tokens - 1) * s1)
    per_ms_b4 = ratio(batch * tokens, batch * p4 + (tokens - 1) * s4)
    out["ratio_with_prefills"] = ratio(per_ms_b4, per_ms_b1)
    return out

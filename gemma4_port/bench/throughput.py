"""Decode throughput and time to first token: our compiled graphs (through the server's own loader)
against transformers' `generate` on the same checkpoint, same dtype, same prompts, same number of
greedy tokens. The two alternate run by run, so drift on a noisy machine hits both alike."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from contract.dtypes import DTYPES
from contract.greedy import argmax
from gemma4_port.bench.stats import ratio, summary
from gemma4_port.verify.reference import load_reference
from runtime.model.loader import load_artifact

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n): return n if n < 2 else",
    "A small team wants its own endpoint for agents and tools,",
)


@dataclass
class TokenTimes:
    ttft: float  # seconds from the call to the first new token
    gaps: list[float]  # seconds between consecutive new tokens
    tokens: list[int]

    @property
    def decode_tok_s(self) -> float:
        return len(self.gaps) / sum(self.gaps) if self.gaps else float("nan")


def ours(runner, ids: list[int], n: int) -> TokenTimes:
    """Greedy through ModelRunner exactly as the engine drives it: prefill, then one decode per token."""
    t0 = time.perf_counter()
    tok = argmax(runner.prefill_prompt(0, ids))
    stamps, tokens = [time.perf_counter()], [tok]
    for _ in range(n - 1):
        tok = argmax(runner.decode({0: tok})[0])
        stamps.append(time.perf_counter())
        tokens.append(tok)
    runner.free(0)
    return TokenTimes(stamps[0] - t0, np.diff(stamps).tolist(), tokens)


def _clock():
    from transformers.generation.streamers import BaseStreamer

    class Clock(BaseStreamer):
        """Timestamps each push from generate(): the prompt first, then one per new token."""

        def __init__(self):
            self.stamps, self.values = [], []

        def put(self, value):
            self.stamps.append(time.perf_counter())
            self.values.append(value)

        def end(self):
            pass

    return Clock()


def transformers_generate(model, ids: list[int], n: int) -> TokenTimes:
    clock = _clock()
    t0 = time.perf_counter()
    # min_new_tokens masks EOS, so both sides produce exactly n tokens.
    model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        streamer=clock,
    )
    stamps = clock.stamps[1:]  # the first push is the prompt itself
    return TokenTimes(stamps[0] - t0, np.diff(stamps).tolist(), [int(v.reshape(-1)[0]) for v in clock.values[1:]])


def _side(runs: list[TokenTimes]) -> dict:
    return {
        "decode_tok_s": float(np.median([r.decode_tok_s for r in runs])),
        "ttft_ms": float(np.median([r.ttft for r in runs]) * 1e3),
        "token_ms": summary((g for r in runs for g in r.gaps), 1e3),
        "runs_decode_tok_s": [round(r.decode_tok_s, 2) for r in runs],
    }


def measure(folder: Path, new_tokens: int, repeats: int, warmup_calls: int) -> tuple[dict, dict[str, list[float]]]:
    """-> (JSON section, per-token latencies in ms per side for the histogram). TorchScript profiles a
    graph on its first call and optimises it on the second (~1 s together, even for the tiny model),
    so each prompt first runs `warmup_calls` times untimed on both sides."""
    loaded = load_artifact(folder)
    geo, runner = loaded.meta.geometry, loaded.runner
    model = load_reference(Path(loaded.meta.checkpoint)).to(DTYPES[geo.dtype])
    # transformers' default for the text model, faster than the reference's eager; its audio tower has no sdpa
    model.set_attn_implementation({"text_config": "sdpa"})
    prompts = [loaded.tokenizer(p).input_ids[: runner.geo.max_prompt] for p in PROMPTS]
    n = min(new_tokens, geo.kv_max - max(map(len, prompts)))
    sides = {
        "ours": lambda ids, k: ours(runner, ids, k),
        "transformers": lambda ids, k: transformers_generate(model, ids, k),
    }
    for ids in prompts * warmup_calls:  # every prefill bucket the prompts use, and the decode graph
        for run in sides.values():
            run(ids, warmup_calls + 1)
    runs: dict[str, list[TokenTimes]] = {name: [] for name in sides}
    for r in range(repeats):
        for i, ids in enumerate(prompts):
            order = list(sides) if (r + i) % 2 == 0 else list(reversed(sides))
            for name in order:
                runs[name].append(sides[name](ids, n))
    same = sum(a.tokens == b.tokens for a, b in zip(runs["ours"], runs["transformers"]))
    result = {
        "artifact": str(folder),
        "name": loaded.meta.name,
        "variant": loaded.meta.variant,
        "dtype": geo.dtype,
        "prompt_tokens": [len(p) for p in prompts],
        "new_tokens": n,
        "repeats": repeats,
        "torch_threads": torch.get_num_threads(),
        "transformers_attention": model.config.get_text_config()._attn_implementation,
        "ours": _side(runs["ours"]),
        "transformers": _side(runs["transformers"]),
        "same_tokens_runs": f"{same}/{len(runs['ours'])}",
    }
    result["decode_speedup"] = ratio(result["ours"]["decode_tok_s"], result["transformers"]["decode_tok_s"])
    result["ttft_speedup"] = ratio(result["transformers"]["ttft_ms"], result["ours"]["ttft_ms"])
    latencies = {name: [g * 1e3 for run in rs for g in run.gaps] for name, rs in runs.items()}
    loaded.close()
    return result, latencies

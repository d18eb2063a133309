"""Host work per decode step at the real Gemma-4 E2B geometry (vocab 262,144, PLE 35 x 256, bf16,
kv_max 2048): everything the engine does on the CPU between two device calls, timed part by part
with the runtime's own code (HostInputs, sampling.sample, detok.TextStream).

The tables are synthetic: 0.8 GB of word and 4.7 GB of PLE embeddings are reserved, but only the
rows the benchmark looks up are ever written (so only they take memory), as the real tables' rows
are in RAM once served."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from runtime.detok import TextStream
from runtime.hostside import DTYPES, HostInputs
from runtime.sampling import SamplingParams, sample, softcap

from ..compile import geometry
from ..configs import text_config_for
from ..manifest import load_manifest
from ..sharding import shard_model
from .stats import summary

REAL_MANIFEST = "manifests/gemma-4-e2b.yaml"
DEVICE_STEP_MS = 22.0  # ~44 tok/s: the E2B decode step on one NeuronCore (seed report)
ID_POOL = 4096  # distinct token ids looked up (their rows are the only ones written)
# Raw logits ~ N(0, 4^2): after the softcap and temperature 0.8 the next-token entropy is a few nats,
# like a trained model's (a flat row would be the worst case for top-p without top-k).
LOGIT_STD = 4.0
SAMPLERS = {
    "greedy": SamplingParams(temperature=0.0),
    "top_k_top_p": SamplingParams(temperature=0.8, top_p=0.95, top_k=64),
    "top_p": SamplingParams(temperature=0.8, top_p=0.95),
}


@dataclass
class SyntheticTables:
    """Duck-types runtime.hostside.HostTables: the two tables HostInputs gathers from."""

    embed: torch.Tensor  # (V, H)
    ple: torch.Tensor  # (V, L*P)


def real_geometry():
    manifest = load_manifest(REAL_MANIFEST)
    config = text_config_for(manifest)
    return geometry(config, shard_model(config, tp=1), manifest.variants[0])


def synthetic_tables(geo, ids: torch.Tensor, gen: torch.Generator) -> SyntheticTables:
    dtype = DTYPES[geo.dtype]
    embed = torch.empty(geo.vocab, geo.hidden, dtype=dtype)  # reserved, untouched
    ple = torch.empty(geo.vocab, geo.num_layers * geo.ple_dim, dtype=dtype)
    embed[ids] = torch.randn(len(ids), geo.hidden, generator=gen).to(dtype)
    ple[ids] = torch.randn(len(ids), ple.shape[1], generator=gen).to(dtype)
    return SyntheticTables(embed, ple)


def entropy_nats(raw: torch.Tensor, params: SamplingParams, cap: float | None) -> float:
    p = torch.softmax(softcap(raw.float(), cap) / params.temperature, dim=-1)
    return float(-(p * p.clamp_min(1e-30).log()).sum())


def measure(tokenizer, steps: int, seed: int = 0) -> dict:
    """`tokenizer`: any artifact's (a test tokenizer: the detokenizer's cost per token, not the vocab's)."""
    torch.set_grad_enabled(False)
    geo = real_geometry()
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randperm(geo.vocab, generator=gen)[:ID_POOL]
    host = HostInputs(geo, synthetic_tables(geo, pool, gen))
    rng = np.random.default_rng(seed)
    text_ids = rng.integers(8, len(tokenizer), size=steps).tolist()
    cap = geo.softcap
    # The device hands back (B, V) at the graph dtype; the runner takes a row as float32.
    device_logits = [(torch.randn(1, geo.vocab, generator=gen) * LOGIT_STD).to(DTYPES[geo.dtype]) for _ in range(8)]
    parts: dict[str, dict[str, list[float]]] = {}
    for name, params in SAMPLERS.items():
        stream = TextStream(tokenizer)
        t = {k: [] for k in ("embed", "inputs", "logits_row", "sample", "detok", "step")}
        for i in range(steps):
            tok = int(pool[i % ID_POOL])
            pos = 512 + i % (geo.kv_max - 512)  # past the sliding window, like a long chat
            t0 = time.perf_counter()
            host.embed(torch.tensor([[tok]]))  # timed alone for the breakdown; inputs() repeats it
            t1 = time.perf_counter()
            host.decode([tok], [pos])
            t2 = time.perf_counter()
            row = device_logits[i % len(device_logits)][0].float()
            t3 = time.perf_counter()
            sample(row, params, cap, gen)
            t4 = time.perf_counter()
            stream.push(text_ids[i])
            t5 = time.perf_counter()
            for k, v in zip(t, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t1)):
                t[k].append(v)
        parts[name] = t
    budget_us = DEVICE_STEP_MS * 1e3
    out = {
        "geometry": {"vocab": geo.vocab, "ple_width": geo.num_layers * geo.ple_dim, "hidden": geo.hidden,
                     "dtype": geo.dtype, "kv_max": geo.kv_max, "batch": geo.batch, "source": REAL_MANIFEST},
        "steps": steps, "device_step_ms": DEVICE_STEP_MS, "detok_vocab": len(tokenizer),
        "logit_std": LOGIT_STD, "samplers": {},
    }
    for name, t in parts.items():
        step = summary(t["step"], 1e6)
        out["samplers"][name] = {
            "params": asdict(SAMPLERS[name]),
            "entropy_nats": None if SAMPLERS[name].greedy else entropy_nats(device_logits[0][0], SAMPLERS[name], cap),
            "parts_us": {k: summary(v, 1e6) for k, v in t.items() if k != "step"},
            "step_us": step,
            "share_of_device_step_p50": step["p50"] / budget_us,
        }
    return out

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

from contract.dtypes import DTYPES
from contract.greedy import softcap
from contract.hostside import HostInputs
from gemma4_port import MANIFESTS
from gemma4_port.bench.stats import summary
from gemma4_port.compile.tracing import geometry
from gemma4_port.port.sharding import shard_model
from gemma4_port.source.configs import text_config_for
from gemma4_port.source.manifest import load_manifest
from runtime.generate.detok import TextStream
from runtime.generate.sampling import SamplingParams, sample

REAL_MANIFEST = MANIFESTS / "gemma-4-e2b.yaml"
DEVICE_STEP_MS = 22.0  # ~44 tok/s: an E2B decode step on one NeuronCore, as an earlier port measured it
ID_POOL = 4096  # distinct token ids looked up (their rows are the only ones written)
SAMPLERS = {
    "greedy": SamplingParams(temperature=0.0),
    "top_k_top_p": SamplingParams(temperature=0.8, top_p=0.95, top_k=64),
    "top_p": SamplingParams(temperature=0.8, top_p=0.95),
}
HEAD = 20  # tokens that carry most of the mass in a "peaked" row
# (sampler, logit rows) pairs timed. "peaked" rows look like a trained model's: a bulk ~ N(0, 2^2) and a
# head of HEAD tokens near 14, so at temperature 0.8 the entropy is ~2.5 nats and the top-p nucleus ~15
# tokens. "flat" rows ~ N(0, 4^2) (entropy ~5 nats, a nucleus of ~1,500 tokens) are the hard case for
# the samplers; shown, not targeted.
CASES = (
    ("greedy", "peaked"),
    ("top_k_top_p", "peaked"),
    ("top_p", "peaked"),
    ("top_k_top_p", "flat"),
    ("top_p", "flat"),
)


@dataclass
class SyntheticTables:
    """Duck-types contract.hostside.HostTables: the two tables HostInputs gathers from."""

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


def logit_rows(kind: str, vocab: int, dtype: torch.dtype, gen: torch.Generator, rows: int = 8) -> list[torch.Tensor]:
    """Raw logits as the device hands them back: (1, V) at the graph dtype."""
    out = []
    for _ in range(rows):
        if kind == "flat":
            x = torch.randn(1, vocab, generator=gen) * 4.0
        else:
            x = torch.randn(1, vocab, generator=gen) * 2.0
            x[0, torch.randint(vocab, (HEAD,), generator=gen)] = 14.0 + 2.0 * torch.randn(HEAD, generator=gen)
        out.append(x.to(dtype))
    return out


def shape_of(raw: torch.Tensor, params: SamplingParams, cap: float | None) -> dict:
    """Entropy (nats) and top-p nucleus size of the distribution a sampler draws from."""
    p = torch.softmax(softcap(raw.float(), cap) / params.temperature, dim=-1)
    ranked = p.sort(descending=True).values
    nucleus = int(((ranked.cumsum(0) - ranked) < params.top_p).sum())
    return {"entropy_nats": float(-(p * p.clamp_min(1e-30).log()).sum()), "nucleus_tokens": nucleus}


def time_steps(
    host: HostInputs,
    params: SamplingParams,
    logits: list[torch.Tensor],
    tokenizer,
    pool: torch.Tensor,
    steps: int,
    gen: torch.Generator,
) -> dict[str, list[float]]:
    """Seconds per part of each decode step, in the engine's order: graph inputs, the logits row,
    sampling, detokenization (and the embedding gather alone, for the breakdown)."""
    geo, stream = host.geo, TextStream(tokenizer)
    text_ids = np.random.default_rng(0).integers(8, len(tokenizer), size=steps).tolist()
    t = {k: [] for k in ("embed", "inputs", "logits_row", "sample", "detok", "step")}
    for i in range(steps):
        tok = int(pool[i % len(pool)])
        pos = 512 + i % (geo.kv_max - 512)  # past the sliding window, like a long chat
        t0 = time.perf_counter()
        host.embed([[tok]])  # timed alone for the breakdown; decode() repeats it
        t1 = time.perf_counter()
        host.decode_inputs([tok], [pos])
        t2 = time.perf_counter()
        row = logits[i % len(logits)][0]  # as ModelRunner.decode hands it on: raw, at the graph dtype
        t3 = time.perf_counter()
        sample(row, params, geo.softcap, gen)
        t4 = time.perf_counter()
        stream.push(text_ids[i])
        t5 = time.perf_counter()
        for k, v in zip(t, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t1)):
            t[k].append(v)
    return t


def measure(tokenizer, steps: int, seed: int = 0) -> dict:
    """`tokenizer`: any artifact's (a test tokenizer: the detokenizer's cost per token, not the vocab's)."""
    torch.set_grad_enabled(False)
    geo = real_geometry()
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randperm(geo.vocab, generator=gen)[:ID_POOL]
    host = HostInputs(geo, synthetic_tables(geo, pool, gen))
    rows = {kind: logit_rows(kind, geo.vocab, DTYPES[geo.dtype], gen) for kind in ("peaked", "flat")}
    out = {
        "geometry": {
            "vocab": geo.vocab,
            "ple_width": geo.num_layers * geo.ple_dim,
            "hidden": geo.hidden,
            "dtype": geo.dtype,
            "kv_max": geo.kv_max,
            "batch": geo.batch,
            "source": f"gemma4_port/manifests/{REAL_MANIFEST.name}",
        },
        "steps": steps,
        "device_step_ms": DEVICE_STEP_MS,
        "detok_vocab": len(tokenizer),
        "torch_threads": torch.get_num_threads(),
        "samplers": {},
    }
    for name, kind in CASES:
        params = SAMPLERS[name]
        t = time_steps(host, params, rows[kind], tokenizer, pool, steps, gen)
        step = summary(t.pop("step"), 1e6)
        out["samplers"][name if kind == "peaked" else f"{name} ({kind})"] = {
            "params": asdict(params),
            "logits": kind,
            "distribution": None if params.greedy else shape_of(rows[kind][0][0], params, geo.softcap),
            "parts_us": {k: summary(v, 1e6) for k, v in t.items()},
            "step_us": step,
            "share_of_device_step_p50": step["p50"] / (DEVICE_STEP_MS * 1e3),
        }
    return out

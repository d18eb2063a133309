"""`build.py compile`: manifest -> artifact directory (graphs, host tables, tokenizer, artifact.json)."""

from __future__ import annotations

import datetime
import json
import math
import platform
import shutil
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from runtime.artifact import (
    ARTIFACT_FORMAT, HOST_TABLES, ArtifactMeta, Geometry, Golden, Rope, sha256, write_meta,
)
from runtime.hostside import DTYPES, HostInputs, scaled_tables
from runtime.tokenizer import load_tokenizer

from .checkpoint import CheckpointReader, read_text_config, resolve_checkpoint
from .graphs import DecodeGraph, PrefillGraph, input_names
from .lint import check_traced
from .manifest import Manifest, Variant
from .model import Gemma4Decoder, kinds_present, kv_shapes
from .reference import load_reference, reference_greedy
from .sharding import ModelShard, shard_model

GOLDEN_STEPS = 8
GOLDEN_PROMPTS = (
    ("capital", "text", "The capital of France is"),
    ("hello", "text", "hello world"),
    ("chat", "chat", "Capital of France?"),
)


class CompileError(RuntimeError):
    pass


def rope_inv_freq(config, kind: str, head_dim: int) -> list[float]:
    """Inverse frequencies per attention kind; proportional RoPE rotates only a leading fraction."""
    params = config.rope_parameters["full_attention" if kind == "full" else "sliding_attention"]
    theta, rope_type = params["rope_theta"], params.get("rope_type", "default")
    if rope_type == "default":
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    elif rope_type == "proportional":
        angles = int(params.get("partial_rotary_factor", 1.0) * head_dim // 2)
        rotated = 1.0 / (theta ** (torch.arange(0, 2 * angles, 2, dtype=torch.float) / head_dim))
        inv = torch.cat((rotated, torch.zeros(head_dim // 2 - angles)))
        inv = inv / params.get("factor", 1.0)
    else:
        raise CompileError(f"rope_type {rope_type!r} for {kind} layers is not supported (default, proportional)")
    return inv.tolist()


def geometry(config, shard: ModelShard, variant: Variant) -> Geometry:
    kinds = kinds_present(shard)
    head_dims = {s.kind: s.head_dim for s in shard.layers}
    return Geometry(
        hidden=shard.hidden, vocab=shard.vocab, num_layers=shard.num_layers, ple_dim=shard.ple_dim,
        sliding_window=shard.sliding_window, kinds=kinds,
        rope={k: Rope(head_dim=head_dims[k], inv_freq=rope_inv_freq(config, k, head_dims[k])) for k in kinds},
        kv_shapes=kv_shapes(shard, variant.batch, variant.kv_max),
        embed_scale=math.sqrt(shard.hidden), ple_scale=math.sqrt(shard.ple_dim) if shard.ple_dim else 1.0,
        softcap=config.final_logit_softcapping, dtype=variant.dtype, batch=variant.batch,
        buckets=variant.buckets, kv_max=variant.kv_max, decode_buckets=variant.kv_buckets, tp=variant.tp,
        inputs={g: tuple(input_names(shard, g)) for g in ("prefill", "decode")},
    )


@dataclass
class _Tables:
    """Duck-types runtime.hostside.HostTables; `blobs` is what host/tables.safetensors holds."""

    blobs: dict[str, torch.Tensor]

    @property
    def embed(self) -> torch.Tensor:
        return self.blobs["embed_tokens_scaled"]

    @property
    def ple(self) -> torch.Tensor | None:
        return self.blobs.get("embed_tokens_per_layer_scaled")


EXAMPLE_TOKEN = 1  # the only id the trace's example inputs look up


def host_tables(reader: CheckpointReader, geo: Geometry, rows: int | None = None) -> _Tables:
    """The scaled host tables; with `rows`, only their first rows (enough for the example inputs of
    a tp rank's trace, which would otherwise hold a whole vocabulary-sized copy per rank)."""
    def read(key: str) -> torch.Tensor:
        return reader.get(key) if rows is None else reader.get_slice(key, 0, 0, rows)

    ple = read("embed_tokens_per_layer.weight") if geo.ple_dim else None
    return _Tables(scaled_tables(read("embed_tokens.weight"), ple, geo))


def example_inputs(host: HostInputs, geo: Geometry, graph: str, bucket: int):
    """A prefill of `bucket` prompt positions, or a decode over `bucket` keys."""
    dtype = DTYPES[geo.dtype]
    kv = tuple(torch.zeros(s, dtype=dtype) for s in geo.kv_shapes)
    if graph == "prefill":
        return host.prefill([EXAMPLE_TOKEN] * max(1, bucket // 2), bucket, 0, kv)
    return host.decode([EXAMPLE_TOKEN] * geo.batch, [0] * geo.batch, kv, keys=bucket)


def golden_prompts(tokenizer, max_len: int) -> list[tuple[str, list[int]]]:
    """The fixed prompts that fit the largest bucket (the self-test must not need truncation)."""
    out = []
    for name, kind, text in GOLDEN_PROMPTS:
        if kind == "chat":
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
        else:
            ids = tokenizer(text).input_ids
        if len(ids) <= max_len:
            out.append((name, list(ids)))
    if not out:
        raise CompileError(f"no golden prompt fits the largest bucket ({max_len} tokens); use a larger bucket")
    return out


def calibrate_golden(folder: Path, reference_logits: dict[str, list[torch.Tensor]]) -> tuple[Golden, ...]:
    """Run the saved artifact as the server will and keep, per golden prompt, the steps it reproduces.

    A divergence that verify's near-tie rule explains (a top-2 margin within the device's measured
    error) ends the checked steps there; any other divergence means the artifact is wrong."""
    from runtime.loader import load_artifact

    from .verify import Case, compare

    model = load_artifact(folder)
    try:
        out = []
        geo = model.meta.geometry
        for g in model.meta.golden:
            tokens, logits = model.runner.greedy(list(g.ids), len(g.tokens))
            row = compare(Case(g.name, list(g.ids), len(g.tokens)), tokens, logits, list(g.tokens),
                          reference_logits[g.name], geo.softcap, geo.dtype)
            if row.verdict == "MISMATCH":
                raise CompileError(f"the compiled graphs disagree with the float reference on golden prompt "
                                   f"{g.name!r}: {row.note}; run `build.py verify {folder}` for the full table")
            if row.first_divergence != 0:
                out.append(g.model_copy(update={"checked": row.first_divergence or len(g.tokens)}))
    finally:
        model.close()
    if not out:
        raise CompileError("every golden prompt starts with a near-tie on this artifact: nothing to self-test")
    return tuple(out)


def eos_token_ids(ckpt: Path, tokenizer) -> tuple[int, ...]:
    """End-of-turn ids from the checkpoint's generation config (chat models stop on more than <eos>)."""
    ids = {tokenizer.eos_token_id}
    gen = ckpt / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id") or []
        ids |= set(eos if isinstance(eos, list) else [eos])
    return tuple(sorted(i for i in ids if i is not None))


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "tokenizers", "safetensors"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def trace_quietly(trace, *args, **kwargs):
    """torch.jit.trace / trace_module without check_trace, and without the warnings that each graph's
    static shapes (a bucket is a Python constant in its graph, as intended) would print."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return trace(*args, check_trace=False, **kwargs)


def trace_cpu(decoder: Gemma4Decoder, host: HostInputs, geo: Geometry, folder: Path, prefix: str = "") -> dict:
    """TorchScript graphs, one prefill per bucket and one decode per KV bucket, each traced at its own
    shape, as methods of one module saved in one file: they share one copy of the weights in RAM."""
    graphs = nn.Module()
    graphs.prefill, graphs.decode = PrefillGraph(decoder).eval(), DecodeGraph(decoder).eval()
    methods = {f"prefill_{b}": ("prefill", b) for b in geo.buckets} | {
        f"decode_{t}": ("decode", t) for t in geo.decode_buckets}
    for name, (graph, _) in methods.items():
        setattr(graphs, name, getattr(graphs, graph).forward)  # trace_module traces methods by name
    traced = trace_quietly(torch.jit.trace_module, graphs, {
        name: example_inputs(host, geo, graph, bucket) for name, (graph, bucket) in methods.items()})
    for name in methods:
        check_traced(getattr(traced, name), prefix + name, geo.vocab)
    rel = f"graphs/{prefix}graphs.pt"
    torch.jit.save(traced, str(folder / rel))
    return {prefix + name: rel for name in methods}


@contextmanager
def _step(progress, text: str):
    task = progress.add_task(text, total=None) if progress else None
    yield
    if progress:
        progress.update(task, total=1, completed=1)


def compile_artifact(manifest: Manifest, variant: Variant, out: Path, backend: str = "cpu", progress=None) -> Path:
    if backend == "neuron":
        from .neuron import compile_neuron

        return compile_neuron(manifest, variant, out, progress)
    if variant.tp > 1:
        from .tp import compile_tp_cpu

        return compile_tp_cpu(manifest, variant, out, progress)
    b = start_build(manifest, variant, out, progress)
    with _step(progress, "load weights (strict key map)"):
        decoder = Gemma4Decoder(b.shards[0], DTYPES[variant.dtype])
        decoder.load_weights(b.reader)
    with _step(progress, f"trace {len(b.geo.buckets)} prefill graph(s) + decode, lint"):
        graphs = trace_cpu(decoder, HostInputs(b.geo, b.tables), b.geo, out)
    return _finish(b, graphs, "cpu", progress)


@dataclass
class Build:
    """What every compile path (cpu, cpu tp, neuron) starts from."""

    manifest: Manifest
    variant: Variant
    out: Path
    ckpt: Path
    config: object  # Gemma4TextConfig
    reader: CheckpointReader
    shards: list[ModelShard]  # one per rank
    geo: Geometry
    tables: _Tables


def start_build(manifest: Manifest, variant: Variant, out: Path, progress=None) -> Build:
    """The checkpoint, the sharding plan (made once: a plan that cannot hold fails before any work),
    the geometry and host tables, and an emptied artifact folder."""
    torch.set_grad_enabled(False)
    with _step(progress, "checkpoint"):
        ckpt = resolve_checkpoint(manifest)
        config = read_text_config(ckpt)
        reader = CheckpointReader(ckpt)
    shards = [shard_model(config, variant.tp, r) for r in range(variant.tp)]
    geo = geometry(config, shards[0], variant)  # every rank has the same per-rank shapes and inputs
    _prepare(out, ckpt)
    return Build(manifest, variant, out, ckpt, config, reader, shards, geo, host_tables(reader, geo))


def _prepare(out: Path, ckpt: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    (out / "graphs").mkdir(parents=True)
    (out / "host").mkdir()
    tok = load_tokenizer(ckpt)
    tok.save_pretrained(out / "tokenizer")
    shutil.copy(ckpt / "config.json", out / "config.json")


def _finish(b: Build, graphs: dict[str, str], backend: str, progress, extra_versions=None) -> Path:
    from safetensors.torch import save_file

    manifest, variant, out, ckpt, geo, tables = b.manifest, b.variant, b.out, b.ckpt, b.geo, b.tables

    save_file(tables.blobs, str(out / HOST_TABLES))
    with _step(progress, "golden tokens from the float reference (transformers, CPU)"):
        tok = load_tokenizer(out / "tokenizer")
        ref = load_reference(ckpt)
        golden, ref_logits = [], {}
        for name, ids in golden_prompts(tok, geo.buckets[-1]):
            tokens, ref_logits[name] = reference_greedy(ref, ids, GOLDEN_STEPS)
            golden.append(Golden(name=name, ids=ids, tokens=tokens, checked=len(tokens)))
    with _step(progress, "sha256 of every file"):
        files = {}
        for p in sorted(out.rglob("*")):
            if p.is_file():
                p.chmod(0o644)  # safetensors writes 0600; a server running as another user must read it
                files[str(p.relative_to(out))] = sha256(p)
    meta = ArtifactMeta(
        format=ARTIFACT_FORMAT, name=manifest.name, variant=variant.name, backend=backend,
        manifest=manifest.model_dump(mode="json"), versions=versions() | (extra_versions or {}),
        geometry=geo, graphs=graphs, files=files, golden=tuple(golden),
        eos_token_ids=eos_token_ids(ckpt, tok), checkpoint=str(ckpt),
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
    write_meta(out, meta)
    if backend == "cpu" or Path("/dev/neuron0").exists():
        with _step(progress, "golden steps the artifact reproduces, loaded as the server loads it"):
            write_meta(out, meta.model_copy(update={"golden": calibrate_golden(out, ref_logits)}))
    return out

"""What every compile path traces from: the geometry of a variant, its host tables, example inputs,
and the CPU TorchScript trace (tp 1, and each rank under cpu tp)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from contract.artifact import AudioGeometry, DrafterGeometry, Geometry, Rope, VisionGeometry
from contract.dtypes import DTYPES
from contract.errors import Gemma4Error
from contract.graph_key import GraphKey, encoder_graphs, variant_graphs
from contract.hostside import DRAFT_ORDERING, VISION_POSITIONS, HostInputs, scaled_tables
from gemma4_port.compile.encoders import encoder_inputs
from gemma4_port.port.audio import AudioEncoder
from gemma4_port.port.decoder import Gemma4Decoder
from gemma4_port.port.drafter import ORDERING_KEY, Gemma4Drafter
from gemma4_port.port.graphs import CopyGraph, DecodeGraph, DraftGraph, PrefillGraph, VerifyGraph, input_names
from gemma4_port.port.kv import kinds_present, kv_kinds, kv_shapes, ring_size
from gemma4_port.port.lint import check_traced
from gemma4_port.port.sharding import DrafterShard, ModelShard
from gemma4_port.port.vision import VisionEncoder
from gemma4_port.source.checkpoint_files import CheckpointReader
from gemma4_port.source.model_sources import Speculative
from gemma4_port.source.variant import Variant

GRAPH_KINDS = ("prefill", "decode", "copy", "verify", "draft")


class CompileError(Gemma4Error, RuntimeError):
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


def _budget(variant: Variant, kind: str, tower):
    """The variant's budget of an encoder kind ("image", "audio"), None without one; a budget on a
    checkpoint without that tower is refused."""
    budget = getattr(variant.media, kind) if variant.media else None
    if budget is not None and tower is None:
        config = "vision_config" if kind == "image" else "audio_config"
        raise CompileError(f"variant {variant.name!r} has an {kind} budget, but the checkpoint has no {config}")
    return budget


def vision_geometry(vision, variant: Variant) -> VisionGeometry | None:
    """The image encoder's shapes where the variant has an image budget (and the model a tower)."""
    budget = _budget(variant, "image", vision)
    if budget is None:
        return None
    return VisionGeometry(
        patch_size=vision.patch_size,
        pooling_kernel=vision.pooling_kernel_size,
        width=vision.hidden_size,
        head_dim=vision.head_dim,
        rope_theta=vision.rope_parameters["rope_theta"],
        max_soft_tokens=budget.max_soft_tokens,
        soft_buckets=budget.soft_buckets,
    )


def audio_geometry(audio, variant: Variant) -> AudioGeometry | None:
    """The audio encoder's shapes where the variant has an audio budget (and the model a tower)."""
    budget = _budget(variant, "audio", audio)
    if budget is None:
        return None
    chunk = audio.attention_chunk_size
    if any(n % chunk for n in budget.soft_buckets):
        raise CompileError(
            f"variant {variant.name!r}: audio buckets {list(budget.soft_buckets)} must be multiples of the "
            f"tower's attention chunk ({chunk} soft tokens)"
        )
    return AudioGeometry(
        chunk=chunk,
        past=audio.attention_context_left - 1,
        future=audio.attention_context_right,
        max_soft_tokens=budget.max_soft_tokens,
        soft_buckets=budget.soft_buckets,
    )


def check_drafter_rope(config, drafter_config) -> None:
    """The drafter's layers take the target's rotary tables and masks: same rope and window per kind."""
    text = drafter_config.text_config
    dims = {
        "full" if t == "full_attention" else "sliding": lc.head_dim
        for t, lc in zip(text.layer_types, text.per_layer_config)
    }
    for kind, dim in dims.items():
        if rope_inv_freq(text, kind, dim) != rope_inv_freq(config, kind, dim):
            raise CompileError(f"the drafter's {kind} layers rotate otherwise than the target's (rope_parameters)")
    if "sliding_attention" in text.layer_types and text.sliding_window != config.sliding_window:
        raise CompileError(
            f"the drafter's sliding window {text.sliding_window} is not the target's {config.sliding_window}"
        )


def drafter_geometry(spec: Speculative, d: DrafterShard) -> DrafterGeometry:
    source = spec.drafter if spec.drafter is not None else "random"
    return DrafterGeometry(
        source=source, revision=spec.revision, k=spec.k, hidden=d.model.hidden, backbone=d.backbone, ordered=d.ordered
    )


def geometry(
    config,
    shard: ModelShard,
    variant: Variant,
    vision: VisionGeometry | None = None,
    placeholders: dict[str, int] | None = None,
    audio: AudioGeometry | None = None,
    spec: Speculative | None = None,
    drafter: DrafterShard | None = None,
) -> Geometry:
    """The variant's geometry; with `spec` (the manifest's speculative decoding, if this variant is
    built with it) its verify graphs, and with `drafter` (its rank-0 shard) the drafter's."""
    kinds = kinds_present(shard)
    head_dims = {s.kind: s.head_dim for s in shard.layers}
    ring = ring_size(shard.sliding_window, variant.kv_max, variant.buckets)
    return Geometry(
        hidden=shard.hidden,
        vocab=shard.vocab,
        num_layers=shard.num_layers,
        ple_dim=shard.ple_dim,
        sliding_window=shard.sliding_window,
        kinds=kinds,
        rope={k: Rope(head_dim=head_dims[k], inv_freq=rope_inv_freq(config, k, head_dims[k])) for k in kinds},
        kv_heads=tuple((heads, dim) for _, heads, _, dim in kv_shapes(shard, variant.batch, variant.kv_max, ring)),
        kv_kinds=kv_kinds(shard),
        ring=ring,
        embed_scale=math.sqrt(shard.hidden),
        ple_scale=math.sqrt(shard.ple_dim) if shard.ple_dim else 1.0,
        softcap=config.final_logit_softcapping,
        dtype=variant.dtype,
        batch=variant.batch,
        buckets=variant.buckets,
        key_buckets=variant.key_buckets,
        tp=variant.tp,
        prefill=variant.prefill,
        inputs={g: tuple(input_names(shard, g)) for g in GRAPH_KINDS},
        pad_id=config.pad_token_id,
        placeholders=placeholders or {},
        vision=vision,
        audio=audio,
        bidirectional_vision=config.use_bidirectional_attention == "vision",
        verify=spec.k + 1 if spec else 0,
        drafter=drafter_geometry(spec, drafter) if spec and drafter else None,
    )


@dataclass
class TableBlobs:
    """Duck-types contract.hostside.HostTables; `blobs` is what host/tables.safetensors holds."""

    blobs: dict[str, torch.Tensor]

    @property
    def embed(self) -> torch.Tensor:
        return self.blobs["embed_tokens_scaled"]

    @property
    def ple(self) -> torch.Tensor | None:
        return self.blobs.get("embed_tokens_per_layer_scaled")

    @property
    def vision_positions(self) -> torch.Tensor | None:
        return self.blobs.get(VISION_POSITIONS)


EXAMPLE_TOKEN = 1  # the only id the trace's example inputs look up


def host_tables(
    reader: CheckpointReader, geo: Geometry, rows: int | None = None, drafter: CheckpointReader | None = None
) -> TableBlobs:
    """The scaled host tables (and a centroid-headed drafter's vocabulary order, from its checkpoint
    `drafter`); with `rows`, only their first rows (enough for the example inputs of a tp rank's
    trace, which would otherwise hold a whole vocabulary-sized copy per rank)."""

    def read(key: str) -> torch.Tensor:
        return reader.get(key) if rows is None else reader.get_slice(key, 0, 0, rows)

    ple = read("embed_tokens_per_layer.weight") if geo.ple_dim else None
    blobs = scaled_tables(read("embed_tokens.weight"), ple, geo)
    if geo.vision is not None:
        table = reader.get("vision_tower.patch_embedder.position_embedding_table")  # (2, E, W)
        blobs[VISION_POSITIONS] = table.to(DTYPES[geo.dtype]).contiguous()
    if drafter is not None and geo.drafter is not None and geo.drafter.ordered:
        blobs[DRAFT_ORDERING] = drafter.get(ORDERING_KEY).long().contiguous()
    return TableBlobs(blobs)


def example_inputs(host: HostInputs, geo: Geometry, graph: GraphKey):
    """A graph's example inputs: a half-full chunk for a prefill, every slot for a decode."""
    dtype = DTYPES[geo.dtype]
    kv = tuple(torch.zeros(s, dtype=dtype) for s in geo.kv_shapes)
    bucket, keys = graph.chunk, graph.keys
    if graph.kind == "prefill":
        return host.prefill_inputs([EXAMPLE_TOKEN] * max(1, bucket // 2), bucket, 0, kv, keys=keys)
    if graph.kind == "copy":
        return host.copy_inputs(0, 1, keys, keys, kv)
    if graph.kind == "verify":
        return host.verify_inputs([[EXAMPLE_TOKEN] * geo.verify] * geo.batch, [0] * geo.batch, kv, keys=keys)
    if graph.kind == "draft":
        hidden = torch.zeros(geo.batch, geo.hidden, dtype=dtype)
        return host.draft_inputs([EXAMPLE_TOKEN] * geo.batch, hidden, [1] * geo.batch, kv, keys=keys)
    return host.decode_inputs([EXAMPLE_TOKEN] * geo.batch, [0] * geo.batch, kv, keys=keys)


def load_drafter(b, rank: int, reduce=None, reader: CheckpointReader | None = None) -> Gemma4Drafter | None:
    """Rank `rank`'s drafter of build `b` (compile.pipeline.Build) with the checkpoint's weights;
    None without one."""
    if b.drafter is None:
        return None
    drafter = Gemma4Drafter(b.drafter.shards[rank], DTYPES[b.geo.dtype], reduce)
    drafter.load_weights(reader or b.drafter.reader)
    return drafter


def trace_quietly(trace, *args, **kwargs):
    """torch.jit.trace / trace_module without check_trace, and without the warnings that each graph's
    static shapes (a bucket is a Python constant in its graph, as intended) would print."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return trace(*args, check_trace=False, **kwargs)


def trace_cpu(
    decoder: Gemma4Decoder,
    host: HostInputs,
    geo: Geometry,
    folder: Path,
    prefix: str = "",
    vision: VisionEncoder | None = None,
    audio: AudioEncoder | None = None,
    drafter: Gemma4Drafter | None = None,
) -> dict:
    """TorchScript graphs, one prefill per chunk bucket and key bucket that holds it, one decode (and
    at batch > 1 one copy, with speculation one verify and with a drafter one drafter step) per key
    bucket, and with `vision` / `audio` one encoder per soft-token bucket, each traced at its own
    shape, as methods of one module saved in one file: they share one copy of the weights in RAM."""
    graphs = nn.Module()
    graphs.prefill, graphs.decode = PrefillGraph(decoder).eval(), DecodeGraph(decoder).eval()
    graphs.copy, graphs.verify = CopyGraph(decoder).eval(), VerifyGraph(decoder).eval()
    if drafter is not None:
        graphs.draft = DraftGraph(decoder, drafter).eval()
    methods = variant_graphs(geo.buckets, geo.key_buckets, geo.batch, verify=geo.verify, drafter=drafter is not None)
    examples = {str(graph): example_inputs(host, geo, graph) for graph in methods}
    encoders = {"vision": vision, "audio": audio}
    for kind, encoder in encoders.items():
        if encoder is not None:
            setattr(graphs, kind, encoder.eval())
    for graph in encoder_graphs(*(g.soft_buckets if g else () for g in (geo.vision, geo.audio))):
        if encoders[graph.kind] is not None:  # a tp rank other than 0 traces none
            examples[str(graph)] = encoder_inputs(geo, host.tables.vision_positions, graph)
            methods += (graph,)
    for graph in methods:
        setattr(graphs, str(graph), getattr(graphs, graph.kind).forward)  # trace_module traces methods by name
    traced = trace_quietly(torch.jit.trace_module, graphs, examples)
    for graph in methods:
        check_traced(getattr(traced, str(graph)), f"{prefix}{graph}", geo.vocab)
    rel = f"graphs/{prefix}graphs.pt"
    torch.jit.save(traced, str(folder / rel))
    return {f"{prefix}{graph}": rel for graph in methods}

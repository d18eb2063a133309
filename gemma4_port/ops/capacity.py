"""`build.py plan`: does a variant fit, before a two-hour compile?

Bytes are counted from the real device module, each rank's Gemma4Decoder built from the sharding
plan on the meta device, not from marketing parameter counts ("E2B" keeps 2.3B parameters on the
device, "E4B" 4.6B). Every variant is one NxD ModelBuilder model (runtime/model/neuron.py): a core
holds one copy of its rank's weights, shared by every prefill and decode bucket, its KV state, and
the working set of the largest graph, a prefill chunk over kv_max keys (its float32 attention
scores and its mask-and-write rows).
Host RAM: the slim server keeps the word and PLE tables (and the whole model's prefill when the
prefill runs on the host); the one-time load reads every rank's weight file through host memory;
the compile is an estimate (see COMPILER_RAM_PER_WEIGHT).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import torch
from rich.console import Console
from rich.table import Table

from contract.dtypes import DTYPES
from contract.layout import NeuronLayout, neuron_layout
from gemma4_port.console import console as build_console
from gemma4_port.port.lint import SBUF_PARTITION_BYTES
from gemma4_port.port.model import Gemma4Decoder, kinds_present, kv_shapes, ring_size
from gemma4_port.port.sharding import ShardingError, shard_model, shard_table
from gemma4_port.source.configs import text_config_for
from gemma4_port.source.manifest import Manifest, Variant, load_manifest

GIB = 2**30
CORE_GIB = 16  # HBM per NeuronCore-v2: 32 GiB per Inferentia2 chip, two cores
# Python, torch, the Neuron SDK and a 262k-vocab tokenizer; python + torch + transformers alone
# measure 0.25 GiB on the development machine, the rest is an allowance.
PROCESS_BYTES = 1 * GIB
# neuronx-cc host RAM per byte of weights of each graph it compiles at once (lowering, the HLO and
# the compiler's working set). Calibrated on the seed's one data point: the 12B TP=2 build peaks
# above 128 GB and needs >= 55 GB of swap. An estimate: it only says which box and how much swap.
COMPILER_RAM_PER_WEIGHT = 4.5


@dataclass(frozen=True)
class Instance:
    name: str
    host_gib: int


INSTANCES = (Instance("inf2.xlarge", 16), Instance("inf2.8xlarge", 128))  # the same chip, 2 NeuronCores
BUILD_HOST = INSTANCES[1]


class ModelSizes:
    """Element counts of one model's device decoder per (tp, rank), each built once on the meta device."""

    def __init__(self, config):
        self.config = config

    @cache
    def shard(self, tp: int, rank: int):
        return shard_model(self.config, tp, rank)

    @cache
    def weights(self, tp: int, rank: int) -> int:
        """Every parameter and buffer of the rank's device graph: what a neff holds as constants."""
        with torch.device("meta"):
            decoder = Gemma4Decoder(self.shard(tp, rank))
        return sum(t.numel() for t in (*decoder.parameters(), *decoder.buffers()))

    def kv(self, tp: int, rank: int, batch: int, kv_max: int, ring: int) -> int:
        """KV elements: global layers keep kv_max positions, sliding layers a ring of `ring`."""
        return sum(math.prod(s) for s in kv_shapes(self.shard(tp, rank), batch, kv_max, ring))

    def ring(self, variant: Variant) -> int:
        return ring_size(self.shard(1, 0).sliding_window, variant.kv_max, variant.buckets)

    def transient(self, tp: int, rank: int, variant: Variant) -> tuple[int, int]:
        """Elements of the largest graph's working set: (float32 attention scores, input rows at the
        variant dtype). The largest graph is the prefill of the largest chunk bucket C over kv_max keys
        (with host prefill: decode over kv_max, B queries). One layer's scores are alive at a time:
        the largest, q heads x C x T_kind (T_kind = kv_max, or the ring for a sliding layer); the rows
        input is C x 2 (mask, write) x T_kind per attention kind."""
        queries = variant.batch if variant.prefill == "host" else variant.buckets[-1]
        ring = self.ring(variant)
        width = {kind: ring if kind == "sliding" else variant.kv_max for kind in kinds_present(self.shard(tp, rank))}
        scores = max(s.q_heads * queries * width[s.kind] for s in self.shard(tp, rank).layers)
        return scores, sum(queries * 2 * w for w in width.values())

    def host_tables(self) -> int:
        m = self.shard(1, 0)
        return m.vocab * m.hidden + m.ple_vocab * m.num_layers * m.ple_dim

    def host_rope(self, kv_max: int) -> int:
        """The host's rotary rows, made at load: cos and sin of every position per attention kind
        (contract/hostside.py HostInputs.rope_rows); the mask strips beside them are 8 x ring or kv_max."""
        dims = {s.kind: s.head_dim for s in self.shard(1, 0).layers}
        return kv_max * 2 * sum(dims.values())


@dataclass(frozen=True)
class Footprint:
    """Bytes of one variant, where they live and when."""

    variant: Variant
    layout: NeuronLayout
    rank_weights: int  # one copy of one rank's device weights (the largest rank), at the variant dtype
    rank_kv: int  # one rank's KV buffers for batch x kv_max
    rank_scores: int  # the largest graph's float32 attention scores, one layer's (see ModelSizes.transient)
    rank_rows: int  # and its mask-and-write rows input, every kind's
    host_tables: int  # word embedding + PLE tables at the variant dtype: the slim server's load
    host_rope: int  # and the rotary rows of every position up to kv_max
    whole_weights: int  # the whole decoder at the variant dtype: the compile holds it, a host prefill runs it

    @property
    def rank_transient(self) -> int:
        return self.rank_scores + self.rank_rows

    @property
    def per_core(self) -> int:
        return self.rank_weights + self.rank_kv + self.rank_transient

    @property
    def host_prefill(self) -> int:
        """The host's TorchScript prefill: one module whose bucket methods share the whole model's weights."""
        return self.whole_weights if self.layout.host_prefill else 0

    @property
    def serve(self) -> int:
        return PROCESS_BYTES + self.host_tables + self.host_rope + self.host_prefill

    @property
    def load_peak(self) -> int:
        """Every rank's weight file is read into host memory before initialize() copies it to its core."""
        return self.serve + self.layout.tp * self.rank_weights

    @property
    def compile_peak(self) -> int:
        jobs = self.layout.compile_jobs * self.rank_weights
        return PROCESS_BYTES + self.whole_weights + int(COMPILER_RAM_PER_WEIGHT * jobs)

    @property
    def fits_core(self) -> bool:
        return self.per_core <= CORE_GIB * GIB


def footprint(sizes: ModelSizes, variant: Variant) -> Footprint:
    size = DTYPES[variant.dtype].itemsize
    ranks = range(variant.tp)
    scores, rows = max(sizes.transient(variant.tp, r, variant) for r in ranks)
    return Footprint(
        variant=variant,
        layout=neuron_layout(variant.tp, variant.prefill, variant.buckets, variant.kv_buckets, variant.batch),
        rank_weights=size * max(sizes.weights(variant.tp, r) for r in ranks),
        rank_kv=size * max(sizes.kv(variant.tp, r, variant.batch, variant.kv_max, sizes.ring(variant)) for r in ranks),
        rank_scores=4 * scores,
        rank_rows=size * rows,
        host_tables=size * sizes.host_tables(),
        host_rope=size * sizes.host_rope(variant.kv_max),
        whole_weights=size * sizes.weights(1, 0),
    )


def swap_gib(need: int, host_gib: int) -> int:
    return max(0, math.ceil(need / GIB - host_gib))


def host_verdict(fp: Footprint, inst: Instance) -> str:
    if not fp.fits_core:
        return "no (core)"
    if fp.serve > inst.host_gib * GIB:
        return "no (host RAM)"
    swap = swap_gib(fp.load_peak, inst.host_gib)
    return f"yes, {swap} GiB swap" if swap else "yes"


def compile_swap_gib(manifest: Manifest, variant: Variant, host_gib: int = BUILD_HOST.host_gib) -> int:
    """Swap (GiB) the Neuron compile of `variant` needs on a build host with `host_gib` of RAM."""
    return swap_gib(footprint(ModelSizes(text_config_for(manifest)), variant).compile_peak, host_gib)


def at_kv_max(sizes: ModelSizes, variant: Variant, kv_max: int) -> Footprint:
    return footprint(sizes, variant.model_copy(update={"kv_max": kv_max, "key_buckets": ()}))


def largest_kv_max(sizes: ModelSizes, fp: Footprint) -> int | None:
    """The largest kv_max (a multiple of 128 above the largest bucket) whose KV and largest graph's
    working set fit next to the weights: both grow with kv_max, so a bisection finds it."""
    v = fp.variant
    low, high = 0, 128
    while at_kv_max(sizes, v, high).fits_core:
        low, high = high, 2 * high
    while high - low > 128:  # at_kv_max(low) fits (or low is below every kv_max), at_kv_max(high) does not
        mid = (low + high) // 256 * 128
        low, high = (mid, high) if at_kv_max(sizes, v, mid).fits_core else (low, mid)
    return low if low > v.buckets[-1] else None


# A softmax row over every key of a global cache, in float32, must fit one SBUF partition (the lint's rule).
SOFTMAX_KEYS = SBUF_PARTITION_BYTES // 4


def kv_max_bound(sizes: ModelSizes, fp: Footprint) -> tuple[int, str] | None:
    """The largest kv_max this variant can take, and what bounds it: the core's memory (HBM: the KV and
    the largest graph's working set beside the weights), the lint (SBUF: a float32 softmax row over
    kv_max keys in one SBUF partition), or the model's own context (max_position_embeddings)."""
    memory = largest_kv_max(sizes, fp)
    if memory is None:
        return None
    bounds = [(memory, "HBM"), (SOFTMAX_KEYS, "SBUF"), (sizes.config.max_position_embeddings, "context")]
    return min(bounds, key=lambda b: b[0])


def kv_max_limit(sizes: ModelSizes, fp: Footprint) -> str:
    bound = kv_max_bound(sizes, fp)
    return f"{bound[0]} {bound[1]}" if bound else "-"


def fixes(sizes: ModelSizes, fp: Footprint) -> list[str]:
    """Changes to the variant that make it fit a NeuronCore, with the bytes per core each gives."""
    v = fp.variant
    tries = []
    if v.dtype == "float32":
        tries.append(("dtype: bfloat16", {"dtype": "bfloat16"}))
    if v.tp == 1:
        tries.append(("tp: 2", {"tp": 2}))
        if v.dtype == "float32":
            tries.append(("tp: 2 and dtype: bfloat16", {"tp": 2, "dtype": "bfloat16"}))
        if v.prefill == "device":
            tries.append(("prefill: host (decode alone on the core, the prompt on the host CPU)", {"prefill": "host"}))
    out = []
    for text, change in tries:
        try:
            other = footprint(sizes, v.model_copy(update=change))
        except ShardingError:
            continue
        if other.fits_core:
            out.append(f"{text} -> {gib(other.per_core)} GiB per core")
    kv_max = largest_kv_max(sizes, fp)
    if kv_max:
        buckets = f", key_buckets ending at {kv_max}" if v.key_buckets else ""
        out.append(f"kv_max: {kv_max} (or less{buckets}) -> the KV fits beside the weights")
    return out


def gib(n: int) -> str:
    return f"{n / GIB:.2f}"


SHORT = {"float32": "fp32", "bfloat16": "bf16"}


def describe(layout: NeuronLayout) -> str:
    copies = len(layout.keys.get("copy", ()))
    n = len(layout.device_graphs) - copies
    return (f"{n} decode (host prefill)" if layout.host_prefill else f"{n} graphs") + (
        f" + {copies} copy" if copies else ""
    )


def render(console: Console, manifest: Manifest, sizes: ModelSizes, fps: list[Footprint]) -> None:
    core = Table(title=f"{manifest.name}: per NeuronCore ({CORE_GIB} GiB), GiB")
    for col in (
        "variant",
        "tp",
        "dtype",
        "batch x kv_max",
        "ring",
        "graphs",
        "weights",
        "KV",
        "chunk",
        "kv_max up to",
        "per core",
        "fits",
    ):
        core.add_column(col)
    for fp in fps:
        v = fp.variant
        core.add_row(
            v.name,
            str(v.tp),
            SHORT[v.dtype],
            f"{v.batch} x {v.kv_max}",
            str(sizes.ring(v)),
            describe(fp.layout),
            gib(fp.rank_weights),
            gib(fp.rank_kv),
            gib(fp.rank_transient),
            kv_max_limit(sizes, fp),
            f"{gib(fp.per_core)} ({100 * fp.per_core / (CORE_GIB * GIB):.0f}%)",
            "yes" if fp.fits_core else "[bold red]NO[/]",
        )
    console.print(core)
    host = Table(title=f"{manifest.name}: host RAM, GiB")
    for col in ("variant", "serve", "first load", "compile (est.)", *(f"{i.name}" for i in INSTANCES), "build swap"):
        host.add_column(col)
    for fp in fps:
        host.add_row(
            fp.variant.name,
            gib(fp.serve),
            gib(fp.load_peak),
            gib(fp.compile_peak),
            *(host_verdict(fp, i) for i in INSTANCES),
            str(swap_gib(fp.compile_peak, BUILD_HOST.host_gib)),
        )
    console.print(host)
    for fp in fps:
        if not fp.fits_core:
            options = fixes(sizes, fp) or ["none of bf16, tp 2, host prefill or a smaller kv_max is enough"]
            console.print(f"[bold]{fp.variant.name}[/] does not fit a NeuronCore; fixes: " + "; ".join(options))
    m = sizes.shard(1, 0)
    whole, lm_head = sizes.weights(1, 0), m.vocab * m.hidden
    console.print(
        "graphs: one NxD ModelBuilder model per variant, its prefill and decode buckets sharing one copy of each "
        "rank's weights per core; with host prefill the model is decode alone and the prompt is prefilled on the "
        "host CPU; at batch > 1, + a fork's copy per key bucket (no weights).\n"
        "Counted on a core: every parameter and buffer of the rank's device graph (Gemma4Decoder of the "
        "sharding plan, built on the meta device): the decoder layers, lm_head (the tied embedding, copied "
        f"to the device), the PLE projection; plus the KV buffers: kv_max positions for a global layer, a ring "
        "of the window plus the largest bucket for a sliding one; plus chunk, the largest graph's working set: "
        "the float32 attention scores of one layer (query heads x the largest bucket x kv_max keys, the ring's "
        "for a sliding layer) and its mask-and-write rows (largest bucket x 2 x keys per attention kind; with "
        "host prefill, decode's: batch queries). kv_max up to: the smallest of what the core's memory holds "
        f"beside the weights (HBM), the lint's bound of {SOFTMAX_KEYS} keys (a float32 softmax row in one SBUF "
        "partition) and the model's context (max_position_embeddings). The whole model is "
        f"{whole / 1e9:.2f}B "
        f"elements = {gib(4 * whole)} GiB fp32, {gib(2 * whole)} GiB bf16; at tp 2 a core holds more than "
        f"half, as lm_head ({gib(2 * lm_head)} GiB bf16), norms and replicated K/V sit on both cores. Not "
        "counted: other activations (the chunk's hidden states, the probabilities the compiler may keep "
        "beside the scores), neff instructions, runtime scratch (keep headroom).\n"
        f"Host: serve = process ({gib(PROCESS_BYTES)}) + word and PLE tables ({sizes.host_tables() / 1e9:.2f}B "
        "elements) + the rotary rows of every position up to kv_max + the host prefill (the whole model, once); first load = serve + every rank's weight "
        f"file on its way to the cores (a swap file covers it); compile = an estimate calibrated on the seed's "
        f"12B TP=2 build; build swap = what it needs on {BUILD_HOST.name} ({BUILD_HOST.host_gib} GiB)."
    )


def plan_main(args) -> int:
    manifest = load_manifest(args.manifest)
    variants = [manifest.variant(args.variant)] if args.variant else list(manifest.variants)
    config = text_config_for(manifest)
    sizes = ModelSizes(config)
    console = build_console()
    render(console, manifest, sizes, [footprint(sizes, v) for v in variants])
    if args.shards:
        for tp in sorted({v.tp for v in variants}):
            console.print(shard_table(config, tp))
    return 0

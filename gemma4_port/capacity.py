"""`build.py plan`: does a variant fit, before a two-hour compile?

Bytes are counted from the real device module, each rank's Gemma4Decoder built from the sharding
plan on the meta device, not from marketing parameter counts ("E2B" keeps 2.3B parameters on the
device, "E4B" 4.6B). Every variant is one NxD ModelBuilder model (runtime/neuron_backend.py): a core
holds one copy of its rank's weights, shared by every prefill and decode bucket, and its KV state.
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

from . import terminal
from .configs import text_config_for
from .lint import SBUF_PARTITION_BYTES
from .manifest import Manifest, Variant, load_manifest
from .model import Gemma4Decoder, kv_shapes, ring_size
from .sharding import ShardingError, shard_model, shard_table

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

    def host_tables(self) -> int:
        m = self.shard(1, 0)
        return m.vocab * m.hidden + m.ple_vocab * m.num_layers * m.ple_dim


@dataclass(frozen=True)
class Footprint:
    """Bytes of one variant, where they live and when."""

    variant: Variant
    layout: NeuronLayout
    rank_weights: int  # one copy of one rank's device weights (the largest rank), at the variant dtype
    rank_kv: int  # one rank's KV buffers for batch x kv_max
    host_tables: int  # word embedding + PLE tables at the variant dtype: the slim server's load
    whole_weights: int  # the whole decoder at the variant dtype: the compile holds it, a host prefill runs it

    @property
    def per_core(self) -> int:
        return self.rank_weights + self.rank_kv

    @property
    def host_prefill(self) -> int:
        """The host's TorchScript prefill: one module whose bucket methods share the whole model's weights."""
        return self.whole_weights if self.layout.host_prefill else 0

    @property
    def serve(self) -> int:
        return PROCESS_BYTES + self.host_tables + self.host_prefill

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
    return Footprint(
        variant=variant, layout=neuron_layout(variant.tp, variant.prefill, variant.buckets, variant.kv_buckets),
        rank_weights=size * max(sizes.weights(variant.tp, r) for r in ranks),
        rank_kv=size * max(sizes.kv(variant.tp, r, variant.batch, variant.kv_max, sizes.ring(variant)) for r in ranks),
        host_tables=size * sizes.host_tables(), whole_weights=size * sizes.weights(1, 0),
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


def largest_kv_max(sizes: ModelSizes, fp: Footprint) -> int | None:
    """The largest kv_max (a multiple of 128 above the largest bucket) whose KV fits next to the weights."""
    v = fp.variant
    size = DTYPES[v.dtype].itemsize
    ring = sizes.shard(1, 0).sliding_window + v.buckets[-1]  # the ring once kv_max is past it
    # The sliding rings are a fixed cost; each further position costs one row of every global cache.
    fixed = size * max(sizes.kv(v.tp, r, v.batch, 0, ring) for r in range(v.tp))
    per_token = size * max(sizes.kv(v.tp, r, v.batch, 1, ring) for r in range(v.tp)) - fixed
    room = CORE_GIB * GIB - fp.rank_weights - fixed
    kv_max = (room // per_token) // 128 * 128 if room > 0 else 0
    return kv_max if kv_max > fp.variant.buckets[-1] else None


# A softmax row over every key of a global cache, in float32, must fit one SBUF partition (the lint's rule).
SOFTMAX_KEYS = SBUF_PARTITION_BYTES // 4


def kv_max_limit(sizes: ModelSizes, fp: Footprint) -> str:
    """The largest kv_max this variant can take, and what bounds it: the core's memory (the KV beside
    the weights) or the lint (a float32 softmax row over kv_max keys in one SBUF partition)."""
    memory = largest_kv_max(sizes, fp)
    if memory is None:
        return "-"
    return f"{SOFTMAX_KEYS} SBUF" if SOFTMAX_KEYS <= memory else f"{memory} HBM"


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
        buckets = f", decode_buckets ending at {kv_max}" if v.decode_buckets else ""
        out.append(f"kv_max: {kv_max} (or less{buckets}) -> the KV fits beside the weights")
    return out


def gib(n: int) -> str:
    return f"{n / GIB:.2f}"


SHORT = {"float32": "fp32", "bfloat16": "bf16"}


def describe(layout: NeuronLayout) -> str:
    n = len(layout.device_graphs)
    return f"{n} decode (host prefill)" if layout.host_prefill else f"{n} buckets"


def render(console: Console, manifest: Manifest, sizes: ModelSizes, fps: list[Footprint]) -> None:
    core = Table(title=f"{manifest.name}: per NeuronCore ({CORE_GIB} GiB), GiB")
    for col in ("variant", "tp", "dtype", "batch x kv_max", "ring", "graphs", "weights", "KV",
                "kv_max up to", "per core", "fits"):
        core.add_column(col)
    for fp in fps:
        v = fp.variant
        core.add_row(v.name, str(v.tp), SHORT[v.dtype], f"{v.batch} x {v.kv_max}", str(sizes.ring(v)),
                     describe(fp.layout), gib(fp.rank_weights), gib(fp.rank_kv),
                     kv_max_limit(sizes, fp), f"{gib(fp.per_core)} ({100 * fp.per_core / (CORE_GIB * GIB):.0f}%)",
                     "yes" if fp.fits_core else "[bold red]NO[/]")
    console.print(core)
    host = Table(title=f"{manifest.name}: host RAM, GiB")
    for col in ("variant", "serve", "first load", "compile (est.)", *(f"{i.name}" for i in INSTANCES), "build swap"):
        host.add_column(col)
    for fp in fps:
        host.add_row(fp.variant.name, gib(fp.serve), gib(fp.load_peak), gib(fp.compile_peak),
                     *(host_verdict(fp, i) for i in INSTANCES), str(swap_gib(fp.compile_peak, BUILD_HOST.host_gib)))
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
        "host CPU.\n"
        "Counted on a core: every parameter and buffer of the rank's device graph (Gemma4Decoder of the "
        "sharding plan, built on the meta device): the decoder layers, lm_head (the tied embedding, copied "
        f"to the device), the PLE projection; plus the KV buffers: kv_max positions for a global layer, a ring "
        "of the window plus the largest bucket for a sliding one. kv_max up to: what the core's memory "
        f"holds beside the weights (HBM), or the lint's bound of {SOFTMAX_KEYS} keys (a float32 softmax row in "
        f"one SBUF partition), whichever is smaller. The whole model is {whole / 1e9:.2f}B "
        f"elements = {gib(4 * whole)} GiB fp32, {gib(2 * whole)} GiB bf16; at tp 2 a core holds more than "
        f"half, as lm_head ({gib(2 * lm_head)} GiB bf16), norms and replicated K/V sit on both cores. Not "
        "counted: activations, neff instructions, runtime scratch (keep headroom).\n"
        f"Host: serve = process ({gib(PROCESS_BYTES)}) + word and PLE tables ({sizes.host_tables() / 1e9:.2f}B "
        "elements) + the host prefill (the whole model, once); first load = serve + every rank's weight "
        f"file on its way to the cores (a swap file covers it); compile = an estimate calibrated on the seed's "
        f"12B TP=2 build; build swap = what it needs on {BUILD_HOST.name} ({BUILD_HOST.host_gib} GiB)."
    )


def plan_main(args) -> int:
    manifest = load_manifest(args.manifest)
    variants = [manifest.variant(args.variant)] if args.variant else list(manifest.variants)
    config = text_config_for(manifest)
    sizes = ModelSizes(config)
    console = terminal.console()
    render(console, manifest, sizes, [footprint(sizes, v) for v in variants])
    if args.shards:
        for tp in sorted({v.tp for v in variants}):
            console.print(shard_table(config, tp))
    return 0

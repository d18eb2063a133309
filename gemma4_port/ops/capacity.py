"""`build.py plan`: does a variant fit, before a two-hour compile?

Bytes are counted from the real device module, each rank's Gemma4Decoder built from the sharding
plan on the meta device, not from marketing parameter counts ("E2B" keeps 2.3B parameters on the
device, "E4B" 4.6B). Every variant is one NxD ModelBuilder model (runtime/model/neuron.py): a core
holds one copy of its rank's weights, shared by every prefill and decode bucket, its KV state, and
the working set of the largest graph, a prefill chunk over kv_max keys (its float32 attention
scores and its mask-and-write rows).

A core's memory is counted in the categories neuron-monitor reports per NeuronCore (aws-neuron-sdk
v2.28.0 tools/neuron-sys-tools/neuron-monitor-user-guide.rst:534-560, 617-625; their meaning in
neuron-runtime/explore/device-memory.rst:19-27), each with where its figure comes from (DEVICE_MEMORY):
what the graph fixes is counted, what the runtime and the compiler decide is a floor or "unknown until
measured" (doctor samples neuron-monitor for the real figures). A verdict is given only where the
counted part decides it: a variant whose counted bytes overflow does not fit; one whose counted bytes
fit has the rest of the core left for what is unknown, and the table says how much.

Host RAM, in the same spirit (HostRam): the slim server keeps the word and PLE tables (and the whole
model's prefill when the prefill runs on the host); the first load reads every rank's weight file
through host memory; the compile holds each key's rank module and the whole checkpoint while it
shards, which is counted, while neuronx-cc's own working set per graph is unknown until measured:
ModelBuilder lowers the weights as graph inputs (inline_weights_to_neff=False,
neuronx-distributed v2.28.0 trace/model_builder.py:891), so no per-weight factor calibrated on graphs
with inlined weights applies to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache, partial

import torch

from contract.dtypes import DTYPES
from contract.layout import NeuronLayout, neuron_layout
from gemma4_port.port.audio import AudioEncoder
from gemma4_port.port.decoder import Gemma4Decoder
from gemma4_port.port.drafter import Gemma4Drafter
from gemma4_port.port.kv import kinds_present, kv_shapes, ring_size
from gemma4_port.port.layers import KEY_BLOCK
from gemma4_port.port.sharding import ShardingError, shard_drafter, shard_model
from gemma4_port.port.vision import VisionEncoder
from gemma4_port.source.configs import audio_config_for, drafter_config_for, text_config_for, vision_config_for
from gemma4_port.source.manifest import Manifest
from gemma4_port.source.model_sources import Speculative
from gemma4_port.source.variant import Variant

GIB = 2**30
MIB = 2**20
CORE_GIB = 16  # HBM per NeuronCore-v2: 32 GiB per Inferentia2 chip, two cores
# Python, torch and a 262k-vocab tokenizer measure 0.25 GiB on the development machine; the Neuron
# SDK's own import is unknown until measured: an allowance, not a measurement.
PROCESS_BYTES = 1 * GIB
# The runtime's micro-code overhead per physical NeuronCore, counted under model code
# (device-memory.rst:22: "96MB per physical Neuron Core"); each neff's own instructions come on top.
MODEL_CODE_FLOOR = 96 * MIB
# The runtime allocates the shared scratchpad in pages, 512 MB by default (device-memory.rst:157-160).
SCRATCHPAD_PAGE = 512 * MIB
UNKNOWN = "unknown until measured"
# neuron-monitor's per-core categories and the source of each figure here.
DEVICE_MEMORY = {
    "tensors": "counted: the rank's weights (ModelBuilder passes them as inputs, not constants: "
    "model_builder.py:891), the KV state and the graphs' inputs",
    "constants": "counted as 0: no weight is inlined; the graph's traced buffers (layer_scalar) are bytes",
    "model_code": f"floor {MODEL_CODE_FLOOR // MIB} MiB of runtime micro-code (device-memory.rst:22); "
    f"the neffs' instructions: {UNKNOWN}",
    "model_shared_scratchpad": "estimate: the largest graph's working set (one layer's float32 scores and the "
    "rows input) in 512 MiB pages; the compiler fixes the real size in each neff (device-memory.rst:143-152)",
    "runtime_memory": f"{UNKNOWN} (with the DMA rings and collectives buffers, device-memory.rst:19-27)",
}


@dataclass(frozen=True)
class Instance:
    name: str
    host_gib: int
    vcpus: int


# The same chip, 2 NeuronCores; a host apart (aws-neuron-sdk about-neuron/arch/neuron-hardware/inf2-arch.rst).
INSTANCES = (Instance("inf2.xlarge", 16, 4), Instance("inf2.8xlarge", 128, 32))
BUILD_HOST = INSTANCES[1]
POD_LIMIT_GIB = 13  # deploy/k8s/deployment.yaml's memory limit for the server on an inf2.xlarge


def compile_threads(inst: Instance) -> int:
    """neuronx-cc runs ModelBuilder starts at once: a ThreadPoolExecutor() with its default workers
    (model_builder.py:710), min(32, cpus + 4) in Python 3.8+."""
    return min(32, inst.vcpus + 4)


class ModelSizes:
    """Element counts of one model's device decoder per (tp, rank), each built once on the meta device,
    and of its encoders (`vision`: a Gemma4VisionConfig, `audio`: a Gemma4AudioConfig, or None),
    replicated on every rank."""

    def __init__(self, config, vision=None, audio=None, speculative: Speculative | None = None, drafter_config=None):
        """`speculative`: the manifest's speculative decoding (verify keys for the variants it names),
        with `drafter_config` its drafter's Gemma4AssistantConfig, whose weights join each rank's."""
        self.config = config
        self.vision, self.audio = vision, audio
        self.speculative, self.drafter_config = speculative, drafter_config
        # Memoised per instance (a method-level cache would keep every instance alive).
        self.shard = cache(partial(shard_model, config))
        self.weights = cache(self._weights)
        self.drafter_weights = cache(self._drafter_weights)

    def _weights(self, tp: int, rank: int) -> int:
        """Every parameter and buffer of the rank's device graph: the weights its neffs take as inputs."""
        with torch.device("meta"):
            decoder = Gemma4Decoder(self.shard(tp, rank))
        return sum(t.numel() for t in (*decoder.parameters(), *decoder.buffers()))

    def _drafter_weights(self, tp: int, rank: int) -> int:
        """The drafter's parameters and buffers beside the rank's decoder (0 without a drafter)."""
        if self.drafter_config is None:
            return 0
        with torch.device("meta"):
            drafter = Gemma4Drafter(shard_drafter(self.drafter_config, self.shard(tp, rank)))
        return sum(t.numel() for t in (*drafter.parameters(), *drafter.buffers()))

    def speculation(self, variant: Variant) -> tuple[int, bool]:
        """(verify tokens per slot, whether a drafter comes with them) for the variant."""
        spec = self.speculative
        if spec is None or not spec.applies_to(variant.name):
            return 0, False
        return spec.k + 1, self.drafter_config is not None

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

    def encoder(self, variant: Variant) -> tuple[int, int, int]:
        """Elements of the variant's encoders, 0 without a media budget: (weights, the largest encoder
        graph's working set, their host table). An image graph of the budget's P = max_soft_tokens x k^2
        patches holds one layer's float32 scores of a key block (heads x P x min(P, KEY_BLOCK)) beside
        its inputs (patches, position embeddings, rope, the N x P pooling matrix), and the host keeps the
        tower's 2-D position table; an audio graph of T soft tokens (4T mel frames) holds the first
        convolution's output (c0 x 2T x 64 float32) or one layer's blocked scores (heads x T x context)."""
        media = variant.media
        weights, transient, table = 0, 0, 0
        if media and media.image and self.vision is not None:
            v = self.vision
            with torch.device("meta"):
                encoder = VisionEncoder(v, self.config.hidden_size)
            weights += sum(t.numel() for t in (*encoder.parameters(), *encoder.buffers()))
            P = media.image.max_soft_tokens * v.pooling_kernel_size**2
            inputs = P * (3 * v.patch_size**2 + v.hidden_size + 2 * v.head_dim) + media.image.max_soft_tokens * P
            transient = v.num_attention_heads * P * min(P, KEY_BLOCK) + inputs
            table = 2 * v.position_embedding_size * v.hidden_size
        if media and media.audio and self.audio is not None:
            a, T = self.audio, media.audio.max_soft_tokens
            with torch.device("meta"):
                clip = AudioEncoder(a, self.config.hidden_size)
            weights += sum(t.numel() for t in (*clip.parameters(), *clip.buffers()))
            context = a.attention_chunk_size + a.attention_context_left - 1 + a.attention_context_right
            scores = a.num_attention_heads * T * context
            transient = max(transient, a.subsampling_conv_channels[0] * 2 * T * 64 + scores)
        return weights, transient, table

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
    encoder_weights: int = 0  # the image encoder at the variant dtype, replicated on every core
    encoder_transient: int = 0  # its largest graph's working set (float32 scores and inputs)
    encoder_table: int = 0  # its host table (the tower's 2-D position embeddings)
    drafter_weights: int = 0  # the whole speculative drafter (its rank's share is in rank_weights)

    @property
    def rank_transient(self) -> int:
        """The largest graph's working set: a decoder graph's, or the image encoder's (never both at once)."""
        return max(self.rank_scores + self.rank_rows, self.encoder_transient)

    @property
    def per_core(self) -> int:
        """The bytes the graphs fix: tensors (weights, KV) and the largest graph's working set."""
        return self.rank_weights + self.encoder_weights + self.rank_kv + self.rank_transient

    @property
    def scratchpad(self) -> int:
        """The largest graph's working set as the runtime reserves it: in whole scratchpad pages."""
        return math.ceil(self.rank_transient / SCRATCHPAD_PAGE) * SCRATCHPAD_PAGE

    @property
    def counted_core(self) -> int:
        """Every per-core category with a figure: tensors, the scratchpad pages and the model-code floor
        (DEVICE_MEMORY); runtime memory and the neffs' instructions come on top, unknown until measured."""
        return self.rank_weights + self.encoder_weights + self.rank_kv + self.scratchpad + MODEL_CODE_FLOOR

    @property
    def host_prefill(self) -> int:
        """The host's TorchScript prefill: one module whose bucket methods share the whole model's weights."""
        return self.whole_weights if self.layout.host_prefill else 0

    @property
    def serve(self) -> int:
        return PROCESS_BYTES + self.host_tables + self.encoder_table + self.host_rope + self.host_prefill

    @property
    def load_peak(self) -> int:
        """Every rank's weight file is read into host memory before initialize() copies it to its core;
        the neffs (graphs/nxd_model.pt, its size known after the compile) come on top."""
        return self.serve + self.layout.tp * self.rank_weights

    @property
    def compile_floor(self) -> int:
        """What the compile holds for certain: each weighted key's rank module, which ModelBuilder keeps
        from trace to shard_checkpoint (the weightless copy key is built on the meta device), then the
        whole checkpoint and one rank's cut of it while it shards. neuronx-cc's own RAM per graph, times
        compile_threads at once, comes on top: unknown until measured."""
        weighted = sum(1 for key in self.layout.keys if key != "copy")
        return PROCESS_BYTES + weighted * self.rank_weights + self.whole_weights + self.rank_weights

    @property
    def fits_core(self) -> bool:
        return self.counted_core <= CORE_GIB * GIB


def footprint(sizes: ModelSizes, variant: Variant) -> Footprint:
    size = DTYPES[variant.dtype].itemsize
    ranks = range(variant.tp)
    scores, rows = max(sizes.transient(variant.tp, r, variant) for r in ranks)
    encoder, encoder_transient, encoder_table = sizes.encoder(variant)
    verify, drafter = sizes.speculation(variant)
    v = variant
    weights = [sizes.weights(v.tp, r) + (sizes.drafter_weights(v.tp, r) if drafter else 0) for r in ranks]
    return Footprint(
        variant=variant,
        layout=neuron_layout(v.tp, v.prefill, v.buckets, v.key_buckets, v.batch, verify, drafter),
        rank_weights=size * max(weights),
        drafter_weights=size * (sizes.drafter_weights(1, 0) if drafter else 0),
        rank_kv=size * max(sizes.kv(variant.tp, r, variant.batch, variant.kv_max, sizes.ring(variant)) for r in ranks),
        rank_scores=4 * scores,
        rank_rows=size * rows,
        host_tables=size * sizes.host_tables(),
        host_rope=size * sizes.host_rope(variant.kv_max),
        whole_weights=size * sizes.weights(1, 0),
        encoder_weights=size * encoder,
        encoder_transient=4 * encoder_transient,
        encoder_table=size * encoder_table,
    )


def model_sizes(manifest: Manifest) -> ModelSizes:
    """The manifest's model (and speculative drafter) as ModelSizes, from their configs alone."""
    return ModelSizes(
        text_config_for(manifest),
        vision_config_for(manifest),
        audio_config_for(manifest),
        manifest.speculative,
        drafter_config_for(manifest),
    )


def swap_gib(need: int, host_gib: int) -> int:
    return max(0, math.ceil(need / GIB - host_gib))


def host_verdict(fp: Footprint, inst: Instance) -> str:
    """From the counted bytes only: "no" when they overflow, the swap they need at least, else "yes"
    (the SDK's import and the neffs' bytes on top are unknown until measured: see the left column)."""
    if not fp.fits_core:
        return "no (core)"
    if fp.serve > inst.host_gib * GIB:
        return "no (host RAM)"
    swap = swap_gib(fp.load_peak, inst.host_gib)
    return f"yes, >= {swap} GiB swap" if swap else "yes"


def compile_swap_gib(manifest: Manifest, variant: Variant, host_gib: int = BUILD_HOST.host_gib) -> int | None:
    """The swap (GiB) the Neuron compile of `variant` needs at least on a build host with `host_gib` of
    RAM, when its counted floor already overflows; None when it does not: the rest (neuronx-cc per
    graph) is unknown until measured, so no "no swap" verdict is founded."""
    swap = swap_gib(footprint(model_sizes(manifest), variant).compile_floor, host_gib)
    return swap or None


def at_kv_max(sizes: ModelSizes, variant: Variant, kv_max: int) -> Footprint:
    return footprint(sizes, variant.model_copy(update={"kv_max": kv_max, "key_buckets": (kv_max,)}))


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


def kv_max_bound(sizes: ModelSizes, fp: Footprint) -> tuple[int, str] | None:
    """The largest kv_max this variant can take, and what bounds it: the core's memory (HBM: the KV and
    the largest graph's working set beside the weights) or the model's own context
    (max_position_embeddings). SBUF bounds no kv_max: attention runs over blocks of KEY_BLOCK keys,
    whatever the key bucket (layers.py `attention`; the lint checks each op's rows)."""
    memory = largest_kv_max(sizes, fp)
    if memory is None:
        return None
    return min([(memory, "HBM"), (sizes.config.max_position_embeddings, "context")], key=lambda b: b[0])


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
            out.append(f"{text} -> {gib(other.counted_core)} GiB per core")
    kv_max = largest_kv_max(sizes, fp)
    if kv_max:
        buckets = f", key_buckets ending at {kv_max}" if len(v.key_buckets) > 1 else ""
        out.append(f"kv_max: {kv_max} (or less{buckets}) -> the KV fits beside the weights")
    return out


def gib(n: int) -> str:
    return f"{n / GIB:.2f}"

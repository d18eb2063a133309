"""`build.py plan`: does a variant fit, before a two-hour compile?

Bytes are counted from the real device module, each rank's Gemma4Decoder built from the sharding
plan on the meta device, not from marketing parameter counts ("E2B" keeps 2.3B parameters on the
device, "E4B" 4.6B). Every variant is one NxD ModelBuilder model (runtime/model/neuron.py): a core
holds one copy of its rank's weights, shared by every prefill and decode bucket, its KV state, and
the working set of the largest graph (its float32 attention scores and its mask-and-write rows): a
prefill chunk over kv_max keys, or a verify of k + 1 tokens in every slot, or a drafter step
(ops/model_sizes.py working_sets, the element counts; ops/fitting.py, what makes a variant fit).

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

from contract.dtypes import DTYPES
from contract.graph_key import encoder_graphs
from contract.layout import NeuronLayout, neuron_layout
from gemma4_port.ops.model_sizes import ModelSizes
from gemma4_port.source.configs import audio_config_for, drafter_config_for, text_config_for, vision_config_for
from gemma4_port.source.manifest import Manifest
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
    "rows input; of prefill, decode, verify and draft, whichever is largest) in 512 MiB pages; the compiler "
    "fixes the real size in each neff (device-memory.rst:143-152)",
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


@dataclass(frozen=True)
class Footprint:
    """Bytes of one variant, where they live and when."""

    variant: Variant
    layout: NeuronLayout
    rank_weights: int  # one copy of one rank's device weights (the largest rank), at the variant dtype
    rank_kv: int  # one rank's KV buffers for batch x kv_max
    rank_scores: int  # the largest graph's float32 attention scores, one layer's (see ModelSizes.working_sets)
    rank_rows: int  # and its mask-and-write rows input, every kind's
    largest_graph: str  # which graph family that is: prefill, decode (host prefill), verify or draft
    host_tables: int  # word embedding + PLE tables at the variant dtype: the slim server's load
    host_rope: int  # and the rotary rows of every position up to kv_max
    whole_weights: int  # the whole decoder at the variant dtype: the compile holds it, a host prefill runs it
    encoder_weights: int = 0  # the image and audio encoders at the variant dtype: a tp-1 model on rank 0's core
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
        """Every rank's weight file (and the encoders') is read into host memory before initialize() copies
        it to its core; the neffs (graphs/nxd_model.pt, its size known after the compile) come on top."""
        return self.serve + self.layout.tp * self.rank_weights + self.encoder_weights

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
    largest, scores, rows = max((sizes.transient(variant.tp, r, variant) for r in ranks), key=lambda t: t[1:])
    encoder, encoder_transient, encoder_table = sizes.encoder(variant)
    verify, drafter = sizes.speculation(variant)
    v, media = variant, variant.media
    encoders = encoder_graphs(
        media.image.soft_buckets if media and media.image and sizes.vision else (),
        media.audio.soft_buckets if media and media.audio and sizes.audio else (),
    )
    weights = [sizes.weights(v.tp, r) + (sizes.drafter_weights(v.tp, r) if drafter else 0) for r in ranks]
    return Footprint(
        variant=variant,
        layout=neuron_layout(v.tp, v.prefill, v.buckets, v.key_buckets, v.batch, verify, drafter, encoders),
        rank_weights=size * max(weights),
        drafter_weights=size * (sizes.drafter_weights(1, 0) if drafter else 0),
        rank_kv=size * max(sizes.kv(variant.tp, r, variant.batch, variant.kv_max, sizes.ring(variant)) for r in ranks),
        rank_scores=4 * scores,
        rank_rows=size * rows,
        largest_graph=largest,
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


def gib(n: int) -> str:
    return f"{n / GIB:.2f}"

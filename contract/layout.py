"""The Neuron layout of a variant: the keys and buckets of its one NxD ModelBuilder model, the files
it is saved in, and each device graph's input signature. The build compiles it
(gemma4_port/neuron.py), the capacity plan budgets it, and the server loads it
(runtime/model/neuron.py): one definition for the three.

Every variant is one ModelBuilder model: a `prefill` key (a bucket per chunk length and key length
that holds it, prefill_<C>_<T>), a `decode` key (a bucket per key length) that share one copy of the
weights per core and the KV as aliased state, and at batch > 1 a `copy` key (a bucket per key
length, no weights) that copies a slot's KV into another for a fork. With speculative decoding a
`verify` key (verify_<N>_<T>) and, with a drafter, a `draft` key whose drafter weights every key
holds (ModelBuilder shards the checkpoint by the first key's module). With `prefill: host` the model
is the decode and copy keys alone; the prompt runs through a CPU prefill of the whole model whose
KV the host writes into the state, split per rank as HOST_KV says. With media budgets the image and
audio encoders are a second ModelBuilder model (ENCODER_MODEL): tp 1, no state, on rank 0's core, a
`vision` and an `audio` key with a bucket per soft-token bucket.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from contract.artifact import ArtifactError, Geometry
from contract.dtypes import DTYPES
from contract.graph_key import GraphKey, encoder_graphs, variant_graphs

HOST_KV = "graphs/host_kv.json"  # {"kv_heads": [[[start, count] per rank] per KV tensor]}
NXD_MODEL = "graphs/nxd_model.pt"  # the traced ModelBuilder model (neffs, no weights), saved with torch.jit.save
NXD_WEIGHTS = "weights/tp{rank}_sharded_checkpoint.safetensors"  # ModelBuilder.shard_checkpoint's names
KV_STATE = "kv.{index}"  # the model's state key of KV tensor `index`: its name in the traced module (DeviceKV)
# The image and audio encoders: a ModelBuilder model of their own at tp 1 (no KV state, rank 0's core)
ENCODER_MODEL = "graphs/nxd_encoders.pt"
ENCODER_WEIGHTS = "encoder_weights/tp{rank}_sharded_checkpoint.safetensors"


@dataclass(frozen=True)
class NeuronLayout:
    tp: int
    device_graphs: tuple[GraphKey, ...]  # the prefills, decodes and copies on the NeuronCores
    host_prefill: bool
    encoders: tuple[GraphKey, ...] = ()  # vision_<N> and audio_<N>: the encoder model's, on rank 0's core

    @property
    def encoder_keys(self) -> dict[str, tuple[GraphKey, ...]]:
        """The encoder model's ModelBuilder keys (vision, audio) and their soft-token buckets."""
        out: dict[str, tuple[GraphKey, ...]] = {}
        for graph in self.encoders:
            out[graph.kind] = out.get(graph.kind, ()) + (graph,)
        return out

    @property
    def keys(self) -> dict[str, tuple[GraphKey, ...]]:
        """ModelBuilder's keys and their buckets, in the order they are added: prefill before decode,
        as NxD Inference adds context encoding before token generation."""
        out: dict[str, tuple[GraphKey, ...]] = {}
        for graph in self.device_graphs:
            out[graph.kind] = out.get(graph.kind, ()) + (graph,)
        return out

    @property
    def compile_jobs(self) -> int:
        """neuronx-cc runs at once that hold the weights: ModelBuilder compiles every bucket of every
        key in parallel, and a copy graph has none."""
        return sum(graph.kind != "copy" for graph in self.device_graphs)


def neuron_layout(
    tp: int,
    prefill: str,
    buckets: tuple[int, ...],
    key_buckets: tuple[int, ...],
    batch: int,
    verify: int = 0,
    drafter: bool = False,
    encoders: tuple[GraphKey, ...] = (),
) -> NeuronLayout:
    """With speculative decoding, `verify` (tokens per slot) and `drafter` add the verify and drafter
    keys after the others: they read and write the same aliased KV state. `encoders`: the image and
    audio encoder graphs (contract.graph_key.encoder_graphs), a model of their own."""
    host = prefill == "host"
    graphs = variant_graphs(buckets, key_buckets, batch, device_prefill=not host, verify=verify, drafter=drafter)
    return NeuronLayout(tp, graphs, host, encoders)


def geometry_layout(geo: Geometry) -> NeuronLayout:
    """An artifact's layout, from its geometry."""
    encoders = encoder_graphs(
        geo.vision.soft_buckets if geo.vision else (), geo.audio.soft_buckets if geo.audio else ()
    )
    return neuron_layout(
        geo.tp, geo.prefill, geo.buckets, geo.key_buckets, geo.batch, geo.verify, geo.drafter is not None, encoders
    )


def signature(geo: Geometry, graph: GraphKey) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """Name, shape and dtype of each non-KV input of a graph, from the geometry alone: what the host
    builds, what the neff was compiled for, and what ModelBuilder routes a call by (the widths of the
    rows, and of a copy's `held`, tell the key buckets apart)."""
    S, keys = graph.tokens, graph.keys
    B = geo.batch
    shapes: dict[str, tuple[int, ...]]
    if graph.kind == "copy":
        shapes = {"source": (B,), "target": (B,), "held": (keys,)}
    else:
        rows = 1 if graph.kind == "prefill" else B
        # a mask-and-write row per chunk token, per slot, or per slot's verified token
        queries = {"prefill": S, "verify": B * S}.get(graph.kind, B)
        width = 2 * geo.hidden if graph.kind == "draft" else geo.hidden  # a drafter step: embedding and hidden state
        shapes = {
            "hidden": (rows, S, width),
            "ple": (rows, S, geo.num_layers, geo.ple_dim),
            "rope": (rows, S, sum(2 * r.head_dim for r in geo.rope.values())),
            "last": (1, S),
            "slot": (B,),
        }
        shapes |= {f"rows_{kind}": (queries, 2, min(keys, geo.span(kind))) for kind in geo.kinds}
    dtype = DTYPES[geo.dtype]
    return [(n, shapes[n], dtype) for n in geo.inputs[graph.kind] if not n.startswith("kv")]


# -- where the ranks run ------------------------------------------------------------------------


class NeuronPlacementError(ArtifactError):
    pass


def visible_cores(env=os.environ) -> tuple[int, ...] | None:
    """The absolute NeuronCore ids this process owns, from NEURON_RT_VISIBLE_CORES as the runtime
    reads it (set by the user, or for the cores a device plugin allocated); None when unset: the
    runtime then takes every core of the machine.

    The runtime takes core ids and inclusive ranges, comma-separated, that together make one run of
    consecutive cores in increasing order ("0-1", "0,1", "4-5", "3-5,6"); a gap ("1,3") or a step
    back ("1,0") is refused at its start (aws-neuron-sdk v2.28.0 neuron-runtime/nrt-developer-guide.rst
    :1051-1054). NxD then puts rank r on the r-th of them (neuronx-distributed v2.28.0
    trace/spmd.py:124-129, `privateuseone:{rank}`), so a tp 2 process is given two consecutive cores.
    """
    raw = env.get("NEURON_RT_VISIBLE_CORES", "").strip()
    if not raw:
        return None
    allowed = "one run of consecutive cores in increasing order, like 0, 0-1, 0,1 or 2-3"
    cores: list[int] = []
    for part in raw.split(","):
        first, _, last = part.strip().partition("-")
        if not first.isdigit() or not (last or first).isdigit() or int(last or first) < int(first):
            raise NeuronPlacementError(
                f"NEURON_RT_VISIBLE_CORES={raw!r}: {part!r} is not a core id or a range; give {allowed}"
            )
        cores += range(int(first), int(last or first) + 1)
    if cores != list(range(cores[0], cores[0] + len(cores))):
        raise NeuronPlacementError(
            f"NEURON_RT_VISIBLE_CORES={raw!r} names cores {cores}: the runtime needs contiguous cores, {allowed}"
        )
    return tuple(cores)


def rank_cores(tp: int, env=os.environ) -> tuple[int, ...] | None:
    """The cores rank 0 .. tp-1 run on: the first `tp` the process sees (NxD puts rank r's state on
    the r-th visible core, spmd.py StateInitializer). Refuses a process that sees fewer than `tp`;
    more run, but the runtime reserves every visible core for the process, used or not
    (nrt-configurable-parameters.rst, note 5)."""
    cores = visible_cores(env)
    if cores is None:
        return None
    if len(cores) < tp:
        raise NeuronPlacementError(
            f"this artifact has {tp} ranks, one per NeuronCore, but NEURON_RT_VISIBLE_CORES="
            f"{env['NEURON_RT_VISIBLE_CORES']} gives the process {len(cores)}: give it {tp} cores, like 0-{tp - 1}"
        )
    return cores[:tp]

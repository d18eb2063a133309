"""The decode roofline `build.py plan` prints: how fast a variant can decode if HBM bandwidth is the
only limit, so a measured tok/s has something to be held against.

A decode step at batch B over a key bucket of T keys reads every weight on the core once and the
KV of B slots in their first T positions (a sliding layer's ring up to min(T, ring)), and writes
those positions back (decoder.py decode: a select over the leading positions). As the graph is written
it also rewrites each buffer's untouched tail (kv.with_tail concatenates it onto the
aliased output): counted here, as the graph asks for it; a compiler that aliases the tail in place
would save it. Time = bytes over the bandwidth of the HBM the core reads; tok/s per stream = 1 / step
time, the aggregate B times that.

Inferentia2: 820 GiB/s of HBM bandwidth per chip (aws-neuron-sdk v2.28.0
about-neuron/arch/neuron-hardware/inferentia2.rst:21-24; the NKI architecture guide says 820 GB/s,
trainium_inferentia2_arch.rst:21) from two HBM stacks; the per-core share is not published, so each
core is assumed to stream from its own stack at half. At tp 2 both cores read their halves at once;
the two all-reduces per layer (attention and MLP outputs, the row-parallel layers) are added at
ALL_REDUCE_S each: an assumed figure, not a measured one (doctor measures the real step time).
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.dtypes import DTYPES
from gemma4_port.ops.model_sizes import ModelSizes
from gemma4_port.port.kv import kv_shapes
from gemma4_port.source.variant import Variant

GIB = 2**30
CHIP_BYTES_PER_S = 820 * GIB
CORE_BYTES_PER_S = CHIP_BYTES_PER_S / 2  # assumed: the per-core share is not published
ALL_REDUCE_S = 20e-6  # assumed per all-reduce of one token's hidden state between the two cores


@dataclass(frozen=True)
class Roofline:
    variant: str
    tp: int
    keys: int  # the key bucket T the step attends over
    batch: int
    weight_bytes: int  # one core's weights, read once per step
    kv_bytes: int  # one core's KV in the leading T positions, read and written back
    tail_bytes: int  # and the rest of its buffers, copied onto the aliased outputs as the graph is written
    all_reduces: int  # per step, at tp > 1

    def step_s(self, tail: bool = True) -> float:
        moved = self.weight_bytes + self.kv_bytes + (self.tail_bytes if tail else 0)
        return moved / CORE_BYTES_PER_S + (self.all_reduces * ALL_REDUCE_S if self.tp > 1 else 0.0)

    def per_stream(self, tail: bool = True) -> float:
        return 1 / self.step_s(tail)

    def aggregate(self, tail: bool = True) -> float:
        return self.batch / self.step_s(tail)


def kv_step_bytes(sizes: ModelSizes, tp: int, rank: int, batch: int, v: Variant, keys: int) -> tuple[int, int]:
    """Bytes of one rank's KV that a decode step over `keys` keys moves, (leading, tail): the leading
    positions read and written back; the rest of each buffer read and written onto the aliased output."""
    lead = tail = 0
    for b, h, s, d in kv_shapes(sizes.shard(tp, rank), batch, v.kv_max, sizes.ring(v)):
        lead += 2 * b * h * d * min(keys, s)
        tail += 2 * b * h * d * (s - min(keys, s))
    itemsize = DTYPES[v.dtype].itemsize
    return itemsize * lead, itemsize * tail


def roofline(sizes: ModelSizes, v: Variant, keys: int, batch: int) -> Roofline:
    """The step of the slowest rank (ranks read their own HBM at once)."""
    itemsize = DTYPES[v.dtype].itemsize
    ranks = range(v.tp)
    weights = max(itemsize * sizes.weights(v.tp, r) for r in ranks)
    lead, tail = max(kv_step_bytes(sizes, v.tp, r, batch, v, keys) for r in ranks)
    return Roofline(v.name, v.tp, keys, batch, weights, lead, tail, 2 * sizes.shard(v.tp, 0).num_layers)


def rooflines(sizes: ModelSizes, v: Variant) -> list[Roofline]:
    """At the smallest and the largest key bucket, at batch 1 and at batch 4."""
    keys = sorted({v.key_buckets[0], v.key_buckets[-1]})
    return [roofline(sizes, v, t, b) for t in keys for b in (1, 4)]


def break_even_all_reduce_s(tp1: Roofline, tp2: Roofline) -> float:
    """The all-reduce time at which tp 2's step takes as long as tp 1's: above it, tp 1 is faster."""
    moved = (tp2.weight_bytes + tp2.kv_bytes + tp2.tail_bytes) / CORE_BYTES_PER_S
    return (tp1.step_s() - moved) / tp2.all_reduces


ASSUMPTIONS = (
    f"HBM {CHIP_BYTES_PER_S / GIB:.0f} GiB/s per chip (inferentia2.rst), assumed {CORE_BYTES_PER_S / GIB:.0f} "
    "GiB/s per core (one HBM stack each; not published); bytes per step = the core's weights once + its KV: "
    "the key bucket's leading positions read and written back, each buffer's tail copied onto the aliased output "
    "as the graph is written (the 'tail aliased' figures drop that copy); "
    f"tp 2: both cores at once, + {ALL_REDUCE_S * 1e6:.0f} us per all-reduce (assumed), "
    "two per layer; compute, host work between steps and the runtime's call overhead are not counted: "
    "a ceiling, not a forecast."
)

"""How far a variant can grow and what makes one fit a NeuronCore: the largest kv_max beside its
weights (and what bounds it), and the changes (dtype, tp, host prefill, kv_max) that fit, each with
its bytes per core. Pure, over ops/capacity.py's footprints."""

from __future__ import annotations

from gemma4_port.ops.capacity import Footprint, footprint, gib
from gemma4_port.ops.model_sizes import ModelSizes
from gemma4_port.port.sharding import ShardingError
from gemma4_port.source.variant import Variant


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

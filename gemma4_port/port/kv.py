"""The KV cache's layout and the writes on it: each buffer's shape and attention kind, the sliding
ring's size, the one-hot select a write is, the untouched tail a bucket hands back, and a fork's slot
copy (the copy graph).

Shapes: B batch slots, KVH this rank's KV heads, S a kind's cache positions (T the leading ones a key
bucket reads), D head_dim.
"""

from __future__ import annotations

import torch

from gemma4_port.port.sharding import ModelShard


def write_one_hot(buf: torch.Tensor, new: torch.Tensor, oh: torch.Tensor) -> torch.Tensor:
    """buf where the one-hot oh is 0, new where it is 1: a select, one read and one write of the buffer.
    (buf * (1 - oh) + new * oh is exact too, but passes three times over a cache that is cold by
    then: ~3% of a small-model decode step on the CPU.)"""
    return torch.where(oh > 0, new, buf)


def with_tail(read, kv) -> list[torch.Tensor]:
    """The untouched tail goes back as it came: the outputs are whole buffers (aliased on the device)."""
    return [
        r if r.shape[2] == t.shape[2] else torch.cat((r, t[:, :, r.shape[2] :]), dim=2)  # (B, KVH, S, D)
        for r, t in zip(read, kv)
    ]


def copy_slot(source, target, held, kv, kinds) -> list[torch.Tensor]:
    """Slot `target`'s KV := slot `source`'s, in the positions a fork keeps: a global cache's first T
    positions where `held` is 1 (the prompt; T the smallest key bucket holding it, so a short prompt's
    fork costs T keys, not kv_max), a sliding ring whole (it is small, and a ring that has wrapped
    holds the prompt's last window anywhere). The source rows are picked by a chain of selects, not a
    one-hot product: bit for bit, -0.0 and non-finite values included; every other slot is untouched.
    source, target (B,) one-hot; held (T,) 1 at each global position the fork keeps; kv and `kinds`
    (each tensor's attention kind) as in prefill. Returns the new KV tensors."""
    B, T = source.shape[0], held.shape[0]
    keep = held.view(1, 1, T, 1) * target.view(B, 1, 1, 1)  # (B, 1, T, 1): target's held positions
    whole = target.view(B, 1, 1, 1)  # (B, 1, 1, 1): target's every ring position
    out = []
    for t, kind in zip(kv, kinds):
        part = t if kind == "sliding" else t[:, :, :T]  # (B, KVH, S, D), S the ring or T
        row = part[0:1]  # (1, KVH, S, D)
        for b in range(1, B):
            row = torch.where(source[b] > 0, part[b : b + 1], row)  # (1, KVH, S, D)
        out.append(write_one_hot(part, row, whole if kind == "sliding" else keep))  # (B, KVH, S, D)
    return with_tail(out, kv)


def ring_size(window: int, kv_max: int, buckets) -> int:
    """Positions a sliding layer keeps: the window, plus a chunk whose keys land before its queries
    read (a chunk's last write must not overwrite a key its first token still sees), capped at kv_max."""
    return min(kv_max, window + max(buckets))


def kv_shapes(m: ModelShard, batch: int, kv_max: int, ring: int) -> list[tuple[int, int, int, int]]:
    """Shape of every KV tensor, K then V per cache-owning layer: (B, KVH, S, D), S = kv_max for a
    global layer, `ring` for a sliding one."""
    out = []
    for layer_index in m.cache_layers:
        s = m.layers[layer_index]
        out += [(batch, s.kv_heads, ring if s.kind == "sliding" else kv_max, s.head_dim)] * 2
    return out


def kv_kinds(m: ModelShard) -> tuple[str, ...]:
    """The attention kind of every KV tensor's owner, in kv_shapes order."""
    return tuple(m.layers[i].kind for i in m.cache_layers for _ in "kv")


def kinds_present(m: ModelShard) -> tuple[str, ...]:
    return tuple(sorted({s.kind for s in m.layers}))

"""Prefill and decode as two traceable modules with flat tensor signatures (what a tracer and a
neff take), sharing one `Gemma4Decoder`'s weights. Input names are recorded in artifact.json so
the host side builds exactly the tensors each graph was traced with."""

from __future__ import annotations

from torch import nn

from .model import Gemma4Decoder, kinds_present


def input_names(m, graph: str) -> list[str]:
    """Few inputs, packed on the host: each is one copy to the device and one small torch op here.
    rope (N, S, sum over kinds of 2D): cos then sin per kind; rows_<kind> (N, 2, T): per query
    (a prefill chunk's tokens, or decode's slots) its mask row over that kind's cache, then its
    one-hot write row (a global cache and a sliding ring differ in width, hence one input per kind)."""
    names = ["hidden"] + (["ple"] if m.ple_dim else []) + ["rope"]
    names += [f"rows_{kind}" for kind in kinds_present(m)]
    names += ["last", "slot"] if graph == "prefill" else []
    names += [f"kv{c}_{kv}" for c in range(len(m.cache_layers)) for kv in ("k", "v")]
    return names


def rope_widths(m) -> dict[str, int]:
    """Head dim per attention kind, in `kinds_present` order: the layout of the packed rope input."""
    dims = {s.kind: s.head_dim for s in m.layers}
    return {k: dims[k] for k in kinds_present(m)}


class _FlatGraph(nn.Module):
    graph = ""

    def __init__(self, decoder: Gemma4Decoder):
        super().__init__()
        self.decoder = decoder
        self.names = input_names(decoder.shard, self.graph)
        self.widths = rope_widths(decoder.shard)

    def _unpack(self, args):
        if len(args) != len(self.names):
            raise TypeError(f"{self.graph} takes {len(self.names)} inputs {self.names}, got {len(args)}")
        a = dict(zip(self.names, args))
        rope, start = {}, 0
        for kind, d in self.widths.items():
            rope[kind] = (a["rope"][..., start:start + d], a["rope"][..., start + d:start + 2 * d])  # (B, S, D) x 2
            start += 2 * d
        kv = [a[n] for n in self.names if n.startswith("kv")]
        rows = {kind: a[f"rows_{kind}"] for kind in self.widths}  # (N, 2, T)
        return a, rope, rows, kv


class PrefillGraph(_FlatGraph):
    graph = "prefill"

    def forward(self, *args):
        a, rope, rows, kv = self._unpack(args)
        logits, new_kv = self.decoder.prefill(a["hidden"], a.get("ple"), rope, rows, a["last"], a["slot"], kv)
        return (logits, *new_kv)


class DecodeGraph(_FlatGraph):
    graph = "decode"

    def forward(self, *args):
        a, rope, rows, kv = self._unpack(args)
        logits, new_kv = self.decoder.decode(a["hidden"], a.get("ple"), rope, rows, kv)
        return (logits, *new_kv)

"""Prefill and decode as two traceable modules with flat tensor signatures (what a tracer and a
neff take), sharing one `Gemma4Decoder`'s weights. Input names are recorded in artifact.json so
the host side builds exactly the tensors each graph was traced with."""

from __future__ import annotations

from torch import nn

from .model import Gemma4Decoder, kinds_present


def input_names(m, graph: str) -> list[str]:
    kinds = kinds_present(m)
    names = ["hidden"] + (["ple"] if m.ple_dim else [])
    names += [f"{part}_{k}" for k in kinds for part in ("cos", "sin")]
    names += [f"mask_{k}" for k in kinds]
    names += ["last", "slot"] if graph == "prefill" else ["write"]
    names += [f"kv{c}_{kv}" for c in range(len(m.cache_layers)) for kv in ("k", "v")]
    return names


class _FlatGraph(nn.Module):
    graph = ""

    def __init__(self, decoder: Gemma4Decoder):
        super().__init__()
        self.decoder = decoder
        self.names = input_names(decoder.m, self.graph)
        self.kinds = kinds_present(decoder.m)

    def _unpack(self, args):
        if len(args) != len(self.names):
            raise TypeError(f"{self.graph} takes {len(self.names)} inputs {self.names}, got {len(args)}")
        a = dict(zip(self.names, args))
        rope = {k: (a[f"cos_{k}"], a[f"sin_{k}"]) for k in self.kinds}
        masks = {k: a[f"mask_{k}"] for k in self.kinds}
        kv = [a[n] for n in self.names if n.startswith("kv")]
        return a, rope, masks, kv


class PrefillGraph(_FlatGraph):
    graph = "prefill"

    def forward(self, *args):
        a, rope, masks, kv = self._unpack(args)
        logits, new_kv = self.decoder.prefill(a["hidden"], a.get("ple"), rope, masks, a["last"], a["slot"], kv)
        return (logits, *new_kv)


class DecodeGraph(_FlatGraph):
    graph = "decode"

    def forward(self, *args):
        a, rope, masks, kv = self._unpack(args)
        logits, new_kv = self.decoder.decode(a["hidden"], a.get("ple"), rope, masks, a["write"], kv)
        return (logits, *new_kv)

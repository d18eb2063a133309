"""Prefill, decode and a speculative verify as traceable modules with flat tensor signatures (what a
tracer and a neff take), sharing one `Gemma4Decoder`'s weights; a drafter step over the same KV
(`Gemma4Drafter`); and a fork's slot copy, which has no weights. Input names are recorded in
artifact.json so the host side builds exactly the tensors each graph was traced with. Every graph's
first output is one tensor of rows (logits, then the hidden state), the KV tensors after it."""

from __future__ import annotations

import torch
from torch import nn

from gemma4_port.port.decoder import Gemma4Decoder
from gemma4_port.port.drafter import Gemma4Drafter
from gemma4_port.port.kv import copy_slot, kinds_present, kv_kinds


def input_names(m, graph: str) -> list[str]:
    """Few inputs, packed on the host: each is one copy to the device and one small torch op here.
    rope (N, S, sum over kinds of 2D): cos then sin per kind; rows_<kind> (N, 2, T): per query
    (a prefill chunk's tokens, or decode's slots) its mask row over that kind's cache, then its
    one-hot write row (a global cache and a sliding ring differ in width, hence one input per kind).
    copy: source and target slot one-hots (B,), and held (T,), the global positions a fork keeps.
    verify: as decode, N tokens per slot (rows_<kind> (B*N, 2, T)). draft: hidden (B, 1, 2H) is the
    drafter's input, cat(word embedding, hidden state); no PLE; rows_<kind> (B, 2, T): a mask row,
    then one more key it sees (contract.hostside.HostInputs.draft)."""
    kv = [f"kv{c}_{kv}" for c in range(len(m.cache_layers)) for kv in ("k", "v")]
    if graph == "copy":
        return ["source", "target", "held", *kv]
    names = ["hidden"] + (["ple"] if m.ple_dim and graph != "draft" else []) + ["rope"]
    names += [f"rows_{kind}" for kind in kinds_present(m)]
    names += ["last", "slot"] if graph == "prefill" else []
    return names + kv


def rope_widths(m) -> dict[str, int]:
    """Head dim per attention kind, in `kinds_present` order: the layout of the packed rope input."""
    dims = {s.kind: s.head_dim for s in m.layers}
    return {k: dims[k] for k in kinds_present(m)}


def bind(names: list[str], graph: str, args) -> dict:
    if len(args) != len(names):
        raise TypeError(f"{graph} takes {len(names)} inputs {names}, got {len(args)}")
    return dict(zip(names, args))


class _FlatGraph(nn.Module):
    graph = ""

    def __init__(self, decoder: Gemma4Decoder):
        super().__init__()
        self.decoder = decoder
        self.names = input_names(decoder.shard, self.graph)
        self.widths = rope_widths(decoder.shard)

    def _unpack(self, args):
        a = bind(self.names, self.graph, args)
        rope, start = {}, 0
        for kind, d in self.widths.items():
            rope[kind] = (a["rope"][..., start : start + d], a["rope"][..., start + d : start + 2 * d])  # (B, S, D) x 2
            start += 2 * d
        kv = [a[n] for n in self.names if n.startswith("kv")]
        rows = {kind: a[f"rows_{kind}"] for kind in self.widths}  # (N, 2, T)
        return a, rope, rows, kv


class PrefillGraph(_FlatGraph):
    graph = "prefill"

    def forward(self, *args):
        a, rope, rows, kv = self._unpack(args)
        out, new_kv = self.decoder.prefill_chunk(a["hidden"], a.get("ple"), rope, rows, a["last"], a["slot"], kv)
        return (out, *new_kv)


class DecodeGraph(_FlatGraph):
    graph = "decode"

    def forward(self, *args):
        a, rope, rows, kv = self._unpack(args)
        out, new_kv = self.decoder.decode(a["hidden"], a.get("ple"), rope, rows, kv)
        return (out, *new_kv)


class VerifyGraph(_FlatGraph):
    graph = "verify"

    def forward(self, *args):
        a, rope, rows, kv = self._unpack(args)
        out, new_kv = self.decoder.verify(a["hidden"], a.get("ple"), rope, rows, kv)
        return (out, *new_kv)


class DraftGraph(_FlatGraph):
    """A drafter step: the decoder's shard only names the inputs and the KV the drafter reads. Its KV
    outputs are its KV inputs, unchanged: on the device every graph of the model aliases the same
    state (a graph that returned none would not share it)."""

    graph = "draft"

    def __init__(self, decoder: Gemma4Decoder, drafter: Gemma4Drafter):
        super().__init__(decoder)
        self.drafter = drafter

    def forward(self, *args):
        a, rope, rows, kv = self._unpack(args)
        B = a["hidden"].shape[0]
        zero = torch.zeros((), dtype=a["hidden"].dtype)
        masks = {k: torch.where(r[:, 1] > 0, zero, r[:, 0]).view(B, 1, 1, -1) for k, r in rows.items()}  # (B, 1, 1, T)
        logits, hidden = self.drafter.step(a["hidden"], rope, masks, self.decoder.leading(kv, rows))
        return (torch.cat((logits, hidden), dim=-1), *kv)  # (B, V + E)


class CopyGraph(nn.Module):
    """A fork's KV copy (kv.copy_slot). No weights: it holds only the KV tensors' kinds. NxD builds one
    output packer for every key of a model from the first key's outputs besides the aliased state
    (neuronx-distributed v2.28.0 trace/model_builder.py:1019-1036, build_packer), one tensor here, so
    the copy has one output of its own too: per slot, how many global positions it wrote (the target's
    count of held positions, 0 elsewhere). It is computed on the device, as every NxD Inference graph's
    first output is (NxD Inference at its SDK 2.28 release, models/model_base.py:1056-1064: the logits
    or tokens, then the KV), rather than an input handed back: whether neuronx-cc keeps a parameter
    as a graph output is nowhere in the public sources, and the lowering prunes what no output
    computes from (model_base.py:1048-1054 keeps inputs alive with `res + active_block_table[0] * 0`)."""

    graph = "copy"

    def __init__(self, decoder: Gemma4Decoder):
        super().__init__()
        self.names = input_names(decoder.shard, self.graph)
        self.kinds = kv_kinds(decoder.shard)

    def forward(self, *args):
        a = bind(self.names, self.graph, args)
        kv = [a[n] for n in self.names if n.startswith("kv")]
        B, T = a["target"].shape[0], a["held"].shape[0]
        written = (a["target"].view(B, 1) * a["held"].view(1, T)).sum(dim=1)  # (B,)
        return (written, *copy_slot(a["source"], a["target"], a["held"], kv, self.kinds))

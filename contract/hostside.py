"""Everything the host computes for a graph call: embedding and PLE lookups, rotary tables, masks,
and the one-hot selectors. Kept off the device on purpose: a vocab-sized table or a data-dependent
index in the graph breaks the Neuron compiler."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .artifact import HOST_TABLES, Geometry
from .dtypes import BITS, DTYPES


class HostTables:
    """Word and PLE embedding tables at the artifact dtype, already multiplied by their scales at
    compile time (the same products, in the same dtype, as transformers' lookups make)."""

    def __init__(self, folder: Path, geo: Geometry):
        from safetensors import safe_open

        with safe_open(str(Path(folder) / HOST_TABLES), framework="pt") as f:
            self.embed = f.get_tensor("embed_tokens_scaled")  # (V, H)
            self.ple = f.get_tensor("embed_tokens_per_layer_scaled") if geo.ple_dim else None  # (V, L*P)


def scaled_tables(embed: torch.Tensor, ple: torch.Tensor | None, geo: Geometry) -> dict[str, torch.Tensor]:
    """The host tables as compile writes them. Each scale is cast to the table dtype first, as
    transformers does (sqrt(1536) is 39.25 in bf16), so a row times its scale is bit for bit the lookup's."""
    dtype = DTYPES[geo.dtype]
    out = {"embed_tokens_scaled": embed.to(dtype) * torch.tensor(geo.embed_scale).to(dtype)}
    if ple is not None:
        out["embed_tokens_per_layer_scaled"] = ple.to(dtype) * torch.tensor(geo.ple_scale).to(dtype)
    return out


class HostInputs:
    """Builds each graph's inputs from tables made once: a decode step is four row gathers. At the
    real vocabulary the host has ~200 us per step; a gather costs ~1-2 us in numpy and ~5-15 us as
    a torch op, so the gathers run in numpy on each table's bit patterns (any float dtype moves as
    same-width integers) and torch only wraps the result."""

    def __init__(self, geo: Geometry, tables: HostTables):
        self.geo = geo
        self.tables = tables
        self.dtype = DTYPES[geo.dtype]
        self.embed_bits = self._bits(tables.embed)  # (V, H)
        self.ple_bits = self._bits(tables.ple) if geo.ple_dim else None  # (V, L*P)
        K = geo.kv_max
        # Row p: every rotary input of position p, as the graphs' packed `rope` input takes it.
        rope = [part for kind in geo.kinds for part in self._rope(torch.arange(K), kind)]
        self.rope_rows = torch.cat(rope, dim=1)  # (K, sum over kinds of 2D)
        # Row p of a causal (or windowed) mask over T keys, and of the one-hot write at p, is the T-wide
        # slice at offset K-1-p of a 2K strip; `unfold` views all those slices without copying, one
        # view per decode bucket T. Offset K (p = -1) is an idle slot's: it sees no key, writes nothing.
        distance = (K - 1) - torch.arange(2 * K)  # strip index -> query position minus key position
        strips = [self._additive(self._visible(distance, kind)) for kind in geo.kinds]
        strips.append((distance == 0).to(self.dtype))
        strips = torch.stack(strips)  # (kinds + 1, 2K): each slice's T values adjacent, so a gather is contiguous
        self.row_bits = {t: self._bits(strips.unfold(1, t, 1).permute(1, 0, 2))  # (2K-T+1, kinds + 1, T)
                         for t in geo.decode_buckets}
        self.rope_bits = self._bits(self.rope_rows)
        self.prefill_masks = {b: torch.stack([
            self._additive(self._visible(torch.arange(b)[:, None] - torch.arange(b), kind)) for kind in geo.kinds
        ])[None] for b in geo.buckets}  # (1, kinds, S, S)
        self.order = {g: [n for n in geo.inputs[g] if not n.startswith("kv")] for g in ("prefill", "decode")}

    def _rope(self, positions: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (N,) -> cos, sin (N, D) at the graph dtype."""
        inv_freq = torch.tensor(self.geo.rope[kind].inv_freq, dtype=torch.float32)
        freqs = positions[:, None].float() * inv_freq  # (N, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (N, D)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def _visible(self, distance: torch.Tensor, kind: str) -> torch.Tensor:
        """Query position minus key position -> may the query see the key (causal, windowed if sliding)."""
        ok = distance >= 0
        if kind == "sliding":
            ok &= distance < self.geo.sliding_window
        return ok

    def _additive(self, visible: torch.Tensor) -> torch.Tensor:
        # finite, not -inf: one-hot arithmetic must never meet inf * 0
        neg = torch.tensor(torch.finfo(self.dtype).min, dtype=self.dtype)
        return torch.where(visible, torch.zeros((), dtype=self.dtype), neg)

    def _bits(self, table: torch.Tensor) -> np.ndarray:
        return table.view(BITS[self.dtype]).numpy()

    def _gather(self, bits: np.ndarray, index) -> torch.Tensor:
        """Rows `index` of a table's bit view -> a fresh tensor at the graph dtype."""
        return torch.from_numpy(bits[index]).view(self.dtype)

    def embed(self, ids: list[list[int]]):
        """ids (B, S) -> hidden (B, S, H) and per-layer inputs (B, S, L, P) or None: pre-scaled rows."""
        ids = np.asarray(ids)  # (B, S)
        h = self._gather(self.embed_bits, ids)  # (B, S, H)
        if not self.geo.ple_dim:
            return h, None
        ple = self._gather(self.ple_bits, ids)  # (B, S, L*P)
        return h, ple.view(*ids.shape, self.geo.num_layers, self.geo.ple_dim)  # (B, S, L, P)

    def _assemble(self, graph: str, values: dict[str, torch.Tensor], kv=()) -> tuple[torch.Tensor, ...]:
        """The graph's inputs in its traced order (each is contiguous: fresh gathers or leading rows)."""
        return tuple(values[n] for n in self.order[graph]) + tuple(kv)

    def prefill(self, ids: list[int], bucket: int, slot: int, kv=()) -> tuple[torch.Tensor, ...]:
        """A prompt right-padded to `bucket`, written into `slot` from position 0."""
        n = len(ids)
        if not 0 < n <= bucket:
            raise ValueError(f"prompt of {n} tokens does not fit bucket {bucket}")
        if bucket not in self.geo.buckets:
            raise ValueError(f"{bucket} is not one of the prefill buckets {self.geo.buckets}")
        h, ple = self.embed([list(ids) + [0] * (bucket - n)])  # ids (1, S)
        values = {"hidden": h, "ple": ple, "rope": self.rope_rows[None, :bucket], "masks": self.prefill_masks[bucket]}
        values["last"] = torch.nn.functional.one_hot(torch.tensor([n - 1]), bucket).to(self.dtype)  # (1, S)
        values["slot"] = torch.nn.functional.one_hot(torch.tensor(slot), self.geo.batch).to(self.dtype)  # (B,)
        return self._assemble("prefill", values, kv)

    def decode(self, tokens: list[int | None], positions: list[int], kv=(), keys: int | None = None
               ) -> tuple[torch.Tensor, ...]:
        """One token per slot, for the decode graph over the first `keys` cache positions (default:
        all); `None` marks an idle slot (it sees no key and writes nothing; its output is never
        read). Four gathers in all: words, PLE, rope rows, mask-and-write rows; nothing else."""
        K, T = self.geo.kv_max, keys or self.geo.kv_max
        if T not in self.row_bits:
            raise ValueError(f"{T} is not one of the decode buckets {self.geo.decode_buckets}")
        h, ple = self.embed([[t or 0] for t in tokens])  # ids (B, 1)
        pos = [[p if t is not None else 0] for t, p in zip(tokens, positions)]  # (B, 1)
        offset = [K - 1 - p if t is not None else K for t, p in zip(tokens, positions)]  # (B,)
        values = {"hidden": h, "ple": ple, "rope": self._gather(self.rope_bits, pos),  # rope (B, 1, 2D per kind)
                  "rows": self._gather(self.row_bits[T], offset)}  # (B, kinds + 1, T)
        return self._assemble("decode", values, kv)

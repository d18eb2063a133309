"""Everything the host computes for a graph call: embedding and PLE lookups, rotary tables, masks,
and the one-hot selectors. Kept off the device on purpose: a vocab-sized table or a data-dependent
index in the graph breaks the Neuron compiler (see the seed report)."""

from __future__ import annotations

from pathlib import Path

import torch

from .artifact import HOST_TABLES, Geometry

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class HostTables:
    """Word and PLE embedding tables, memory-mapped from safetensors at the artifact dtype."""

    def __init__(self, folder: Path, geo: Geometry):
        from safetensors import safe_open

        with safe_open(str(Path(folder) / HOST_TABLES), framework="pt") as f:
            self.embed = f.get_tensor("embed_tokens")  # (V, H)
            self.ple = f.get_tensor("embed_tokens_per_layer") if geo.ple_dim else None  # (V, L*P)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.embed, self.ple) if t is not None)


class HostInputs:
    def __init__(self, geo: Geometry, tables: HostTables):
        self.geo = geo
        self.tables = tables
        self.dtype = DTYPES[geo.dtype]
        self.neg = torch.finfo(self.dtype).min  # finite: one-hot arithmetic must never meet inf * 0
        # Scales are cast to the table dtype first, as transformers does (sqrt(1536) is 39.25 in bf16).
        self.embed_scale = torch.tensor(geo.embed_scale).to(self.dtype)
        self.ple_scale = torch.tensor(geo.ple_scale).to(self.dtype)
        self.inv_freq = {k: torch.tensor(r.inv_freq, dtype=torch.float32) for k, r in geo.rope.items()}

    def embed(self, ids: torch.Tensor):
        """ids (B, S) -> hidden (B, S, H) and raw per-layer inputs (B, S, L, P) or None."""
        h = self.tables.embed[ids] * self.embed_scale
        if not self.geo.ple_dim:
            return h, None
        ple = self.tables.ple[ids] * self.ple_scale
        return h, ple.view(*ids.shape, self.geo.num_layers, self.geo.ple_dim)  # (B, S, L, P)

    def rope(self, positions: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """positions (B, S) -> {kind: (cos, sin) (B, S, D)}."""
        out = {}
        for kind in self.geo.kinds:
            freqs = positions[..., None].float() * self.inv_freq[kind]  # (B, S, D/2)
            emb = torch.cat((freqs, freqs), dim=-1)  # (B, S, D)
            out[kind] = (emb.cos().to(self.dtype), emb.sin().to(self.dtype))
        return out

    def _mask(self, q_pos: torch.Tensor, k_pos: torch.Tensor, kind: str) -> torch.Tensor:
        """q_pos (B, S), k_pos (T,) -> additive mask (B, 1, S, T): causal, and windowed if sliding."""
        dist = q_pos[:, :, None] - k_pos[None, None, :]  # (B, S, T)
        ok = dist >= 0
        if kind == "sliding":
            ok &= dist < self.geo.sliding_window
        zero = torch.zeros((), dtype=self.dtype)
        return torch.where(ok, zero, torch.tensor(self.neg, dtype=self.dtype)).unsqueeze(1)

    def _assemble(self, graph: str, values: dict[str, torch.Tensor], kv=()) -> tuple[torch.Tensor, ...]:
        names = self.geo.inputs[graph]
        return tuple(values[n] for n in names if not n.startswith("kv")) + tuple(kv)

    def prefill(self, ids: list[int], bucket: int, slot: int, kv=()) -> tuple[torch.Tensor, ...]:
        """A prompt right-padded to `bucket`, written into `slot` from position 0."""
        n = len(ids)
        if not 0 < n <= bucket:
            raise ValueError(f"prompt of {n} tokens does not fit bucket {bucket}")
        padded = torch.tensor([list(ids) + [0] * (bucket - n)])  # (1, S)
        h, ple = self.embed(padded)
        positions = torch.arange(bucket)[None]  # (1, S)
        values = {"hidden": h, "ple": ple}
        for kind, (cos, sin) in self.rope(positions).items():
            values[f"cos_{kind}"], values[f"sin_{kind}"] = cos, sin
            values[f"mask_{kind}"] = self._mask(positions, torch.arange(bucket), kind)
        values["last"] = torch.nn.functional.one_hot(torch.tensor([n - 1]), bucket).to(self.dtype)  # (1, S)
        values["slot"] = torch.nn.functional.one_hot(torch.tensor(slot), self.geo.batch).to(self.dtype)  # (B,)
        return self._assemble("prefill", values, kv)

    def decode(self, tokens: list[int | None], positions: list[int], kv=()) -> tuple[torch.Tensor, ...]:
        """One token per slot; `None` marks an idle slot (no cache write, a harmless mask)."""
        active = torch.tensor([t is not None for t in tokens])
        ids = torch.tensor([[t if t is not None else 0] for t in tokens])  # (B, 1)
        pos = torch.tensor([[p if t is not None else 0] for t, p in zip(tokens, positions)])  # (B, 1)
        h, ple = self.embed(ids)
        values = {"hidden": h, "ple": ple}
        keys = torch.arange(self.geo.kv_max)
        for kind, (cos, sin) in self.rope(pos).items():
            values[f"cos_{kind}"], values[f"sin_{kind}"] = cos, sin
            values[f"mask_{kind}"] = self._mask(pos, keys, kind)
        write = torch.nn.functional.one_hot(pos[:, 0], self.geo.kv_max) * active[:, None]  # (B, K)
        values["write"] = write.to(self.dtype)
        return self._assemble("decode", values, kv)

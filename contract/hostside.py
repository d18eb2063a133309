"""Everything the host computes for a graph call: embedding and PLE lookups, rotary tables, masks,
and the one-hot selectors. Kept off the device on purpose: a vocab-sized table or a data-dependent
index in the graph breaks the Neuron compiler."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from contract.artifact import HOST_TABLES, Geometry
from contract.dtypes import BITS, DTYPES

VISION_POSITIONS = "vision_position_table"  # the vision tower's 2-D position table (2, E, W), at the graph dtype
DRAFT_ORDERING = "drafter_token_ordering"  # host table: the centroid head's vocabulary order (V,)


class HostTables:
    """Word and PLE embedding tables at the artifact dtype, already multiplied by their scales at
    compile time (the same products, in the same dtype, as transformers' lookups make)."""

    def __init__(self, folder: Path, geo: Geometry):
        from safetensors import safe_open

        with safe_open(str(Path(folder) / HOST_TABLES), framework="pt") as f:
            self.embed = f.get_tensor("embed_tokens_scaled")  # (V, H)
            self.ple = f.get_tensor("embed_tokens_per_layer_scaled") if geo.ple_dim else None  # (V, L*P)
            self.vision_positions = f.get_tensor(VISION_POSITIONS) if geo.vision else None  # (2, E, W)
            ordered = geo.drafter is not None and geo.drafter.ordered
            # The drafter's centroid head computes its logits in its own vocabulary order: entry j is
            # token ordering[j], so logits[..., draft_order] is in token order.
            self.draft_order = torch.argsort(f.get_tensor(DRAFT_ORDERING)) if ordered else None  # (V,)


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
        self.ple_bits = self._bits(tables.ple) if geo.ple_dim and tables.ple is not None else None  # (V, L*P)
        K = geo.kv_max
        # Row p: every rotary input of position p, as the graphs' packed `rope` input takes it.
        rope = [part for kind in geo.kinds for part in self._rope(torch.arange(K), kind)]
        self.rope_rows = torch.cat(rope, dim=1)  # (K, sum over kinds of 2D)
        self.rope_bits = self._bits(self.rope_rows)
        # Per kind, the mask row and one-hot write row of a query at position q over that kind's cache
        # of S positions (kv_max, or the sliding ring), as a T-wide slice of one 4S strip: a sliding-window
        # view gives every slice without copying, one view per width a graph reads.
        self.spans = {kind: geo.span(kind) for kind in geo.kinds}
        self.row_bits = {}
        for kind, S in self.spans.items():
            strip = self._bits(self._strip(kind, S))  # (2, 4S)
            widths = {min(t, S) for t in geo.key_buckets} | {S}
            self.row_bits[kind] = {
                w: np.lib.stride_tricks.sliding_window_view(strip, w, axis=1).transpose(1, 0, 2) for w in widths
            }  # (4S-w+1, 2, w)
        self.order = {g: [n for n in names if not n.startswith("kv")] for g, names in geo.inputs.items()}
        # Every id as the tables look it up: a media placeholder (a soft token's stand-in, no text)
        # looks up the pad token's rows, as transformers' Gemma4Model does for words and PLE alike.
        self.lookup = np.arange(geo.vocab)
        self.lookup[list(geo.placeholders.values())] = geo.pad_id

    def _strip(self, kind: str, S: int) -> torch.Tensor:
        """(2, 4S): additive mask, then one-hot write. Slice S-1-q (q < S) is the row of position q
        while the cache is filling: key j holds position j. Slice 3S-1-(q mod S) (q >= S) is the row
        of a ring that has wrapped: key j holds the latest position congruent to j, q - ((q - j) mod S).
        Slice S sees no key and writes nothing: an idle slot or a chunk's padding."""
        i = torch.arange(4 * S)
        linear = (S - 1) - i  # query position minus the position key j holds, for i < 2S
        wrapped = (3 * S - 1 - i) % S  # the same once every key holds a position (i >= 2S)
        distance = torch.where(i < 2 * S, linear, wrapped)
        return torch.stack([self._additive(self._visible(distance, kind)), (distance == 0).to(self.dtype)])

    def _offset(self, kind: str, position: int | None) -> int:
        S = self.spans[kind]
        if position is None:
            return S
        return S - 1 - position if position < S else 3 * S - 1 - position % S

    def _rows(self, positions: list[int | None], keys: int) -> dict[str, torch.Tensor]:
        """rows_<kind> (N, 2, T) for queries at `positions` over the first `keys` cache positions."""
        out = {}
        for kind, S in self.spans.items():
            index = [self._offset(kind, p) for p in positions]
            out[f"rows_{kind}"] = self._gather(self.row_bits[kind][min(keys, S)], index)  # (N, 2, T)
        return out

    def _both_ways(self, rows: torch.Tensor, start: int, n: int, blocks: Sequence[tuple[int, int]]) -> torch.Tensor:
        """Sliding mask rows of a chunk's tokens at start .. start+n-1 where a query inside a block
        [a, b) also sees the block's later keys (within the window its earlier ones, as any key):
        AND(window, OR(causal, same block)), as transformers' create_masks_for_vision_model. The
        chunk's writes are in by then, so ring key j holds the latest position up to the chunk's end
        congruent to j."""
        S, T = self.spans["sliding"], rows.shape[-1]
        end = start + n - 1
        j = torch.arange(T)
        held = j + S * torch.div(end - j, S, rounding_mode="floor")  # (T,): the position key j holds, < 0 if none
        rows = rows.clone()
        for a, b in blocks:
            if not (start <= a and b <= start + n):
                raise ValueError(
                    f"a bidirectional block at positions {a} .. {b - 1} is not inside chunk {start} .. {end}"
                )
            for q in range(a, b):
                seen = (held >= 0) & (q - held < self.geo.sliding_window) & ((held <= q) | ((held >= a) & (held < b)))
                rows[q - start, 0] = self._additive(seen)
        return rows

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
        index = self.lookup[np.asarray(ids)]  # (B, S)
        h = self._gather(self.embed_bits, index)  # (B, S, H)
        if self.ple_bits is None:
            return h, None
        ple = self._gather(self.ple_bits, index)  # (B, S, L*P)
        return h, ple.view(*index.shape, self.geo.num_layers, self.geo.ple_dim)  # (B, S, L, P)

    def _assemble(self, graph: str, values: dict[str, torch.Tensor], kv=()) -> tuple[torch.Tensor, ...]:
        """The graph's inputs in its traced order (each is contiguous: fresh gathers or leading rows)."""
        return tuple(values[n] for n in self.order[graph]) + tuple(kv)

    def prefill_inputs(
        self,
        ids: list[int],
        bucket: int,
        slot: int,
        kv=(),
        start: int = 0,
        keys: int | None = None,
        soft: Sequence[tuple[int, torch.Tensor]] = (),
        blocks: Sequence[tuple[int, int]] = (),
    ) -> tuple[torch.Tensor, ...]:
        """A chunk of prompt tokens right-padded to `bucket`, at positions start .. start+n-1 of `slot`
        (whose earlier positions already hold this request's KV), for the prefill graph over the first
        `keys` cache positions (default: the smallest key bucket that holds the chunk); its last
        token's logits come back.

        soft: (index in the chunk, rows (m, H)) of an image's soft tokens: the rows replace the words of
        their placeholders (whose PLE rows are the pad token's, as `embed` looks every placeholder up).
        blocks: positions [a, b) of the soft tokens that see each other both ways on sliding layers
        (each ends inside this chunk: the chunk holds all of its keys)."""
        n = len(ids)
        if not 0 < n <= bucket:
            raise ValueError(f"a chunk of {n} tokens does not fit bucket {bucket}")
        if bucket not in self.geo.buckets:
            raise ValueError(f"{bucket} is not one of the prefill buckets {self.geo.buckets}")
        if not 0 <= start <= self.geo.kv_max - n:
            raise ValueError(f"a chunk of {n} tokens at position {start} does not fit kv_max={self.geo.kv_max}")
        T = keys or self.geo.keys_for_chunk(bucket, start + n)
        if T not in self.geo.prefill_keys(bucket) or start + n > T:
            raise ValueError(
                f"a chunk of {n} tokens in bucket {bucket} at position {start} has no prefill graph "
                f"over {T} keys; it runs over one of {self.geo.prefill_keys(bucket)} holding "
                f"position {start + n - 1}"
            )
        positions = [start + i for i in range(n)] + [None] * (bucket - n)
        h, ple = self.embed([list(ids) + [0] * (bucket - n)])  # ids (1, C)
        for i, rows in soft:
            h[0, i : i + len(rows)] = rows.to(self.dtype)  # (m, H): the encoder's soft tokens
        rope = self._gather(self.rope_bits, [[p or 0 for p in positions]])  # (1, C, 2D per kind)
        values = {"hidden": h, "ple": ple, "rope": rope, **self._rows(positions, T)}  # rows_<kind> (C, 2, T)
        if blocks and "sliding" in self.spans:
            values["rows_sliding"] = self._both_ways(values["rows_sliding"], start, n, blocks)
        values["last"] = torch.nn.functional.one_hot(torch.tensor([n - 1]), bucket).to(self.dtype)  # (1, C)
        values["slot"] = torch.nn.functional.one_hot(torch.tensor(slot), self.geo.batch).to(self.dtype)  # (B,)
        return self._assemble("prefill", values, kv)

    def decode_inputs(
        self, tokens: list[int | None], positions: list[int], kv=(), keys: int | None = None
    ) -> tuple[torch.Tensor, ...]:
        """One token per slot, for the decode graph over the first `keys` cache positions (default:
        all); `None` marks an idle slot (it sees no key and writes nothing; its output is never
        read). Four gathers in all: words, PLE, rope rows, mask-and-write rows; nothing else."""
        T = keys or self.geo.kv_max
        if T not in self.geo.key_buckets:
            raise ValueError(f"{T} is not one of the key buckets {self.geo.key_buckets}")
        h, ple = self.embed([[t or 0] for t in tokens])  # ids (B, 1)
        at = [p if t is not None else None for t, p in zip(tokens, positions)]
        pos = [[p or 0] for p in at]  # (B, 1)
        values = {
            "hidden": h,
            "ple": ple,
            "rope": self._gather(self.rope_bits, pos),  # rope (B, 1, 2D per kind)
            **self._rows(at, T),
        }  # rows_<kind> (B, 2, T)
        return self._assemble("decode", values, kv)

    def verify_inputs(
        self, tokens: list[list[int] | None], positions: list[int], kv=(), keys: int | None = None
    ) -> tuple[torch.Tensor, ...]:
        """Up to N = geometry.verify tokens per slot, slot b's at positions[b], positions[b] + 1, ...,
        for the verify graph over the first `keys` cache positions (default: all). A slot's list is
        right-padded to N (padding rows see no key and write nothing); `None` marks an idle slot.
        The same gathers as a decode step, for B x N queries: rows_<kind> (B*N, 2, T), slot-major."""
        N, T = self.geo.verify, keys or self.geo.kv_max
        if not N:
            raise ValueError("this artifact has no verify graphs (its manifest has no `speculative`)")
        if T not in self.geo.key_buckets:
            raise ValueError(f"{T} is not one of the key buckets {self.geo.key_buckets}")
        ids, at = [], []
        for run, p in zip(tokens, positions):
            run = run or []
            if len(run) > N or (run and p + len(run) > T):
                raise ValueError(f"{len(run)} tokens at position {p} do not fit a verify of {N} over {T} keys")
            ids.append(list(run) + [0] * (N - len(run)))
            at += [p + i for i in range(len(run))] + [None] * (N - len(run))
        h, ple = self.embed(ids)  # ids (B, N)
        values = {
            "hidden": h,
            "ple": ple,
            "rope": self._gather(self.rope_bits, [[p or 0 for p in at[b * N : (b + 1) * N]] for b in range(len(ids))]),
            **self._rows(at, T),
        }  # rope (B, N, 2D per kind); rows_<kind> (B*N, 2, T)
        return self._assemble("verify", values, kv)

    def draft_inputs(
        self,
        tokens: list[int | None],
        hidden: torch.Tensor,
        positions: Sequence[int | None],
        kv=(),
        keys: int | None = None,
        at: dict[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """One drafter step per slot: slot b's input is cat(word embedding of tokens[b], hidden[b])
        (B, 1, 2H), at rotary position positions[b] (the position of the token, not yet in the cache),
        attending to the target's cache before it (draft_positions; `at`: its result, which every step
        of a round shares, as they all sit at one position). `None` marks an idle slot."""
        h, _ = self.embed([[t or 0] for t in tokens])  # (B, 1, H)
        if at is None:
            at = self.draft_positions([p if t is not None else None for t, p in zip(tokens, positions)], keys)
        values = {"hidden": torch.cat((h, hidden.to(self.dtype).view(h.shape)), dim=-1), **at}  # (B, 1, 2H)
        return self._assemble("draft", values, kv)

    def draft_positions(self, positions: list[int | None], keys: int | None = None) -> dict[str, torch.Tensor]:
        """A drafter step's rotary rows and masks for slots at `positions` (None: idle): rope (B, 1, 2D per
        kind); rows_<kind> (B, 2, T), the mask row of position p - 1, then the one-hot of one key more
        that the assistant sees: its sliding window is inclusive (transformers' bidirectional overlay,
        distance <= window), so it reaches one position further back than the target's (a global row
        has none)."""
        T = keys or self.geo.kv_max
        if self.geo.drafter is None:
            raise ValueError("this artifact has no drafter (its manifest's `speculative` names none)")
        if T not in self.geo.key_buckets:
            raise ValueError(f"{T} is not one of the key buckets {self.geo.key_buckets}")
        seen = [p - 1 if p is not None else None for p in positions]
        W = self.geo.sliding_window
        rows, further = self._rows(seen, T), self._rows([q - W if q is not None and q >= W else None for q in seen], T)
        for kind in self.spans:
            rows[f"rows_{kind}"][:, 1] = further[f"rows_{kind}"][:, 1] if kind == "sliding" else 0
        return {"rope": self._gather(self.rope_bits, [[p or 0] for p in positions]), **rows}

    def copy_inputs(self, source: int, target: int, keep: int, keys: int, kv=()) -> tuple[torch.Tensor, ...]:
        """A fork: slot `target` takes slot `source`'s KV of positions 0 .. keep-1, for the copy graph
        over the first `keys` positions of a global cache (keep <= keys; sliding rings go whole)."""
        B = self.geo.batch
        if not (0 <= source < B and 0 <= target < B and source != target):
            raise ValueError(f"a copy goes from one slot to another of 0 .. {B - 1}, not {source} -> {target}")
        if keys not in self.geo.key_buckets or not 0 < keep <= keys:
            raise ValueError(
                f"a copy of {keep} positions has no graph over {keys} keys; it runs over the "
                f"smallest of {self.geo.key_buckets} holding them"
            )
        one_hot = torch.nn.functional.one_hot
        values = {
            "source": one_hot(torch.tensor(source), B).to(self.dtype),  # (B,)
            "target": one_hot(torch.tensor(target), B).to(self.dtype),  # (B,)
            "held": (torch.arange(keys) < keep).to(self.dtype),
        }  # (T,)
        return self._assemble("copy", values, kv)

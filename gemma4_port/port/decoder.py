"""The Gemma-4 text decoder as a device graph: weight map and loading, the layer loop, prefill and decode.

Static shapes; KV buffers `(B, KVH, S, D)` only for layers that own a cache (kv-shared layers read
their owner's): S = kv_max for global layers, a ring of `ring` positions for sliding ones (the
window plus a chunk: older keys are never attended). Cache writes select by a one-hot mask (never an
index); rotary tables, masks and the one-hot write rows come from the host; word and per-layer
embeddings are looked up on the host; explicit tanh-GELU and matmul attention over key blocks (an
online softmax: `attention`); raw logits out (the softcap is monotonic, so argmax is unchanged; the
host applies it to sample).

Shapes: B batch slots, C prompt chunk bucket, S a kind's cache positions (T: the leading ones a
key bucket reads, in prefill and decode), H hidden, L layers, P PLE width, V vocab, Hq/KVH this
rank's query/KV heads, D head_dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from contract.errors import Gemma4Error
from gemma4_port.port.kv import kv_kinds, with_tail, write_one_hot
from gemma4_port.port.layers import Layer, RMSNorm, gelu_tanh, linear
from gemma4_port.port.sharding import ModelShard


class WeightError(Gemma4Error, RuntimeError):
    pass


@dataclass(frozen=True)
class WeightEntry:
    """A module tensor, the checkpoint key it comes from, and the slice this rank keeps."""

    name: str
    key: str
    dim: int | None = None
    start: int = 0
    stop: int = 0


@torch.no_grad()
def load_mapped(module: nn.Module, reader, what: str) -> None:
    """Copy each tensor of `module.weight_map()` in (this rank's slice where an entry names one):
    strict, every parameter and persistent buffer mapped; a missing key or shape fails by name."""
    tensors = module.state_dict(keep_vars=True)
    wanted = module.weight_map()
    unmapped = set(tensors) - {e.name for e in wanted}
    if unmapped:
        raise WeightError(f"{what} tensors with no checkpoint key: {sorted(unmapped)}")
    for e in wanted:
        src = reader.get(e.key) if e.dim is None else reader.get_slice(e.key, e.dim, e.start, e.stop)
        dst = tensors[e.name]
        if tuple(src.shape) != tuple(dst.shape):
            raise WeightError(
                f"checkpoint tensor {e.key!r} has shape {tuple(src.shape)}, {e.name} needs {tuple(dst.shape)}"
            )
        dst.copy_(src.to(dst.dtype))


class Gemma4Decoder(nn.Module):
    def __init__(self, m: ModelShard, dtype: torch.dtype = torch.float32, reduce=None):
        super().__init__()
        self.shard = m
        self.layers = nn.ModuleList(Layer(s, m) for s in m.layers)
        self.norm = RMSNorm(m.hidden, m.eps)
        self.lm_head = linear(m.hidden, m.vocab)
        if m.ple_dim:
            self.per_layer_model_projection = linear(m.hidden, m.num_layers * m.ple_dim)
            self.per_layer_projection_norm = RMSNorm(m.ple_dim, m.eps)
        # All-reduce after row-parallel projections; identity on one rank.
        self.reduce = reduce or (lambda x: x)
        self.to(dtype)

    # -- weights ---------------------------------------------------------------------------------

    def weight_map(self) -> list[WeightEntry]:
        """Every tensor the module needs and its checkpoint key: strict, buffers included."""
        m, out = self.shard, []
        out.append(WeightEntry("norm.weight", "norm.weight"))
        out.append(WeightEntry("lm_head.weight", "embed_tokens.weight" if m.tied else "lm_head.weight"))
        if m.ple_dim:
            out += [
                WeightEntry(f"{n}.weight", f"{n}.weight")
                for n in ("per_layer_model_projection", "per_layer_projection_norm")
            ]
        for s in m.layers:
            p = f"layers.{s.index}."
            D = s.head_dim
            q_rows = (0, s.q_start * D, (s.q_start + s.q_heads) * D)
            kv_rows = (0, s.kv_start * D, (s.kv_start + s.kv_heads) * D)
            mlp_rows = (0, s.intermediate_start, s.intermediate_start + s.intermediate)
            mlp_cols = (1, *mlp_rows[1:])
            out.append(WeightEntry(p + "self_attn.q_proj.weight", p + "self_attn.q_proj.weight", *q_rows))
            out.append(WeightEntry(p + "self_attn.o_proj.weight", p + "self_attn.o_proj.weight", 1, *q_rows[1:]))
            out.append(WeightEntry(p + "self_attn.q_norm.weight", p + "self_attn.q_norm.weight"))
            if s.owns_cache:
                out.append(WeightEntry(p + "self_attn.k_proj.weight", p + "self_attn.k_proj.weight", *kv_rows))
                out.append(WeightEntry(p + "self_attn.k_norm.weight", p + "self_attn.k_norm.weight"))
                if not s.k_eq_v:
                    out.append(WeightEntry(p + "self_attn.v_proj.weight", p + "self_attn.v_proj.weight", *kv_rows))
            out.append(WeightEntry(p + "mlp.gate_proj.weight", p + "mlp.gate_proj.weight", *mlp_rows))
            out.append(WeightEntry(p + "mlp.up_proj.weight", p + "mlp.up_proj.weight", *mlp_rows))
            out.append(WeightEntry(p + "mlp.down_proj.weight", p + "mlp.down_proj.weight", *mlp_cols))
            for n in (
                "input_layernorm",
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
            ):
                out.append(WeightEntry(p + n + ".weight", p + n + ".weight"))
            out.append(WeightEntry(p + "layer_scalar", p + "layer_scalar"))
            if m.ple_dim:
                out += [
                    WeightEntry(p + f"{n}.weight", p + f"{n}.weight")
                    for n in ("per_layer_input_gate", "per_layer_projection", "post_per_layer_input_norm")
                ]
        return out

    def load_weights(self, reader) -> None:
        load_mapped(self, reader, "decoder")

    # -- graph pieces ----------------------------------------------------------------------------

    def project_ple(self, h: torch.Tensor, ple: torch.Tensor) -> torch.Tensor:
        """h (B, S, H), ple (B, S, L, P) raw host lookup -> mixed per-layer inputs (B, S, L, P)."""
        B, S, _ = h.shape
        proj = self.per_layer_model_projection(h) * (self.shard.hidden**-0.5)  # (B, S, L*P)
        proj = self.per_layer_projection_norm(
            proj.view(B, S, self.shard.num_layers, self.shard.ple_dim)
        )  # (B, S, L, P)
        return (proj + ple) * (2.0**-0.5)

    def layer_tail(self, layer: Layer, h, attn_out, ple_i):
        """Everything in a decoder layer after attention: norms, MLP, PLE, layer_scalar."""
        h = h + layer.post_attention_layernorm(self.reduce(attn_out))
        x = layer.pre_feedforward_layernorm(h)
        h = h + layer.post_feedforward_layernorm(self.reduce(layer.mlp(x)))
        if self.shard.ple_dim:
            g = gelu_tanh(layer.per_layer_input_gate(h)) * ple_i  # (B, S, P)
            h = h + layer.post_per_layer_input_norm(layer.per_layer_projection(g))
        return h * layer.layer_scalar

    def rows(self, h: torch.Tensor) -> torch.Tensor:
        """h (N, H), the last layer's output -> rows (N, V + H): raw logits (no softcap on the device),
        then the final-norm hidden state they come from (what a drafter step starts from)."""
        normed = self.norm(h)
        return torch.cat((self.lm_head(normed), normed), dim=-1)

    def forward(self, h, ple, rope, masks, caches, write, last=None):
        """The layer loop both graphs run (as gpt-fast's one forward serves prefill and decode).
        h (N, S, H) for N queries of S tokens; ple (N, S, L, P) raw, or None; rope {kind: (cos, sin)
        (N, S, D)}; masks {kind: (N, 1, S, T)} additive; caches: the KV tensors the layers read
        (N, KVH, T, D), K then V per cache; write(kind, cache, new) puts a layer's new K or V
        (N, KVH, S, D) into its cache; last (N, S) one-hot of the token whose logits are wanted, or
        None for every token's. Returns the last layer's output (N, S, H), or (N, 1, H) with `last`,
        and the caches with this step's K/V in."""
        if self.shard.ple_dim:
            ple = self.project_ple(h, ple)
        caches = list(caches)
        for layer in self.layers:
            s = layer.shard
            if last is not None and s.index == self.shard.first_shared:
                # kv-shared layers write no cache: only the last position feeds the logits.
                h, ple, rope, masks = self.keep_last(last, h, ple, rope, masks)
            cos, sin = rope[s.kind]
            x = layer.input_layernorm(h)
            q = layer.self_attn.query(x, cos, sin)
            if s.owns_cache:
                for i, new in zip((2 * s.cache, 2 * s.cache + 1), layer.self_attn.key_value(x, cos, sin)):
                    caches[i] = write(s.kind, caches[i], new)
            a = layer.self_attn.attend(q, caches[2 * s.cache], caches[2 * s.cache + 1], masks[s.kind])
            h = self.layer_tail(layer, h, a, ple[:, :, s.index] if self.shard.ple_dim else None)
        if last is not None and self.shard.first_shared == self.shard.num_layers:
            h = torch.matmul(last.unsqueeze(1), h)  # (N, 1, H)
        return h, caches

    def keep_last(self, last, h, ple, rope, masks):
        """Every per-token input narrowed to the token `last` picks, by a one-hot product."""
        pick = last.unsqueeze(1)  # (N, 1, S)
        h = torch.matmul(pick, h)  # (N, 1, H)
        if self.shard.ple_dim:
            ple = torch.einsum("bs,bsld->bld", last, ple).unsqueeze(1)  # (N, 1, L, P)
        rope = {k: (torch.matmul(pick, c), torch.matmul(pick, n)) for k, (c, n) in rope.items()}  # (N, 1, D)
        masks = {k: torch.matmul(pick.unsqueeze(1), v) for k, v in masks.items()}  # (N, 1, 1, T)
        return h, ple, rope, masks

    def prefill_chunk(self, h, ple, rope, rows, last, slot, kv):
        """A chunk of C prompt tokens at positions p .. p+C-1 of one slot whose positions before p
        already hold this request's KV (an earlier chunk, or a reused prefix). A prefill graph of T
        keys (T >= C, and every real token's position below T): a global cache is read and rewritten
        only in its first T positions, a sliding ring in its first min(T, ring), as in decode, so a
        short prompt's chunk costs T keys.

        The chunk's K/V go into the slot's cache first, each token at the position its one-hot write
        row names (padding rows write nothing), then every token attends to the cache through its mask
        row: causal within the chunk, the slot's earlier keys (sliding: the last `window`), and never a
        position past its own, so whatever an earlier request left there is never read.
        h (1, C, H); ple (1, C, L, P) or None; rope {kind: (cos, sin) (1, C, D)};
        rows {kind: (C, 2, T_kind)}: per token an additive mask row, then its one-hot write row;
        last (1, C) one-hot of the token whose logits are returned; slot (B,) one-hot;
        kv: 2 tensors per cache (B, KVH, S, D). Returns the last token's rows (1, V + H) and the new
        KV tensors.
        """
        B = slot.shape[0]
        masks = {k: r[:, 0].unsqueeze(0).unsqueeze(0) for k, r in rows.items()}  # (1, 1, C, T)
        puts = {k: r[:, 1].transpose(0, 1) for k, r in rows.items()}  # (T, C): position <- chunk token
        hits = {k: r[:, 1].sum(0).view(1, 1, -1, 1) > 0 for k, r in rows.items()}  # (1, 1, T, 1)
        pick_slot = slot.view(1, B).to(kv[0].dtype)  # (1, B)
        read = self.leading(kv, rows)  # (B, KVH, T, D)
        # The slot's own buffers, selected by a one-hot product (exact: one 1.0 term, the rest 0.0).
        mine = [torch.matmul(pick_slot, t.reshape(B, -1)).view(1, *t.shape[1:]) for t in read]  # (1, KVH, T, D)

        def write(kind, cache, new):
            placed = torch.matmul(puts[kind], new)  # (1, KVH, T, D): each chunk token at its position
            return torch.where(hits[kind], placed, cache)

        h, mine = self.forward(h, ple, rope, masks, mine, write, last)
        sel = slot.view(B, 1, 1, 1) > 0  # (B, 1, 1, 1)
        new_kv = [write_one_hot(old, new, sel) for old, new in zip(read, mine)]  # (B, KVH, T, D)
        return self.rows(h[:, 0]), with_tail(new_kv, kv)

    def decode(self, h, ple, rope, rows, kv):
        """One token for every slot. A decode bucket of T keys: every busy slot's position is below T,
        so a global cache is read and rewritten only in its first T positions, a sliding ring in its
        first min(T, ring); the rest goes back untouched.

        h (B, 1, H); ple (B, 1, L, P) or None; rope {kind: (cos, sin) (B, 1, D)};
        rows {kind: (B, 2, T_kind)}: per slot an additive mask row, then the one-hot write of its
        position (all zero for an idle slot); kv as in prefill. Returns rows (B, V + H) and the new KV.
        """
        B = h.shape[0]
        masks = {k: r[:, 0].view(B, 1, 1, -1) for k, r in rows.items()}  # (B, 1, 1, T)
        writes = {k: r[:, 1].view(B, 1, -1, 1) for k, r in rows.items()}  # (B, 1, T, 1)

        def write(kind, cache, new):
            return write_one_hot(cache, new, writes[kind])  # new (B, KVH, 1, D) at each slot's position

        h, read = self.forward(h, ple, rope, masks, self.leading(kv, rows), write)
        return self.rows(h[:, 0]), with_tail(read, kv)

    def verify(self, h, ple, rope, rows, kv):
        """N tokens for every slot, slot b's at its own positions p_b .. p_b+N-1 (a speculative
        verify: the slot's next token and the drafted ones), written into its cache as a prefill
        chunk's are (a one-hot product per slot; padding rows write nothing), each attending through
        its own mask row. Over T keys as in decode, every real position below T.
        h (B, N, H); ple (B, N, L, P) or None; rope {kind: (cos, sin) (B, N, D)};
        rows {kind: (B*N, 2, T_kind)}, slot-major; kv as in prefill.
        Returns rows (B*N, V + H), every token's, and the new KV tensors.
        """
        B, N = h.shape[:2]
        per_slot = {k: r.view(B, N, 2, -1) for k, r in rows.items()}  # (B, N, 2, T)
        masks = {k: r[:, :, 0].unsqueeze(1) for k, r in per_slot.items()}  # (B, 1, N, T)
        puts = {k: r[:, :, 1].transpose(1, 2).unsqueeze(1) for k, r in per_slot.items()}  # (B, 1, T, N)
        hits = {k: p.sum(-1, keepdim=True) > 0 for k, p in puts.items()}  # (B, 1, T, 1)

        def write(kind, cache, new):
            return torch.where(hits[kind], torch.matmul(puts[kind], new), cache)  # new (B, KVH, N, D)

        h, read = self.forward(h, ple, rope, masks, self.leading(kv, rows), write)
        return self.rows(h.reshape(B * N, -1)), with_tail(read, kv)  # h (B, N, H) -> (B*N, H)

    def leading(self, kv, rows) -> list[torch.Tensor]:
        """The first T_kind positions of every KV tensor, T_kind the width of its kind's rows."""
        return [t[:, :, : rows[kind].shape[-1]] for kind, t in zip(kv_kinds(self.shard), kv)]  # (B, KVH, T, D)

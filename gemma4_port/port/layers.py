"""The pieces of a Gemma-4 decoder layer: RMSNorm, rotary, attention (projections and the blocked
online-softmax `attention`), the tanh-GELU MLP, and the layer that holds them. `decoder.py` runs the
layer loop over them.

Shapes: B batch slots, S query tokens, T keys read, H hidden, Hq/KVH this rank's query/KV heads
(KVu the KV heads it uses, G query groups per KV head), D head_dim.
"""

from __future__ import annotations

import torch
from torch import nn

from gemma4_port.port.sharding import LayerShard, ModelShard


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


class RMSNorm(nn.Module):
    """Computed in float32 and multiplied by `weight` (not 1 + weight), as Gemma-4 does."""

    def __init__(self, dim: int, eps: float, with_scale: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if with_scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.pow(y.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if self.weight is not None:
            y = y * self.weight.float()
        return y.type_as(x)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, S, h, D); cos/sin (B, S, D) from the host."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # (B, S, h, D)
    return x * cos.unsqueeze(2) + rotated * sin.unsqueeze(2)


def linear(n_in: int, n_out: int) -> nn.Linear:
    return nn.Linear(n_in, n_out, bias=False)


class Attention(nn.Module):
    def __init__(self, s: LayerShard, hidden: int, eps: float):
        super().__init__()
        self.shard = s
        self.q_proj = linear(hidden, s.q_heads * s.head_dim)
        self.q_norm = RMSNorm(s.head_dim, eps)
        if s.owns_cache:
            self.k_proj = linear(hidden, s.kv_heads * s.head_dim)
            self.v_proj = None if s.k_eq_v else linear(hidden, s.kv_heads * s.head_dim)
            self.k_norm = RMSNorm(s.head_dim, eps)
            self.v_norm = RMSNorm(s.head_dim, eps, with_scale=False)
        self.o_proj = linear(s.q_heads * s.head_dim, hidden)

    def query(self, x, cos, sin):
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, self.shard.q_heads, self.shard.head_dim)  # (B, S, Hq, D)
        return rotate(self.q_norm(q), cos, sin).transpose(1, 2)  # (B, Hq, S, D)

    def key_value(self, x, cos, sin):
        B, S, _ = x.shape
        k = self.k_proj(x).view(B, S, self.shard.kv_heads, self.shard.head_dim)  # (B, S, KVH, D)
        # attention_k_eq_v: V is the raw k_proj output, taken before k_norm and RoPE.
        v = k if self.v_proj is None else self.v_proj(x).view(B, S, self.shard.kv_heads, self.shard.head_dim)
        k = rotate(self.k_norm(k), cos, sin).transpose(1, 2)  # (B, KVH, S, D)
        v = self.v_norm(v).transpose(1, 2)  # (B, KVH, S, D)
        return k, v

    def attend(self, q, k, v, mask):
        """q (B, Hq, S, D); k, v (B, KVH, T, D); mask (B, 1, S, T) additive. Scaling is 1.0."""
        B, _, S, D = q.shape
        s = self.shard
        k = k[:, s.kv_use_start : s.kv_use_start + s.kv_use]  # (B, KVu, T, D)
        v = v[:, s.kv_use_start : s.kv_use_start + s.kv_use]  # (B, KVu, T, D)
        # Query groups folded into the query length: one matmul per KV head, K/V never expanded or copied.
        q = q.reshape(B, s.kv_use, s.groups * S, D)  # (B, KVu, G*S, D)
        out = attention(q, k, v, mask, s.groups)  # (B, KVu, G*S, D)
        out = out.reshape(B, s.q_heads, S, D).transpose(1, 2).reshape(B, S, s.q_heads * D)  # (B, S, Hq*D)
        return self.o_proj(out)  # (B, S, H), a partial sum when tp > 1


# Keys per attention block. One block's float32 scores for a query row are 2 KiB: a PSUM bank holds
# 512 float32 per partition, the most one TensorE matmul writes (aws-neuron-sdk v2.28.0
# nki/guides/architecture/trainium_inferentia2_arch.rst:169-170).
KEY_BLOCK = 512


def attention(q, k, v, mask, groups: int, block: int = KEY_BLOCK) -> torch.Tensor:
    """softmax(q k^T + mask) v over key blocks, in plain ops: a flash-style online softmax keeps each
    query row's running max and sum in float32 and rescales the accumulated output when a later block
    raises the max, so no op ever spans more than `block` keys (NxD Inference switches to a flash
    kernel from 4,096 keys for the same reason: attention_base.py:1377-1379 at its SDK 2.28 release).
    A row of at most one block is one plain softmax. The mask is finite (contract/hostside.py), so a
    fully masked block gives finite scores whose weight a later real key's max rescales to zero.
    q (B, KVu, G*S, D); k, v (B, KVu, T, D); mask (B, 1, S, T). Returns (B, KVu, G*S, D) in q's dtype."""
    B, KVu, GS, D = q.shape
    S, T = GS // groups, k.shape[2]
    if T <= block:
        scores = torch.matmul(q, k.transpose(-1, -2)).view(B, KVu, groups, S, T) + mask.unsqueeze(1)
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype).view(B, KVu, GS, T)  # (B, KVu, G*S, T)
        return torch.matmul(probs, v)
    top = total = acc = None
    for start in range(0, T, block):
        stop = min(start + block, T)
        kb, vb = k[:, :, start:stop], v[:, :, start:stop]  # (B, KVu, Tb, D)
        scores = torch.matmul(q, kb.transpose(-1, -2)).view(B, KVu, groups, S, stop - start)  # (B, KVu, G, S, Tb)
        scores = (scores + mask[..., start:stop].unsqueeze(1)).float()
        block_top = scores.amax(-1, keepdim=True)  # (B, KVu, G, S, 1)
        new_top = block_top if top is None else torch.maximum(top, block_top)
        p = torch.exp(scores - new_top)  # (B, KVu, G, S, Tb), each <= 1
        part = torch.matmul(p.to(q.dtype).view(B, KVu, GS, stop - start), vb).float().view(B, KVu, groups, S, D)
        if top is None:
            total, acc = p.sum(-1, keepdim=True), part
        else:
            rescale = torch.exp(top - new_top)  # (B, KVu, G, S, 1)
            total = total * rescale + p.sum(-1, keepdim=True)
            acc = acc * rescale + part
        top = new_top
    return (acc / total).to(q.dtype).view(B, KVu, GS, D)


class MLP(nn.Module):
    def __init__(self, hidden: int, width: int):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = (
            linear(hidden, width),
            linear(hidden, width),
            linear(width, hidden),
        )

    def forward(self, x):
        return self.down_proj(gelu_tanh(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, s: LayerShard, m: ModelShard):
        super().__init__()
        self.shard = s
        self.self_attn = Attention(s, m.hidden, m.eps)
        self.mlp = MLP(m.hidden, s.intermediate)
        for name in (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ):
            setattr(self, name, RMSNorm(m.hidden, m.eps))
        self.register_buffer("layer_scalar", torch.full((1,), float("nan")))  # must come from the checkpoint
        if m.ple_dim:
            self.per_layer_input_gate = linear(m.hidden, m.ple_dim)
            self.per_layer_projection = linear(m.ple_dim, m.hidden)
            self.post_per_layer_input_norm = RMSNorm(m.hidden, m.eps)

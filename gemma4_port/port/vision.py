"""Gemma-4's vision tower and its embedder as one device graph per patch bucket: patches in, soft
tokens at the text width out (what transformers' Gemma4VisionModel and Gemma4MultimodalEmbedder
compute for one image).

As for the decoder, the host owns every lookup and data-dependent choice: the 2-D position
embeddings (a table lookup by patch coordinates), the axial rotary tables, the additive key mask
of the padding patches and the pooling matrix (each patch's weight 1/k^2 in the soft token its
k x k cell pools into, 0 for padding) come in as inputs (contract/media_inputs.py). Attention runs
over key blocks (layers.attention), so a 10,080-patch image never makes a patches-wide row.

Shapes: P patches of the bucket, N = P / k^2 soft tokens, W vision width, Hv/D its heads and head
dim, H the text width.
"""

from __future__ import annotations

import torch
from torch import nn

from gemma4_port.port.decoder import WeightEntry, load_mapped
from gemma4_port.port.layers import RMSNorm, attention, gelu_tanh

TOWER = "vision_tower."
EMBEDDER = "embed_vision."
CLIP_BUFFERS = ("input_min", "input_max", "output_min", "output_max")


class ClippedLinear(nn.Module):
    """A bias-free linear whose input and output are clamped to bounds the checkpoint carries
    (use_clipped_linears), or a plain one."""

    def __init__(self, n_in: int, n_out: int, clipped: bool):
        super().__init__()
        self.linear = nn.Linear(n_in, n_out, bias=False)
        self.clipped = clipped
        if clipped:
            for name in CLIP_BUFFERS:
                self.register_buffer(name, torch.full((), float("nan")))  # must come from the checkpoint

    def forward(self, x):
        if not self.clipped:
            return self.linear(x)
        x = torch.clamp(x, self.input_min, self.input_max)
        return torch.clamp(self.linear(x), self.output_min, self.output_max)


def rotate_2d(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Axial RoPE: the head dim in two halves (x, then y coordinate), each rotated by its own half
    of cos/sin. x (1, P, Hv, D); cos/sin (1, P, D)."""
    half = x.shape[-1] // 2
    out = []
    for part, c, s in (
        (x[..., :half], cos[..., :half], sin[..., :half]),
        (x[..., half:], cos[..., half:], sin[..., half:]),
    ):
        q = part.shape[-1] // 2
        rotated = torch.cat((-part[..., q:], part[..., :q]), dim=-1)  # (1, P, Hv, D/2)
        out.append(part * c.unsqueeze(2) + rotated * s.unsqueeze(2))
    return torch.cat(out, dim=-1)  # (1, P, Hv, D)


class VisionLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        W, D, clip = config.hidden_size, config.head_dim, config.use_clipped_linears
        self.heads, self.head_dim = config.num_attention_heads, D
        self.q_proj = ClippedLinear(W, self.heads * D, clip)
        self.k_proj = ClippedLinear(W, config.num_key_value_heads * D, clip)
        self.v_proj = ClippedLinear(W, config.num_key_value_heads * D, clip)
        self.o_proj = ClippedLinear(self.heads * D, W, clip)
        self.kv_heads = config.num_key_value_heads
        eps = config.rms_norm_eps
        self.q_norm, self.k_norm, self.v_norm = RMSNorm(D, eps), RMSNorm(D, eps), RMSNorm(D, eps, with_scale=False)
        self.gate_proj = ClippedLinear(W, config.intermediate_size, clip)
        self.up_proj = ClippedLinear(W, config.intermediate_size, clip)
        self.down_proj = ClippedLinear(config.intermediate_size, W, clip)
        for name in (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ):
            setattr(self, name, RMSNorm(W, eps))

    def forward(self, h, cos, sin, mask):
        B, P, _ = h.shape
        x = self.input_layernorm(h)
        q = rotate_2d(self.q_norm(self.q_proj(x).view(B, P, self.heads, self.head_dim)), cos, sin)  # (1, P, Hv, D)
        k = rotate_2d(self.k_norm(self.k_proj(x).view(B, P, self.kv_heads, self.head_dim)), cos, sin)
        v = self.v_norm(self.v_proj(x).view(B, P, self.kv_heads, self.head_dim))  # (1, P, KVv, D)
        groups = self.heads // self.kv_heads
        q = q.transpose(1, 2).reshape(B, self.kv_heads, groups * P, self.head_dim)  # (1, KVv, G*P, D)
        a = attention(q, k.transpose(1, 2), v.transpose(1, 2), mask, groups)  # (1, KVv, G*P, D)
        a = a.reshape(B, self.heads, P, self.head_dim).transpose(1, 2).reshape(B, P, -1)  # (1, P, Hv*D)
        h = h + self.post_attention_layernorm(self.o_proj(a))
        x = self.pre_feedforward_layernorm(h)
        return h + self.post_feedforward_layernorm(self.down_proj(gelu_tanh(self.gate_proj(x)) * self.up_proj(x)))


class VisionEncoder(nn.Module):
    """Patches -> soft tokens at the text width, for one image padded to a patch bucket."""

    def __init__(self, config, text_hidden: int, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.config = config
        W = config.hidden_size
        self.input_proj = nn.Linear(3 * config.patch_size**2, W, bias=False)
        self.layers = nn.ModuleList(VisionLayer(config) for _ in range(config.num_hidden_layers))
        self.standardize = bool(config.standardize)
        if self.standardize:
            self.register_buffer("std_bias", torch.full((W,), float("nan")))
            self.register_buffer("std_scale", torch.full((W,), float("nan")))
        self.embed_norm = RMSNorm(W, config.rms_norm_eps, with_scale=False)
        self.embedding_projection = nn.Linear(W, text_hidden, bias=False)
        self.to(dtype)

    def weight_map(self) -> list[WeightEntry]:
        """Every tensor and its key in the hub's Gemma4ForConditionalGeneration layout (under model.)."""
        out = [
            WeightEntry("input_proj.weight", TOWER + "patch_embedder.input_proj.weight"),
            WeightEntry("embedding_projection.weight", EMBEDDER + "embedding_projection.weight"),
        ]
        if self.standardize:
            out += [WeightEntry(n, TOWER + n) for n in ("std_bias", "std_scale")]
        for i, layer in enumerate(self.layers):
            p = f"{TOWER}encoder.layers.{i}."
            for name, module in layer.named_children():
                if isinstance(module, ClippedLinear):
                    group = "self_attn" if name.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
                    out.append(WeightEntry(f"layers.{i}.{name}.linear.weight", f"{p}{group}.{name}.linear.weight"))
                    if module.clipped:
                        out += [WeightEntry(f"layers.{i}.{name}.{b}", f"{p}{group}.{name}.{b}") for b in CLIP_BUFFERS]
                elif name in ("q_norm", "k_norm"):
                    out.append(WeightEntry(f"layers.{i}.{name}.weight", f"{p}self_attn.{name}.weight"))
                elif module.weight is not None:
                    out.append(WeightEntry(f"layers.{i}.{name}.weight", f"{p}{name}.weight"))
        return out

    def load_weights(self, reader) -> None:
        load_mapped(self, reader, "vision")

    def forward(self, patches, positions, rope, mask, pool):
        """patches (1, P, 3p^2) in [0, 1]; positions (1, P, W) the 2-D position embeddings (0 for
        padding); rope (1, P, 2D) cos then sin; mask (1, 1, 1, P) additive over the keys (padding
        masked); pool (1, N, P) float32. Returns soft tokens (1, N, H); rows past the image's own
        soft tokens (pooled from nothing) are the host's to drop."""
        D = rope.shape[-1] // 2
        cos, sin = rope[..., :D], rope[..., D:]  # (1, P, D) each
        h = self.input_proj((2 * (patches - 0.5)).to(self.input_proj.weight.dtype)) + positions  # (1, P, W)
        for layer in self.layers:
            h = layer(h, cos, sin, mask)
        # Pooled in float32 and rounded to the graph dtype, then scaled by sqrt(W) in float32 (the
        # magnitude may pass float16's range) and standardized there, as transformers' pooler does.
        pooled = torch.matmul(pool, h.float()).to(h.dtype).float() * (self.config.hidden_size**0.5)  # (1, N, W)
        if self.standardize:
            pooled = (pooled - self.std_bias.float()) * self.std_scale.float()
        return self.embedding_projection(self.embed_norm(pooled.to(h.dtype)))  # (1, N, H)

"""Gemma-4's audio tower (E2B / E4B) and its embedder as one device graph per frame bucket: mel frames
in, soft tokens at the text width out (what transformers' Gemma4AudioModel and Gemma4MultimodalEmbedder
compute for one clip): two stride-2 convolutions, then conformer layers (feed-forward halves, chunked
local attention with a relative position bias, a causal depthwise convolution).

The host gives the frame mask and the attention's blocked mask (contract/media_inputs.py); the
relative position table is a constant of the config. Shapes: F frames of the bucket (mel width M),
T = F / 4 soft tokens after the two convolutions, A the tower's width, nb = T / chunk blocks, ctx the
context a block's queries see (chunk + left - 1 + right).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from gemma4_port.port.decoder import WeightEntry, load_mapped
from gemma4_port.port.layers import RMSNorm
from gemma4_port.port.vision import CLIP_BUFFERS, ClippedLinear

TOWER = "audio_tower."
EMBEDDER = "embed_audio."


def _clip(x: torch.Tensor, bound: float) -> torch.Tensor:
    bound = min(bound, torch.finfo(x.dtype).max)  # as transformers: no overflow where the bound is huge
    return torch.clamp(x, -bound, bound)


class Subsample(nn.Module):
    """Two 3x3 stride-2 convolutions over (frames, mel), each masked, layer-normed over channels, ReLU."""

    def __init__(self, config):
        super().__init__()
        c0, c1 = config.subsampling_conv_channels
        self.conv0 = nn.Conv2d(1, c0, 3, stride=2, padding=1, bias=False)
        self.norm0 = nn.LayerNorm(c0, eps=config.rms_norm_eps, bias=False)
        self.conv1 = nn.Conv2d(c0, c1, 3, stride=2, padding=1, bias=False)
        self.norm1 = nn.LayerNorm(c1, eps=config.rms_norm_eps, bias=False)
        self.input_proj_linear = nn.Linear((c0 // 4) * c1, config.hidden_size, bias=False)

    def forward(self, frames, valid0, valid1):
        """frames (1, F, M); valid0 (1, F), valid1 (1, F/2): 1 on real frames."""
        h = frames.unsqueeze(1) * valid0[:, None, :, None]  # (1, 1, F, M)
        h = self.conv0(h.to(self.conv0.weight.dtype))  # (1, c0, F/2, M/2)
        h = torch.relu(self.norm0(h.permute(0, 2, 3, 1))).permute(0, 3, 1, 2) * valid1[:, None, :, None]
        h = self.conv1(h)  # (1, c1, F/4, M/4)
        h = torch.relu(self.norm1(h.permute(0, 2, 3, 1)))  # (1, F/4, M/4, c1)
        return self.input_proj_linear(h.reshape(h.shape[0], h.shape[1], -1))  # (1, T, A)


class FeedForward(nn.Module):
    def __init__(self, config):
        super().__init__()
        A, clip = config.hidden_size, config.use_clipped_linears
        self.ffw_layer_1 = ClippedLinear(A, 4 * A, clip)
        self.ffw_layer_2 = ClippedLinear(4 * A, A, clip)
        self.pre_layer_norm, self.post_layer_norm = RMSNorm(A, 1e-6), RMSNorm(A, 1e-6)
        self.bound, self.scale = config.gradient_clipping, config.residual_weight

    def forward(self, h):
        x = self.pre_layer_norm(_clip(h, self.bound))
        x = self.ffw_layer_2(torch.nn.functional.silu(self.ffw_layer_1(x)))
        return h + self.post_layer_norm(_clip(x, self.bound)) * self.scale


class ChunkedAttention(nn.Module):
    """Each block of `chunk` frames attends to itself and the `left - 1` frames before it (and `right`
    after), with a Transformer-XL relative position term, logits softcapped."""

    def __init__(self, config):
        super().__init__()
        A, clip = config.hidden_size, config.use_clipped_linears
        self.heads = config.num_attention_heads
        self.head_dim = A // self.heads
        self.chunk = config.attention_chunk_size
        self.past, self.future = config.attention_context_left - 1, config.attention_context_right
        self.context = self.chunk + self.past + self.future
        self.cap, self.invalid = config.attention_logit_cap, config.attention_invalid_logits_value
        self.q_scale = (self.head_dim**-0.5) / math.log(2)
        self.k_scale = math.log(1 + math.e) / math.log(2)
        self.q_proj, self.k_proj, self.v_proj = (ClippedLinear(A, A, clip) for _ in range(3))
        self.post = ClippedLinear(A, A, clip)
        self.relative_k_proj = nn.Linear(A, A, bias=False)
        self.per_dim_scale = nn.Parameter(torch.zeros(self.head_dim))

    def _context(self, x):
        """(1, T, h, D) -> each block's context (1, nb, ctx, h, D)."""
        x = torch.nn.functional.pad(x, (0, 0, 0, 0, self.past, self.future + self.chunk - 1))
        return torch.movedim(x.unfold(1, self.context, self.chunk), -1, 2)  # (1, nb, ctx, h, D)

    def _rel_shift(self, x):
        """(1, h, nb, chunk, P) -> (1, h, nb, chunk, ctx): each query's position term by its distance."""
        B, h, nb, c, P = x.shape
        x = torch.nn.functional.pad(x, (0, self.context + 1 - P)).view(B, h, nb, c * (self.context + 1))
        return x[..., : c * self.context].view(B, h, nb, c, self.context)

    def forward(self, x, positions, blocked):
        """x (1, T, A); positions (P, A) the sinusoid table; blocked (1, 1, nb, chunk, ctx) True where masked."""
        B, T, _ = x.shape
        nb = T // self.chunk
        shape = (B, T, self.heads, self.head_dim)
        q = self.q_proj(x).float().view(shape) * self.q_scale * torch.nn.functional.softplus(self.per_dim_scale)
        k = self._context(self.k_proj(x).float().view(shape) * self.k_scale)  # (1, nb, ctx, h, D)
        v = self._context(self.v_proj(x).float().view(shape))
        q = q.view(B, nb, self.chunk, self.heads, self.head_dim).permute(0, 3, 1, 2, 4)  # (1, h, nb, chunk, D)
        rel = self.relative_k_proj(positions).view(-1, self.heads, self.head_dim).float()  # (P, h, D)
        ac = q @ k.permute(0, 3, 1, 4, 2)  # (1, h, nb, chunk, ctx)
        bd = (q.reshape(B, self.heads, -1, self.head_dim) @ rel.permute(1, 2, 0)).view(
            B, self.heads, nb, self.chunk, -1
        )
        logits = torch.tanh((ac + self._rel_shift(bd)) / self.cap) * self.cap
        logits = torch.where(blocked, torch.full((), self.invalid), logits)
        probs = torch.softmax(logits, dim=-1)  # (1, h, nb, chunk, ctx), float32
        out = (probs @ v.permute(0, 3, 1, 2, 4)).permute(0, 2, 3, 1, 4).reshape(B, T, -1)  # (1, T, A)
        return self.post(out.to(x.dtype))


class LightConv(nn.Module):
    def __init__(self, config):
        super().__init__()
        A, clip = config.hidden_size, config.use_clipped_linears
        self.linear_start, self.linear_end = ClippedLinear(A, 2 * A, clip), ClippedLinear(A, A, clip)
        self.kernel = config.conv_kernel_size
        self.depthwise_conv1d = nn.Conv1d(A, A, self.kernel, groups=A, bias=False)
        self.pre_layer_norm = RMSNorm(A, config.rms_norm_eps)
        self.conv_norm = RMSNorm(A, config.rms_norm_eps)
        self.bound = config.gradient_clipping

    def forward(self, h):
        x = torch.nn.functional.glu(self.linear_start(self.pre_layer_norm(h)), dim=-1)  # (1, T, A)
        x = torch.nn.functional.pad(x.transpose(1, 2), (self.kernel - 1, 0))  # (1, A, T + K - 1): causal
        x = self.depthwise_conv1d(x).transpose(1, 2)  # (1, T, A)
        x = torch.nn.functional.silu(self.conv_norm(_clip(x, self.bound)))
        return h + self.linear_end(x)


class AudioLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        A = config.hidden_size
        self.feed_forward1, self.feed_forward2 = FeedForward(config), FeedForward(config)
        self.self_attn = ChunkedAttention(config)
        self.lconv1d = LightConv(config)
        self.norm_pre_attn, self.norm_post_attn, self.norm_out = RMSNorm(A, 1e-6), RMSNorm(A, 1e-6), RMSNorm(A, 1e-6)
        self.bound = config.gradient_clipping

    def forward(self, h, positions, blocked):
        h = self.feed_forward1(h)
        a = self.self_attn(self.norm_pre_attn(_clip(h, self.bound)), positions, blocked)
        h = h + self.norm_post_attn(_clip(a, self.bound))
        h = self.feed_forward2(self.lconv1d(h))
        return self.norm_out(_clip(h, self.bound))


def relative_positions(config) -> torch.Tensor:
    """The sinusoid table of the relative distances a block sees, context//2 down to 0: (P, A), sin then cos."""
    context = config.attention_chunk_size + config.attention_context_left - 1 + config.attention_context_right
    n = config.hidden_size // 2
    inv = torch.exp(torch.arange(n) * -(math.log(10000.0) / max(n - 1, 1)))  # (A/2,)
    t = torch.arange(context // 2, -1, -1)[:, None] * inv[None]  # (P, A/2)
    return torch.cat([torch.sin(t), torch.cos(t)], dim=-1)


class AudioEncoder(nn.Module):
    """Mel frames -> soft tokens at the text width, for one clip padded to a frame bucket."""

    def __init__(self, config, text_hidden: int, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.config = config
        self.subsample_conv_projection = Subsample(config)
        self.layers = nn.ModuleList(AudioLayer(config) for _ in range(config.num_hidden_layers))
        self.output_proj = nn.Linear(config.hidden_size, config.output_proj_dims, bias=True)
        self.embed_norm = RMSNorm(config.output_proj_dims, config.rms_norm_eps, with_scale=False)
        self.embedding_projection = nn.Linear(config.output_proj_dims, text_hidden, bias=False)
        self.register_buffer("positions", relative_positions(config), persistent=False)
        self.to(dtype)

    def weight_map(self) -> list[WeightEntry]:
        """Every tensor and its key in the hub's Gemma4ForConditionalGeneration layout (under model.)."""
        renames = {
            "subsample_conv_projection.conv0.": "subsample_conv_projection.layer0.conv.",
            "subsample_conv_projection.norm0.": "subsample_conv_projection.layer0.norm.",
            "subsample_conv_projection.conv1.": "subsample_conv_projection.layer1.conv.",
            "subsample_conv_projection.norm1.": "subsample_conv_projection.layer1.norm.",
        }
        out = []
        for name, _ in [*self.named_parameters(), *((n, b) for n, b in self.named_buffers() if n != "positions")]:
            if name.startswith(("embed_norm", "embedding_projection")):
                out.append(WeightEntry(name, EMBEDDER + name))
                continue
            key = name
            for old, new in renames.items():
                key = key.replace(old, new)
            out.append(WeightEntry(name, TOWER + key))
        return out

    def load_weights(self, reader) -> None:
        load_mapped(self, reader, "audio")

    def forward(self, frames, valid0, valid1, blocked):
        """frames (1, F, M) mel features; valid0 (1, F), valid1 (1, F/2) 1 on real frames; blocked
        (1, 1, nb, chunk, ctx) True where a query may not see a key. Returns (1, T, H); rows past the
        clip's soft tokens are the host's to drop."""
        h = self.subsample_conv_projection(frames, valid0, valid1)
        positions = self.positions.to(h.dtype)
        for layer in self.layers:
            h = layer(h, positions, blocked)
        return self.embedding_projection(self.embed_norm(self.output_proj(h)))


__all__ = ["AudioEncoder", "CLIP_BUFFERS"]

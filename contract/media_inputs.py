"""An image encoder graph's inputs, built on the host from what transformers' image processor gives
for one image (pixel_values (1, P, 3p^2) and image_position_ids (1, P, 2), its real patches first,
then padding marked (-1, -1)): the lookups and data-dependent choices the device graph must not make
(gemma4_port/port/vision.py). The same builder makes the trace's example inputs and the server's."""

from __future__ import annotations

import torch

from contract.artifact import AudioGeometry, Geometry, VisionGeometry
from contract.dtypes import DTYPES

VISION_INPUTS = ("patches", "positions", "rope", "mask", "pool")


class VisionInputs:
    """table: the tower's 2-D position table (2, position_embedding_size, W) at the graph dtype."""

    def __init__(self, geo: Geometry, table: torch.Tensor):
        if geo.vision is None:
            raise ValueError("this model has no vision encoder")
        self.v: VisionGeometry = geo.vision
        self.dtype = DTYPES[geo.dtype]
        self.table = table.to(self.dtype)
        spatial = self.v.head_dim // 2
        self.inv_freq = 1.0 / (self.v.rope_theta ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial))

    def soft_tokens(self, positions: torch.Tensor) -> int:
        """An image's soft tokens: its real patches over k^2."""
        return int((positions[0] >= 0).all(-1).sum()) // self.v.patches_per_token

    def __call__(self, features: dict[str, torch.Tensor], bucket: int | None = None) -> tuple[torch.Tensor, ...]:
        """The vision graph's inputs for one image at the soft-token bucket `bucket` (default: the
        smallest that holds it), in VISION_INPUTS order."""
        pixels, pos = features["pixel_values"], features["image_position_ids"]
        if pixels.dim() != 3 or pixels.shape[0] != 1 or pos.shape[:2] != pixels.shape[:2] or pos.shape[-1] != 2:
            raise ValueError(
                f"one image's pixel_values (1, patches, 3p^2) and image_position_ids (1, patches, 2), "
                f"got {tuple(pixels.shape)} and {tuple(pos.shape)}"
            )
        n = self.soft_tokens(pos)
        bucket = bucket or self.v.bucket_for(n)
        P, k = bucket * self.v.patches_per_token, self.v.pooling_kernel
        real = n * self.v.patches_per_token
        if n > bucket or not (pos[0, real:] < 0).all():
            raise ValueError(f"an image of {n} soft tokens, its real patches first, does not fit bucket {bucket}")
        # The processor pads to its whole budget; a bucket keeps the real patches and as much padding as it needs.
        pixels = torch.nn.functional.pad(pixels[:, :P], (0, 0, 0, max(0, P - pixels.shape[1])))  # (1, P, 3p^2)
        pos = torch.nn.functional.pad(pos[:, :P], (0, 0, 0, max(0, P - pos.shape[1])), value=-1).long()  # (1, P, 2)
        valid = (pos >= 0).all(-1)  # (1, P)
        clamped = pos.clamp(min=0)
        table = self.table
        positions = table[0][clamped[..., 0]] + table[1][clamped[..., 1]]  # (1, P, W)
        positions = torch.where(valid.unsqueeze(-1), positions, torch.zeros((), dtype=self.dtype))
        freqs = pos[..., None].float() * self.inv_freq  # (1, P, 2, D/4)
        cos = torch.cat([freqs[:, :, 0].cos()] * 2 + [freqs[:, :, 1].cos()] * 2, dim=-1)  # (1, P, D): x, x, y, y
        sin = torch.cat([freqs[:, :, 0].sin()] * 2 + [freqs[:, :, 1].sin()] * 2, dim=-1)  # (1, P, D)
        rope = torch.cat((cos, sin), dim=-1).to(self.dtype)  # (1, P, 2D)
        neg = torch.tensor(torch.finfo(self.dtype).min, dtype=self.dtype)
        mask = torch.where(valid, torch.zeros((), dtype=self.dtype), neg).view(1, 1, 1, P)  # (1, 1, 1, P)
        # Soft token of a patch: its k x k cell, numbered row by row across the image's width in cells.
        cells_across = (int(clamped[..., 0].max()) + 1) // k
        cell = (clamped[..., 0] // k) + cells_across * (clamped[..., 1] // k)  # (1, P)
        pool = torch.nn.functional.one_hot(cell, bucket).float() / (k * k)  # (1, P, N)
        pool = (pool * valid.unsqueeze(-1)).transpose(1, 2).contiguous()  # (1, N, P): padding weighs nothing
        return pixels.float().contiguous(), positions.contiguous(), rope.contiguous(), mask, pool


class AudioInputs:
    """An audio graph's inputs for one clip, from what transformers' feature extractor gives for it
    (input_features (1, F, M) mel frames and input_features_mask (1, F), real frames first)."""

    def __init__(self, geo: Geometry):
        if geo.audio is None:
            raise ValueError("this model has no audio encoder")
        self.a: AudioGeometry = geo.audio
        self.dtype = DTYPES[geo.dtype]

    @staticmethod
    def soft_tokens(mask: torch.Tensor) -> int:
        """A clip's soft tokens: its real frames after the two stride-2 convolutions."""
        return int(mask[0, ::2][::2].sum())

    def __call__(self, features: dict[str, torch.Tensor], bucket: int | None = None) -> tuple[torch.Tensor, ...]:
        """The audio graph's inputs at the soft-token bucket `bucket` (default: the smallest that
        holds the clip): frames, the frame masks before each convolution, the blocked attention mask."""
        frames, mask = features["input_features"], features["input_features_mask"].bool()
        if frames.dim() != 3 or frames.shape[0] != 1 or mask.shape != frames.shape[:2]:
            raise ValueError(
                f"one clip's input_features (1, frames, mel) and input_features_mask (1, frames), "
                f"got {tuple(frames.shape)} and {tuple(mask.shape)}"
            )
        n = self.soft_tokens(mask)
        bucket = bucket or self.a.bucket_for(n)
        F = 4 * bucket
        if n > bucket or mask[0, : 4 * n].sum() < mask.sum():
            raise ValueError(f"a clip of {n} soft tokens, its real frames first, does not fit bucket {bucket}")
        frames = torch.nn.functional.pad(frames[:, :F], (0, 0, 0, max(0, F - frames.shape[1])))  # (1, F, M)
        mask = torch.nn.functional.pad(mask[:, :F], (0, max(0, F - mask.shape[1])))  # (1, F)
        valid1, valid = mask[:, ::2], mask[:, ::2][:, ::2]  # (1, F/2), (1, T)
        a, T = self.a, bucket
        # Query q of block b sees key k = b * chunk - past + c when k is a real frame within the window.
        q = torch.arange(T).view(T // a.chunk, a.chunk, 1)  # (nb, chunk, 1)
        k = (torch.arange(T // a.chunk) * a.chunk).view(-1, 1, 1) - a.past + torch.arange(a.context).view(1, 1, -1)
        dist = q - k  # (nb, chunk, ctx)
        inside = (k >= 0) & (k < T)
        window = ((dist >= 0) & (dist < a.past)) | ((dist < 0) & (-dist < a.future))  # (nb, chunk, ctx)
        seen = window & inside & valid[0, k.clamp(0, T - 1)]
        return (
            frames.to(self.dtype).contiguous(),
            mask.to(self.dtype),
            valid1.to(self.dtype).contiguous(),
            (~seen).view(1, 1, *seen.shape),
        )

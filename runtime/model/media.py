"""A prompt's images (and later audio clips) as the runner takes them: where their soft tokens sit in
the prompt's ids, the processor's features to encode, and the digest of the source bytes that keys
prefix reuse. Pure functions of ids and media; the runner encodes and merges (runner.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from contract.errors import Gemma4Error


class MediaError(Gemma4Error, ValueError):
    """A media part the server will not take; the message says why (a 400, named by its part)."""


@dataclass(frozen=True)
class MediaInput:
    """One image or audio clip of a prompt. Its soft tokens are ids[offset : offset + length], each the model's
    placeholder (Geometry.placeholders); `features` is what transformers' processor gives for this one item
    (pixel_values (1, P, 3p^2) and image_position_ids (1, P, 2) for an image; input_features
    (1, F, 128) and input_features_mask (1, F) for a clip)."""

    kind: str  # "image" | "audio"
    offset: int  # index in ids of its first soft token
    length: int  # soft tokens
    digest: str  # sha256 of the source bytes (hex)
    features: dict[str, torch.Tensor] = field(compare=False, hash=False)

    @property
    def end(self) -> int:
        return self.offset + self.length


def check_media(
    ids: Sequence[int], media: Sequence[MediaInput], placeholder: dict[str, int], encoders: Sequence[str]
) -> None:
    """Each item is of a kind the model encodes (`encoders`), its span lies inside the prompt, in
    order, apart, and holds only its kind's placeholder id (placeholder: kind -> id). A placeholder
    outside every span stays as it is: its word is the pad token's, as for any placeholder
    (HostInputs.embed), so a prompt that holds one reads as transformers reads it."""
    last = 0
    for m in media:
        if m.kind not in encoders or m.kind not in placeholder:
            raise MediaError(f"this model takes {list(encoders) or 'no media'}, not {m.kind!r}")
        if m.length < 1 or m.offset < last or m.end > len(ids):
            raise MediaError(
                f"{m.kind} soft tokens at {m.offset} .. {m.end - 1} do not lie in order inside a prompt "
                f"of {len(ids)} ids"
            )
        if any(t != placeholder[m.kind] for t in ids[m.offset : m.end]):
            raise MediaError(
                f"ids {m.offset} .. {m.end - 1} are not all the {m.kind} placeholder {placeholder[m.kind]}"
            )
        last = m.end


def keyed(ids: Sequence[int], media: Sequence[MediaInput]) -> list[int]:
    """The prompt as prefix reuse compares it: each soft token's placeholder replaced by a negative
    number made of its item's digest and its index in the item, so two prompts share a prefix through
    an image only when it is the same bytes (no token id is negative)."""
    out = list(ids)
    for m in media:
        base = int(m.digest[:24], 16) << 20
        out[m.offset : m.end] = [-(1 + base + i) for i in range(m.length)]
    return out


def blocks(media: Sequence[MediaInput], bidirectional: bool) -> list[tuple[int, int]]:
    """Positions [a, b) whose tokens see each other both ways: each image's soft tokens on a model
    whose sliding layers do (Geometry.bidirectional_vision); none otherwise."""
    return [(m.offset, m.end) for m in media if bidirectional and m.kind == "image"]


def outside_blocks(position: int, whole: Sequence[tuple[int, int]]) -> int:
    """`position` moved back to the start of a block it falls inside (a kept prefix may not end within one)."""
    for a, b in whole:
        if a < position < b:
            return a
    return position

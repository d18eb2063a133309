"""A prompt's media as the runner takes them (runtime/model/media.py): the checks on their spans,
prefix keys by digest, and chunks that never split a bidirectional block."""

from __future__ import annotations

import pytest
import torch

from runtime.model.media import MediaError, MediaInput, blocks, check_media, keyed, outside_blocks
from runtime.model.prefix import reusable_prefix
from runtime.model.prompt_chunks import chunks

IMG = 21
PLACEHOLDERS = {"image": IMG, "audio": 22, "video": 23}


def image(offset: int, length: int, digest: str = "ab" * 32) -> MediaInput:
    return MediaInput("image", offset, length, digest, {"pixel_values": torch.zeros(1)})


def test_spans_must_hold_their_placeholders_in_order():
    ids = [2, 17, *[IMG] * 4, 18, 5, 17, *[IMG] * 3, 18]
    check_media(ids, [image(2, 4), image(9, 3)], PLACEHOLDERS, ("image",))
    for media, match in (
        ([image(2, 5)], "not all the image placeholder 21"),
        ([image(9, 3), image(2, 4)], "in order"),
        ([image(11, 3)], "inside a prompt of 13 ids"),
        ([MediaInput("audio", 2, 4, "00", {})], r"takes \['image'\], not 'audio'"),
    ):
        with pytest.raises(MediaError, match=match):
            check_media(ids, media, PLACEHOLDERS, ("image",))
    with pytest.raises(MediaError, match="takes no media"):
        check_media(ids, [image(2, 4)], PLACEHOLDERS, ())


def test_an_image_keys_its_prefix_by_its_bytes():
    ids = [2, 17, *[IMG] * 4, 18, 5]
    same, other = keyed(ids, [image(2, 4)]), keyed(ids, [image(2, 4, "cd" * 32)])
    assert same[:2] == ids[:2] and same[6:] == ids[6:] and all(t < 0 for t in same[2:6])
    assert len(set(same[2:6])) == 4 and not set(same) & set(other[2:6])
    geo = type("G", (), {"ring": 64, "kv_max": 64, "sliding_window": 8})()
    assert reusable_prefix(geo, same, keyed(ids + [9], [image(2, 4)])) == len(ids)
    assert reusable_prefix(geo, same, other + [9]) == 2  # up to the image, whose bytes differ


def test_a_chunk_never_ends_inside_a_block():
    whole = blocks([image(10, 10), image(40, 5)], bidirectional=True)
    assert whole == [(10, 20), (40, 45)] and blocks([image(10, 10)], bidirectional=False) == []
    assert chunks(0, 50, (8, 16), ()) == [(0, 16, 16), (16, 16, 16), (32, 16, 16), (48, 2, 8)]
    # 0..15 would split the first block: that chunk ends at its start, and the block is the next chunk's;
    # 26..41 would split the second: it ends at 40
    assert chunks(0, 50, (8, 16), whole) == [(0, 10, 16), (10, 16, 16), (26, 14, 16), (40, 10, 16)]
    with pytest.raises(MediaError, match="block of 20 soft tokens does not fit the largest prefill bucket"):
        chunks(0, 50, (8, 16), [(10, 30)])
    assert outside_blocks(15, whole) == 10 and outside_blocks(20, whole) == 20 and outside_blocks(5, whole) == 5

"""contract.hostside: every graph input the host builds, against its definition and the graph
signatures."""

import pytest
import torch

from contract.graph_key import GraphKey
from gemma4_port.compile.tracing import example_inputs
from support.builds import setup


def test_graph_signatures_match_the_host_inputs():
    _, _, shard, geo, decoder, host = setup("tiny-e2b", "b4")
    pre = example_inputs(host, geo, GraphKey.prefill(16, 32))
    assert geo.key_buckets == (32, 64)
    dec = example_inputs(host, geo, GraphKey.decode(32))
    assert len(pre) == len(geo.inputs["prefill"]) and len(dec) == len(geo.inputs["decode"])
    named = dict(zip(geo.inputs["decode"], dec))
    assert named["hidden"].shape == (4, 1, geo.hidden)
    assert named["ple"].shape == (4, 1, geo.num_layers, geo.ple_dim)
    assert named["rope"].shape == (4, 1, sum(2 * r.head_dim for r in geo.rope.values()))
    assert named["rows_full"].shape == (4, 2, 32)  # a mask row, then the write, over the first 32 keys
    assert named["rows_sliding"].shape == (4, 2, 32)  # the ring (40) read up to the bucket too
    assert named["kv0_k"].shape == geo.kv_shapes[0]  # the graph still takes (and returns) whole buffers
    named = dict(zip(geo.inputs["prefill"], pre))
    assert named["slot"].shape == (4,) and named["rows_full"].shape == (16, 2, 32)  # a chunk reads 32 keys too
    assert named["rows_sliding"].shape == (16, 2, 32)
    named = dict(zip(geo.inputs["prefill"], example_inputs(host, geo, GraphKey.prefill(32, 64))))
    assert named["rows_full"].shape == (32, 2, geo.kv_max) and named["rows_sliding"].shape == (32, 2, geo.ring)


def test_a_chunk_runs_in_the_smallest_key_bucket_that_holds_it():
    """Its rows are the leading keys of the kv_max-wide rows (the same mask and writes, cut where no
    position of the chunk reaches); a key bucket it does not fit is refused, naming the ones it does."""
    *_, geo, _, host = setup("tiny-e2b", "b4")
    assert [geo.keys_for_chunk(16, end) for end in (1, 32, 33, 64)] == [32, 32, 64, 64]
    assert geo.prefill_keys(32) == (32, 64)
    ids = list(range(1, 12))
    short = dict(zip(geo.inputs["prefill"], host.prefill_inputs(ids, 16, 1, start=20)))
    whole = dict(zip(geo.inputs["prefill"], host.prefill_inputs(ids, 16, 1, start=20, keys=64)))
    for kind in geo.kinds:
        assert short[f"rows_{kind}"].shape == (16, 2, 32)
        assert torch.equal(short[f"rows_{kind}"], whole[f"rows_{kind}"][..., :32])
        past = whole[f"rows_{kind}"][..., 32:]  # keys 32.. : none visible, none written
        assert not (past[:, 0] == 0).any() and not past[:, 1].any()
    with pytest.raises(ValueError, match=r"no prefill graph over 32 keys; it runs over one of \(32, 64\)"):
        host.prefill_inputs(ids, 16, 1, start=22, keys=32)


def test_decode_inputs_are_the_rows_of_their_definition():
    """The precomputed tables give, per slot, exactly the causal/windowed mask over its kind's cache
    (a sliding ring key j holds position q - ((q - j) mod ring)), the one-hot write and the rotary
    rows of its position; an idle slot writes nothing and sees no key."""
    *_, geo, _, host = setup("tiny-e2b", "b4")
    K, W = geo.kv_max, geo.sliding_window
    positions = [0, W, K - 1, 5]
    named = dict(zip(geo.inputs["decode"], host.decode_inputs([7, 8, 9, None], positions)))
    rope = named["rope"]
    for slot, p in enumerate(positions[:3]):
        start = 0
        for kind in geo.kinds:
            S, rows = geo.span(kind), named[f"rows_{kind}"]
            keys = torch.arange(S)
            held = p - (p - keys) % S
            visible = (held >= 0) & ((held > p - W) if kind == "sliding" else True)
            assert torch.equal(rows[slot, 0] == 0, visible), (kind, p)
            assert torch.equal(rows[slot, 1], (keys == p % S).to(host.dtype))
            inv = torch.tensor(geo.rope[kind].inv_freq)
            angles = torch.cat((p * inv, p * inv))
            d = geo.rope[kind].head_dim
            assert torch.equal(rope[slot, 0, start : start + d], angles.cos().to(host.dtype))
            assert torch.equal(rope[slot, 0, start + d : start + 2 * d], angles.sin().to(host.dtype))
            start += 2 * d
    for kind in geo.kinds:
        rows = named[f"rows_{kind}"]
        assert not rows[3, 1].any() and not (rows[3, 0] == 0).any()
    assert all(t.is_contiguous() for t in named.values())


def test_chunk_inputs_are_the_rows_of_their_definition():
    """Each chunk token's mask row sees exactly the keys (p - window, p] of its own position q (the
    ring key j holding q - ((q - j) mod S)) and its write row names q mod S; padding sees and writes nothing."""
    *_, geo, _, host = setup("tiny-e2b")
    start, n, bucket = 37, 9, 16
    named = dict(zip(geo.inputs["prefill"], host.prefill_inputs(list(range(1, n + 1)), bucket, 0, start=start)))
    for kind in geo.kinds:
        S, rows = geo.span(kind), named[f"rows_{kind}"]
        assert rows.shape == (bucket, 2, S)
        j = torch.arange(S)
        for i in range(bucket):
            if i >= n:
                assert not rows[i, 1].any() and not (rows[i, 0] == 0).any()
                continue
            q = start + i
            held = q - (q - j) % S  # the position key j holds once q is written
            visible = held >= 0
            if kind == "sliding":
                visible &= held > q - geo.sliding_window
            assert torch.equal(rows[i, 0] == 0, visible), (kind, q)
            assert torch.equal(rows[i, 1], (j == q % S).to(host.dtype)), (kind, q)
    assert torch.equal(named["last"][0], torch.nn.functional.one_hot(torch.tensor(n - 1), bucket).float())
    with pytest.raises(ValueError, match="does not fit kv_max"):
        host.prefill_inputs([1] * 9, 16, 0, start=geo.kv_max - 8)


def test_copy_inputs_name_the_slots_and_the_kept_positions_and_refuse_what_has_no_graph():
    *_, geo, _, host = setup("tiny-e2b", "b4")
    named = dict(zip(geo.inputs["copy"], host.copy_inputs(2, 0, 20, 32)))
    assert named["source"].tolist() == [0, 0, 1, 0] and named["target"].tolist() == [1, 0, 0, 0]
    assert named["held"].tolist() == [1] * 20 + [0] * 12  # (T,): the prompt's positions of copy_32
    with pytest.raises(ValueError, match=r"from one slot to another of 0 \.\. 3, not 1 -> 1"):
        host.copy_inputs(1, 1, 5, 32)
    with pytest.raises(ValueError, match=r"a copy of 33 positions has no graph over 32 keys; .* \(32, 64\)"):
        host.copy_inputs(0, 1, 33, 32)

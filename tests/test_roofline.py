"""The decode roofline: bytes a step moves over the HBM bandwidth, on the real E2B / 12B configs."""

import pytest

from gemma4_port.ops.capacity import GIB, footprint
from gemma4_port.ops.model_sizes import ModelSizes
from gemma4_port.ops.roofline import ALL_REDUCE_S, CORE_BYTES_PER_S, break_even_all_reduce_s, roofline
from gemma4_port.source.configs import text_config_for
from gemma4_port.source.manifest import load_manifest
from support import MANIFESTS

E2B_DEVICE = 2_279_759_139  # elements on the device at tp 1 (test_capacity.py counts them)


@pytest.fixture(scope="module")
def e2b():
    manifest = load_manifest(MANIFESTS / "gemma-4-e2b.yaml")
    return manifest, ModelSizes(text_config_for(manifest))


def test_a_step_reads_the_weights_once_and_moves_the_kv_in_and_out(e2b):
    manifest, sizes = e2b
    v = manifest.variant("512-128")
    r = roofline(sizes, v, v.kv_max, 1)
    kv = footprint(sizes, v).rank_kv
    assert r.weight_bytes == 2 * E2B_DEVICE and r.kv_bytes == 2 * kv and r.tail_bytes == 0
    assert r.step_s() == pytest.approx((2 * E2B_DEVICE + 2 * kv) / (410 * GIB))
    assert 80 < r.per_stream() < 90  # the HBM ceiling of a one-core E2B at bf16


def test_a_small_key_bucket_still_copies_the_tail_as_the_graph_is_written(e2b):
    manifest, sizes = e2b
    v = manifest.variant("512-128")
    short, full = roofline(sizes, v, 4096, 1), roofline(sizes, v, v.kv_max, 1)
    assert short.kv_bytes < full.kv_bytes and short.kv_bytes + short.tail_bytes == full.kv_bytes
    assert short.step_s() == pytest.approx(full.step_s())
    assert short.per_stream(tail=False) > full.per_stream()  # what aliasing the tail in place would gain


def test_batch_4_shares_one_read_of_the_weights(e2b):
    manifest, sizes = e2b
    v = manifest.variant("b4")
    one, four = roofline(sizes, v, v.kv_max, 1), roofline(sizes, v, v.kv_max, 4)
    assert four.weight_bytes == one.weight_bytes and four.kv_bytes == 4 * one.kv_bytes
    assert four.aggregate() == pytest.approx(4 * four.per_stream()) and one.per_stream() > four.per_stream()
    assert four.aggregate() > 2.5 * one.aggregate()


def test_tp2_against_tp1_with_the_all_reduces_as_stated(e2b):
    manifest, sizes = e2b
    tp1 = roofline(sizes, manifest.variant("512-128"), 49152, 1)
    tp2 = roofline(sizes, manifest.variant("tp2-48k"), 49152, 1)
    assert tp2.all_reduces == 2 * 35  # attention and MLP outputs of every layer
    moved = (tp2.weight_bytes + tp2.kv_bytes) / CORE_BYTES_PER_S
    assert tp2.step_s() == pytest.approx(moved + 70 * ALL_REDUCE_S)
    assert tp2.per_stream() > tp1.per_stream()  # by the roofline, at the assumed 20 us
    even = break_even_all_reduce_s(tp1, tp2)
    assert 50e-6 < even < 70e-6  # above ~59 us per all-reduce tp 1 would win

"""contract/graph_key.py: a graph's key, its text, and the graphs of a variant."""

import pytest

from contract.graph_key import GraphKey, GraphKeyError, variant_graphs


def test_a_graph_key_reads_back_from_its_text_and_a_bad_name_is_refused():
    for key in (GraphKey.prefill(128, 2048), GraphKey.decode(512), GraphKey.copy(256)):
        assert GraphKey.parse(str(key)) == key
    assert str(GraphKey.prefill(16, 64)) == "prefill_16_64"
    for bad in ("prefill_16", "decode_0", "decode_64_64", "copy_x", "rank0/decode_64", "model"):
        with pytest.raises(GraphKeyError, match="is not a graph name: prefill_<chunk>_<keys>, decode_<keys>"):
            GraphKey.parse(bad)
    with pytest.raises(GraphKeyError, match="no graph decode with 16 chunk tokens"):
        GraphKey("decode", 64, 16)


def test_a_variant_traces_prefills_then_decodes_then_copies():
    graphs = variant_graphs((16, 32), (32, 64), 4)
    assert list(map(str, graphs)) == [
        "prefill_16_32",
        "prefill_16_64",
        "prefill_32_32",
        "prefill_32_64",
        "decode_32",
        "decode_64",
        "copy_32",
        "copy_64",
    ]
    assert [g.kind for g in variant_graphs((16,), (32, 64), 1, device_prefill=False)] == ["decode", "decode"]

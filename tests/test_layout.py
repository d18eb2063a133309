"""contract/layout.py: a variant's ModelBuilder keys, and the cores its ranks run on."""

import pytest

from contract.graph_key import GraphKey
from contract.layout import NeuronPlacementError, neuron_layout, rank_cores, visible_cores


def names(keys: dict[str, tuple[GraphKey, ...]]) -> dict[str, tuple[str, ...]]:
    return {kind: tuple(map(str, graphs)) for kind, graphs in keys.items()}


def test_layouts_are_model_builder_keys_prefill_first():
    device = neuron_layout(1, "device", (128, 512), (256, 512, 2048), 1)
    # a chunk bucket has a graph for each key bucket that holds it (T >= C): 128 over 256 .. 2048, 512 over 512, 2048
    assert names(device.keys) == {
        "prefill": ("prefill_128_256", "prefill_128_512", "prefill_128_2048", "prefill_512_512", "prefill_512_2048"),
        "decode": ("decode_256", "decode_512", "decode_2048"),
    }
    assert list(device.keys) == ["prefill", "decode"] and device.compile_jobs == 8
    parsed = [GraphKey.parse(n) for n in ("prefill_128_2048", "decode_512", "copy_256")]
    assert [(g.kind, g.tokens, g.keys) for g in parsed] == [
        ("prefill", 128, 2048),
        ("decode", 1, 512),
        ("copy", 0, 256),
    ]
    # batch > 1: a weightless copy key last (ModelBuilder shards the weights by the first key's module),
    # a bucket per key bucket; it adds no compile job that holds the weights
    batch = neuron_layout(1, "device", (128, 512), (256, 512, 2048), 4)
    assert list(batch.keys) == ["prefill", "decode", "copy"] and batch.compile_jobs == 8
    assert names(batch.keys)["copy"] == ("copy_256", "copy_512", "copy_2048")
    host = neuron_layout(2, "host", (512,), (1024, 2048), 2)
    assert (names(host.keys), host.host_prefill, host.compile_jobs) == (
        {"decode": ("decode_1024", "decode_2048"), "copy": ("copy_1024", "copy_2048")},
        True,
        2,
    )


def test_core_ids_come_from_the_environment():
    assert visible_cores({}) is None
    assert visible_cores({"NEURON_RT_VISIBLE_CORES": "4-5"}) == (4, 5)
    # the runtime's forms: ids and ranges making one increasing run of cores
    assert visible_cores({"NEURON_RT_VISIBLE_CORES": "0,1"}) == visible_cores({"NEURON_RT_VISIBLE_CORES": "0-1"})
    assert visible_cores({"NEURON_RT_VISIBLE_CORES": "3-5,6"}) == (3, 4, 5, 6)
    for gapped in ("1,3", "1,0", "0-1,1", "0,2-3"):
        with pytest.raises(NeuronPlacementError, match="the runtime needs contiguous cores, one run of consecutive"):
            visible_cores({"NEURON_RT_VISIBLE_CORES": gapped})
    assert rank_cores(2, {"NEURON_RT_VISIBLE_CORES": "2-3"}) == (2, 3)
    with pytest.raises(NeuronPlacementError, match="gives the process 1: give it 2 cores, like 0-1"):
        rank_cores(2, {"NEURON_RT_VISIBLE_CORES": "1"})
    with pytest.raises(NeuronPlacementError, match="not a core id or a range"):
        visible_cores({"NEURON_RT_VISIBLE_CORES": "nc0"})

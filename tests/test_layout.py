"""contract/layout.py: a variant's ModelBuilder keys, and the cores its ranks run on."""

import pytest

from contract.layout import NeuronPlacementError, neuron_layout, rank_cores, visible_cores


def test_layouts_are_model_builder_keys_prefill_first():
    device = neuron_layout(1, "device", (128, 512), (512, 2048))
    assert device.keys == {"prefill": ("prefill_128", "prefill_512"), "decode": ("decode_512", "decode_2048")}
    assert list(device.keys) == ["prefill", "decode"] and device.compile_jobs == 4
    host = neuron_layout(2, "host", (512,), (1024, 2048))
    assert (host.keys, host.host_prefill, host.compile_jobs) == ({"decode": ("decode_1024", "decode_2048")}, True, 2)


def test_core_ids_come_from_the_environment():
    assert visible_cores({}) is None
    assert visible_cores({"NEURON_RT_VISIBLE_CORES": "4-5"}) == (4, 5)
    assert visible_cores({"NEURON_RT_VISIBLE_CORES": "1,3"}) == (1, 3)
    assert rank_cores(2, {"NEURON_RT_VISIBLE_CORES": "2-3"}) == (2, 3)
    with pytest.raises(NeuronPlacementError, match="gives the process 1: give it 2 cores"):
        rank_cores(2, {"NEURON_RT_VISIBLE_CORES": "1"})
    with pytest.raises(NeuronPlacementError, match="not a core id or a range"):
        visible_cores({"NEURON_RT_VISIBLE_CORES": "nc0"})

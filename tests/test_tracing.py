"""gemma4_port.tracing: example inputs from the rows a trace needs, and the CPU graphs as methods of
one module sharing one copy of the weights."""

from pathlib import Path

import torch

from contract.artifact import load_meta
from contract.hostside import HostInputs
from gemma4_port.checkpoint import CheckpointReader
from gemma4_port.tracing import EXAMPLE_TOKEN, example_inputs, host_tables

from support.builds import setup


def test_cpu_graphs_are_methods_of_one_module_sharing_one_copy_of_the_weights(compiled):
    folder = compiled("tiny-e2b", "b4")
    meta = load_meta(folder)
    # a prefill per chunk bucket and key bucket that holds it: 16 over 32 or 64 keys, 32 over 32 or 64
    assert set(meta.graphs) == {"prefill_16_32", "prefill_16_64", "prefill_32_32", "prefill_32_64", "decode_32",
                                "decode_64"}
    assert set(meta.graphs.values()) == {"graphs/graphs.pt"}
    state = torch.jit.load(str(folder / "graphs/graphs.pt")).state_dict()
    weight = "decoder.layers.0.mlp.up_proj.weight"
    assert state[f"prefill.{weight}"].data_ptr() == state[f"decode.{weight}"].data_ptr()
    checkpoint = (Path(meta.checkpoint) / "model.safetensors").stat().st_size
    # one copy, not one per graph (six graphs: their code adds ~0.1 MB each)
    assert (folder / "graphs/graphs.pt").stat().st_size < 1.5 * checkpoint


def test_a_tp_rank_traces_from_the_rows_its_example_inputs_look_up():
    folder, _, _, geo, _, host = setup("tiny-e2b", "b4")
    few = HostInputs(geo, host_tables(CheckpointReader(folder), geo, rows=EXAMPLE_TOKEN + 1))
    assert few.tables.embed.shape == (EXAMPLE_TOKEN + 1, geo.hidden)
    for name in ("prefill_16_32", "decode_32"):
        for a, b in zip(example_inputs(few, geo, name), example_inputs(host, geo, name)):
            assert torch.equal(a, b)

"""gemma4_port.tracing: the CPU graphs as methods of one module sharing one copy of the weights."""

from pathlib import Path

import torch

from contract.artifact import load_meta


def test_cpu_graphs_are_methods_of_one_module_sharing_one_copy_of_the_weights(compiled):
    folder = compiled("tiny-e2b", "b4")
    meta = load_meta(folder)
    assert set(meta.graphs) == {"prefill_16", "prefill_32", "decode_32", "decode_64"}
    assert set(meta.graphs.values()) == {"graphs/graphs.pt"}
    state = torch.jit.load(str(folder / "graphs/graphs.pt")).state_dict()
    weight = "decoder.layers.0.mlp.up_proj.weight"
    assert state[f"prefill.{weight}"].data_ptr() == state[f"decode.{weight}"].data_ptr()
    checkpoint = (Path(meta.checkpoint) / "model.safetensors").stat().st_size
    assert (folder / "graphs/graphs.pt").stat().st_size < 1.2 * checkpoint  # one copy, not one per graph

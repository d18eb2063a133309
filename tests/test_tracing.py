"""gemma4_port.compile.tracing: example inputs from the rows a trace needs, and the CPU graphs as methods of
one module sharing one copy of the weights."""

from pathlib import Path

import torch

from contract.artifact import load_meta
from contract.dtypes import DTYPES
from contract.graph_key import GraphKey
from contract.hostside import HostInputs, HostTables
from gemma4_port.compile.tracing import EXAMPLE_TOKEN, example_inputs, host_tables
from gemma4_port.source.checkpoint_files import CheckpointReader
from support.builds import setup
from support.copies import check_copied, planted_kv


def test_cpu_graphs_are_methods_of_one_module_sharing_one_copy_of_the_weights(compiled):
    folder = compiled("tiny-e2b", "b4")
    meta = load_meta(folder)
    # a prefill per chunk bucket and key bucket that holds it: 16 over 32 or 64 keys, 32 over 32 or 64
    assert set(meta.graphs) == {
        "prefill_16_32",
        "prefill_16_64",
        "prefill_32_32",
        "prefill_32_64",
        "decode_32",
        "decode_64",
        "copy_32",
        "copy_64",
    }  # a fork's copy per key bucket (batch 4)
    assert set(meta.graphs.values()) == {"graphs/graphs.pt"}
    state = torch.jit.load(str(folder / "graphs/graphs.pt")).state_dict()
    weight = "decoder.layers.0.mlp.up_proj.weight"
    assert state[f"prefill.{weight}"].data_ptr() == state[f"decode.{weight}"].data_ptr()
    checkpoint = (Path(meta.checkpoint) / "model.safetensors").stat().st_size
    # one copy, not one per graph (eight graphs: their code adds ~0.1 MB each)
    assert (folder / "graphs/graphs.pt").stat().st_size < 1.5 * checkpoint


def test_a_tp_rank_traces_from_the_rows_its_example_inputs_look_up():
    folder, _, _, geo, _, host = setup("tiny-e2b", "b4")
    few = HostInputs(geo, host_tables(CheckpointReader(folder), geo, rows=EXAMPLE_TOKEN + 1))
    assert few.tables.embed.shape == (EXAMPLE_TOKEN + 1, geo.hidden)
    for graph in (GraphKey.prefill(16, 32), GraphKey.decode(32)):
        for a, b in zip(example_inputs(few, geo, graph), example_inputs(host, geo, graph)):
            assert torch.equal(a, b)


def test_the_traced_copy_graphs_copy_a_slot_bit_for_bit_and_batch_1_has_none(compiled):
    """copy_<T> as saved, at each key bucket; a batch-1 artifact forks in place and has no copy graph."""
    folder = compiled("tiny-e2b", "b4")
    meta = load_meta(folder)
    geo = meta.geometry
    graphs = torch.jit.load(str(folder / "graphs/graphs.pt"))
    host = HostInputs(geo, HostTables(folder, geo))
    kv = planted_kv(geo.kv_shapes, DTYPES[geo.dtype])
    for source, target, keep in ((1, 3, 9), (3, 0, 32), (0, 2, 33), (2, 1, 63)):
        T = next(t for t in geo.key_buckets if keep <= t)
        _, *out = getattr(graphs, f"copy_{T}")(*host.copy_inputs(source, target, keep, T), *kv)
        check_copied(kv, out, geo.kv_kinds, source, target, keep)
    assert not [g for g in load_meta(compiled("tiny-e2b", "fp32")).graphs if g.startswith("copy")]

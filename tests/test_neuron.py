"""gemma4_port/neuron.py on the CPU without the SDK: the KV alias map and the state names
ModelBuilder gives it, the sharding plan as NxD layers, the graph signatures ModelBuilder routes
by, the checkpoint it shards, the buffers copied before tracing, and the one-line stop without
the SDK. The SDK calls themselves run against the stand-in in test_neuron_path.py."""

import subprocess
import sys

import pytest
import torch

from contract.graph_key import GraphKey
from contract.hostside import HostInputs
from contract.layout import KV_STATE, neuron_layout, signature
from gemma4_port.compile.device_kv import (
    DECODER,
    DeviceKV,
    check_inputs,
    empty_decoder,
    full_checkpoint,
    graph_inputs,
    load_buffers,
)
from gemma4_port.compile.nxd_plan import check_spmd, nxd_plan
from gemma4_port.compile.tracing import CompileError
from gemma4_port.port.decoder import Gemma4Decoder
from gemma4_port.port.graphs import CopyGraph, DecodeGraph, PrefillGraph
from gemma4_port.port.kv import kv_shapes
from gemma4_port.port.sharding import REPLICATED, shard_model
from gemma4_port.source.configs import text_config_for
from gemma4_port.source.manifest import load_manifest
from support import MANIFESTS, ROOT
from support.builds import started
from support.copies import check_copied

TINY = ["tiny-e2b", "tiny-e4b", "tiny-12b"]
REAL = ["gemma-4-e2b", "gemma-4-e4b", "gemma-4-12b"]


def _tiny(name, variant):
    b = started(name, variant)
    return b.ckpt, b.config, b.reader, b.variant, b.geo, HostInputs(b.geo, b.tables)


def _random_kv(module: DeviceKV, seed: int) -> None:
    """Distinct random contents per buffer, so a map to the wrong buffer cannot pass by accident."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.kv:
            p.copy_(torch.randn(p.shape, generator=gen))


@torch.no_grad()
@pytest.mark.parametrize("name", TINY)
def test_alias_map_points_each_kv_parameter_at_the_output_that_updates_it(name):
    folder, config, reader, v, geo, host = _tiny(name, "fp32")
    decoder = Gemma4Decoder(shard_model(config), torch.float32)
    decoder.load_weights(reader)
    module = DeviceKV(DecodeGraph(decoder), geo.kv_shapes, torch.float32)
    _random_kv(module, 0)
    old = [p.clone() for p in module.kv]
    pos = 5
    inputs = host.decode_inputs([17], [pos])
    out = module(*inputs)
    aliases = module.aliases()
    assert sorted(aliases.values()) == list(range(1, len(out)))  # every output but the logits is a buffer's update
    # What the functional graph computes for each buffer, with the same inputs and cache passed in.
    _, *expected = DecodeGraph(decoder)(*inputs, *old)
    for i, p in enumerate(module.kv):
        new = out[aliases[p]]
        assert torch.equal(new, expected[i])
        # the update of *this* buffer: equal to it everywhere but the written position
        kept = [k for k in range(new.shape[2]) if k != pos]
        assert torch.equal(new[:, :, kept], old[i][:, :, kept])
        assert not torch.equal(new[:, :, pos], old[i][:, :, pos])


@torch.no_grad()
def test_prefill_alias_updates_one_slot_and_keeps_the_others():
    folder, config, reader, v, geo, host = _tiny("tiny-e2b", "b4")
    decoder = Gemma4Decoder(shard_model(config), torch.float32)
    decoder.load_weights(reader)
    module = DeviceKV(PrefillGraph(decoder), geo.kv_shapes, torch.float32)
    _random_kv(module, 1)
    old = [p.clone() for p in module.kv]
    out = module(*host.prefill_inputs([5, 6, 7], 16, 2))
    expected = PrefillGraph(decoder)(*host.prefill_inputs([5, 6, 7], 16, 2), *old)
    for i, p in enumerate(module.kv):
        new = out[module.aliases()[p]]
        assert torch.equal(new, expected[1 + i])
        assert torch.equal(new[[0, 1, 3]], old[i][[0, 1, 3]]) and not torch.equal(new[2], old[i][2])


@torch.no_grad()
def test_copy_alias_writes_the_target_slot_and_the_copy_key_holds_no_weights():
    folder, config, reader, v, geo, host = _tiny("tiny-e2b", "b4")
    with torch.device("meta"):  # as RankGraph builds the copy key: the decoder only names the kinds
        decoder = Gemma4Decoder(shard_model(config), torch.float32)
    module = DeviceKV(CopyGraph(decoder), geo.kv_shapes, torch.float32)
    _random_kv(module, 2)
    old = [p.clone() for p in module.kv]
    out = module(*host.copy_inputs(3, 1, 20, 32))
    assert sorted(module.aliases().values()) == list(range(1, len(out)))  # output 0 only for NxD's packer
    # output 0 is computed, not an input handed back: the positions written into each slot
    assert out[0].tolist() == [0, 20, 0, 0]
    assert [n for n, _ in module.named_parameters()] == [f"kv.{i}" for i in range(len(geo.kv_shapes))]
    check_copied(old, [out[module.aliases()[p]] for p in module.kv], geo.kv_kinds, 3, 1, 20)


@pytest.mark.parametrize("name", TINY + REAL)
def test_nxd_layers_of_each_rank_match_the_sharding_plan(name):
    config = text_config_for(load_manifest(MANIFESTS / f"{name}.yaml"))
    shards = [shard_model(config, 2, r) for r in range(2)]
    check_spmd(shards)
    with torch.device("meta"):
        whole = dict(Gemma4Decoder(shard_model(config)).named_parameters())
    for shard in shards:
        plan = {e.path + ".weight": e for e in nxd_plan(shard)}
        with torch.device("meta"):
            decoder = Gemma4Decoder(shard)
        tensors = dict(decoder.named_parameters())
        for entry in decoder.weight_map():
            if entry.name not in tensors or tensors[entry.name].shape == whole[entry.name].shape:
                assert entry.name not in plan  # whole on every rank: a plain module, which NxD leaves whole
                continue
            e = plan.pop(entry.name)  # every split tensor is an NxD parallel layer ...
            assert e.local_shape(2) == tuple(tensors[entry.name].shape)
            # ... and NxD's checkpoint sharder gives this rank exactly the plan's slice
            assert e.rank_slice(2, shard.rank) == (entry.dim, entry.start, entry.stop)
        assert not plan, f"NxD layers with no split tensor: {sorted(plan)}"
        replicated = [s for s in shard.layers if s.owns_cache and s.kv_rule == REPLICATED]
        assert replicated or "e4b" in name  # E2B (nkv 1) and the 12B global layers replicate K/V
        for s in replicated:
            assert f"layers.{s.index}.self_attn.k_proj.weight" not in {e.path + ".weight" for e in nxd_plan(shard)}


@pytest.mark.parametrize(
    "name,variant",
    [
        ("tiny-e2b", "fp32"),
        ("tiny-e2b", "b4"),
        ("tiny-e4b", "tp2-bf16"),
        ("tiny-12b", "tp2"),
        ("tiny-12b", "chunks-tp2"),
    ],
)
def test_example_inputs_match_the_graph_signatures(name, variant):
    folder, config, reader, v, geo, host = _tiny(name, variant)
    layout = neuron_layout(v.tp, v.prefill, v.buckets, v.key_buckets, v.batch)
    routes = set()
    for graph in layout.device_graphs:
        inputs = graph_inputs(host, geo, graph)
        check_inputs(inputs, geo, graph)
        assert [n for n, _, _ in signature(geo, graph)] == [n for n in geo.inputs[graph.kind] if not n.startswith("kv")]
        routes.add(str([t.shape for t in inputs]))
    assert len(routes) == len(layout.device_graphs)  # ModelBuilder routes each call by its input shapes
    decode = GraphKey.decode(geo.kv_max)
    bad = list(graph_inputs(host, geo, decode))
    bad[0] = bad[0][:, :, :-1]
    with pytest.raises(CompileError, match="hidden"):
        check_inputs(bad, geo, decode)


def test_modelbuilder_checkpoint_keys_are_the_modules_weights():
    folder, config, reader, v, geo, host = _tiny("tiny-e4b", "tp2")
    full = full_checkpoint(folder, config, torch.float32)
    shard = shard_model(config, 2, 1)
    with torch.device("meta"):
        module = DeviceKV(
            PrefillGraph(Gemma4Decoder(shard)), kv_shapes(shard, v.batch, v.kv_max, geo.ring), torch.float32
        )
    names = set(module.state_dict())
    assert set(full) == {n for n in names if not n.startswith("kv.")}  # every weight, no KV state
    assert all(n.startswith(DECODER) for n in full)
    # NxD slices the whole tensors: a split tensor is full-size in the checkpoint
    assert (
        full[DECODER + "layers.0.self_attn.q_proj.weight"].shape[0]
        == 2 * module.state_dict()[DECODER + "layers.0.self_attn.q_proj.weight"].shape[0]
    )


@torch.no_grad()
def test_buffers_come_from_the_checkpoint_before_tracing():
    folder, config, reader, v, geo, host = _tiny("tiny-e2b", "fp32")
    decoder = empty_decoder(shard_model(config, 2, 0), torch.float32)
    load_buffers(decoder, reader)
    for i, layer in enumerate(decoder.layers):
        assert torch.equal(layer.layer_scalar, reader.get(f"layers.{i}.layer_scalar"))
        assert float(layer.layer_scalar) != 1.0


def test_kv_state_is_named_as_the_server_reads_it():
    """ModelBuilder keys the model's state by the module's names of the aliased tensors."""
    folder, config, reader, v, geo, host = _tiny("tiny-e4b", "tp2")
    with torch.device("meta"):
        module = DeviceKV(DecodeGraph(Gemma4Decoder(shard_model(config, 2, 0))), geo.kv_shapes, torch.float32)
    names = {id(p): n for n, p in module.named_parameters()}
    assert [names[id(p)] for p in module.aliases()] == [KV_STATE.format(index=i) for i in range(len(geo.kv_shapes))]


def test_compile_for_neuron_without_the_sdk_stops_at_once_naming_the_package(tmp_path):
    out = tmp_path / "artifact"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "build.py"),
            "compile",
            str(MANIFESTS / "tiny-e4b.yaml"),
            "--variant",
            "tp2",
            "--backend",
            "neuron",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "torch_neuronx" in lines[0] and "torch-neuronx==2.8.0.2.12.22436" in lines[0] and "not installed" in lines[0]
    assert not out.exists()  # nothing was done before the check


def test_two_buckets_of_one_model_with_the_same_input_shapes_are_refused():
    """ModelBuilder's router keys a call by its inputs' shapes; a second bucket of the same shapes would
    silently take the first one's calls."""
    from gemma4_port.compile.nxd_encoders import check_routable

    a, b = (torch.zeros(1, 8), torch.zeros(1, 1, 8)), (torch.zeros(1, 8), torch.zeros(1, 1, 4))
    check_routable({"vision": [a, b]}, {"vision": ["vision_35", "vision_70"]})  # distinct: no error
    with pytest.raises(CompileError, match="vision_70 and audio_24 of one Neuron model take inputs of the same"):
        check_routable({"vision": [a, b], "audio": [b]}, {"vision": ["vision_35", "vision_70"], "audio": ["audio_24"]})


def test_an_image_and_audio_variant_has_an_encoder_model_of_a_key_per_kind():
    from gemma4_port.compile.neuron import NeuronGraphs

    manifest = load_manifest(MANIFESTS / "tiny-e2b.yaml")
    layout = NeuronGraphs(manifest, manifest.variant("media-tp2")).layout
    assert {k: [str(g) for g in v] for k, v in layout.encoder_keys.items()} == {
        "vision": ["vision_35", "vision_70"],
        "audio": ["audio_24", "audio_48"],
    }
    assert all(g.kind not in ("vision", "audio") for g in layout.device_graphs)  # not keys of the decoder's model

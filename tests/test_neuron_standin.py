"""The Neuron SDK stand-in behaves as the SDK's source says (tests/support/neuron_sdk), on a toy
two-rank model: the traced executor's fixed arity, routing by input shapes, the uninitialised
refusal, per-rank state that the bucket updates in place and a reset replaces, one output packer
for every key, the sharded checkpoint files, the compiler flags ModelBuilder adds, a save/load in a
fresh process, and the platform detection NxD runs while it traces."""

import pytest

from support.sdk import run_python

BUILD = r"""
import torch
from torch import nn
from neuronx_distributed.parallel_layers import parallel_state
from neuronx_distributed.parallel_layers.layers import ColumnParallelLinear, RowParallelLinear
from neuronx_distributed.trace.model_builder import ModelBuilder

class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = ColumnParallelLinear(4, 8, bias=False, gather_output=False)
        self.down = RowParallelLinear(8, 4, bias=False, input_is_parallel=True)
        self.kv = nn.ParameterList([nn.Parameter(torch.zeros(2, 4), requires_grad=False)])

    def forward(self, x, *unused):
        y = self.down(self.up(x))
        return y.sum(0), self.kv[0] + y[:2]

class Instance:
    def load_module(self):
        self.module = Toy()
        self.rank = parallel_state.get_tensor_model_parallel_rank()

    def get(self, bucket, **_):
        return self.module, {self.module.kv[0]: 1}

out = sys.argv[1]
torch.manual_seed(0)
full = {"up.weight": torch.randn(8, 4), "down.weight": torch.randn(4, 8), "unused": torch.ones(1)}
builder = ModelBuilder(None, 2, lambda: dict(full), compiler_workdir=out + "/work")
prefill = Instance()
builder.add("prefill", prefill, [(torch.ones(3, 4), torch.ones(1)), (torch.ones(5, 4), torch.ones(1))],
            "--auto-cast all")
builder.add("decode", Instance(), [(torch.ones(2, 4),)], "--model-type=transformer -O2")
torch.jit.save(builder.trace(initialize_model_weights=False), out + "/model.pt")
shards = builder.shard_checkpoint(out + "/weights")
torch.save(full, out + "/full.pt")
flags = {k: open(f"{out}/work/{k}/_tp0_bk0/compiler_flags.txt").read().split() for k in ("prefill", "decode")}

class StateOnly(Instance):  # every output aliased: nothing for the packer traced from the first key
    def load_module(self):
        super().load_module()
        self.module.forward = lambda x, *unused: (self.module.kv[0] + 1,)

    def get(self, bucket, **_):
        return self.module, {self.module.kv[0]: 0}

odd = ModelBuilder(None, 2, lambda: dict(full), compiler_workdir=out + "/odd")
odd.add("decode", Instance(), [(torch.ones(2, 4),)])
odd.add("copy", StateOnly(), [(torch.ones(4),)])
try:
    odd.trace(initialize_model_weights=False)
    packer = None
except NotImplementedError as exc:
    packer = str(exc)
report({"traced_as_rank": prefill.rank, "flags": flags, "shards": [sorted(s) for s in shards], "packer": packer})
"""

PROBE = r"""
import torch, torch_neuronx
from safetensors.torch import load_file

out = sys.argv[1]
full = torch.load(out + "/full.pt")
model = torch.jit.load(out + "/model.pt")
seen = {}

def error(call):
    try:
        call()
    except Exception as exc:
        return str(exc).strip().splitlines()[-1]
    return None

seen["uninitialised"] = error(lambda: model.nxd_model.forward([torch.ones(2, 4)]))
weights = [load_file(f"{out}/weights/tp{r}_sharded_checkpoint.safetensors") for r in range(2)]
seen["files"] = [{k: list(v.shape) for k, v in w.items()} for w in weights]
seen["rank1_is_chunk1"] = torch.equal(weights[1]["up.weight"], full["up.weight"][4:]) and torch.equal(
    weights[1]["down.weight"], full["down.weight"][:, 4:])
model.nxd_model.initialize(weights, torch.tensor([0], dtype=torch.int32))
x = torch.randn(3, 4)
y = x @ full["up.weight"].T @ full["down.weight"].T
out_list = model.nxd_model.forward([x, torch.ones(1)])
seen["prefill_matches_the_whole_model"] = torch.allclose(out_list[0], y.sum(0), atol=1e-5)
state = model.nxd_model.state
seen["state_keys"] = [sorted(rank) for rank in state]
seen["state_updated_on_every_rank"] = all(torch.allclose(rank["kv.0"], y[:2], atol=1e-5) for rank in state)
state[0]["kv.0"].copy_(torch.full((2, 4), 100.0))  # a host write lands where the next call reads
decoded = model.nxd_model.forward([torch.zeros(2, 4)])
seen["host_write_read_by_the_bucket"] = bool((model.nxd_model.state[0]["kv.0"] == 100.0).all())
seen["executor_decode"] = list(model(torch.zeros(2, 4))[0].shape)
seen["executor_prefill"] = error(lambda: model(x, torch.ones(1)))
seen["unknown_shape"] = error(lambda: model.nxd_model.forward([torch.ones(7, 4)]))
seen["wrong_dtype"] = error(lambda: model.nxd_model.forward([torch.ones(2, 4, dtype=torch.bfloat16)]))
old = model.nxd_model.state[0]["kv.0"]
model.nxd_model.initialize_with_saved_weights(torch.tensor([0], dtype=torch.int32))
seen["reset_is_new_zero_state"] = old is not model.nxd_model.state[0]["kv.0"] and float(
    model.nxd_model.state[0]["kv.0"].abs().sum()) == 0.0 and float(old.abs().sum()) > 0
seen["cores"] = list(model.nxd_model.cores)
report(seen)
"""


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    out = tmp_path_factory.mktemp("toy")
    built = run_python(BUILD, out, NEURON_PLATFORM_TARGET_OVERRIDE="trn1")  # a CPU host: no device to ask
    return built, run_python(PROBE, out), out


def test_model_builder_traces_rank_0_and_adds_its_default_flags(toy):
    built, _, _ = toy
    assert built["traced_as_rank"] == 0  # model_builder.py: trace under mock_distributed, rank 0
    # append_default_compiler_flags: --auto-cast kept as given (with a warning), -O1 added when absent
    assert built["flags"]["prefill"] == ["--auto-cast", "all", "-O1"]
    assert built["flags"]["decode"] == ["--model-type=transformer", "-O2", "--auto-cast=none"]


def test_every_key_gives_as_many_unaliased_outputs_as_the_first_keys_packer_takes(toy):
    built, _, _ = toy  # model_builder.py build_packer: one packer, traced from the first key's outputs
    assert "['copy_0'] give another number of unaliased outputs than the first key's 1" in built["packer"]


def test_sharded_checkpoint_files_hold_each_ranks_slice(toy):
    built, seen, _ = toy
    assert built["shards"] == [["down.weight", "up.weight"]] * 2  # keys outside the module dropped
    assert seen["files"] == [{"down.weight": [4, 4], "up.weight": [4, 4]}] * 2
    assert seen["rank1_is_chunk1"]


def test_a_fresh_process_runs_the_saved_model_after_initialize(toy):
    _, seen, _ = toy
    assert "This model is not initialized" in seen["uninitialised"]
    assert seen["prefill_matches_the_whole_model"]  # two ranks, all-reduced, equal the unsharded product
    assert seen["cores"] == [0, 1]


def test_the_traced_executor_takes_the_last_keys_arity_and_forward_routes_by_shapes(toy):
    _, seen, _ = toy
    assert seen["executor_decode"] == [4]
    assert "expected at most 2 argument(s) but received 3" in seen["executor_prefill"]
    assert "Input shape [[7, 4]] not found in input_shape_map" in seen["unknown_shape"]
    assert "input 0 of decode_0 has dtype 15, compiled as dtype 6" in seen["wrong_dtype"]  # bf16, not fp32


def test_state_is_per_rank_updated_in_place_and_replaced_by_a_reset(toy):
    _, seen, _ = toy
    assert seen["state_keys"] == [["kv.0"], ["kv.0"]]
    assert seen["state_updated_on_every_rank"]
    assert seen["host_write_read_by_the_bucket"]
    assert seen["reset_is_new_zero_state"]


def test_placement_follows_the_visible_cores_and_refuses_too_few(toy):
    _, _, out = toy
    code = r"""
import torch, torch_neuronx
from safetensors.torch import load_file
model = torch.jit.load(sys.argv[1] + "/model.pt")
weights = [load_file(f"{sys.argv[1]}/weights/tp{r}_sharded_checkpoint.safetensors") for r in range(2)]
try:
    model.nxd_model.initialize(weights, torch.tensor([0], dtype=torch.int32))
    report(list(model.nxd_model.cores))
except Exception as exc:
    report(str(exc))
"""
    assert run_python(code, out, NEURON_RT_VISIBLE_CORES="0-1") == [0, 1]
    assert "process sees 1 NeuronCore(s) [1]" in run_python(code, out, NEURON_RT_VISIBLE_CORES="1")


PLATFORM = r"""
import torch
from neuronx_distributed.parallel_layers import parallel_state
from neuronx_distributed.trace.model_builder import ModelBuilder, BaseModelInstance

class Plain(torch.nn.Module):
    def forward(self, x):
        return (x + 1,)

builder = ModelBuilder(None, 1, dict, compiler_workdir=sys.argv[1])
builder.add("decode", BaseModelInstance(Plain, {}), [(torch.ones(2),)], "--target inf2")
try:
    builder.trace(initialize_model_weights=False)
except RuntimeError as exc:
    report({"error": str(exc)})
else:
    report({"hardware": parallel_state._HARDWARE_TYPE.name,
            "target": open(sys.argv[1] + "/decode/_tp0_bk0/platform_target.txt").read().strip()})
"""


def test_without_a_device_the_trace_needs_the_platform_override_whatever_the_target_flag(tmp_path):
    # parallel_state.py:558-560 asks the platform with no flags: --target inf2 does not reach it.
    seen = run_python(PLATFORM, tmp_path / "none")
    assert "please supply compiler argument target" in seen["error"]


@pytest.mark.parametrize(("override", "member"), [("trn1", "TRN1"), ("inf2", "CUSTOM")])
def test_the_override_resolves_as_nxds_hardware_enum_does(tmp_path, override, member):
    # utils/utils.py:6-27: CUSTOM takes the override's value, so "inf2" is CUSTOM and "trn1" is TRN1;
    # the compiler still gets the graph's own --target (model_builder.py:608).
    seen = run_python(PLATFORM, tmp_path / override, NEURON_PLATFORM_TARGET_OVERRIDE=override)
    assert seen == {"hardware": member, "target": "inf2"}


STATELESS = r"""
import torch
from torch import nn
from neuronx_distributed.trace.model_builder import ModelBuilder

class Scale(nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.w = nn.Parameter(torch.full((4,), float(factor)), requires_grad=False)

    def forward(self, x):
        return (x * self.w,)

class Instance:  # an encoder's: no state, no aliases
    def __init__(self, factor):
        self.factor = factor

    def load_module(self):
        self.module = Scale(self.factor)

    def get(self, bucket, **_):
        return self.module, {}

out = sys.argv[1]
builder = ModelBuilder(None, 1, lambda: {"w": torch.full((4,), 2.0)}, compiler_workdir=out + "/work")
builder.add("first", Instance(2), [(torch.ones(3, 4),)])
builder.add("same_shapes", Instance(2), [(torch.ones(3, 4),), (torch.ones(5, 4),)])
model = builder.trace(initialize_model_weights=False)
weights = builder.shard_checkpoint()
placeholder = sorted(model.nxd_model.state[0])
model.nxd_model.initialize(weights, torch.tensor([0], dtype=torch.int32))
report({"routes": {k: list(v) for k, v in model.nxd_model.input_shape_map.items()},
        "state_before": placeholder, "state_after": sorted(model.nxd_model.state[0]),
        "out": model.nxd_model.forward([torch.ones(5, 4)])[0].tolist()[0]})
"""


def test_a_model_without_state_keeps_its_placeholder_state_and_a_later_bucket_of_the_same_shapes_wins(tmp_path):
    """model_builder.py build_state_initializer gives None when no input is state, and spmd.py then never
    replaces the placeholder; build_nxd_model fills input_shape_map in key order, so the same shapes
    route to the bucket added last (the compile refuses that: nxd_encoders.check_routable)."""
    seen = run_python(STATELESS, tmp_path, NEURON_PLATFORM_TARGET_OVERRIDE="trn1")
    assert seen["routes"] == {"[[3, 4]]": ["same_shapes", 0], "[[5, 4]]": ["same_shapes", 1]}
    assert seen["state_before"] == seen["state_after"] == ["__neuronprivatetensor__"]
    assert seen["out"] == [2.0] * 4

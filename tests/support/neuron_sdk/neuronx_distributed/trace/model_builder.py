"""ModelBuilder: several keyed models (each a list of bucket example inputs) compiled as one model
that shares its weights and its aliased state, then sharded per rank.

Modelled on src/neuronx_distributed/trace/model_builder.py at tag v2.28.0:
- add(): compiler_args go through append_default_compiler_flags (defaults when empty; `--auto-cast=none`
  added when no --auto-cast is given, a warning when another value is; -O1 when no -O level).
- trace(initialize_model_weights=True): under mock_distributed, rank 0 of tp_degree (parallel_state
  initialised, no live process group; its platform detection raises on a host without a device
  unless NEURON_PLATFORM_TARGET_OVERRIDE is set, parallel_state.py here), each key's instance is
  load_module()d once and get(bucket_rank) per bucket gives (module, {state parameter: output
  index}); the module is lowered with its non-aliased parameters as weight inputs (generate_hlo
  inline_weights_to_neff=False) and its aliased parameters as state. build_nxd_model():
  input_shape_map maps str([list(shape) ...]) of every key's every example to (key, bucket), a later
  example of the same shapes replacing an earlier one's entry (a dict filled in key order); the
  state initializer comes from the first key (none for a model whose buckets alias nothing); the
  executor is torch.jit.trace'd with `example_inputs[0]` of the key added last; one output packer
  for every key, traced from the first key's first bucket's outputs that no state aliases
  (build_packer): a bucket with another number of them is not modelled (raises). With
  initialize_model_weights it shards into compiler_workdir and initialises the model.
- shard_checkpoint(serialize_path): the first key's instance, checkpoint_loader(), keys absent from
  the module's state_dict dropped (trace.py preprocess_checkpoint), tensors cast to the parameter
  dtype (cast_weights), each tensor-parallel parameter cut to chunk `rank` of its partition_dim
  (trace.py shard_children / create_local_weight, stride 1); one
  `tp{rank}_sharded_checkpoint.safetensors` per rank; returns the per-rank dicts.
Not modelled (raises): bucket_config, priority_model_idx, dry_run, pp/ep degrees, multi-node ranks.
Buffers are traced as constants of the graph (NxD's sharder reads parameters only).
"""

import io
import logging
import os
import re
import warnings
from contextlib import contextmanager

import torch
import torch_neuronx._runtime as runtime
from safetensors.torch import save_file
from torch_neuronx.utils.utils import get_platform_target

from ..parallel_layers import parallel_state
from .spmd import NxDModel, NxDModelExecutor

logger = logging.getLogger("Neuron")


def append_default_compiler_flags(compiler_args=""):
    if not compiler_args:
        compiler_args = "--enable-saturate-infinity --auto-cast=none --model-type=transformer -O1"
    if "--auto-cast" not in compiler_args:
        compiler_args += " --auto-cast=none "
    elif "--auto-cast=none" not in compiler_args:
        logger.warning(
            "Compiler argument ``--auto-cast=none`` not detected. Other values might result in lower accuracy"
        )
    if not re.search(r"-O\d+", compiler_args):
        compiler_args += " -O1 "
    return compiler_args


class BaseModelInstance:
    def __init__(self, module_cls, input_output_aliases):
        self.module_cls = module_cls
        self.module = None
        self.input_output_aliases = [input_output_aliases]

    def load_module(self):
        self.module = self.module_cls()

    def get(self, bucket_rank, **kwargs):
        return self.module, self.input_output_aliases[0]


@contextmanager
def _mock_distributed(tp: int):
    parallel_state.initialize_model_parallel(tp, rank=0)
    try:
        yield
    finally:
        parallel_state.destroy_model_parallel()


@contextmanager
def _as_inputs(module: torch.nn.Module, names: list[str], tensors):
    """The named parameters replaced by plain tensors (graph inputs) for the duration of a trace."""
    saved = []
    for name, tensor in zip(names, tensors):
        owner, _, attr = name.rpartition(".")
        sub = module.get_submodule(owner)
        saved.append((sub, attr, sub._parameters.pop(attr)))
        setattr(sub, attr, tensor)
    try:
        yield
    finally:
        for sub, attr, param in saved:
            delattr(sub, attr)
            sub._parameters[attr] = param


class _Lowered:
    """One bucket compiled: the graph's bytes and how its inputs and outputs map to weights and state."""

    def __init__(self, module, aliases, example_inputs, state_names):
        params = dict(module.named_parameters(remove_duplicate=False))
        by_id = {id(p): n for n, p in params.items()}
        aliased = {by_id[id(p)]: index for p, index in aliases.items()}
        if sorted(aliased) != sorted(state_names):
            raise NotImplementedError(
                f"buckets alias different state ({sorted(aliased)} vs {sorted(state_names)}): not modelled"
            )
        self.weight_names = [n for n in params if n not in aliased]
        self.aliased = [aliased[n] for n in state_names]
        names = self.weight_names + list(state_names)
        tensors = [params[n].detach() for n in names]

        def graph(*args):
            with _as_inputs(module, names, args[len(example_inputs) :]):
                return module(*args[: len(example_inputs)])

        with runtime.tracing(), warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            traced = torch.jit.trace(graph, (*example_inputs, *tensors), check_trace=False)
            outputs = graph(*example_inputs, *tensors)
        for name, index in zip(state_names, self.aliased):
            if index >= len(outputs) or outputs[index].shape != params[name].shape:
                raise ValueError(
                    f"state {name} {tuple(params[name].shape)} is aliased to output {index}, which has another shape"
                )
        buf = io.BytesIO()
        torch.jit.save(traced, buf)
        self.neff = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        self.outputs = len(outputs) - len(self.aliased)  # what the packer packs
        self.input_types = [torch.empty(0, dtype=t.dtype) for t in example_inputs]


class ModelBuilder:
    def __init__(
        self,
        router,
        tp_degree,
        checkpoint_loader,
        start_rank_id=0,
        pp_degree=1,
        ep_degree=1,
        local_ranks_size=None,
        world_size=None,
        compiler_workdir=None,
        **other,
    ):
        if (
            pp_degree != 1
            or ep_degree != 1
            or start_rank_id != 0
            or world_size not in (None, tp_degree)
            or local_ranks_size not in (None, tp_degree)
            or any(other.values())
        ):
            raise NotImplementedError("the stand-in models one node of tp ranks, nothing else")
        self.tp_degree = tp_degree
        self.checkpoint_loader = checkpoint_loader
        self.compiler_workdir = compiler_workdir or "/tmp/nxd_model/"
        self.model_collection = {}

    def add(self, key, model_instance, example_inputs, compiler_args=None, bucket_config=None, priority_model_idx=None):
        if bucket_config is not None or priority_model_idx is not None:
            raise NotImplementedError("bucket_config / priority_model_idx are not modelled")
        self.model_collection[key] = (
            model_instance,
            [tuple(e) for e in example_inputs],
            append_default_compiler_flags(compiler_args),
        )
        return self

    def trace(self, initialize_model_weights=True, dry_run=False):
        if dry_run:
            raise NotImplementedError("dry_run is not modelled")
        lowered, state = {}, None
        with _mock_distributed(self.tp_degree):
            for key, (instance, examples, flags) in self.model_collection.items():
                instance.load_module()
                for bucket, example in enumerate(examples):
                    module, aliases = instance.get(bucket)
                    if state is None:  # the state initializer is the first key's
                        params = dict(module.named_parameters())
                        names = [n for n, p in params.items() if any(p is a for a in aliases)]
                        state = (names, [torch.zeros(params[n].shape, dtype=params[n].dtype) for n in names])
                    lowered[(key, bucket)] = _Lowered(module, aliases, example, state[0])
                    self._record(key, bucket, flags)
        packed = next(iter(lowered.values())).outputs
        odd = [f"{k}_{b}" for (k, b), low in lowered.items() if low.outputs != packed]
        if odd:
            raise NotImplementedError(
                f"{odd} give another number of unaliased outputs than the first key's "
                f"{packed}, which its one packer is traced from: not modelled"
            )
        shape_map = {}
        for (key, bucket), _ in lowered.items():
            example = self.model_collection[key][1][bucket]
            shape_map[str([list(t.shape) for t in example])] = (key, bucket)
        ids = {f"{k}_{b}": low for (k, b), low in lowered.items()}
        nxd_model = torch.jit.script(
            NxDModel(
                {i: low.neff for i, low in ids.items()},
                shape_map,
                {i: low.input_types for i, low in ids.items()},
                {i: low.weight_names for i, low in ids.items()},
                {i: low.aliased for i, low in ids.items()},
                state[0],
                state[1],
                self.tp_degree,
            )
        )
        last = list(self.model_collection.values())[-1][1]
        nxd_model.mocked = True  # ModelBuilder mocks initialisation for the executor's trace
        executor = torch.jit.trace(NxDModelExecutor(nxd_model), last[0], strict=False)
        executor.nxd_model.mocked = False
        if initialize_model_weights:
            weights = self.shard_checkpoint(self.compiler_workdir)
            executor.nxd_model.initialize(weights, torch.tensor([0], dtype=torch.int32))
        return executor

    def _record(self, key, bucket, flags):
        """The compiler flags each graph would be compiled with, where ModelBuilder keeps its work, and
        the platform it compiles for: get_platform_target(flags) (model_builder.py:608), which reads a
        `--target` in the flags before it asks the machine."""
        folder = os.path.join(self.compiler_workdir, key, f"_tp0_bk{bucket}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "compiler_flags.txt"), "w") as f:
            f.write(flags.strip() + "\n")
        with open(os.path.join(folder, "platform_target.txt"), "w") as f:
            f.write(get_platform_target(flags) + "\n")

    def shard_checkpoint(self, serialize_path=None):
        if serialize_path is not None:
            os.makedirs(serialize_path, exist_ok=True)
        instance = next(iter(self.model_collection.values()))[0]
        with _mock_distributed(self.tp_degree):
            instance.load_module()
            model, _ = instance.get(0)
            checkpoint = self.checkpoint_loader()
            names = set(model.state_dict())
            for key in [k for k in checkpoint if k not in names]:
                checkpoint.pop(key)
            params = dict(model.named_parameters())
            for name, param in params.items():
                if name in checkpoint and checkpoint[name].dtype != param.dtype:
                    checkpoint[name] = checkpoint[name].to(param.dtype)
            out = []
            for rank in range(self.tp_degree):
                sharded = dict(checkpoint)
                for name, param in params.items():
                    if getattr(param, "tensor_model_parallel", False) and name in sharded:
                        size = sharded[name].shape[param.partition_dim] // param.num_partitions
                        sharded[name] = sharded[name].narrow(param.partition_dim, rank * size, size)
                if serialize_path is not None:
                    save_file(
                        {k: v.contiguous() for k, v in sharded.items()},
                        os.path.join(serialize_path, f"tp{rank}_sharded_checkpoint.safetensors"),
                    )
                out.append(sharded)
        return out

"""The traced NxD model: what `torch.jit.load` gives back and what the server calls.

Modelled on src/neuronx_distributed/trace/spmd.py at tag v2.28.0:
- NxDModel.router keys a call by `str([tensor.shape for tensor in inputs])` (TorchScript prints a
  shape as a list of ints) in `input_shape_map`; a shape compiled for no bucket is a ValueError
  "Input shape ... not found in input_shape_map".
- NxDModel.forward(inputs: List[Tensor]) runs the routed bucket; a model neither initialize()d
  nor initialize_with_saved_weights()d raises SPMDBucketModelScript's "This model is not
  initialized" ValueError.
- initialize(checkpoint: one dict per local rank, start_rank_tensor) loads the weights (a copy on
  the device) and builds fresh zero state; initialize_with_saved_weights(start_rank_tensor) builds
  fresh zero state over the weights already loaded. `state` is one dict per rank, keyed by the
  module's name of each aliased tensor (StateInitializer, from the metaneff's checkpoint keys).
  A model with no aliased tensor has no state initializer (model_builder.py build_state_initializer
  returns None) and keeps its placeholder state. NxD Inference reads it with
  `nxd_model.state[rank][key].to("cpu")` (utils/snapshot.py), and
  NxD's V2 model writes a buffer with `.copy_(tensor)` after a shape check
  (trace/nxd_model/nxd_model.py write_to_neuron_buffer).
- NxDModelExecutor.forward(*inputs) = nxd_model(list(inputs)), *traced* by ModelBuilder with one
  example: its TorchScript forward takes exactly that example's number of tensors.
Outputs: the bucket's outputs that no state aliases, as a list (the real packer's structure is not
in the source; callers take element 0). Input dtypes must be the compiled ones (a neff's tensors
have fixed types; the real error is not in the source, so this one is the stand-in's).
"""

import torch
import torch_neuronx  # noqa: F401 - registers the runtime ops this module calls


class NxDModel(torch.nn.Module):
    neffs: dict[str, torch.Tensor]
    input_shape_map: dict[str, tuple[str, int]]
    input_types: dict[str, list[torch.Tensor]]
    weight_names: dict[str, list[str]]
    aliased: dict[str, list[int]]
    state_names: list[str]
    state_zeros: list[torch.Tensor]
    local_ranks: int
    weights: list[dict[str, torch.Tensor]]
    state: list[dict[str, torch.Tensor]]
    cores: list[int]
    loaded: bool
    initialized: bool
    mocked: bool

    def __init__(
        self,
        neffs: dict[str, torch.Tensor],
        input_shape_map: dict[str, tuple[str, int]],
        input_types: dict[str, list[torch.Tensor]],
        weight_names: dict[str, list[str]],
        aliased: dict[str, list[int]],
        state_names: list[str],
        state_zeros: list[torch.Tensor],
        local_ranks: int,
    ):
        super().__init__()
        self.neffs = neffs
        self.input_shape_map = input_shape_map
        self.input_types = input_types  # empty tensors of each input's compiled dtype
        self.weight_names = weight_names
        self.aliased = aliased
        self.state_names = state_names
        self.state_zeros = state_zeros
        self.local_ranks = local_ranks
        self.weights = [{"__neuronprivatetensor__": torch.tensor(0)}]
        self.state = [{"__neuronprivatetensor__": torch.tensor(0)}]
        self.cores = []
        self.loaded = False
        self.initialized = False
        self.mocked = False

    def _fresh_state(self) -> list[dict[str, torch.Tensor]]:
        out: list[dict[str, torch.Tensor]] = []
        for _ in range(self.local_ranks):
            rank: dict[str, torch.Tensor] = {}
            for name, zero in zip(self.state_names, self.state_zeros):
                rank[name] = zero.clone()
            out.append(rank)
        return out

    @torch.jit.export
    def initialize(self, checkpoint: list[dict[str, torch.Tensor]], start_rank_tensor: torch.Tensor):
        if len(checkpoint) != self.local_ranks:
            raise ValueError(
                "initialize() got "
                + str(len(checkpoint))
                + " rank checkpoints for a model of "
                + str(self.local_ranks)
                + " local ranks"
            )
        weights: list[dict[str, torch.Tensor]] = []
        for rank, ckpt in enumerate(checkpoint):
            on_device: dict[str, torch.Tensor] = {}
            for names in self.weight_names.values():
                for name in names:
                    if name not in ckpt:
                        raise ValueError("rank " + str(rank) + " checkpoint has no weight " + name)
                    on_device[name] = ckpt[name].clone()
            weights.append(on_device)
        self.cores = torch.ops.nxd_standin.place(self.local_ranks, start_rank_tensor)
        self.weights = weights
        self.loaded = True
        if len(self.state_names) > 0:  # a model without state has no state initializer
            self.state = self._fresh_state()
        self.initialized = True

    @torch.jit.export
    def initialize_with_saved_weights(self, start_rank_tensor: torch.Tensor):
        if not self.loaded:
            raise ValueError(
                "initialize_with_saved_weights() before any initialize(): no weights on the device (not modelled)"
            )
        self.cores = torch.ops.nxd_standin.place(self.local_ranks, start_rank_tensor)
        if len(self.state_names) > 0:
            self.state = self._fresh_state()
        self.initialized = True

    def router(self, inputs: list[torch.Tensor]) -> tuple[str, int]:
        actual_shape = str([tensor.shape for tensor in inputs])
        if actual_shape not in self.input_shape_map:
            raise ValueError(
                "Input shape "
                + actual_shape
                + " not found in input_shape_map: "
                + str(list(self.input_shape_map.keys()))
            )
        return self.input_shape_map[actual_shape]

    def forward(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        model_name, bucket_idx = self.router(inputs)
        if self.mocked:
            return [torch.zeros(0)]
        if not self.initialized:
            raise ValueError(
                "This model is not initialized, please call traced_model.nxd_model.initialize("
                "sharded_checkpoint) or traced_model.nxd_model.initialize_with_saved_weights()"
            )
        bucket = model_name + "_" + str(bucket_idx)
        compiled = self.input_types[bucket]
        for i in range(len(compiled)):
            if inputs[i].dtype != compiled[i].dtype:
                raise ValueError(
                    "input "
                    + str(i)
                    + " of "
                    + bucket
                    + " has dtype "
                    + str(inputs[i].dtype)
                    + ", compiled as dtype "
                    + str(compiled[i].dtype)
                    + " (torch ScalarType codes)"
                )
        flat_weights: list[torch.Tensor] = []
        flat_states: list[torch.Tensor] = []
        for rank in range(self.local_ranks):
            for name in self.weight_names[bucket]:
                flat_weights.append(self.weights[rank][name])
            for name in self.state_names:
                flat_states.append(self.state[rank][name])
        return torch.ops.nxd_standin.spmd_run(
            self.neffs[bucket], inputs, flat_weights, flat_states, self.local_ranks, self.aliased[bucket]
        )


class NxDModelExecutor(torch.nn.Module):
    def __init__(self, nxd_model):
        super().__init__()
        self.nxd_model = nxd_model

    def forward(self, *inputs):
        return self.nxd_model(list(inputs))

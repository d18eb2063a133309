"""The stand-in's NeuronCore runtime: cores, placement, and SPMD execution of a compiled bucket.

A real NxD model keeps each bucket as a `torch.classes.neuron.SPMDModel` holding a neff; executing
it runs the same program on every local rank's core with that rank's weights and state, and the
collectives inside it join the ranks. Here a "neff" is a serialized TorchScript function of
(inputs, weights, states) traced from rank 0's module (as ModelBuilder traces rank 0 only), and the
ranks run it in threads whose `all_reduce` meets at a barrier. Registered as torch ops so a saved
model calls them from TorchScript after `torch.jit.load`, in any process that imported torch_neuronx.

Sources (aws-neuron/neuronx-distributed at tag v2.28.0 unless named otherwise):
- src/neuronx_distributed/trace/spmd.py: StateInitializer puts rank r's state on
  `privateuseone:{r}`, i.e. the r-th core visible to the process.
- src/neuronx_distributed/parallel_layers/mappings.py `_reduce`: an all-reduce SUM over the tensor
  parallel group, skipped when the group has one rank.
- aws-neuron-sdk frameworks/torch/torch-neuronx/programming-guide/inference/core-placement.rst:
  NEURON_RT_VISIBLE_CORES names the cores a process owns ("0", "0,1", "4-5"); neuron-runtime/
  nrt-developer-guide.rst:1051-1054: one contiguous increasing run, a gap is refused.
- NxD Inference at its SDK 2.28 release (models/application_base.py:326, :414) loads a ModelBuilder
  model with a plain torch.jit.load and places it by the start rank of initialize(); so does the
  server, and torch_neuronx.neuron_cores_context (for torch_neuronx.trace models) is not modelled.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading

import torch

MACHINE_CORES = 2  # one Inferentia2 chip (inf2.xlarge / inf2.8xlarge): two NeuronCore-v2
_local = threading.local()
_graphs: dict[tuple[int, int], torch.jit.ScriptModule] = {}
_graphs_lock = threading.Lock()
_tracing = threading.local()


def visible_cores() -> list[int]:
    """Absolute ids of the cores this process may use, as the runtime reads them from the environment."""
    raw = os.environ.get("NEURON_RT_VISIBLE_CORES", "").strip()
    if not raw:
        return list(range(MACHINE_CORES))
    cores = []
    for part in raw.split(","):
        first, _, last = part.partition("-")
        cores += range(int(first), int(last or first) + 1)
    if cores != list(range(cores[0], cores[0] + len(cores))):
        # the runtime refuses a gap or a step back (nrt-developer-guide.rst:1053-1054)
        raise RuntimeError(f"NEURON_RT_VISIBLE_CORES={raw}: the cores must be contiguous, in increasing order")
    bad = [c for c in cores if not 0 <= c < MACHINE_CORES]
    if bad:
        raise RuntimeError(
            f"NEURON_RT_VISIBLE_CORES={raw}: no NeuronCore {bad} on this machine (it has {MACHINE_CORES})"
        )
    return cores


@contextlib.contextmanager
def tracing():
    """While ModelBuilder lowers rank 0's module there is no peer: a collective is recorded, not run."""
    _tracing.on = True
    try:
        yield
    finally:
        _tracing.on = False


_LIB = torch.library.Library("nxd_standin", "DEF")
_LIB.define("all_reduce(Tensor x) -> Tensor")
_LIB.define("place(int ranks, Tensor start_rank) -> int[]")
_LIB.define(
    "spmd_run(Tensor neff, Tensor[] inputs, Tensor[] weights, Tensor(a!)[] states, int ranks, "
    "int[] aliased) -> Tensor[]"
)


@torch.library.impl(_LIB, "all_reduce", "CPU")
def _all_reduce(x: torch.Tensor) -> torch.Tensor:
    group = getattr(_local, "group", None)
    if group is None:
        if getattr(_tracing, "on", False):
            return x.clone()
        raise RuntimeError("a collective ran outside an SPMD execution (no rank group)")
    return group.reduce(_local.rank, x)


@torch.library.impl(_LIB, "place", "CPU")
def _place(ranks: int, start_rank: torch.Tensor) -> list[int]:
    if int(start_rank.reshape(-1)[0]) != 0:
        raise NotImplementedError("the stand-in models one node: start_rank must be 0")
    cores = visible_cores()
    if ranks > len(cores):
        raise RuntimeError(
            f"the model has {ranks} ranks, the process sees {len(cores)} NeuronCore(s) {cores} "
            f"(NEURON_RT_VISIBLE_CORES={os.environ.get('NEURON_RT_VISIBLE_CORES', '')!r})"
        )
    return cores[:ranks]


class _Group:
    """One SPMD execution's ranks: every all-reduce is a barrier, then the same sum on every rank."""

    def __init__(self, ranks: int):
        self.barrier = threading.Barrier(ranks, timeout=600)
        self.slots: list[torch.Tensor | None] = [None] * ranks

    def reduce(self, rank: int, x: torch.Tensor) -> torch.Tensor:
        self.slots[rank] = x
        self.barrier.wait()
        total = self.slots[0]
        for part in self.slots[1:]:
            total = total + part  # rank order: every rank sums alike
        self.barrier.wait()  # nobody overwrites a slot before all have read it
        return total


def _graph(neff: torch.Tensor) -> torch.jit.ScriptModule:
    key = (neff.data_ptr(), neff.numel())
    with _graphs_lock:
        if key not in _graphs:
            _graphs[key] = torch.jit.load(io.BytesIO(neff.numpy().tobytes()))
        return _graphs[key]


def _run_rank(graph, group, rank, inputs, weights, states, out, errors):
    _local.group, _local.rank = group, rank
    try:
        out[rank] = graph(*inputs, *weights, *states)
    except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
        errors.append(exc)
        group.barrier.abort()  # peers waiting in an all-reduce fail instead of hanging
    finally:
        _local.group = None


@torch.library.impl(_LIB, "spmd_run", "CPU")
def _spmd_run(neff, inputs, weights, states, ranks: int, aliased: list[int]):
    graph = _graph(neff)
    n_w, n_s = len(weights) // ranks, len(states) // ranks
    per_rank = [(weights[r * n_w : (r + 1) * n_w], states[r * n_s : (r + 1) * n_s]) for r in range(ranks)]
    group, out, errors = _Group(ranks), [None] * ranks, []
    if ranks == 1:
        _run_rank(graph, group, 0, inputs, *per_rank[0], out, errors)
    else:
        threads = [
            threading.Thread(target=_run_rank, args=(graph, group, r, inputs, *per_rank[r], out, errors))
            for r in range(ranks)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    with torch.no_grad():
        for r, (_, rank_states) in enumerate(per_rank):
            for state, index in zip(rank_states, aliased, strict=True):
                state.copy_(out[r][index])  # the aliased output lands in the state, in place
    return [t for i, t in enumerate(out[0]) if i not in aliased]

"""`build.py compile` for a `tp > 1` variant on the CPU: every rank traces its own graphs.

The ranks run as processes in one gloo group (runtime.tp_backend.RankGroup). Each builds the
decoder of its shard only, loads only its slices of the checkpoint, and traces its prefill and
decode graphs with the all-reduce inside them; the traces run in lockstep because each one
executes its all-reduces. Host tables, inputs and golden tokens are those of tp 1: replicated.
"""

from __future__ import annotations

from pathlib import Path

import torch

from runtime.artifact import Geometry
from runtime.hostside import DTYPES, HostInputs
from runtime.tp_backend import RankGroup, all_reduce

from .checkpoint import CheckpointReader, read_text_config, resolve_checkpoint
from .compile import _finish, _prepare, _step, geometry, host_tables, trace_cpu
from .manifest import Manifest, Variant
from .model import Gemma4Decoder
from .sharding import ModelShard, shard_model


class _RankTracer:
    """One rank's decoder: its shard of the weights, with `reduce` = the traceable all-reduce."""

    def __init__(self, rank: int, tp: int, ckpt: Path, geo: Geometry, shards: list[ModelShard]):
        reader = CheckpointReader(ckpt)
        self.rank, self.geo = rank, geo
        self.decoder = Gemma4Decoder(shards[rank], DTYPES[geo.dtype], all_reduce)
        self.decoder.load_weights(reader)  # reads only this rank's rows/columns (get_slice)
        self.host = HostInputs(geo, host_tables(reader, geo))

    def trace(self, out: Path) -> dict[str, str]:
        prefix = f"rank{self.rank}/"
        (out / "graphs" / prefix).mkdir()
        return trace_cpu(self.decoder, self.host, self.geo, out, prefix)


def compile_tp_cpu(manifest: Manifest, variant: Variant, out: Path, progress=None) -> Path:
    torch.set_grad_enabled(False)
    with _step(progress, "checkpoint"):
        ckpt = resolve_checkpoint(manifest)
        config = read_text_config(ckpt)
        reader = CheckpointReader(ckpt)
    # The plan is made once, here: a plan that cannot hold fails before any process starts.
    shards = [shard_model(config, variant.tp, r) for r in range(variant.tp)]
    geo = geometry(config, shards[0], variant)  # every rank has the same per-rank shapes and inputs
    _prepare(out, ckpt)
    tables = host_tables(reader, geo)
    with _step(progress, f"{variant.tp} ranks (gloo): load each rank's shard, trace with all-reduce, lint"):
        group = RankGroup(variant.tp, _RankTracer, (ckpt, geo, shards))
        try:
            graphs = {k: v for per_rank in group.call("trace", out) for k, v in per_rank.items()}
        finally:
            group.close()
    return _finish(manifest, variant, out, ckpt, geo, graphs, tables, "cpu", progress)

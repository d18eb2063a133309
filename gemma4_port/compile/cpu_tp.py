"""`build.py compile` for a `tp > 1` variant on the CPU: every rank traces its own graphs.

The ranks run as processes in one gloo group (runtime.model.ranks.RankGroup). Each builds the
decoder of its shard only, loads only its slices of the checkpoint, and traces its prefill and
decode graphs with the all-reduce inside them; the traces run in lockstep because each one
executes its all-reduces. Host tables, inputs and golden tokens are those of tp 1: replicated
(a rank reads only the table rows its example inputs look up). The image and audio encoders are not split
(a few hundred MB at the real size, and its output goes to the host): rank 0 traces it whole.
"""

from __future__ import annotations

from pathlib import Path

from contract.artifact import Geometry
from contract.dtypes import DTYPES
from contract.hostside import HostInputs
from gemma4_port.compile.encoders import load_encoder
from gemma4_port.compile.pipeline import Build, step
from gemma4_port.compile.tracing import EXAMPLE_TOKEN, host_tables, trace_cpu
from gemma4_port.port.decoder import Gemma4Decoder
from gemma4_port.port.drafter import Gemma4Drafter
from gemma4_port.port.sharding import ModelShard
from gemma4_port.source.checkpoint_files import CheckpointReader
from runtime.model.ranks import RankGroup, all_reduce


class _RankTracer:
    """One rank's decoder: its shard of the weights, with `reduce` = the traceable all-reduce."""

    def __init__(
        self,
        rank: int,
        tp: int,
        ckpt: Path,
        geo: Geometry,
        shards: list[ModelShard],
        vision=None,
        audio=None,
        drafter=None,
    ):
        reader = CheckpointReader(ckpt)
        self.rank, self.geo = rank, geo
        self.decoder = Gemma4Decoder(shards[rank], DTYPES[geo.dtype], all_reduce)
        self.decoder.load_weights(reader)  # reads only this rank's rows/columns (get_slice)
        self.drafter = None
        if drafter is not None:  # (checkpoint folder, this rank's DrafterShard per rank)
            self.drafter = Gemma4Drafter(drafter[1][rank], DTYPES[geo.dtype], all_reduce)
            self.drafter.load_weights(CheckpointReader(drafter[0]))
        self.host = HostInputs(geo, host_tables(reader, geo, rows=EXAMPLE_TOKEN + 1))
        self.vision = load_encoder("vision", vision, geo, reader) if rank == 0 else None
        self.audio = load_encoder("audio", audio, geo, reader) if rank == 0 else None

    def trace(self, out: Path) -> dict[str, str]:
        prefix = f"rank{self.rank}/"
        (out / "graphs" / prefix).mkdir()
        return trace_cpu(
            self.decoder, self.host, self.geo, out, prefix, vision=self.vision, audio=self.audio, drafter=self.drafter
        )


class CpuTensorParallelGraphs:
    """tp > 1 on the CPU: each rank traces its own graphs in a process of the group."""

    backend = "cpu"

    def check(self) -> dict[str, str]:
        return {}

    def graphs(self, b: Build, progress) -> dict[str, str]:
        tp = b.variant.tp
        with step(progress, f"{tp} ranks (gloo): load each rank's shard, trace with all-reduce, lint"):
            drafter = (b.drafter.ckpt, b.drafter.shards) if b.drafter else None
            group = RankGroup(tp, _RankTracer, (b.ckpt, b.geo, b.shards, b.vision, b.audio, drafter))
            try:
                return {k: v for per_rank in group.call("trace", b.out) for k, v in per_rank.items()}
            finally:
                group.close()

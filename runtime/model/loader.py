"""Load an artifact directory exactly one way, and prove it with the self-test: the server, compile
and `build.py verify` all come here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from contract.artifact import ArtifactError, ArtifactMeta, check_files, load_meta
from contract.errors import Gemma4Error
from contract.hostside import HostInputs, HostTables
from contract.logit_error import judge_golden
from contract.media_inputs import AudioInputs, VisionInputs
from contract.tokenizer import check_vocab, load_tokenizer
from runtime.model.backend import Backend
from runtime.model.runner import ModelRunner
from runtime.model.timed import TimedEncoders


class SelfTestFailed(Gemma4Error, RuntimeError):
    pass


@dataclass
class LoadedModel:
    folder: Path
    meta: ArtifactMeta
    tokenizer: object
    runner: ModelRunner

    def close(self) -> None:
        self.runner.backend.close()

    def self_test(self) -> None:
        """Every golden prompt of artifact.json through the real graphs, judged against the float
        reference's best logits that compile stored for each step: the reference's tokens, or a
        near-tie within the dtype's logit bound, so a server is never failed by luck nor passes
        garbage. Goldens rotate over the slots so every slot is exercised when there are enough."""
        meta = self.meta
        if not meta.golden:
            raise SelfTestFailed("artifact.json has no golden prompts: nothing proves the output correct")
        geo = meta.geometry
        for i, golden in enumerate(meta.golden):
            slot = i % geo.batch
            tokens, logits = self.runner.greedy(list(golden.ids), len(golden.tokens), slot)
            _, problem = judge_golden(golden, tokens, logits, geo.softcap, geo.dtype)
            if problem:
                raise SelfTestFailed(
                    f"golden prompt {golden.name!r} (slot {slot}) gave {tokens}, the float "
                    f"reference {list(golden.tokens)}: {problem}"
                )


def make_backend(folder: Path, meta: ArtifactMeta) -> Backend:
    """The backend the artifact was compiled for; each is imported only when chosen (the Neuron one
    needs the SDK, the tp one spawns processes)."""
    if meta.backend == "cpu" and meta.geometry.tp == 1:
        from runtime.model.cpu import CpuBackend

        return CpuBackend(folder, meta)
    if meta.backend == "cpu":
        from runtime.model.tp import CpuTensorParallelBackend

        return CpuTensorParallelBackend(folder, meta)
    from runtime.model.neuron import NeuronBackend

    return NeuronBackend(folder, meta)


def load_artifact(
    folder: str | Path, check_sha256: bool = True, on_encode: Callable[[str, float], None] | None = None
) -> LoadedModel:
    """The artifact's model ready to run; `on_encode(kind, seconds)` is told of every encoder run."""
    folder = Path(folder)
    meta = load_meta(folder)
    if check_sha256:
        problems = check_files(folder, meta)
        if problems:
            raise ArtifactError(f"{folder}: " + "; ".join(problems))
    tokenizer = load_tokenizer(folder / "tokenizer")
    check_vocab(tokenizer, meta.geometry.vocab, str(folder / "tokenizer"))
    geo = meta.geometry
    tables = HostTables(folder, geo)
    vision = VisionInputs(geo, tables.vision_positions) if tables.vision_positions is not None else None
    audio = AudioInputs(geo) if geo.audio is not None else None
    host = HostInputs(geo, tables)
    backend = make_backend(folder, meta)
    if on_encode is not None and (vision is not None or audio is not None):
        backend = TimedEncoders(backend, on_encode)
    runner = ModelRunner(geo, host, backend, vision, audio, draft_order=tables.draft_order)
    return LoadedModel(folder, meta, tokenizer, runner)

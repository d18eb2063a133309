"""Load an artifact directory exactly one way: the server and `build.py verify` both come here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from contract.artifact import ArtifactError, ArtifactMeta, check_files, load_meta
from contract.hostside import HostInputs, HostTables
from contract.tokenizer import load_tokenizer

from .runner import Backend, ModelRunner


@dataclass
class LoadedModel:
    folder: Path
    meta: ArtifactMeta
    tokenizer: object
    runner: ModelRunner

    def close(self) -> None:
        self.runner.backend.close()


def make_backend(folder: Path, meta: ArtifactMeta) -> Backend:
    """The backend the artifact was compiled for; each is imported only when chosen (the Neuron one
    needs the SDK, the tp one spawns processes)."""
    if meta.backend == "cpu" and meta.geometry.tp == 1:
        from .cpu import CpuBackend

        return CpuBackend(folder, meta)
    if meta.backend == "cpu":
        from .tp import CpuTensorParallelBackend

        return CpuTensorParallelBackend(folder, meta)
    from .neuron import NeuronBackend

    return NeuronBackend(folder, meta)


def load_artifact(folder: str | Path, check_sha256: bool = True) -> LoadedModel:
    folder = Path(folder)
    meta = load_meta(folder)
    if check_sha256:
        problems = check_files(folder, meta)
        if problems:
            raise ArtifactError(f"{folder}: " + "; ".join(problems))
    tokenizer = load_tokenizer(folder / "tokenizer")
    tables = HostTables(folder, meta.geometry)
    runner = ModelRunner(meta.geometry, HostInputs(meta.geometry, tables), make_backend(folder, meta))
    return LoadedModel(folder, meta, tokenizer, runner)

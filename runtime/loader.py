"""Load an artifact directory exactly one way: the server and `build.py verify` both come here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .artifact import ArtifactError, ArtifactMeta, check_files, load_meta
from .backends import make_backend
from .hostside import HostInputs, HostTables
from .runner import ModelRunner
from .tokenizer import load_tokenizer


@dataclass
class LoadedModel:
    folder: Path
    meta: ArtifactMeta
    tokenizer: object
    tables: HostTables
    runner: ModelRunner

    def close(self) -> None:
        self.runner.backend.close()


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
    return LoadedModel(folder, meta, tokenizer, tables, runner)

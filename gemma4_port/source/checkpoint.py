"""The manifest's checkpoint folder (and its drafter's): a random one written once into the cache, a local one
checked against its pinned digest, a hub one downloaded with huggingface_hub."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from gemma4_port.source.checkpoint_files import CheckpointError
from gemma4_port.source.checkpoint_writer import write_random_checkpoint, write_random_drafter
from gemma4_port.source.manifest import Manifest
from gemma4_port.source.model_sources import Speculative, is_hub_id
from gemma4_port.source.toy_tokenizer import TEMPLATE_FILE

# Part of a random checkpoint's cache key: bump it when the writer's output changes, so that a cache
# made by an older writer (e.g. one with Gemma-3's chat tokens) is never reused.
RANDOM_FORMAT = "4"  # 3: vision / audio towers and their processors; 4: the processors in one processor_config.json


def cache_root() -> Path:
    return Path(os.environ.get("GEMMA4_INF2_CACHE", Path.home() / ".cache" / "gemma4-inf2"))


def resolve_checkpoint(manifest: Manifest, progress=None) -> Path:
    """The local folder holding the manifest's checkpoint, creating or downloading it if needed."""
    src = manifest.model
    if src.random is not None:
        random = src.random
        # The chat template is written into the checkpoint too: a change to it makes a new one.
        return _random_folder(
            manifest.name,
            random.model_dump_json() + TEMPLATE_FILE.read_text(),
            lambda tmp: write_random_checkpoint(random, tmp),
        )
    folder = local_folder(manifest)
    if folder is not None:
        return _pinned(folder, src.digest, "model.digest")
    return _local_or_download(src.source, src.revision)


def resolve_drafter(manifest: Manifest, spec: Speculative, backbone: int) -> Path:
    """The local folder holding the speculative drafter's checkpoint (a random one is written for a
    target of width `backbone`, like a random target)."""
    if spec.random is not None:
        random = spec.random
        return _random_folder(
            f"{manifest.name}-drafter",
            random.model_dump_json() + f"/{backbone}",
            lambda tmp: write_random_drafter(random, backbone, tmp),
        )
    assert spec.drafter is not None  # Speculative.has_drafter, checked by the caller
    folder = _local_source(manifest, spec.drafter, "speculative.drafter")
    if folder is not None:
        return _pinned(folder, spec.digest, "speculative.digest")
    return _local_or_download(spec.drafter, spec.revision)


def _pinned(folder: Path, digest: str | None, field: str) -> Path:
    """`folder`, if its files are what the manifest's `field` pins (or nothing is pinned)."""
    if digest is not None and (found := folder_digest(folder)) != digest:
        raise CheckpointError(
            f"{folder}: its files' digest is {found}, but the manifest pins {digest} "
            f"(the folder changed since the manifest was written: restore it, or update {field})"
        )
    return folder


def _random_folder(name: str, spec_json: str, write) -> Path:
    key = hashlib.sha256((RANDOM_FORMAT + spec_json).encode()).hexdigest()[:12]
    folder = cache_root() / "random" / f"{name}-{key}"
    if not folder.is_dir():
        # Written aside and renamed: concurrent builds never see (or write) a half-made checkpoint.
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        write(tmp)
        try:
            tmp.rename(folder)
        except OSError:  # another process finished first; its bytes are the same
            shutil.rmtree(tmp)
    return folder


def _local_or_download(source: str, revision: str | None) -> Path:
    if Path(source).expanduser().is_dir():
        return Path(source).expanduser()
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(
                source,
                revision=revision,
                allow_patterns=["*.json", "*.safetensors", "*.jinja", "tokenizer*"],
            )
        )
    except Exception as exc:  # noqa: BLE001 - the hub raises HTTP, OS and value errors alike: one line for all
        raise CheckpointError(
            f"cannot download {source}@{revision or 'main'}: {exc} "
            "(gated models need `huggingface-cli login` or HF_TOKEN)"
        ) from None


def local_folder(manifest: Manifest) -> Path | None:
    """The manifest's local checkpoint folder, a relative one taken from the manifest's own folder
    (so that a shipped manifest finds the checkpoint shipped beside it); None for a hub id."""
    return _local_source(manifest, manifest.model.source, "model.source")


def drafter_folder(manifest: Manifest) -> Path | None:
    """The speculative drafter's local folder, a relative one taken from the manifest's own folder (as
    local_folder); None for a hub id or no named drafter."""
    spec = manifest.speculative
    return None if spec is None else _local_source(manifest, spec.drafter, "speculative.drafter")


def _local_source(manifest: Manifest, source: str | None, field: str) -> Path | None:
    """`source` as a local folder, a relative one taken from the manifest's own folder; None for a hub id."""
    if source is None or is_hub_id(source) and not Path(source).is_dir():
        return None
    folder = Path(source).expanduser()
    if not folder.is_absolute() and manifest.path is not None and (manifest.path.parent / folder).is_dir():
        folder = manifest.path.parent / folder
    if not folder.is_dir():
        raise CheckpointError(f"{manifest.path or manifest.name}: {field} {source!r}: no such folder")
    return folder.resolve()


def folder_digest(folder: Path) -> str:
    """sha256 over the folder's files, by relative path and content: what `model.digest` pins (and
    `speculative.digest`, the drafter's)."""
    outer = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        outer.update(path.relative_to(folder).as_posix().encode() + b"\0")
        outer.update(hashlib.sha256(path.read_bytes()).digest())
    return "sha256:" + outer.hexdigest()

"""The artifacts the bench measures: the one given (or compiled from the scale's manifest) and its batch-1 and
batch-4 siblings, compiled from the same manifest when it is not one of them."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from contract.artifact import load_meta
from gemma4_port import MANIFESTS
from gemma4_port.bench.bench_error import BenchError
from gemma4_port.source.manifest import Manifest, load_manifest, parse_manifest
from gemma4_port.source.variant import Variant

SCALE_MANIFEST = {"tiny": MANIFESTS / "tiny-e2b.yaml", "small": MANIFESTS / "small-e2b.yaml"}


def _compile(manifest: Manifest, variant: Variant, work: Path, backend: str, console: Console) -> Path:
    from gemma4_port.compile.backends import compile_artifact

    console.log(f"compiling {manifest.name}/{variant.name} (batch {variant.batch}, {backend}) into {work}")
    return compile_artifact(manifest, variant, work / f"{manifest.name}-{variant.name}", backend=backend)


def _variant(manifest: Manifest, batch: int, like: Variant) -> Variant:
    """The manifest's single-rank variant with `batch` slots, preferring `like`'s dtype."""
    found = sorted(
        (v for v in manifest.variants if v.batch == batch and v.tp == 1), key=lambda v: v.dtype != like.dtype
    )
    if not found:
        raise BenchError(
            f"manifest {manifest.name} has no tp=1 variant with batch {batch}; the concurrency "
            f"benchmark needs one (variants: {[v.name for v in manifest.variants]})"
        )
    return found[0]


def artifacts(folder: Path | None, scale: str, work: Path, console: Console) -> tuple[Path, Path, Path, Path | None]:
    """(measured artifact, batch-1 artifact, batch-4 artifact, an artifact with an image budget: the
    measured one if it has one, else the manifest's first tp-1 variant with one, None if none has),
    compiling what is not given."""
    if folder is None:
        manifest = load_manifest(SCALE_MANIFEST[scale])
        folder = _compile(manifest, manifest.variants[0], work, "cpu", console)
    meta = load_meta(folder)
    manifest = parse_manifest(meta.manifest, f"{folder}/artifact.json")
    variant = manifest.variant(meta.variant)

    def with_batch(batch: int) -> Path:
        if (variant.batch, variant.tp) == (batch, 1):
            return folder
        return _compile(manifest, _variant(manifest, batch, variant), work, meta.backend, console)

    images = [v for v in manifest.variants if v.tp == 1 and v.media is not None and v.media.image is not None]
    if meta.geometry.vision is not None:
        image: Path | None = folder
    else:
        image = _compile(manifest, images[0], work, meta.backend, console) if images else None
    return folder, with_batch(1), with_batch(4), image

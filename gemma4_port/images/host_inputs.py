"""What the image builds take from this host: the cpu flavour's artifacts (compiled here beforehand,
`build.py compile`), its Python packages (downloaded here into a wheelhouse: the builds have no
network), the checkpoint a `--weights copy` copies in, and each build context, staged under
build/images/ with hard links so that the big files are never copied."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from gemma4_port.images.plan import python_requirements
from gemma4_port.images.project import code_file
from gemma4_port.images.spec import ImageError, ImageOptions, ImageSpec
from gemma4_port.source.manifest import Manifest

# pip takes the platforms it is given literally: name every manylinux level the image's glibc runs
# (Debian bookworm: 2.36), or a wheel built for a level between the named ones is not found
# (llguidance ships only manylinux_2_31).
IMAGE_GLIBC_MINOR = 36
WHEEL_PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(IMAGE_GLIBC_MINOR, 16, -1)),
    "manylinux2014_x86_64",
)


def image_cache() -> Path:
    """Rootfs tarball and wheelhouses: kept between runs, so rebuilds skip debootstrap and pip."""
    default = Path.home() / ".cache" / "gemma4-inf2" / "images"
    return Path(os.environ.get("GEMMA4_INF2_IMAGE_CACHE", default))


def wheelhouse(requirements: tuple[str, ...], cache: Path, console: Console) -> Path:
    """The cp311 manylinux wheels of `requirements` and their dependencies, downloaded once."""
    key = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:12]
    folder = cache / f"wheels-cp311-{key}"
    if (folder / "requirements.txt").is_file():
        return folder
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    platforms = [arg for p in WHEEL_PLATFORMS for arg in ("--platform", p)]
    with console.status(f"downloading {len(requirements)} Python packages and their dependencies (once)"):
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--dest",
                str(partial),
                "--only-binary=:all:",
                "--python-version",
                "3.11",
                "--implementation",
                "cp",
                "--abi",
                "cp311",
                *platforms,
                *requirements,
            ],
            capture_output=True,
            text=True,
        )
    if run.returncode:
        lines = [ln for ln in run.stderr.strip().splitlines() if ln.startswith("ERROR")] or ["pip failed"]
        raise ImageError(f"wheelhouse: {lines[-1]}")
    (partial / "requirements.txt").write_text("\n".join(requirements) + "\n")
    partial.rename(folder)
    return folder


def host_artifact(manifest: Manifest, variant: str, console: Console) -> Path:
    """artifacts/NAME-VARIANT (build.py compile's default), compiled now if it is not there or broken."""
    from contract.artifact import ArtifactError, check_files, load_meta
    from gemma4_port.compile.backends import compile_artifact

    out = Path("artifacts") / f"{manifest.name}-{variant}"
    try:
        meta = load_meta(out)
        if meta.backend == "cpu" and not check_files(out, meta):
            console.print(f"reusing {out} (compiled {meta.created}; delete it to recompile)")
            return out
    except ArtifactError:
        pass
    console.print(f"compiling {manifest.name} {variant} for the cpu flavour into {out}")
    return compile_artifact(manifest, manifest.variant(variant), out, backend="cpu")


def host_checkpoint(manifest: Manifest) -> Path:
    """The Hugging Face cache folder of the manifest's model (refs, snapshots, blobs), downloaded here."""
    from gemma4_port.source.checkpoint import resolve_checkpoint

    if manifest.model.source is None or Path(manifest.model.source).expanduser().is_dir():
        raise ImageError(
            f"plan: --weights copy copies a Hugging Face hub download; {manifest.name}'s model is not a hub repo id"
        )
    return resolve_checkpoint(manifest).parents[1]


def _link_tree(src: Path, dst: Path) -> None:
    """Hard links (big artifacts and wheels are never copied), except for files others cannot read:
    the server runs as a non-root user, so those are copied and made readable (the host's stay as they are)."""

    def link(a, b):
        if os.stat(a).st_mode & 0o004:
            try:
                return os.link(a, b)
            except OSError:  # another filesystem
                pass
        shutil.copy2(a, b)
        os.chmod(b, os.stat(b).st_mode | 0o444)

    if src.is_dir():
        shutil.copytree(src, dst, copy_function=link, symlinks=True)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        link(src, dst)


def stage_context(spec: ImageSpec, dockerfile: str, folder: Path, sources: dict[str, Path]) -> Path:
    """The build context of one image: exactly the files its plan lists, and its Dockerfile."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for dest, what in spec.context:
        src = code_file(what.removeprefix("code:")) if what.startswith("code:") else sources[what]
        _link_tree(src, folder / dest)
    (folder / "Dockerfile").write_text(dockerfile)
    return folder


def host_inputs(manifest: Manifest, options: ImageOptions, base: ImageSpec, driver, log: Console) -> dict[str, Path]:
    """What the build contexts take from this host, by the names the plan uses."""
    if options.flavour == "neuron":
        sources = {"manifest": manifest.path}
        if options.weights == "copy" and manifest.model.source:
            sources["checkpoint"] = host_checkpoint(manifest)
        return sources
    cache = image_cache()
    driver.ensure_os_image(base.from_image, cache)  # first: a base image that will not do fails in seconds
    sources = {f"artifact:{v}": host_artifact(manifest, v, log) for v in base.variants}
    sources["wheelhouse"] = wheelhouse(python_requirements(manifest, options), cache, log)
    return sources

"""`build.py images`: plan (imageplan), prepare what the builds need on the host, drive Docker
(docker_driver), and print a summary: image, tag, digest, size, bytes pushed.

The host side: the cpu flavour's artifacts are compiled here beforehand (`build.py compile`), its
Python packages are downloaded here into a wheelhouse (the builds have no network), and each build
context is staged under build/images/ with hard links, so the big files are never copied.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from rich.console import Console
from rich.table import Table

from gemma4_port import ROOT
from gemma4_port.console import console as build_console
from gemma4_port.images.plan import (
    BUILD_TOOLS,
    SERVER_CODE,
    SLIM_TP,
    ImageError,
    ImageOptions,
    ImageSpec,
    base_variants,
    pin_base,
    plan_images,
    python_requirements,
    render_dockerfile,
)
from gemma4_port.source.manifest import Manifest, load_manifest

# Host tools, not image contents: the images run the server and the build tools, nothing else.
HOST_ONLY = {"docker", "matplotlib", "torch", "transformers"}  # torch / transformers are pinned by the plan
# pip takes the platforms it is given literally: name every manylinux level the image's glibc runs
# (Debian bookworm: 2.36), or a wheel built for a level between the named ones is not found
# (llguidance ships only manylinux_2_31).
IMAGE_GLIBC_MINOR = 36
WHEEL_PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(IMAGE_GLIBC_MINOR, 16, -1)),
    "manylinux2014_x86_64",
)
SERVER_ENTRY = ("runtime/serve.py",)


def image_cache() -> Path:
    """Rootfs tarball and wheelhouses: kept between runs, so rebuilds skip debootstrap and pip."""
    default = Path.home() / ".cache" / "gemma4-inf2" / "images"
    return Path(os.environ.get("GEMMA4_INF2_IMAGE_CACHE", default))


# ------------------------------------------------------------------------------------ options


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def host_requirements() -> tuple[str, ...]:
    """The project's runtime dependencies at the versions installed here: the images run what the
    tests ran against."""
    pins = []
    for spec in _pyproject()["dependencies"]:
        name = Requirement(spec).name
        if name not in HOST_ONLY:
            pins.append(f"{name}=={md.version(name)}")
    return tuple(pins)


def git_revision(root: Path = ROOT) -> str:
    """HEAD's commit, read from .git without running git."""
    git = root / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
    except OSError:
        return "unknown"
    if not head.startswith("ref: "):
        return head
    ref = head.removeprefix("ref: ")
    if (git / ref).is_file():
        return (git / ref).read_text().strip()
    packed = git / "packed-refs"
    for line in packed.read_text().splitlines() if packed.is_file() else []:
        if line.endswith(f" {ref}"):
            return line.split()[0]
    return "unknown"


def compile_swap(manifest: Manifest) -> dict[str, int]:
    """variant -> GiB of swap its Neuron compile needs on the build host (build.py plan's estimate)."""
    from gemma4_port.ops.capacity import compile_swap_gib

    return {v: compile_swap_gib(manifest, manifest.variant(v)) for v in base_variants(manifest)}


def image_options(args, manifest: Manifest) -> ImageOptions:
    flavour = args.flavour or ("cpu" if manifest.model.random else "neuron")
    project = _pyproject()
    return ImageOptions(
        flavour=flavour,
        base_image=args.base_image,
        registry=args.registry,
        only=tuple(t.strip() for t in (args.tags or "").split(",") if t.strip()),
        weights=args.weights or "secret",
        requirements=host_requirements(),
        cpu_torch=md.version("torch"),
        compile_swap_gib=compile_swap(manifest) if flavour == "neuron" else None,
        source=project.get("urls", {}).get("Source", "unknown"),
        version=project["version"],
        revision=git_revision(),
        created=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def package_files(paths: tuple[str, ...]) -> tuple[str, ...]:
    """Every file under the repo-relative `paths` (files or package folders), repo-relative."""
    out = []
    for rel in paths:
        path = ROOT / rel
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        out += [str(p.relative_to(ROOT)) for p in found if "__pycache__" not in p.parts]
    return tuple(out)


def project_files() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the base's build-tool files, the slim's server files), repo-relative."""
    return package_files(BUILD_TOOLS), package_files(SERVER_CODE)


# ------------------------------------------------------------------------------- host inputs


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
        src = ROOT / what.removeprefix("code:") if what.startswith("code:") else sources[what]
        _link_tree(src, folder / dest)
    (folder / "Dockerfile").write_text(dockerfile)
    return folder


# ------------------------------------------------------------------------------------ main


def write_dockerfiles(specs: list[ImageSpec], folder: Path) -> list[Path]:
    """Each image's rendered Dockerfile as DIR/KIND.Dockerfile (for linters and review)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for spec in specs:
        path = folder / f"{spec.kind}.Dockerfile"
        path.write_text(render_dockerfile(spec))
        written.append(path)
    return written


def print_plan(specs: list[ImageSpec], console: Console) -> None:
    for spec in specs:
        parts = sorted({what.split(":")[0] if what.startswith("code:") else what for _, what in spec.context})
        console.rule(f"{spec.kind}: {spec.ref}  (FROM {spec.from_image})")
        console.print(f"# context: {', '.join(parts) or 'none'}", highlight=False, markup=False)
        console.print(render_dockerfile(spec), highlight=False, markup=False, soft_wrap=True)


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


def _buildkit_base(driver, spec: ImageSpec, context: Path, log: Console):
    """The neuron base with a weights secret is built by buildx (the classic builder cannot mount
    secrets); the slim images then build FROM it here."""
    built = driver.existing(spec.ref)
    if built is None:
        raise ImageError(
            f"build base: the neuron base downloads the weights with a BuildKit secret, which the docker SDK's "
            f"classic builder cannot pass; run `docker buildx build --load --secret id=hf_token,env=HF_TOKEN "
            f"-t {spec.ref} {context}` (context staged there) and rerun, or use --weights copy"
        )
    log.print(f"using {spec.ref} built with buildx ({built.image_id[:19]}); rebuild it there after a change")
    return built


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


def summary(title: str, rows: list) -> Table:
    """image, tag, digest (the image id if not pushed), size (what a slim adds), build time, push."""
    table = Table(title=title)
    for col in ("image", "tag", "digest", "size", "build", "layers pushed", "bytes pushed"):
        table.add_column(col, justify="right" if col in ("size", "build", "bytes pushed") else "left")
    base_size = rows[0][1].size  # the base is always built first
    for spec, built, pushed in rows:
        own = "" if spec.kind == "base" else f" (+{_size(built.size - base_size)})"
        table.add_row(
            spec.kind,
            spec.ref,
            pushed.digest[:19] if pushed else built.image_id[:19],
            _size(built.size) + own,
            f"{built.seconds:.0f} s",
            f"{pushed.uploaded} new, {pushed.reused} reused" if pushed else "not pushed",
            _size(pushed.bytes_pushed) if pushed else "-",
        )
    return table


def images_main(args) -> int:
    out = build_console()
    log = Console(stderr=True, soft_wrap=True)  # build logs as they come, never re-wrapped
    if args.out and not args.dry_run:
        raise ImageError("--out writes the rendered Dockerfiles of a --dry-run: add --dry-run")
    manifest = load_manifest(args.manifest)
    options = image_options(args, manifest)
    build_files, server_files = project_files()
    specs = plan_images(manifest, options, build_files, server_files)
    if args.dry_run:
        print_plan(specs, out)
        if args.out:
            for path in write_dockerfiles(specs, Path(args.out)):
                out.print(f"wrote {path}", highlight=False)
        return 0
    missing = [f for f in SERVER_ENTRY if not (ROOT / f).is_file()]
    if missing and any(s.kind in SLIM_TP for s in specs):
        raise ImageError(f"plan: {', '.join(missing)} missing: the slim images run `python -m runtime.serve`")

    from gemma4_port.images.docker_driver import Driver

    driver = Driver(log)  # first: a daemon that is not there fails before any slow step
    base = next(s for s in specs if s.kind == "base")
    buildkit_base = options.flavour == "neuron" and options.weights == "secret" and manifest.model.source
    sources = host_inputs(manifest, options, base, driver, log)

    rows = []
    base_digest = None
    for spec in specs:
        if spec.kind != "base":
            digest = base_digest or driver.repo_digest(base)
            spec = pin_base(spec, digest) if digest else spec
        context = stage_context(
            spec, render_dockerfile(spec), Path("build/images") / manifest.name / spec.kind, sources
        )
        if spec.kind == "base" and buildkit_base:
            built = _buildkit_base(driver, spec, context, log)
        else:
            built = driver.build(spec, context, network="none" if options.flavour == "cpu" else None)
        log.print(f"[green]built[/] {spec.ref} ({_size(built.size)}, {built.seconds:.0f} s)")
        ready = driver.smoke(spec.ref) if spec.kind in SLIM_TP and options.flavour == "cpu" else None
        if ready is not None:
            log.print(f"[green]ready[/] {spec.ref}: /ready 200 after {ready:.0f} s (self-test passed)")
        pushed = driver.push(spec) if args.push else None
        if pushed and spec.kind == "base":
            base_digest = pushed.digest
        rows.append((spec, built, pushed))

    out.print(summary(f"{manifest.name} images ({options.flavour})", rows))
    return 0

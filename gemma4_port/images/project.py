"""What `build.py images` takes from the project: its version, source and dependencies (pinned at the
versions installed here), its git revision, the files each image carries, and the options of one
run (`ImageOptions`)."""

from __future__ import annotations

import datetime
import importlib.metadata as md
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

from gemma4_port import ROOT, checkout
from gemma4_port.images.plan import base_variants
from gemma4_port.images.spec import BUILD_TOOLS, SERVER_CODE, ImageError, ImageOptions
from gemma4_port.source.manifest import Manifest

# Host tools, not image contents: the images run the server and the build tools, nothing else.
HOST_ONLY = {"docker", "matplotlib", "torch", "transformers"}  # torch / transformers are pinned by the plan
SERVER_ENTRY = ("runtime/serve.py",)


DISTRIBUTION = "gemma4-inf2"


@dataclass(frozen=True)
class Project:
    version: str
    source: str  # the Source URL, or "unknown"
    dependencies: tuple[str, ...]  # the runtime requirements, as declared


def project() -> Project:
    """The project's version, source and dependencies: from pyproject.toml in a checkout (the source
    tree is the truth there, whatever an earlier install recorded), else from the installed
    distribution's metadata (what its wheel declared)."""
    tree = checkout()
    if tree is not None:
        table = tomllib.loads((tree / "pyproject.toml").read_text())["project"]
        return Project(table["version"], table.get("urls", {}).get("Source", "unknown"), tuple(table["dependencies"]))
    try:
        meta = md.metadata(DISTRIBUTION)
    except md.PackageNotFoundError:
        raise ImageError(f"plan: neither a checkout nor an installed {DISTRIBUTION} distribution to read") from None
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or () if ", " in u)
    required = tuple(r for r in md.requires(DISTRIBUTION) or () if Requirement(r).marker is None)
    return Project(meta["Version"], urls.get("Source", "unknown"), required)


def host_requirements() -> tuple[str, ...]:
    """The project's runtime dependencies at the versions installed here: the images run what the
    tests ran against."""
    pins = []
    for spec in project().dependencies:
        name = Requirement(spec).name
        if name not in HOST_ONLY:
            pins.append(f"{name}=={md.version(name)}")
    return tuple(pins)


def git_revision(root: Path | None = None) -> str:
    """HEAD's commit, read from the checkout's .git without running git ("unknown" when installed)."""
    root = root or checkout()
    if root is None:
        return "unknown"
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
    about = project()
    return ImageOptions(
        flavour=flavour,
        base_image=args.base_image,
        registry=args.registry,
        only=tuple(t.strip() for t in (args.tags or "").split(",") if t.strip()),
        weights=args.weights or "secret",
        requirements=host_requirements(),
        cpu_torch=md.version("torch"),
        compile_swap_gib=compile_swap(manifest) if flavour == "neuron" else None,
        source=about.source,
        version=about.version,
        revision=git_revision(),
        created=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def code_file(rel: str) -> Path:
    """A file the images carry, by its path relative to ROOT (a checkout, or site-packages)."""
    return ROOT / rel


def package_files(paths: tuple[str, ...]) -> tuple[str, ...]:
    """Every file under the ROOT-relative `paths` (files or package folders), ROOT-relative. The packages
    are where they were imported from; a path outside them (build.py) only a checkout has."""
    out = []
    for rel in paths:
        path = code_file(rel)
        if not path.exists():
            hint = "" if checkout() else " (a wheel carries the packages only): run `build.py images` from a checkout"
            raise ImageError(f"plan: the images carry {rel}, which {ROOT} lacks{hint}")
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        out += [str(p.relative_to(ROOT)) for p in found if "__pycache__" not in p.parts]
    return tuple(out)


def project_files() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the base's build-tool files, the slim's server files), repo-relative."""
    return package_files(BUILD_TOOLS), package_files(SERVER_CODE)

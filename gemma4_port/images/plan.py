"""`build.py images`, the plan: a manifest and options in, ordered image specs and their Dockerfiles out.

Pure: no docker, no files, no clock. Everything that varies between runs (versions, revision, time,
the base's digest) comes in through `ImageOptions`, so the same inputs always render the same
Dockerfiles and the golden tests can hold them still.

Layering, the reason for all of this: an unlayered image of this kind runs to 70+ GB and a server change re-uploads
gigabytes. Here the base holds everything heavy (OS, Python packages, compiled artifacts, and the
build tools that made them); `slim` / `tp2-slim` add only the server code and its configuration, so
a server change rebuilds and pushes one thin layer.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from contract.errors import Gemma4Error
from contract.versions import SYSTEM_PACKAGES
from gemma4_port.source.manifest import Manifest, is_hub_id

TEMPLATES = Path(__file__).resolve().parent / "templates"

KINDS = ("base", "slim", "tp2-slim")
SLIM_TP = {"slim": 1, "tp2-slim": 2}
FLAVOURS = ("neuron", "cpu")
DEFAULT_OS_IMAGE = {"neuron": "ubuntu:22.04", "cpu": "local/debian:bookworm"}
PYTHON = {"neuron": "python3.11", "cpu": "python3"}  # Ubuntu 22.04 has 3.11 in universe; bookworm's python3 is 3.11

APP_DIR = "/opt/gemma4"  # base: build tools, manifest, artifacts
SERVER_DIR = "/app"  # slim: the server package
SERVER_PORT = 8080
SERVER_UID = 10001  # numeric, so Kubernetes' runAsNonRoot can check it without /etc/passwd
# The first graph load: ~100 s for E2B on a NeuronCore as measured, longer for 12B; seconds on the CPU.
START_PERIOD = {"neuron": "10m", "cpu": "2m"}

NEURON_APT_REPO = "https://apt.repos.neuron.amazonaws.com"
# Ubuntu 22.04's own packages for the neuron base, pinned to the series it ships (its security updates
# move within them).
OS_APT_PINS = {"ca-certificates": "2024*", PYTHON["neuron"]: "3.11.*", f"{PYTHON['neuron']}-venv": "3.11.*"}


# What each image carries, by package (repo-relative paths): the base runs `build.py compile` and
# `verify`, which load an artifact through runtime.model as the server does; the slim adds the
# server. A server change therefore rebuilds only the slim layer.
BUILD_TOOLS = ("build.py", "contract", "gemma4_port", "runtime/__init__.py", "runtime/model")
SERVER_CODE = ("contract", "runtime")
SERVER_CONTEXT = "server"  # the slim's code, in one folder of its build context: one COPY, one layer


class ImageError(Gemma4Error, RuntimeError):
    """One line: the step that failed (plan, connect, build, push, ...) and why."""


@dataclass(frozen=True)
class ImageOptions:
    flavour: Literal["neuron", "cpu"]
    base_image: str | None = None  # the OS image the base starts FROM; default by flavour
    registry: str | None = None  # HOST:PORT prefixed to the repository
    only: tuple[str, ...] = ()  # kinds or tags asked for (--tags); empty: all the manifest tags
    weights: Literal["secret", "copy"] = "secret"  # neuron: download in the build, or copy the host's checkpoint
    requirements: tuple[str, ...] = ()  # pinned Python packages besides torch / transformers / Neuron
    cpu_torch: str = "2.13.0+cpu"  # the CPU torch wheel of the cpu flavour
    compile_swap_gib: Mapping[str, float] | None = None  # variant -> swap the compile needs (build.py plan)
    source: str = "unknown"
    version: str = "unknown"
    revision: str = "unknown"
    created: str = "unknown"


@dataclass(frozen=True)
class ImageSpec:
    kind: str  # base | slim | tp2-slim
    flavour: str
    repository: str  # with the registry prefix, if any
    tag: str
    template: str  # file under images/
    from_image: str
    depends_on: str | None  # kind of the image this one is FROM
    variants: tuple[str, ...]  # base: artifacts it holds; slim: the one it serves
    context: tuple[tuple[str, str], ...]  # (path in the build context, what goes there)
    env: tuple[tuple[str, str], ...]
    labels: tuple[tuple[str, str], ...]
    values: tuple[tuple[str, str], ...]  # the template's remaining placeholders

    @property
    def ref(self) -> str:
        return f"{self.repository}:{self.tag}"


# ---------------------------------------------------------------------------------------------- plan


def image_tags(manifest: Manifest) -> dict[str, str]:
    """kind -> tag, validated against the kinds this project builds."""
    if manifest.images is None:
        raise ImageError(f"plan: {manifest.path or manifest.name} has no `images:` section (repository, tags)")
    unknown = sorted(set(manifest.images.tags) - set(KINDS))
    if unknown:
        raise ImageError(f"plan: images.tags: unknown image kind(s) {unknown}; allowed: {', '.join(KINDS)}")
    if not manifest.images.tags:
        raise ImageError(f"plan: images.tags is empty; give a tag for some of {', '.join(KINDS)}")
    return {kind: manifest.images.tags[kind] for kind in KINDS if kind in manifest.images.tags}


def served_variant(manifest: Manifest, kind: str) -> str:
    """The variant a slim image serves: `images.variant` if its tp fits the kind, else the first that does."""
    tp = SLIM_TP[kind]
    chosen = manifest.variant(manifest.images.variant if manifest.images else None)
    if chosen.tp == tp:
        return chosen.name
    for v in manifest.variants:
        if v.tp == tp:
            return v.name
    raise ImageError(
        f"plan: {kind} needs a variant with tp {tp}; {manifest.name} has none "
        f"({', '.join(f'{v.name} (tp {v.tp})' for v in manifest.variants)})"
    )


def base_variants(manifest: Manifest) -> tuple[str, ...]:
    """The artifacts the base holds: one per slim image the manifest tags, whatever --tags asks for,
    so the base (and its digest) never depends on which images one run builds."""
    slims = [k for k in image_tags(manifest) if k in SLIM_TP]
    return tuple(dict.fromkeys(served_variant(manifest, k) for k in slims)) or (
        manifest.variant(manifest.images.variant).name,
    )


def _selected(tags: dict[str, str], only: tuple[str, ...]) -> list[str]:
    if not only:
        return list(tags)
    by_name = {**{tag: kind for kind, tag in tags.items()}, **{kind: kind for kind in tags}}
    unknown = [o for o in only if o not in by_name]
    if unknown:
        raise ImageError(
            f"plan: --tags {','.join(unknown)}: not an image of this manifest; "
            f"choose from {', '.join(f'{k} ({t})' for k, t in tags.items())}"
        )
    wanted = {by_name[o] for o in only}
    if wanted & set(SLIM_TP):
        wanted.add("base")  # a slim image is FROM the base: dependency order, base first
    return [kind for kind in tags if kind in wanted]


def plan_images(
    manifest: Manifest, options: ImageOptions, build_files: Iterable[str] = (), server_files: Iterable[str] = ()
) -> list[ImageSpec]:
    """The images to build, in dependency order. `build_files` / `server_files` are repo-relative
    files for the base's build tools and the slim's server (the files under BUILD_TOOLS / SERVER_CODE)."""
    if options.flavour not in FLAVOURS:
        raise ImageError(f"plan: flavour {options.flavour!r}; allowed: {', '.join(FLAVOURS)}")
    tags = image_tags(manifest)
    slims = [k for k in tags if k in SLIM_TP]
    variants = base_variants(manifest)
    repository = f"{options.registry}/{manifest.images.repository}" if options.registry else manifest.images.repository
    base_tag = tags.get("base", "base")
    base = _base_spec(manifest, options, repository, base_tag, variants, tuple(build_files))
    specs = {"base": base}
    for kind in slims:
        specs[kind] = _slim_spec(
            manifest, options, base, kind, tags[kind], served_variant(manifest, kind), tuple(server_files)
        )
    return [specs[kind] for kind in _selected({"base": base_tag, **tags}, options.only)]


def _oci_labels(options: ImageOptions, base_name: str, base_digest: str | None) -> list[tuple[str, str]]:
    labels = [
        ("org.opencontainers.image.source", options.source),
        ("org.opencontainers.image.version", options.version),
        ("org.opencontainers.image.revision", options.revision),
        ("org.opencontainers.image.created", options.created),
        ("org.opencontainers.image.base.name", base_name),
    ]
    if base_digest:
        labels.append(("org.opencontainers.image.base.digest", base_digest))
    return labels


def swap_advice(variant: str, swap_gib: float | None) -> str:
    """The sentence (Dockerfile comment) for the swap a variant's compile needs, from `build.py plan`."""
    if swap_gib is None:
        return f"{variant}: run `build.py plan MANIFEST --variant {variant}` for the swap its compile needs"
    if swap_gib <= 0:
        return f"{variant}: the compile fits in an inf2.8xlarge's 128 GiB of RAM, no swap needed"
    return f"{variant}: the compile needs >= {swap_gib:g} GiB of swap on an inf2.8xlarge (128 GiB RAM; build.py plan)"


def _base_spec(
    manifest: Manifest,
    options: ImageOptions,
    repository: str,
    tag: str,
    variants: tuple[str, ...],
    build_files: tuple[str, ...],
) -> ImageSpec:
    flavour = options.flavour
    os_image = options.base_image or DEFAULT_OS_IMAGE[flavour]
    tc = manifest.toolchain
    context = [(f"app/{f}", f"code:{f}") for f in build_files]
    values = {"python": PYTHON[flavour], "app": APP_DIR, "transformers": tc.transformers}
    labels = [("gemma4-inf2.flavour", flavour), ("gemma4-inf2.variants", ",".join(variants))]
    if flavour == "cpu":
        context = [("wheels", "wheelhouse"), *((f"artifacts/{v}", f"artifact:{v}") for v in variants), *context]
    else:
        swap = dict(options.compile_swap_gib or {})
        context.append(("app/manifest.yaml", "manifest"))
        weights = "random" if manifest.model.random else options.weights
        if weights == "copy":
            context.append(("checkpoint", "checkpoint"))
        source = manifest.model.source or ""
        if source and not is_hub_id(source):
            raise ImageError(
                f"plan: model.source {source!r} is a local folder; a neuron image gets its weights from the "
                "hub (downloaded in the build, or --weights copy): give a hub repo id"
            )
        pins = {  # build argument -> (pip or apt package, the manifest's exact build)
            "NEURONX_CC": ("neuronx-cc", tc.neuronx_cc),
            "TORCH_NEURONX": ("torch-neuronx", tc.torch_neuronx),
            "NEURONX_DISTRIBUTED": ("neuronx-distributed", tc.neuronx_distributed),
        }
        apt = dict(zip(("NEURON_RUNTIME", "NEURON_COLLECTIVES", "NEURON_TOOLS"), SYSTEM_PACKAGES, strict=True))
        toolchain_args = {
            "TORCH": ".".join(tc.torch_neuronx.split(".")[:2]) + ".*",  # torch-neuronx X.Y.* runs on torch X.Y
            **{arg: version for arg, (_, version) in pins.items()},
            "TRANSFORMERS": tc.transformers,
            "NEURON_RUNTIME": tc.neuron_runtime,
            "NEURON_COLLECTIVES": tc.neuron_collectives,
            "NEURON_TOOLS": tc.neuron_tools,
        }
        values.update(
            weights_mode=weights,
            neuron_apt_repo=NEURON_APT_REPO,
            os_apt=" ".join(f"{p}={v}" for p, v in OS_APT_PINS.items()),
            toolchain_args=build_args(toolchain_args),
            neuron_pins=" ".join(f'"{p}==${{{arg}}}"' for arg, (p, _) in pins.items()),
            # The manifest's exact builds; a Neuron Debian version carries a -<revision> ("2.30.51.0-<hash>").
            neuron_apt=" ".join(f'{p}="${{{arg}}}-*"' for arg, p in apt.items()),
            model_args=build_args({"MODEL_SOURCE": source, "MODEL_REVISION": manifest.model.revision or "main"}),
            hf_cache_dir=f"/opt/hf/hub/models--{source.replace('/', '--')}",
            swap_comments="\n".join(f"#   {swap_advice(v, swap.get(v))}" for v in variants),
            requirements=" ".join(f'"{r}"' for r in options.requirements),
            compile="\n".join(  # one RUN per variant (each cached on its own), exec form: no shell
                "RUN "
                + json.dumps(
                    ["python", "build.py", "compile", "manifest.yaml", "--variant", v, "--backend", "neuron"]
                    + ["--out", f"{APP_DIR}/artifacts/{v}"]
                )
                for v in variants
            ),
        )
        for v in variants:
            if swap.get(v) is not None:
                labels.append((f"gemma4-inf2.compile-swap-gib.{v}", f"{swap[v]:g}"))
    return ImageSpec(
        kind="base",
        flavour=flavour,
        repository=repository,
        tag=tag,
        template=f"base-{flavour}.template",
        from_image=os_image,
        depends_on=None,
        variants=variants,
        context=tuple(context),
        env=(),
        labels=tuple(_oci_labels(options, os_image, None) + labels),
        values=tuple(values.items()),
    )


def _slim_spec(
    manifest: Manifest,
    options: ImageOptions,
    base: ImageSpec,
    kind: str,
    tag: str,
    variant: str,
    server_files: tuple[str, ...],
) -> ImageSpec:
    tp = manifest.variant(variant).tp
    env = (
        ("GEMMA4_ARTIFACT", f"{APP_DIR}/artifacts/{variant}"),
        ("GEMMA4_BACKEND", options.flavour),
        ("GEMMA4_MODEL_NAME", manifest.name),
        ("GEMMA4_HOST", "0.0.0.0"),
        ("GEMMA4_PORT", str(SERVER_PORT)),
        ("NEURON_RT_VISIBLE_CORES", ",".join(str(c) for c in range(tp))),
        ("PYTHONPATH", SERVER_DIR),
    )
    return ImageSpec(
        kind=kind,
        flavour=options.flavour,
        repository=base.repository,
        tag=tag,
        template="slim.template",
        from_image=base.ref,
        depends_on="base",
        variants=(variant,),
        context=tuple((f"{SERVER_CONTEXT}/{f}", f"code:{f}") for f in server_files),
        env=env,
        labels=tuple(
            _oci_labels(options, base.ref, None)
            + [("gemma4-inf2.flavour", options.flavour), ("gemma4-inf2.variants", variant)]
        ),
        values=(
            ("uid", str(SERVER_UID)),
            ("server", SERVER_DIR),
            ("port", str(SERVER_PORT)),
            ("start_period", START_PERIOD[options.flavour]),
        ),
    )


def pin_base(spec: ImageSpec, digest: str) -> ImageSpec:
    """The slim spec once its base has a registry digest: FROM by digest, and the digest in its labels."""
    labels = tuple(kv for kv in spec.labels if kv[0] != "org.opencontainers.image.base.digest")
    return replace(
        spec,
        from_image=f"{spec.repository}@{digest}",
        labels=labels + (("org.opencontainers.image.base.digest", digest),),
    )


# -------------------------------------------------------------------------------------------- render


class _Template(string.Template):
    delimiter = "@"  # Dockerfiles are full of shell `$VARS`; `@{name}` keeps the templates readable


def build_args(args: Mapping[str, str]) -> str:
    """One ARG instruction: values the shell sees only as variables (`"${NAME}"`), never as its text.
    They are validated where they come from (the manifest); a Dockerfile's own quoting and expansion
    characters are refused here too, so no value can end the instruction or expand another."""
    for name, value in args.items():
        if not re.fullmatch(r"[^\x00-\x1f\x7f$\"'\\`]+", value):
            raise ImageError(f"plan: build argument {name}={value!r}: a character a Dockerfile would interpret")
    return _instruction("ARG", args.items())


def _instruction(keyword: str, pairs: Iterable[tuple[str, str]]) -> str:
    pairs = list(pairs)
    if not pairs:
        return ""
    body = " \\\n    ".join(f"{k}={json.dumps(v)}" for k, v in pairs)
    return f"{keyword} {body}"


def render_dockerfile(spec: ImageSpec) -> str:
    """The Dockerfile of one image: its template under images/ with the spec's values filled in."""
    values = dict(spec.values)
    values.update(
        from_image=spec.from_image,
        kind=spec.kind,
        flavour=spec.flavour,
        ref=spec.ref,
        env=_instruction("ENV", spec.env),
        labels=_instruction("LABEL", spec.labels),
        variants=", ".join(spec.variants),
    )
    if spec.kind == "base":
        values["artifacts"] = "\n".join(_artifact_lines(spec))
    if spec.kind in SLIM_TP:
        probe = (
            "import os, urllib.request; urllib.request.urlopen("
            "'http://127.0.0.1:%s/ready' % os.environ['GEMMA4_PORT'], timeout=4)"
        )
        values["healthcheck"] = json.dumps(["python", "-c", probe])
        values["cmd"] = json.dumps(["python", "-m", "runtime.serve"])  # the checks of `build.py serve`, then gunicorn
    if spec.flavour == "neuron" and spec.kind == "base":
        values["syntax"] = "# syntax=docker/dockerfile:1\n" if values["weights_mode"] == "secret" else ""
        values["weights"] = _neuron_weights(values)
    text = _Template((TEMPLATES / spec.template).read_text()).substitute(values)
    return "\n".join(line.rstrip() for line in text.splitlines()).strip() + "\n"


def _artifact_lines(spec: ImageSpec) -> list[str]:
    if spec.flavour == "cpu":  # compiled on the host beforehand (`build.py compile`), copied in
        return [f"COPY artifacts/{v}/ {APP_DIR}/artifacts/{v}/" for v in spec.variants]
    return [f"COPY --from=compile {APP_DIR}/artifacts/{v}/ {APP_DIR}/artifacts/{v}/" for v in spec.variants]


def _neuron_weights(values: dict[str, str]) -> str:
    if values["weights_mode"] == "random":
        return "# Random weights: `build.py compile` makes them from the manifest's seed."
    if values["weights_mode"] == "copy":
        return (
            "# The checkpoint, downloaded on the build host (its HF_TOKEN stays there), copied in.\n"
            f"COPY checkpoint/ {values['hf_cache_dir']}/"
        )
    download = (  # the model and revision come from the build arguments, in the environment
        "import os, pathlib; from huggingface_hub import snapshot_download; "
        "token = pathlib.Path('/run/secrets/hf_token'); "
        "snapshot_download(os.environ['MODEL_SOURCE'], revision=os.environ['MODEL_REVISION'], "
        "token=token.read_text().strip() if token.is_file() else None)"
    )
    return (
        f"{values['model_args']}\n"
        "# Gated models need a token: a BuildKit secret is mounted for this one RUN and never lands in a\n"
        "# layer. The classic builder (docker SDK) cannot pass secrets: build this stage with\n"
        "#   docker buildx build --secret id=hf_token,env=HF_TOKEN ...\n"
        "# or use `build.py images --weights copy` to copy a checkpoint downloaded on the host.\n"
        "RUN --mount=type=secret,id=hf_token,required=false \\\n"
        f"    {json.dumps(['python', '-c', download])}"
    )


def python_requirements(manifest: Manifest, options: ImageOptions) -> tuple[str, ...]:
    """The pins the cpu flavour's wheelhouse holds (requirements.txt): torch, transformers and the rest."""
    return (f"torch=={options.cpu_torch}", f"transformers=={manifest.toolchain.transformers}", *options.requirements)

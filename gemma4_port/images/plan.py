"""`build.py images`, the plan: a manifest and options in, ordered image specs out (their Dockerfiles:
dockerfile.py; what a spec is: spec.py).

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
from collections.abc import Iterable
from dataclasses import replace

from contract.versions import SYSTEM_PACKAGES
from gemma4_port.images.dockerfile import build_args
from gemma4_port.images.spec import (
    APP_DIR,
    DEFAULT_OS_IMAGE,
    ENTRYPOINT,
    FLAVOURS,
    KINDS,
    NEURON_APT_REPO,
    NEURON_CONSTRAINTS,
    OS_APT_PINS,
    PYTHON,
    SERVER_CONTEXT,
    SERVER_DIR,
    SERVER_PORT,
    SERVER_UID,
    SLIM_TP,
    START_PERIOD,
    ImageError,
    ImageOptions,
    ImageSpec,
)
from gemma4_port.source.manifest import Manifest
from gemma4_port.source.model_sources import is_hub_id


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
            constraints=NEURON_CONSTRAINTS,
            entrypoint=ENTRYPOINT,
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


def python_requirements(manifest: Manifest, options: ImageOptions) -> tuple[str, ...]:
    """The pins the cpu flavour's wheelhouse holds (requirements.txt): torch, transformers and the rest."""
    return (f"torch=={options.cpu_torch}", f"transformers=={manifest.toolchain.transformers}", *options.requirements)

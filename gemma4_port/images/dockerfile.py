"""An image's Dockerfile: its template under templates/ with the spec's values filled in, and the
instructions (ARG, ENV, LABEL) written so that no value can end one or expand another. Pure."""

from __future__ import annotations

import json
import re
import string
from collections.abc import Iterable, Mapping
from pathlib import Path

from gemma4_port.images.spec import APP_DIR, SLIM_TP, ImageError, ImageSpec

TEMPLATES = Path(__file__).resolve().parent / "templates"


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

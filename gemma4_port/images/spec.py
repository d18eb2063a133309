"""What the image plan is made of: the image kinds and flavours, the paths and ports the images agree
on, the options a run brings (`ImageOptions`), and one planned image (`ImageSpec`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from contract.errors import Gemma4Error

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
NEURON_CONSTRAINTS = "constraints/neuron.txt"  # the framework wheels under the Neuron SDK, pinned
ENTRYPOINT = "gemma4_port/images/entrypoint.sh"  # the Neuron images': build.py's commands by name
BUILD_TOOLS = ("build.py", "contract", "gemma4_port", "runtime/__init__.py", "runtime/model", NEURON_CONSTRAINTS)
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

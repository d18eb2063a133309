"""Which Neuron SDK is installed, and whether it is the one an artifact was compiled with.

A neff compiled by one neuronx-cc and run by another SDK can execute and return garbage instead of
failing (the seed lost hours to it), so a Neuron artifact records the versions it was built with
and the loader refuses any other. The SDK is imported lazily: nothing here needs it installed.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import logging
import shutil
import subprocess
from pathlib import Path

from contract.artifact import ArtifactError
from contract.errors import Gemma4Error

NEURON_PIP_INDEX = "https://pip.repos.neuron.amazonaws.com"
RUNTIME_PACKAGE = "aws-neuronx-runtime-lib"  # libnrt, from the Neuron apt/yum repository
SYSTEM_PACKAGES = (RUNTIME_PACKAGE, "aws-neuronx-collectives", "aws-neuronx-tools")  # apt, inside the image
DRIVER_VERSION_FILE = Path("/sys/module/neuron/version")  # the loaded driver (modinfo shows the file on disk)
log = logging.getLogger(__name__)
NEURON_PACKAGES = ("neuronx-cc", "torch-neuronx", "neuronx-distributed")  # the wheels a neff depends on


class NeuronUnavailable(Gemma4Error, RuntimeError):
    """A Neuron SDK package this machine lacks."""


class VersionMismatch(ArtifactError):
    pass


def require(module: str, package: str, version: str | None = None):
    """Import one SDK module, or fail with one line naming the package to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        wanted = f"{package}=={version}" if version else package
        raise NeuronUnavailable(
            f"the Neuron backend needs {module} ({wanted} from the Neuron pip index, {NEURON_PIP_INDEX}); "
            "it is not installed here"
        ) from None


def system_package_version(package: str = RUNTIME_PACKAGE) -> str | None:
    """An installed Neuron system package (not a wheel), when a package manager knows it."""
    for tool, args in (
        ("dpkg-query", ["-W", "-f=${Version}", package]),
        ("rpm", ["-q", "--qf", "%{VERSION}-%{RELEASE}", package]),
    ):
        if shutil.which(tool):
            done = subprocess.run([tool, *args], capture_output=True, text=True, check=False)
            if done.returncode == 0 and done.stdout.strip():
                return done.stdout.strip()
    return None


def installed_versions(packages: tuple[str, ...] = NEURON_PACKAGES) -> dict[str, str]:
    """Installed version of each named Python package, plus the runtime library when detectable."""
    out = {}
    for pkg in packages:
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    rt = system_package_version()
    if rt:
        out[RUNTIME_PACKAGE] = rt
    return out


def matches_pin(pin: str, installed: str) -> bool:
    """A manifest pin names one build, exactly: torch-neuronx 2.8.0.2.12.22436 is SDK 2.28's, while
    a prefix like 2.8.0 would also admit SDK 2.26's and 2.27's builds. A wheel may carry a local label
    (neuronx-cc 2.23.6484.0+3b612583) and a Debian package a revision (2.30.51.0-0d3ac3dfc): the
    version they qualify is what must match."""
    return installed.partition("+")[0].partition("-")[0] == pin


def driver_version(path: Path = DRIVER_VERSION_FILE) -> str | None:
    """The Neuron driver the host kernel runs (aws-neuronx-dkms), or None when none is loaded."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.partition("-")[0].split(".") if p.isdigit())


def driver_problem(required: str | None, found: str | None) -> str | None:
    """One line when the host driver is missing or older than the SDK release needs, else None."""
    if not required:
        return None
    if found is None:
        return (
            f"no Neuron driver is loaded ({DRIVER_VERSION_FILE} is missing): install aws-neuronx-dkms "
            f">= {required} on the host"
        )
    if _release(found) < _release(required):
        return (
            f"the host's Neuron driver is {found}, older than the {required} this SDK release needs: "
            "update aws-neuronx-dkms on the host (the runtime may refuse it or fail on load)"
        )
    return None


def check_driver(required: str | None, path: Path = DRIVER_VERSION_FILE) -> str | None:
    """Say at start-up, as a warning, when the host driver is older than the pins need."""
    problem = driver_problem(required, driver_version(path))
    if problem:
        log.warning(problem)
    return problem


def pin_problems(pins: dict[str, str], installed: dict[str, str]) -> list[str]:
    """One line per package whose installed version does not match the manifest's toolchain pin."""
    return [
        f"{pkg} {installed.get(pkg, 'is not installed')} (manifest pins {pin})"
        for pkg, pin in pins.items()
        if not matches_pin(pin, installed.get(pkg, ""))
    ]


def version_problems(recorded: dict[str, str], installed: dict[str, str]) -> list[str]:
    """One line per SDK component the artifact recorded that is installed at another version (or not at all)."""
    return [
        f"{pkg}: compiled with {recorded[pkg]}, installed {installed.get(pkg, 'none (or not detectable)')}"
        for pkg in (*NEURON_PACKAGES, RUNTIME_PACKAGE)
        if pkg in recorded and installed.get(pkg) != recorded[pkg]
    ]


def check_versions(recorded: dict[str, str], installed: dict[str, str]) -> None:
    problems = version_problems(recorded, installed)
    if problems:
        raise VersionMismatch(
            "this Neuron artifact was compiled under another SDK and could run but return garbage: "
            + "; ".join(problems)
            + ". Install the recorded versions or recompile here "
            "(`build.py compile MANIFEST --variant V --backend neuron`)"
        )

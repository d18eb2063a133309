"""Which Neuron SDK is installed, and whether it is the one an artifact was compiled with.

A neff compiled by one neuronx-cc and run by another SDK can execute and return garbage instead of
failing (the seed lost hours to it), so a Neuron artifact records the versions it was built with
and the loader refuses any other. The SDK is imported lazily: nothing here needs it installed.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import shutil
import subprocess

from .artifact import ArtifactError
from .errors import Gemma4Error

NEURON_PIP_INDEX = "https://pip.repos.neuron.amazonaws.com"
RUNTIME_PACKAGE = "aws-neuronx-runtime-lib"  # libnrt, from the Neuron apt/yum repository
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


def runtime_version() -> str | None:
    """The installed Neuron runtime library (a system package, not a wheel), when a package manager knows it."""
    for tool, args in (("dpkg-query", ["-W", "-f=${Version}", RUNTIME_PACKAGE]),
                       ("rpm", ["-q", "--qf", "%{VERSION}-%{RELEASE}", RUNTIME_PACKAGE])):
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
    rt = runtime_version()
    if rt:
        out[RUNTIME_PACKAGE] = rt
    return out


def matches_pin(pin: str, installed: str) -> bool:
    """A manifest pin names a release prefix: "2.8.0" admits torch-neuronx 2.8.0.2.10.16998, not 2.8.1."""
    return installed == pin or installed.startswith((pin + ".", pin + "+"))


def pin_problems(pins: dict[str, str], installed: dict[str, str]) -> list[str]:
    """One line per package whose installed version does not match the manifest's toolchain pin."""
    return [f"{pkg} {installed.get(pkg, 'is not installed')} (manifest pins {pin})"
            for pkg, pin in pins.items() if not matches_pin(pin, installed.get(pkg, ""))]


def version_problems(recorded: dict[str, str], installed: dict[str, str]) -> list[str]:
    """One line per SDK component the artifact recorded that is installed at another version (or not at all)."""
    return [f"{pkg}: compiled with {recorded[pkg]}, installed {installed.get(pkg, 'none (or not detectable)')}"
            for pkg in (*NEURON_PACKAGES, RUNTIME_PACKAGE) if pkg in recorded and installed.get(pkg) != recorded[pkg]]


def check_versions(recorded: dict[str, str], installed: dict[str, str]) -> None:
    problems = version_problems(recorded, installed)
    if problems:
        raise VersionMismatch(
            "this Neuron artifact was compiled under another SDK and could run but return garbage: "
            + "; ".join(problems) + ". Install the recorded versions or recompile here "
            "(`build.py compile MANIFEST --variant V --backend neuron`)"
        )

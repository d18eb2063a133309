"""The Neuron SDK builds an artifact and its server must agree on, and the rules that compare them.

A neff compiled by one neuronx-cc and run by another SDK can execute and return garbage instead of
failing, so a Neuron artifact records the versions it was built with and the loader refuses any
other. The probing of what a machine has installed runs where it is needed
(runtime/model/neuron_sdk.py); this module holds only the names, pins and comparisons.
"""

from __future__ import annotations

from contract.artifact import ArtifactError

NEURON_PIP_INDEX = "https://pip.repos.neuron.amazonaws.com"
RUNTIME_PACKAGE = "aws-neuronx-runtime-lib"  # libnrt, from the Neuron apt/yum repository
SYSTEM_PACKAGES = (RUNTIME_PACKAGE, "aws-neuronx-collectives", "aws-neuronx-tools")  # apt, inside the image
NEURON_PACKAGES = ("neuronx-cc", "torch-neuronx", "neuronx-distributed")  # the wheels a neff depends on


class VersionMismatch(ArtifactError):
    pass


def matches_pin(pin: str, installed: str) -> bool:
    """A manifest pin names one build, exactly: torch-neuronx 2.8.0.2.12.22436 is SDK 2.28's, while
    a prefix like 2.8.0 would also admit SDK 2.26's and 2.27's builds. A wheel may carry a local label
    (neuronx-cc 2.23.6484.0+3b612583) and a Debian package a revision (2.30.51.0-0d3ac3dfc): the
    version they qualify is what must match."""
    return installed.partition("+")[0].partition("-")[0] == pin


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.partition("-")[0].split(".") if p.isdigit())


def driver_problem(required: str | None, found: str | None) -> str | None:
    """One line when the host driver is missing or older than the SDK release needs, else None."""
    if not required:
        return None
    if found is None:
        return (
            "no Neuron driver is loaded (/sys/module/neuron/version is missing): install aws-neuronx-dkms "
            f">= {required} on the host"
        )
    if _release(found) < _release(required):
        return (
            f"the host's Neuron driver is {found}, older than the {required} this SDK release needs: "
            "update aws-neuronx-dkms on the host (the runtime may refuse it or fail on load)"
        )
    return None


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

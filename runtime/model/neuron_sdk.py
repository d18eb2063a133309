"""What this machine has of the Neuron SDK, asked where it runs: the server before it loads a
Neuron artifact, the compile before it starts, doctor when it checks a machine. The pins both sides
agree on, and the comparisons against them, are contract/versions.py's; this module only probes
(wheels through importlib.metadata, the runtime library through dpkg or rpm, the driver through
sysfs) and imports the SDK lazily: nothing here needs it installed."""

from __future__ import annotations

import importlib
import importlib.metadata as md
import logging
import shutil
import subprocess
from pathlib import Path

from contract.errors import Gemma4Error
from contract.versions import NEURON_PACKAGES, NEURON_PIP_INDEX, RUNTIME_PACKAGE, driver_problem

DRIVER_VERSION_FILE = Path("/sys/module/neuron/version")  # the loaded driver (modinfo shows the file on disk)
log = logging.getLogger(__name__)


class NeuronUnavailable(Gemma4Error, RuntimeError):
    """A Neuron SDK package this machine lacks."""


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


def wheel_versions(packages: tuple[str, ...]) -> dict[str, str]:
    """The installed version of each named Python package that is installed."""
    out = {}
    for pkg in packages:
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


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
    out = wheel_versions(packages)
    rt = system_package_version()
    if rt:
        out[RUNTIME_PACKAGE] = rt
    return out


def driver_version(path: Path = DRIVER_VERSION_FILE) -> str | None:
    """The Neuron driver the host kernel runs (aws-neuronx-dkms), or None when none is loaded."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def check_driver(required: str | None, path: Path = DRIVER_VERSION_FILE) -> str | None:
    """Say at start-up, as a warning, when the host driver is older than the pins need."""
    problem = driver_problem(required, driver_version(path))
    if problem:
        log.warning(problem)
    return problem

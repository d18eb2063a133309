"""Shared fixtures: tiny random checkpoints and compiled artifacts, made once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support import MANIFESTS

_SESSION_CACHE: list[str] = []  # the per-session cache this conftest made, removed at the end


def pytest_configure(config):
    # Random checkpoints are cached per session, not in the user's cache: tests start from nothing.
    if "GEMMA4_INF2_CACHE" not in os.environ:
        import tempfile

        os.environ["GEMMA4_INF2_CACHE"] = tempfile.mkdtemp(prefix="gemma4-inf2-test-cache-")
        _SESSION_CACHE.append(os.environ["GEMMA4_INF2_CACHE"])


def pytest_unconfigure(config):
    import shutil

    for folder in _SESSION_CACHE:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    try:
        import torch_neuronx  # noqa: F401

        has_neuron = True
    except ImportError:
        has_neuron = False
    skip = pytest.mark.skip(reason="needs an Inferentia2 machine with the Neuron SDK")
    for item in items:
        if item.get_closest_marker("neuron") and not has_neuron:  # a marker, not any name "neuron" (a folder)
            item.add_marker(skip)


@pytest.fixture(scope="session")
def compiled(tmp_path_factory):
    """compiled("tiny-e2b", "fp32") -> artifact directory, compiled once per session."""
    from gemma4_port.compile.backends import compile_artifact
    from gemma4_port.source.manifest import load_manifest

    made: dict[tuple[str, str], Path] = {}

    def get(name: str, variant: str) -> Path:
        if (name, variant) not in made:
            manifest = load_manifest(MANIFESTS / f"{name}.yaml")
            out = tmp_path_factory.mktemp(f"{name}-{variant}")
            made[(name, variant)] = compile_artifact(manifest, manifest.variant(variant), out / "artifact")
        return made[(name, variant)]

    return get

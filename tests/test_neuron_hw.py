"""On an Inferentia2 machine with the Neuron SDK: compile tiny variants for the NeuronCores and verify
them as the server loads them. Skipped elsewhere (conftest: no torch_neuronx, no `neuron` tests).

Run on an inf2 box:  .venv/bin/python -m pytest -m neuron tests/test_neuron_hw.py
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from contract.artifact import ArtifactError, write_raw
from gemma4_port.compile import compile_artifact
from gemma4_port.manifest import load_manifest
from runtime.model.loader import load_artifact

from support import ROOT

pytestmark = pytest.mark.neuron

# The manifests' compiler args auto-cast matmuls to bf16, so the device runs are judged as bf16.
CASES = [
    ("tiny-e2b", "bf16", {}),  # tp 1: a neff per graph, KV shared between them (nkv 1)
    ("tiny-e2b", "b4", {"dtype": "bfloat16"}),  # batch 4: slots prefilled and decoded together
    ("tiny-e2b", "bf16", {"prefill": "host"}),  # tp 1 decode on the core, prompt on the host
    ("tiny-e4b", "tp2-bf16", {}),  # ModelBuilder: prefill buckets + decode, GQA split heads
    ("tiny-e4b", "tp2-bf16", {"prefill": "host"}),  # parallel_model_trace, host KV split per rank
    ("tiny-12b", "tp2", {"dtype": "bfloat16"}),  # sliding split + global replicated K/V (k_eq_v)
    ("tiny-e2b", "tp2", {"dtype": "bfloat16"}),  # nkv 1 replicated on both ranks
]


def _variant(name, variant, change):
    manifest = load_manifest(ROOT / f"manifests/{name}.yaml")
    v = manifest.variant(variant).model_copy(update=change)
    return manifest.model_copy(update={"variants": (v,)}), v


@pytest.fixture(scope="module")
def neuron_compiled(tmp_path_factory):
    made = {}

    def get(name, variant, change):
        key = (name, variant, tuple(sorted(change.items())))
        if key not in made:
            manifest, v = _variant(name, variant, change)
            made[key] = compile_artifact(manifest, v, tmp_path_factory.mktemp(name) / "artifact", backend="neuron")
        return made[key]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("name,variant,change", CASES)
def test_compile_for_neuron_then_verify_matches_the_float_reference(neuron_compiled, name, variant, change):
    folder = neuron_compiled(name, variant, change)
    meta = json.loads((folder / "artifact.json").read_text())
    assert meta["backend"] == "neuron"
    assert {"neuronx-cc", "torch-neuronx"} <= set(meta["versions"])
    result = subprocess.run([sys.executable, str(ROOT / "build.py"), "verify", str(folder)], capture_output=True,
                            text=True, cwd=ROOT, env=os.environ | {"COLUMNS": "250"}, timeout=3600)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name,variant,change", [CASES[0], CASES[4]])
def test_graph_writes_land_in_the_kv_tensors_the_backend_holds(neuron_compiled, name, variant, change):
    """The seed's leak: after a load, the state tensors read too early are orphaned CPU copies, so a
    reset (or a host prefill) writes where no graph reads. Here the graphs' writes must be visible in
    the tensors the backend holds, and a reset must clear what the graphs read."""
    model = load_artifact(neuron_compiled(name, variant, change))
    backend, runner = model.runner.backend, model.runner
    first = runner.greedy([9, 10, 11, 12, 13], 6)[0]
    assert any(float(t.cpu().abs().sum()) > 0 for rank in backend.device.kv.ranks for t in rank)
    backend.reset()
    assert all(float(t.cpu().abs().sum()) == 0 for rank in backend.device.kv.ranks for t in rank)
    assert runner.greedy([9, 10, 11, 12, 13], 6)[0] == first
    model.close()


@pytest.mark.slow
def test_other_installed_versions_are_refused(neuron_compiled, tmp_path):
    folder = tmp_path / "artifact"
    shutil.copytree(neuron_compiled(*CASES[0]), folder)
    meta = json.loads((folder / "artifact.json").read_text())
    meta["versions"]["neuronx-cc"] += ".other"
    meta.pop("digest")
    write_raw(folder, meta)  # a consistent edit: the version check behind the digest check sees it
    with pytest.raises(ArtifactError, match="neuronx-cc: compiled with"):
        load_artifact(folder)

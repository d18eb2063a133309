"""On an Inferentia2 machine with the Neuron SDK: compile tiny variants for the NeuronCores and verify
them as the server loads them. Skipped elsewhere (conftest: no torch_neuronx, no `neuron` tests).
Each compile runs in its own `build.py compile` process: ModelBuilder releases the Neuron runtime
only when its process exits (model_builder.py trace's docstring), and the compile cache
(NEURON_COMPILE_CACHE_URL) is shared by those processes. `build.py doctor` runs the same on a
fresh machine and writes a report.

Run on an inf2 box:  .venv/bin/python -m pytest -m neuron tests/test_neuron_hw.py
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from contract.artifact import ArtifactError, write_raw
from gemma4_port.source.manifest import load_manifest
from runtime.model.loader import load_artifact
from support import MANIFESTS, ROOT

pytestmark = pytest.mark.neuron

# Every case is one ModelBuilder model; bf16 runs are judged as bf16.
CASES = [
    ("tiny-e2b", "bf16", {}),  # tp 1: prefill buckets + decode on one core, KV as state (nkv 1)
    ("tiny-e2b", "b4", {"dtype": "bfloat16"}),  # batch 4: slots prefilled and decoded together
    ("tiny-e2b", "bf16", {"prefill": "host"}),  # tp 1 decode on the core, prompt on the host
    ("tiny-e4b", "tp2-bf16", {}),  # tp 2: prefill buckets + decode, GQA split heads
    ("tiny-e4b", "tp2-bf16", {"prefill": "host"}),  # tp 2 decode alone, host KV written per rank
    ("tiny-12b", "tp2", {"dtype": "bfloat16"}),  # sliding split + global replicated K/V (k_eq_v)
    ("tiny-e2b", "tp2", {"dtype": "bfloat16"}),  # nkv 1 replicated on both ranks
]


def compile_in_own_process(name: str, variant: str, change: dict, folder: Path) -> Path:
    """The manifest narrowed to the changed variant, compiled by `build.py compile` in a process of its own."""
    raw = yaml.safe_load((MANIFESTS / f"{name}.yaml").read_text())
    raw["variants"] = [v | change for v in raw["variants"] if v["name"] == variant]
    raw["images"]["variant"] = variant
    raw["images"]["tags"] = {"base": "latest"}
    manifest = folder / f"{name}.yaml"
    manifest.write_text(yaml.safe_dump(raw))
    load_manifest(manifest)  # a bad change fails here, not after a compile
    out = folder / "artifact"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "build.py"),
            "compile",
            str(manifest),
            "--variant",
            variant,
            "--backend",
            "neuron",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=7200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return out


@pytest.fixture(scope="module")
def neuron_compiled(tmp_path_factory):
    made = {}

    def get(name, variant, change):
        key = (name, variant, tuple(sorted(change.items())))
        if key not in made:
            made[key] = compile_in_own_process(name, variant, change, tmp_path_factory.mktemp(name))
        return made[key]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("name,variant,change", CASES)
def test_compile_for_neuron_then_verify_matches_the_float_reference(neuron_compiled, name, variant, change):
    folder = neuron_compiled(name, variant, change)
    meta = json.loads((folder / "artifact.json").read_text())
    assert meta["backend"] == "neuron"
    assert {"neuronx-cc", "torch-neuronx"} <= set(meta["versions"])
    result = subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "verify", str(folder)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=os.environ | {"COLUMNS": "250"},
        timeout=3600,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name,variant,change", [CASES[0], CASES[4]])
def test_graph_writes_land_in_the_kv_tensors_the_backend_holds(neuron_compiled, name, variant, change):
    """A leak to guard against: after a load, the state tensors read too early are orphaned CPU copies, so a
    reset (or a host prefill) writes where no graph reads. Here the graphs' writes must be visible in
    the tensors the backend holds, and a reset must clear what the graphs read."""
    model = load_artifact(neuron_compiled(name, variant, change))
    backend, runner = model.runner.backend, model.runner
    first = runner.greedy([9, 10, 11, 12, 13], 6)[0]
    assert any(float(t.cpu().abs().sum()) > 0 for rank in backend.kv.ranks for t in rank)
    backend.reset()
    assert all(float(t.cpu().abs().sum()) == 0 for rank in backend.kv.ranks for t in rank)
    assert runner.greedy([9, 10, 11, 12, 13], 6)[0] == first
    model.close()


@pytest.mark.slow
@pytest.mark.parametrize("name,variant,change", [CASES[1], CASES[4]])
def test_a_fork_copies_on_the_cores_and_decodes_as_a_prefill_does(neuron_compiled, name, variant, change):
    """The copy key on the NeuronCores (device prefill, and host prefill with 2 slots): the target slot
    holds the source's prompt rows bit for bit, the other slots are as they were, and the forked slot
    decodes what a fresh prefill of the prompt decodes."""
    model = load_artifact(neuron_compiled(name, variant, change))
    runner, kv = model.runner, model.runner.backend.kv
    ids = [9, 10, 11, 12, 13, 14, 15]
    others = [slot for slot in range(model.meta.geometry.batch) if slot != 1]
    want = runner.greedy(ids, 6, slot=others[-1])[0]
    logits = runner.prefill_prompt(0, ids)
    before = kv.read()
    runner.fork(0, 1)
    for new_rank, old_rank in zip(kv.read(), before):
        for new, old in zip(new_rank, old_rank):  # (B, KVH, S, D)
            assert torch.equal(new[1, :, : len(ids)], old[0, :, : len(ids)]) and torch.equal(new[others], old[others])
    runner.free(0)
    got = []
    for _ in want:
        got.append(int(logits.argmax()))
        logits = runner.decode({1: got[-1]})[1]
    assert got == want
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

"""`build.py doctor`: the machine checks against the pins (from facts a test gives), the exit-2 report
of a machine without the SDK or a device, and the layout steps run against the SDK stand-in."""

import json
import os
import subprocess
import sys

import pytest

from gemma4_port.ops.doctor import LAYOUTS, Machine, machine_checks, render, run_all
from gemma4_port.source.manifest import load_manifest
from support import MANIFESTS
from support.sdk import ROOT, sdk_env

TC = load_manifest(MANIFESTS / "tiny-e2b.yaml").toolchain
# An inf2.xlarge as `neuron-ls -j` describes it (aws-neuron-sdk tools/neuron-sys-tools/neuron-ls.rst fields).
ONE_CHIP = [
    {"neuron_device": 0, "nc_count": 2, "neuroncore_ids": [0, 1], "memory_size": 34359738368, "neuron_processes": []}
]


def healthy(**change) -> Machine:
    m = Machine(
        wheels={
            "torch-neuronx": TC.torch_neuronx,
            "neuronx-cc": TC.neuronx_cc + "+3b612583",
            "neuronx-distributed": TC.neuronx_distributed,
        },
        apt={
            "aws-neuronx-runtime-lib": TC.neuron_runtime + "-0d3ac3dfc",
            "aws-neuronx-collectives": TC.neuron_collectives + "-2a1b5a9c8",
            "aws-neuronx-tools": TC.neuron_tools + "-1f2e3d4c5",
        },
        driver=TC.neuron_driver,
        devices=["/dev/neuron0"],
        neuron_ls=ONE_CHIP,
        env={},
    )
    for key, value in change.items():
        setattr(m, key, value)
    return m


def failing(m: Machine) -> dict[str, bool]:
    return {c.name: c.blocking for c in machine_checks(TC, m) if not c.ok}


def test_a_ready_inf2_passes_every_check():
    assert failing(healthy()) == {}


def test_each_gap_is_named_with_its_fix():
    assert failing(healthy(wheels={"torch-neuronx": "2.8.0.2.11.19912"})) == {  # SDK 2.27's build
        "torch-neuronx": True,
        "neuronx-cc": True,
        "neuronx-distributed": True,
    }
    assert failing(healthy(driver="2.25.4.0")) == {"Neuron driver (aws-neuronx-dkms, host)": False}  # a warning
    assert failing(healthy(env={"NEURON_RT_VISIBLE_CORES": "1"})) == {"NeuronCores this process may use": True}
    held = [dict(ONE_CHIP[0], neuron_processes=[{"pid": 42, "command": "python serve"}])]
    checks = {c.name: c for c in machine_checks(TC, healthy(neuron_ls=held))}
    assert not checks["Neuron memory free"].ok and "held by 42 (python serve)" in checks["Neuron memory free"].found
    # neuron-monitor-user-guide.rst: memory_used.neuron_runtime_used_bytes.neuron_device per runtime
    busy = {
        "neuron_runtime_data": [
            {
                "pid": 7,
                "report": {
                    "memory_used": {"neuron_runtime_used_bytes": {"host": 6997643264, "neuron_device": 12519788544}}
                },
            }
        ]
    }
    memory = {c.name: c for c in machine_checks(TC, healthy(monitor=busy))}["Neuron memory free"]
    assert not memory.ok and "32 GiB on 1 device(s), 20.3 GiB free (neuron-monitor)" == memory.found
    idle = {c.name: c for c in machine_checks(TC, healthy(monitor={"neuron_runtime_data": []}))}["Neuron memory free"]
    assert idle.ok and idle.found == "32 GiB on 1 device(s), 32.0 GiB free (neuron-monitor)"
    apt = {c.name: c for c in machine_checks(TC, healthy(apt={}))}["aws-neuronx-tools"]
    assert apt.fix == f"apt-get install aws-neuronx-tools={TC.neuron_tools}* (Neuron apt repository)"


def test_without_sdk_or_device_doctor_says_what_is_missing_and_exits_2(tmp_path):
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "doctor", "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    missing = done.stderr.strip().splitlines()
    assert all(line.startswith("missing: ") for line in missing)
    names = [line.removeprefix("missing: ").split(":")[0] for line in missing]
    assert {"torch-neuronx", "neuronx-cc", "neuronx-distributed", "Neuron devices"} <= set(names)
    report = json.loads(out.read_text())
    assert report["steps"] == [] and len(report["missing"]) == len(missing)
    assert "| torch-neuronx | MISSING | not installed | 2.8.0.2.12.22436 |" in done.stdout


@pytest.mark.slow
def test_the_layout_steps_run_each_in_its_own_process_on_the_stand_in(tmp_path):
    """Compile, verify and serve of the tp 2 device-prefill layout, as doctor runs them on inf2."""
    steps = run_all(tmp_path, sdk_env(), ["tp2-device-prefill"])
    assert [(s.step, s.ok) for s in steps] == [("compile", True), ("verify", True), ("serve", True)], steps
    assert "passed, 0 failed" in steps[1].data["summary"]
    assert steps[2].data["completion_tokens"] > 0 and steps[2].data["text"]
    report = {
        "created": "now",
        "host": "h",
        "python": "3",
        "sdk": "2.28",
        "work": str(tmp_path),
        "missing": [],
        "machine": [],
        "steps": [vars(s) for s in steps],
    }
    text = render(report)
    assert "| tp2-device-prefill | serve | ok |" in text and "### tp2-device-prefill: serve" in text
    assert set(LAYOUTS) == {"tp1", "batch4", "tp2-device-prefill", "tp2-host-prefill"}


def test_a_neuron_ls_that_hangs_fails_or_prints_no_list_is_not_available(tmp_path, monkeypatch):
    from gemma4_port.ops import doctor

    tool = tmp_path / "neuron-ls"
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    for body in ("echo '{not json'", "echo '{\"a\": 1}'", "exit 3", "sleep 5"):
        tool.write_text(f"#!/bin/sh\n{body}\n")
        tool.chmod(0o755)
        assert doctor._neuron_ls(timeout_s=1) is None, body
    tool.write_text("#!/bin/sh\necho '[{\"nc_count\": 2}]'\n")
    assert doctor._neuron_ls(timeout_s=5) == [{"nc_count": 2}]

"""`build.py doctor`: the machine checks against the pins (from facts a test gives), the planning of what
runs where, the report assembled from steps, tools that fail in every way, and the steps run against
the SDK stand-in."""

import json
import os
import subprocess
import sys

import pytest

from gemma4_port.ops.doctor import monitor
from gemma4_port.ops.doctor.checks import machine_checks
from gemma4_port.ops.doctor.facts import Machine, neuron_ls
from gemma4_port.ops.doctor.main import CONSTRAINTS, framework_pins, run_all
from gemma4_port.ops.doctor.measure import rates, versus_roofline
from gemma4_port.ops.doctor.report import render, write
from gemma4_port.ops.doctor.steps import copy_logs, run_cli
from gemma4_port.ops.doctor.targets import REAL, TINY, DoctorError, Skip, Target, plan, select, target
from gemma4_port.ops.model_sizes import ModelSizes
from gemma4_port.source.configs import text_config_for
from gemma4_port.source.manifest import load_manifest
from gemma4_port.source.toolchain import load_toolchain
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


def failing(m: Machine, cores: int = 2) -> dict[str, bool]:
    return {c.name: c.blocking for c in machine_checks(TC, m, cores) if not c.ok}


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


def test_one_core_is_enough_for_tp1_and_the_tp2_layouts_are_skipped_saying_why():
    one = healthy(env={"NEURON_RT_VISIBLE_CORES": "1"})
    assert failing(one, cores=1) == {}
    out = plan(select("tp1,tp2-host-prefill"), cores=1, host_bytes=0)
    assert [type(p) for p in out] == [Target, Skip]
    assert out[1].reason == "needs 2 NeuronCores (tp 2), this process may use 1"


def test_the_framework_wheels_are_recorded_and_checked_against_the_constraints():
    pins = framework_pins()
    assert pins == {"torch": "2.8.0", "torch-xla": "2.8.1", "libneuronxla": "2.2.15515.0"}
    # the SDK's own wheels are pinned once, by the toolchain, never again in the constraints
    pinned = CONSTRAINTS.read_text()
    assert not any(f"\n{w}==" in pinned for w in ("torch-neuronx", "neuronx-cc", "neuronx-distributed"))
    m = healthy(wheels=healthy().wheels | {"torch": "2.8.0+cpu", "torch-xla": "2.8.0", "libneuronxla": "2.2.15515.0"})
    found = {c.name: c for c in machine_checks(TC, m, 2, pins)}
    assert found["torch"].ok and found["libneuronxla"].ok
    assert not found["torch-xla"].ok and not found["torch-xla"].blocking and found["torch-xla"].want == "2.8.1"


def test_bad_tool_output_and_a_bad_core_setting_are_findings_not_tracebacks(tmp_path, monkeypatch):
    tool = tmp_path / "neuron-ls"
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    for body, why in (
        ("echo '{not json'", "printed no JSON"),
        ("echo '{\"a\": 1}'", "not a device list"),
        ("echo broken >&2; exit 3", "exit 3: broken"),
        ("sleep 5", "no answer in 1 s"),
    ):
        tool.write_text(f"#!/bin/sh\n{body}\n")
        tool.chmod(0o755)
        listed, reason = neuron_ls(timeout_s=1)
        assert listed is None and why in reason, body
    tool.write_text("#!/bin/sh\necho '[{\"nc_count\": 2}]'\n")
    assert neuron_ls(timeout_s=5) == ([{"nc_count": 2}], "")
    bad = healthy(env={"NEURON_RT_VISIBLE_CORES": "0-x"}, problems={"neuron-monitor": "printed no JSON: 'oops'"})
    checks = {c.name: c for c in machine_checks(TC, bad)}
    assert "is not a core id or a range" in checks["NeuronCores this process may use"].found
    assert (
        checks["tool: neuron-monitor"].found == "printed no JSON: 'oops'"
        and not checks["tool: neuron-monitor"].blocking
    )
    gap = {c.name: c for c in machine_checks(TC, healthy(env={"NEURON_RT_VISIBLE_CORES": "0,2"}))}
    assert "the runtime needs contiguous cores" in gap["NeuronCores this process may use"].found
    assert (
        failing(healthy(env={"NEURON_RT_VISIBLE_CORES": "0,1"}))
        == failing(healthy(env={"NEURON_RT_VISIBLE_CORES": "0-1"}))
        == {}
    )
    odd = healthy(neuron_ls=[{"nc_count": "two", "neuron_processes": None, "memory_size": "big"}])
    assert not {c.name: c for c in machine_checks(TC, odd)}["NeuronCores this process may use"].ok


def test_without_sdk_or_device_doctor_says_what_is_missing_and_exits_2(tmp_path):
    """On this machine, with every Neuron tool present but broken, and a bad core setting."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("neuron-ls", "exit 1"), ("neuron-monitor", "echo '<html>'"), ("dpkg-query", "exit 9")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    out = tmp_path / "report.json"
    env = os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}", "NEURON_RT_VISIBLE_CORES": "0-x"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "doctor", "--json", str(out), "--work", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    missing = done.stderr.strip().splitlines()
    assert all(line.startswith("missing: ") for line in missing)
    names = [line.removeprefix("missing: ").split(":")[0] for line in missing]
    assert {"torch-neuronx", "neuronx-cc", "neuronx-distributed", "Neuron devices"} <= set(names)
    report = json.loads(out.read_text())
    assert report["steps"] == [] and len(report["missing"]) == len(missing)
    assert "| torch-neuronx | MISSING | not installed | 2.8.0.2.12.22436 |" in done.stdout
    assert "| tool: neuron-ls | warning | exit 1 |" in done.stdout
    assert "| tool: neuron-monitor | warning | printed no JSON: '<html>'" in done.stdout
    assert {"report.md", "report.json", "versions.txt"} <= {p.name for p in (tmp_path / "r").iterdir()}
    assert "pytest==" in (tmp_path / "r" / "versions.txt").read_text()


def test_the_real_targets_stand_in_for_each_model_with_random_weights_of_its_config():
    assert select(None) == [*TINY, *REAL]
    with pytest.raises(DoctorError, match="--layouts e9b: no such layout"):
        select("tp1,e9b")
    for name, shipped in REAL.items():
        t, real = target(name), load_manifest(MANIFESTS / f"{shipped}.yaml")
        assert t.real and t.serve and t.variant == real.images.variant
        assert t.manifest.variant(t.variant) == real.variant(t.variant) and len(t.manifest.variants) == 1
        # the device graphs are the real model's: every shape of its config, the vocabulary included
        assert text_config_for(t.manifest).to_dict() | {"vocab_size": 0} == text_config_for(real).to_dict() | {
            "vocab_size": 0
        }
        assert t.manifest.model.random.config["vocab_size"] == 262_144
    e2b = target("e2b")
    out = plan(["e2b", "tp1"], cores=2, host_bytes=16 * 2**30, need=lambda t: 35 * 2**30 if t.real else 0)
    assert isinstance(out[0], Skip) and "needs >= 35 GiB of host RAM" in out[0].reason and "16 GiB" in out[0].reason
    assert plan(["e2b"], cores=2, host_bytes=128 * 2**30, need=lambda t: 35 * 2**30) == [e2b]


SAMPLE = {  # two runtimes on core 0, one on core 1 (neuron-monitor-user-guide.rst:390-437, 534-560)
    "neuron_runtime_data": [
        {
            "report": {
                "memory_used": {
                    "neuron_runtime_used_bytes": {
                        "usage_breakdown": {
                            "neuroncore_memory_usage": {
                                "0": {"tensors": 100, "model_code": 10, "constants": 0},
                                "1": {"tensors": 50, "runtime_memory": 5, "model_shared_scratchpad": 512},
                            }
                        }
                    }
                },
                "neuroncore_counters": {"neuroncores_in_use": {"0": {"neuroncore_utilization": 40.0}}},
            }
        },
        {
            "report": {
                "memory_used": {
                    "neuron_runtime_used_bytes": {"usage_breakdown": {"neuroncore_memory_usage": {"0": {"tensors": 7}}}}
                }
            }
        },
        {"report": "garbage"},
    ]
}


def test_neuron_monitor_samples_summarise_per_core_and_category():
    later = json.loads(json.dumps(SAMPLE).replace("40.0", "80.0").replace('"tensors": 100', '"tensors": 60'))
    s = monitor.summarise([SAMPLE, later, {}])
    assert s["memory"]["0"]["tensors"] == 107 and s["memory"]["0"]["model_code"] == 10  # peak, runtimes summed
    assert s["memory"]["1"] == {
        "tensors": 50,
        "constants": 0,
        "model_code": 0,
        "model_shared_scratchpad": 512,
        "runtime_memory": 5,
        "total": 567,
    }
    assert s["utilisation"] == {"0": {"mean": 60.0, "peak": 80.0}}


def test_the_sampler_keeps_every_line_and_survives_a_missing_or_broken_monitor(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with monitor.Sampler(tmp_path / "none.jsonl") as absent:
        pass
    assert absent.summary()["problem"] == "neuron-monitor not installed (aws-neuronx-tools)"
    tool = tmp_path / "neuron-monitor"
    tool.write_text(f"#!/bin/sh\necho '{json.dumps(SAMPLE)}'\necho 'not json'\necho '[1]'\nexec sleep 60\n")
    tool.chmod(0o755)
    with monitor.Sampler(tmp_path / "raw.jsonl") as sampler:
        for _ in range(200):
            if sampler.unreadable == 2:
                break
            import time

            time.sleep(0.05)
    summary = sampler.summary()
    assert summary["samples"] == 1 and summary["unreadable"] == 2 and summary["memory"]["1"]["total"] == 567
    assert len((tmp_path / "raw.jsonl").read_text().splitlines()) == 3


def test_stream_rates_and_the_roofline_they_are_held_against():
    s = rates(10.0, [10.5, 10.6, 11.5], 11)
    assert s.ttft_s == 0.5 and s.decode_tok_s == pytest.approx(10.0)
    assert rates(0.0, [0.2], 1).decode_tok_s is None
    with pytest.raises(ValueError, match="no content"):
        rates(0.0, [], 0)
    m = load_manifest(MANIFESTS / "tiny-e2b.yaml")
    sizes, b4 = ModelSizes(text_config_for(m)), m.variant("b4")
    v = versus_roofline({"decode_tok_s": 100.0, "batch": {"streams": 4, "aggregate_tok_s": 200.0}}, sizes, b4)
    assert v["key_bucket"] == 32 and v["of_roofline"] == round(100.0 / v["roofline_tok_s"], 3)
    assert v["roofline_aggregate_tok_s"] > v["roofline_tok_s"] and v["measured_aggregate_tok_s"] == 200.0


def test_the_report_holds_every_step_skip_and_figure(tmp_path):
    steps = [
        {
            "target": "e2b",
            "step": "compile",
            "ok": True,
            "seconds": 5400.0,
            "detail": "",
            "peak_rss": 80 * 2**30,
            "log": "e2b/compile.log",
            "data": {"compiler_logs": ["e2b/compiler/prefill/log-neuron-cc.txt"]},
        },
        {
            "target": "e2b",
            "step": "serve",
            "ok": True,
            "seconds": 300.0,
            "detail": "",
            "peak_rss": None,
            "log": None,
            "data": {
                "load_s": 120.0,
                "ttft_ms": 85.0,
                "neuron_monitor": monitor.summarise([SAMPLE]) | {"samples": 1},
                "versus_roofline": {
                    "key_bucket": 4096,
                    "roofline_tok_s": 70.1,
                    "measured_tok_s": 35.0,
                    "of_roofline": 0.499,
                },
            },
        },
        {
            "target": "tp1",
            "step": "verify",
            "ok": False,
            "seconds": 3.0,
            "detail": "exit 1: boom (whole log: tp1/verify.log)",
            "peak_rss": 2**30,
            "log": "tp1/verify.log",
            "data": {},
        },
    ]
    report = {
        "created": "now",
        "host": "h",
        "python": "3.11",
        "sdk": "2.28",
        "work": str(tmp_path),
        "versions": {"torch": "2.8.0", "libneuronxla": "2.2.15515.0"},
        "machine": [],
        "missing": [],
        "skipped": [{"name": "12b", "reason": "needs 2 NeuronCores (tp 2), this process may use 1"}],
        "steps": steps,
    }
    text = write(report, tmp_path, ["torch==2.8.0"])
    assert "wheels: libneuronxla 2.2.15515.0, torch 2.8.0" in text
    assert "| e2b | compile | ok | 5400.0 | 80.00 |  | e2b/compile.log |" in text
    assert "| tp1 | verify | FAILED | 3.0 | 1.00 | exit 1: boom (whole log: tp1/verify.log) | tp1/verify.log |" in text
    assert "| 12b |  | skipped |  |  | needs 2 NeuronCores (tp 2), this process may use 1 |  |" in text
    assert "measured 35.0 tok/s, roofline 70.1 tok/s (50% of it)" in text and "- ttft_ms: 85.0" in text
    assert "| 0 | 0 | 0 | 0 | 0 | 0 | 0 | 40.0 | 40.0 |" in text  # bytes shown in MiB: 107 B rounds to 0
    assert "compiler logs copied: 1 file(s) under e2b/compiler/" in text
    assert (tmp_path / "report.md").read_text() == text == render(report)
    assert json.loads((tmp_path / "report.json").read_text())["steps"][0]["peak_rss"] == 80 * 2**30


def test_a_failing_step_keeps_its_whole_log_and_the_compiler_logs_are_copied(tmp_path):
    step = run_cli(
        "tp1", "verify", ["verify", tmp_path / "nothing"], dict(os.environ), tmp_path, tmp_path / "tp1" / "v.log"
    )
    assert not step.ok and step.detail.startswith("exit ") and "(whole log: tp1/v.log)" in step.detail
    assert step.peak_rss and step.peak_rss > 10 * 2**20 and step.log == "tp1/v.log"
    work = tmp_path / "workdir"
    (work / "prefill" / "_tp0_bk0").mkdir(parents=True)
    (work / "prefill" / "_tp0_bk0" / "log-neuron-cc.txt").write_text("a\n" * 5000)
    (work / "prefill" / "_tp0_bk0" / "model.neff").write_bytes(b"\0" * 100)
    assert copy_logs(work, tmp_path / "copied") == ["prefill/_tp0_bk0/log-neuron-cc.txt"]
    assert (tmp_path / "copied" / "prefill" / "_tp0_bk0" / "log-neuron-cc.txt").read_text() == "a\n" * 5000
    assert copy_logs(tmp_path / "absent", tmp_path / "x") == []


@pytest.mark.slow
def test_the_steps_run_each_in_its_own_process_on_the_stand_in(tmp_path):
    """Compile, verify and serve of the tp 2 device-prefill layout, as doctor runs them on inf2."""
    steps = run_all(tmp_path, sdk_env(), [target("tp2-device-prefill")])
    assert [(s.step, s.ok) for s in steps] == [("compile", True), ("verify", True), ("serve", True)], steps
    assert (
        all(s.peak_rss and s.peak_rss > 50 * 2**20 for s in steps[:2])
        and steps[0].log == "tp2-device-prefill/compile.log"
    )
    assert "Traceback" not in (tmp_path / steps[0].log).read_text()
    assert "passed, 0 failed" in steps[1].data["summary"]
    assert steps[1].data["neuron_monitor"]["problem"] == "neuron-monitor not installed (aws-neuronx-tools)"
    serve = steps[2].data
    assert serve["streams"][0]["completion_tokens"] > 0 and serve["ttft_ms"] > 0 and serve["batch"]["streams"] == 2
    assert serve["server_logs"] and (tmp_path / serve["server_logs"][0]).is_file()
    assert load_toolchain().neuron_sdk == "2.28"

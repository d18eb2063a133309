"""`build.py doctor`: the machine's checks first (whatever blocks is one `missing:` line on stderr and
exit 2: nothing else can run), then each target the machine can run, in its own processes, into one
report folder. Exit 1 when a step failed."""

from __future__ import annotations

import datetime
import os
import platform
import sys
from dataclasses import asdict
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from gemma4_port import ROOT
from gemma4_port.ops.doctor import report as rep
from gemma4_port.ops.doctor.checks import machine_checks, usable_cores
from gemma4_port.ops.doctor.facts import Machine, installed_distributions
from gemma4_port.ops.doctor.run import run_target
from gemma4_port.ops.doctor.targets import Skip, Target, plan, select, target
from gemma4_port.source.checkpoint import cache_root
from gemma4_port.source.toolchain import load_toolchain

CONSTRAINTS = ROOT / "constraints" / "neuron.txt"
FRAMEWORK = ("torch", "torch-xla", "libneuronxla")  # checked against the constraints, as warnings


def framework_pins(path: Path = CONSTRAINTS) -> dict[str, str]:
    """name -> exact version of the FRAMEWORK wheels the constraints file pins ({} if it is absent)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    pins = {}
    for line in lines:
        text = line.partition("#")[0].strip()
        try:
            req = Requirement(text) if text else None
        except InvalidRequirement:
            continue
        spec = list(req.specifier) if req else []
        if req and req.name in FRAMEWORK and len(spec) == 1 and spec[0].operator == "==":
            pins[req.name] = spec[0].version
    return pins


def run_all(work: Path, env: dict, targets: list[Target]) -> list:
    work.mkdir(parents=True, exist_ok=True)
    steps = []
    for t in targets:
        steps += run_target(t, work, env)
    return steps


def doctor_main(args) -> int:
    names = select(args.layouts)
    tc = load_toolchain()
    machine = Machine.here()
    cores, _ = usable_cores(machine)
    # the smallest tp asked for must fit; a target needing more cores than there are is skipped, said why
    checks = machine_checks(tc, machine, min(target(n).tp for n in names), framework_pins())
    missing = [f"{c.name}: {c.found}, wanted {c.want} -> {c.fix}" for c in checks if not c.ok and c.blocking]
    planned = [] if missing else plan(names, None if cores is None else len(cores), machine.host_bytes)
    work = Path(args.work or cache_root() / "doctor" / datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    report = {
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "sdk": tc.neuron_sdk,
        "versions": machine.wheels,
        "work": str(work),
        "machine": [asdict(c) for c in checks],
        "missing": missing,
        "skipped": [asdict(p) for p in planned if isinstance(p, Skip)],
        "steps": [],
    }
    if not report["missing"]:
        runnable = [p for p in planned if isinstance(p, Target)]
        report["steps"] = [asdict(s) for s in run_all(work, dict(os.environ), runnable)]
    print(rep.write(report, work, installed_distributions()), end="")
    if args.json_out:
        Path(args.json_out).write_text((work / "report.json").read_text())
    for line in report["missing"]:
        print(f"missing: {line}", file=sys.stderr)
    if report["missing"]:
        return 2
    return 0 if all(s["ok"] for s in report["steps"]) else 1

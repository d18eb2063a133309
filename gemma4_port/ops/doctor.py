"""`build.py doctor [--json OUT]`: is this machine ready for Gemma-4 on Inferentia2, and does every
Neuron layout work on it? What to run first on a new inf2 machine, and what to attach to a bug report.

First the machine against the manifests' toolchain (one SDK release, every component at its exact
build): the SDK wheels, the Neuron apt packages, the host driver, the Neuron devices, the cores this
process may use and who else holds them. Whatever is missing is said in one line each, and doctor
exits 2: nothing else can run. Then, each in a process of its own (the Neuron runtime holds the
cores a process opened until it exits, and ModelBuilder wants a process per trace), it compiles the
tiny manifests for every layout, verifies each against the float reference, serves one and answers
a request, and runs a short bench. The report is Markdown on stdout and, with --json, a JSON file;
the artifacts and logs stay in the work folder it names. Exit 1 when a step failed.

`verify` writes its own figures when it takes `--json` (the verify command's report): doctor passes
the flag when the command has it and puts what it wrote, as it is, into this report.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import platform
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from contract.errors import Gemma4Error
from contract.layout import visible_cores
from contract.versions import NEURON_PIP_INDEX, SYSTEM_PACKAGES, driver_problem, matches_pin
from gemma4_port import MANIFESTS, ROOT
from gemma4_port.source.checkpoint import cache_root
from gemma4_port.source.manifest import Toolchain, load_manifest
from runtime.model.neuron_sdk import driver_version, installed_versions, system_package_version


class DoctorError(Gemma4Error, ValueError):
    pass


# The four ways a Neuron artifact runs, on the tiny manifests: all one ModelBuilder model each.
LAYOUTS = {
    "tp1": ("tiny-e2b", "bf16"),
    "batch4": ("tiny-e2b", "b4"),
    "tp2-device-prefill": ("tiny-e4b", "tp2-bf16"),
    "tp2-host-prefill": ("tiny-e4b", "tp2-host"),
}
SERVED = "tp2-device-prefill"  # the layout whose server answers a request: tp 2 with the prefill on the device
BENCHED = "tp1"
TIMEOUT_S = {"compile": 3600, "verify": 1800, "serve": 900, "bench": 3600}
WHEELS = (
    ("torch-neuronx", "torch_neuronx"),
    ("neuronx-cc", "neuronx_cc"),
    ("neuronx-distributed", "neuronx_distributed"),
)


# -- the machine ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    found: str
    want: str
    fix: str = ""  # what to do, when not ok
    blocking: bool = True  # not ok -> the layouts cannot run


@dataclass
class Machine:
    """The raw facts, gathered once (tests give their own)."""

    wheels: dict[str, str]
    apt: dict[str, str | None]
    driver: str | None
    devices: list[str]
    neuron_ls: list[dict] | None  # `neuron-ls -j`, None when the tool is absent or fails
    env: dict[str, str]
    monitor: dict | None = None  # one `neuron-monitor` report (memory_used per Neuron runtime), None without it

    @classmethod
    def here(cls) -> Machine:
        return cls(
            installed_versions(tuple(w for w, _ in WHEELS)),
            {p: system_package_version(p) for p in SYSTEM_PACKAGES},
            driver_version(),
            sorted(glob.glob("/dev/neuron[0-9]*")),
            _neuron_ls(),
            dict(os.environ),
            _monitor_once(),
        )


def _neuron_ls(timeout_s: float = 60) -> list[dict] | None:
    """`neuron-ls -j`'s device list; None when the tool is absent, fails, hangs or prints no JSON list
    (the machine check then says it is not available: a line in the report, not a traceback)."""
    if not shutil.which("neuron-ls"):
        return None
    try:
        done = subprocess.run(["neuron-ls", "-j"], capture_output=True, text=True, timeout=timeout_s, check=False)
        listed = json.loads(done.stdout) if done.returncode == 0 else None
    except (subprocess.TimeoutExpired, OSError, ValueError):
        return None
    return listed if isinstance(listed, list) and all(isinstance(d, dict) for d in listed) else None


def _monitor_once(timeout_s: float = 15) -> dict | None:
    """The first report of `neuron-monitor` with only the memory_used group (aws-neuron-sdk
    tools/neuron-sys-tools/neuron-monitor-user-guide.rst: one JSON document per line and period)."""
    if not shutil.which("neuron-monitor"):
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as cfg:
        json.dump(
            {
                "period": "1s",
                "neuron_runtimes": [{"tag_filter": ".*", "metrics": [{"type": "memory_used"}]}],
                "system_metrics": [],
            },
            cfg,
        )
    proc = subprocess.Popen(
        ["neuron-monitor", "-c", cfg.name], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        line = proc.stdout.readline() if ready else ""
    finally:
        proc.terminate()
        proc.wait(10)
        os.unlink(cfg.name)
    try:
        return json.loads(line)
    except ValueError:
        return None


def device_bytes_in_use(report: dict) -> int:
    """Device memory every running Neuron runtime holds, from a neuron-monitor report."""
    return sum(
        rt.get("report", {}).get("memory_used", {}).get("neuron_runtime_used_bytes", {}).get("neuron_device", 0)
        for rt in report.get("neuron_runtime_data") or []
    )


def machine_checks(tc: Toolchain, m: Machine) -> list[Check]:
    out = []
    for wheel, field_name in WHEELS:
        pin, found = getattr(tc, field_name), m.wheels.get(wheel)
        out.append(
            Check(
                wheel,
                bool(found) and matches_pin(pin, found),
                found or "not installed",
                pin,
                f"pip install --extra-index-url {NEURON_PIP_INDEX} {wheel}=={pin}",
            )
        )
    for package, pin in zip(SYSTEM_PACKAGES, (tc.neuron_runtime, tc.neuron_collectives, tc.neuron_tools), strict=True):
        found = m.apt.get(package)
        out.append(
            Check(
                package,
                bool(found) and matches_pin(pin, found),
                found or "not installed",
                pin,
                f"apt-get install {package}={pin}* (Neuron apt repository)",
            )
        )
    problem = driver_problem(tc.neuron_driver, m.driver)
    out.append(
        Check(
            "Neuron driver (aws-neuronx-dkms, host)",
            problem is None,
            m.driver or "not loaded",
            f">= {tc.neuron_driver}",
            problem or "",
            blocking=m.driver is None,
        )
    )
    out.append(
        Check(
            "Neuron devices",
            bool(m.devices),
            " ".join(m.devices) or "none",
            "/dev/neuron0 or more",
            "run on an inf2 instance; in a container pass --device /dev/neuron0",
        )
    )
    out += _core_checks(m)
    return out


def _core_checks(m: Machine) -> list[Check]:
    if m.neuron_ls is None:
        return [
            Check(
                "neuron-ls -j",
                False,
                "not available",
                "the device list (aws-neuronx-tools)",
                "install aws-neuronx-tools; on a machine without Neuron devices it has nothing to list",
            )
        ]
    cores = [c for d in m.neuron_ls for c in d.get("neuroncore_ids", range(d.get("nc_count", 0)))]
    visible = visible_cores(m.env)
    mine = [c for c in cores if visible is None or c in visible]
    held = sorted(
        {f"{p.get('pid')} ({p.get('command', '?')})" for d in m.neuron_ls for p in d.get("neuron_processes", [])}
    )
    total = sum(d.get("memory_size", 0) for d in m.neuron_ls)
    used = device_bytes_in_use(m.monitor) if m.monitor else None
    memory = f"{total / 2**30:.0f} GiB on {len(m.neuron_ls)} device(s)" + (
        f", {(total - used) / 2**30:.1f} GiB free (neuron-monitor)"
        if used is not None
        else ", free unknown (no neuron-monitor)"
    )
    return [
        Check(
            "NeuronCores this process may use",
            len(mine) >= 2,
            f"{mine} (NEURON_RT_VISIBLE_CORES={m.env.get('NEURON_RT_VISIBLE_CORES', 'unset')})",
            "2 or more (the tp 2 layouts)",
            "unset NEURON_RT_VISIBLE_CORES or give it two cores, e.g. 0-1",
        ),
        Check(
            "Neuron memory free",
            not held and not used,
            memory + (f"; held by {', '.join(held)}" if held else ""),
            "all of it: no other process on the devices",
            "stop the processes that hold the NeuronCores (neuron-ls lists them)",
        ),
    ]


# -- the layouts ---------------------------------------------------------------------------------


@dataclass
class Step:
    layout: str
    step: str
    ok: bool
    seconds: float
    detail: str = ""
    data: dict = field(default_factory=dict)


def _verify_takes_json(env: dict) -> bool:
    """Whether `build.py verify` writes a JSON report of its figures (its --help says so)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "verify", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
        check=False,
    )
    return "--json" in done.stdout


def _cli(layout: str, step: str, args: list, env: dict, log: Path) -> Step:
    start = time.perf_counter()
    with open(log, "w") as out:
        try:
            done = subprocess.run(
                [sys.executable, str(ROOT / "build.py"), *map(str, args)],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env=env,
                timeout=TIMEOUT_S[step],
                check=False,
            )
            rc = done.returncode
        except subprocess.TimeoutExpired:
            rc = None
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    detail = f"timed out after {TIMEOUT_S[step]} s" if rc is None else (lines[-1] if lines else "") if rc else ""
    if rc:
        detail = f"exit {rc}: {detail} (log {log})"
    return Step(layout, step, rc == 0, round(time.perf_counter() - start, 1), detail)


def run_layout(layout: str, work: Path, env: dict) -> list[Step]:
    name, variant = LAYOUTS[layout]
    folder = work / layout
    folder.mkdir(parents=True, exist_ok=True)
    artifact = folder / "artifact"
    steps = [
        _cli(
            layout,
            "compile",
            ["compile", MANIFESTS / f"{name}.yaml", "--variant", variant, "--backend", "neuron", "--out", artifact],
            env,
            folder / "compile.log",
        )
    ]
    if not steps[-1].ok:
        return steps
    report = folder / "verify.json"
    args = ["verify", artifact, "--quick"] + (["--json", report] if _verify_takes_json(env) else [])
    steps.append(_cli(layout, "verify", args, env, folder / "verify.log"))
    if report.is_file():
        steps[-1].data = json.loads(report.read_text())
    log = (folder / "verify.log").read_text(errors="replace").splitlines()
    summary = [ln for ln in log if "passed," in ln and "failed" in ln]
    if summary:
        steps[-1].data.setdefault("summary", summary[-1].strip())
    return steps


def serve_once(layout: str, artifact: Path, work: Path, env: dict) -> Step:
    """`build.py serve` in its own process, one chat request through the official client."""
    import openai

    from gemma4_port.bench.server import Server

    start = time.perf_counter()
    extra = {k: v for k, v in env.items() if os.environ.get(k) != v}
    try:
        with Server(artifact, work / "serve-logs", ready_timeout_s=TIMEOUT_S["serve"], env=extra) as server:
            asked = time.perf_counter()
            reply = openai.OpenAI(
                base_url=f"{server.url}/v1", api_key=env.get("GEMMA4_API_KEY", "none")
            ).chat.completions.create(
                model=server.model,
                messages=[{"role": "user", "content": "Capital of France?"}],
                max_tokens=8,
                temperature=0,
            )
            data = {
                "load_s": round(server.load_s, 1),
                "answer_s": round(time.perf_counter() - asked, 3),
                "text": reply.choices[0].message.content,
                "completion_tokens": reply.usage.completion_tokens,
            }
    except Exception as exc:  # noqa: BLE001 - the report says what failed; the other steps still ran
        return Step(layout, "serve", False, round(time.perf_counter() - start, 1), f"{type(exc).__name__}: {exc}")
    return Step(layout, "serve", True, round(time.perf_counter() - start, 1), data=data)


def bench_once(layout: str, artifact: Path, work: Path, env: dict) -> Step:
    out = work / "bench.json"
    step = _cli(layout, "bench", ["bench", artifact, "--json", out], env, work / "bench.log")
    if out.is_file():
        step.data = json.loads(out.read_text())
    return step


# -- the report ----------------------------------------------------------------------------------


def _table(rows: list[list], header: list[str]) -> list[str]:
    clean = [[str(c).replace("|", "/").replace("\n", " ") for c in r] for r in rows]
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in clean)]


def _figures(data) -> list[str]:
    """Whatever a step's JSON holds, as it is: scalars as lines, a list of records as a table."""
    if not isinstance(data, dict):
        return [f"    {json.dumps(data)[:2000]}"]
    out = []
    for key, value in data.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            cols = list(dict.fromkeys(k for v in value for k in v))
            out += [
                f"{key}:",
                "",
                *_table(
                    [
                        [json.dumps(v.get(c)) if isinstance(v.get(c), (dict, list)) else v.get(c, "") for c in cols]
                        for v in value
                    ],
                    cols,
                ),
                "",
            ]
        else:
            out.append(f"- {key}: {json.dumps(value)[:500]}")
    return out


def render(report: dict) -> str:
    lines = [
        f"# gemma4-inf2 doctor, {report['created']}",
        "",
        f"host {report['host']}, Python {report['python']}; toolchain: Neuron SDK {report['sdk']}",
        "",
        "## Machine",
        "",
    ]
    lines += _table(
        [
            [
                c["name"],
                "ok" if c["ok"] else ("MISSING" if c["blocking"] else "warning"),
                c["found"],
                c["want"],
                "" if c["ok"] else c["fix"],
            ]
            for c in report["machine"]
        ],
        ["check", "", "found", "wanted", "fix"],
    )
    if report["missing"]:
        lines += ["", f"Nothing else ran: {len(report['missing'])} prerequisite(s) missing (above)."]
        return "\n".join(lines) + "\n"
    lines += ["", "## Layouts (tiny manifests, each step in its own process)", ""]
    lines += _table(
        [
            [
                s["layout"],
                s["step"],
                "ok" if s["ok"] else "FAILED",
                s["seconds"],
                s["detail"] or s["data"].get("summary", ""),
            ]
            for s in report["steps"]
        ],
        ["layout", "step", "", "seconds", "detail"],
    )
    for s in report["steps"]:
        if set(s["data"]) - {"summary"}:  # figures beyond verify's one-line summary
            lines += ["", f"### {s['layout']}: {s['step']}", "", *_figures(s["data"])]
    lines += ["", f"Work folder (artifacts and logs): {report['work']}"]
    return "\n".join(lines) + "\n"


def doctor_main(args) -> int:
    tc = load_manifest(MANIFESTS / "tiny-e2b.yaml").toolchain
    machine = Machine.here()
    checks = machine_checks(tc, machine)
    work = Path(args.work or cache_root() / "doctor" / datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    report = {
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "sdk": tc.neuron_sdk,
        "work": str(work),
        "machine": [asdict(c) for c in checks],
        "missing": [f"{c.name}: {c.found}, wanted {c.want} -> {c.fix}" for c in checks if not c.ok and c.blocking],
        "steps": [],
    }
    if not report["missing"]:
        layouts = args.layouts.split(",") if args.layouts else list(LAYOUTS)
        unknown = sorted(set(layouts) - set(LAYOUTS))
        if unknown:
            raise DoctorError(f"--layouts {','.join(unknown)}: no such layout (have {', '.join(LAYOUTS)})")
        report["steps"] = [asdict(s) for s in run_all(work, dict(os.environ), layouts)]
    text = render(report)
    print(text, end="")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1) + "\n")
    for line in report["missing"]:
        print(f"missing: {line}", file=sys.stderr)
    if report["missing"]:
        return 2
    return 0 if all(s["ok"] for s in report["steps"]) else 1


def run_all(work: Path, env: dict, layouts: list[str]) -> list[Step]:
    work.mkdir(parents=True, exist_ok=True)
    steps = []
    for layout in layouts:
        steps += run_layout(layout, work, env)
    verified = {s.layout for s in steps if s.step == "verify" and s.ok}
    if SERVED in verified:
        steps.append(serve_once(SERVED, work / SERVED / "artifact", work / SERVED, env))
    if BENCHED in verified:
        steps.append(bench_once(BENCHED, work / BENCHED / "artifact", work / BENCHED, env))
    return steps

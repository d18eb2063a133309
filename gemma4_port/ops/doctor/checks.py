"""The machine against the manifests' toolchain, one check per unit, each a finding with its fix:
a pinned wheel, a framework wheel the constraints pin, an apt package, the host driver, the devices,
the cores this process may use, the device memory in use, and each tool that gave nothing. A blocking
finding means no target can run (doctor then exits 2); the rest are warnings."""

from __future__ import annotations

from dataclasses import dataclass

from contract.layout import NeuronPlacementError, visible_cores
from contract.versions import NEURON_PIP_INDEX, SYSTEM_PACKAGES, driver_problem, matches_pin
from gemma4_port.ops.doctor.facts import PINNED_WHEELS, Machine
from gemma4_port.ops.doctor.monitor import device_bytes_in_use
from gemma4_port.source.toolchain import Toolchain

GIB = 2**30


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    found: str
    want: str
    fix: str = ""  # what to do, when not ok
    blocking: bool = True  # not ok -> no target can run


def wheel_checks(tc: Toolchain, m: Machine) -> list[Check]:
    out = []
    for wheel, field_name in PINNED_WHEELS:
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
    return out


def framework_checks(pins: dict[str, str], m: Machine) -> list[Check]:
    """torch, torch-xla, libneuronxla against constraints/neuron.txt: warnings (the SDK's own wheels
    name what they need; a mismatch here is what to look at first when a graph misbehaves)."""
    return [
        Check(
            wheel,
            m.wheels.get(wheel, "").partition("+")[0] == pin,
            m.wheels.get(wheel) or "not installed",
            pin,
            f"pip install -c constraints/neuron.txt {wheel}=={pin}",
            blocking=False,
        )
        for wheel, pin in pins.items()
    ]


def apt_checks(tc: Toolchain, m: Machine) -> list[Check]:
    pins = (tc.neuron_runtime, tc.neuron_collectives, tc.neuron_tools)
    out = []
    for package, pin in zip(SYSTEM_PACKAGES, pins, strict=True):
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
    return out


def driver_check(tc: Toolchain, m: Machine) -> Check:
    problem = driver_problem(tc.neuron_driver, m.driver)
    return Check(
        "Neuron driver (aws-neuronx-dkms, host)",
        problem is None,
        m.driver or "not loaded",
        f">= {tc.neuron_driver}",
        problem or "",
        blocking=m.driver is None,
    )


def device_check(m: Machine) -> Check:
    return Check(
        "Neuron devices",
        bool(m.devices),
        " ".join(m.devices) or "none",
        "/dev/neuron0 or more",
        "run on an inf2 instance; in a container pass --device /dev/neuron0",
    )


def usable_cores(m: Machine) -> tuple[list[int] | None, str]:
    """The NeuronCores this process may use (neuron-ls's, within NEURON_RT_VISIBLE_CORES), or None and why."""
    if m.neuron_ls is None:
        return None, "neuron-ls gave no device list"
    try:
        visible = visible_cores(m.env)
    except NeuronPlacementError as exc:  # the variable does not parse, or names a gap the runtime refuses
        return None, str(exc)
    cores = []
    for d in m.neuron_ls:
        ids = d.get("neuroncore_ids")
        count = d.get("nc_count", 0)
        listed = ids if isinstance(ids, list) else list(range(count if isinstance(count, int) else 0))
        cores += [c for c in listed if isinstance(c, int)]
    return [c for c in cores if visible is None or c in visible], ""


def core_check(m: Machine, needed: int) -> Check:
    mine, why = usable_cores(m)
    setting = m.env.get("NEURON_RT_VISIBLE_CORES", "unset")
    return Check(
        "NeuronCores this process may use",
        mine is not None and len(mine) >= needed,
        why if mine is None else f"{mine} (NEURON_RT_VISIBLE_CORES={setting})",
        f"{needed} or more (the largest tp of the layouts asked for)",
        "unset NEURON_RT_VISIBLE_CORES or give it the cores, e.g. 0-1; or ask for fewer layouts (--layouts tp1)",
    )


def memory_check(m: Machine) -> Check:
    listed = m.neuron_ls or []
    held = sorted(
        {
            f"{p.get('pid')} ({p.get('command', '?')})"
            for d in listed
            for p in (d.get("neuron_processes") or [])
            if isinstance(p, dict)
        }
    )
    total = sum(d.get("memory_size", 0) for d in listed if isinstance(d.get("memory_size", 0), int))
    used = device_bytes_in_use(m.monitor) if m.monitor else None
    memory = f"{total / GIB:.0f} GiB on {len(listed)} device(s)" + (
        f", {(total - used) / GIB:.1f} GiB free (neuron-monitor)" if used is not None else ", free unknown"
    )
    return Check(
        "Neuron memory free",
        not held and not used,
        memory + (f"; held by {', '.join(held)}" if held else ""),
        "all of it: no other process on the devices",
        "stop the processes that hold the NeuronCores (neuron-ls lists them)",
        blocking=bool(held or used),
    )


def tool_checks(m: Machine) -> list[Check]:
    """Each tool that gave nothing: a warning naming why (the checks that needed it say what is unknown)."""
    return [
        Check(f"tool: {tool}", False, why, "an answer", "see the reason; the report goes on without it", blocking=False)
        for tool, why in sorted(m.problems.items())
    ]


def machine_checks(tc: Toolchain, m: Machine, cores_needed: int = 2, framework_pins: dict | None = None) -> list[Check]:
    checks = [*wheel_checks(tc, m), *framework_checks(framework_pins or {}, m), *apt_checks(tc, m)]
    checks += [driver_check(tc, m), device_check(m), core_check(m, cores_needed)]
    if m.neuron_ls is not None:
        checks.append(memory_check(m))
    return checks + tool_checks(m)

"""The report: one folder a user attaches to an issue. report.md (what stdout shows), report.json (the
same, whole), versions.txt (every installed distribution), and beside them each target's logs, whole:
the compile's, the compiler's own, verify's, the server's, the raw neuron-monitor lines. Rendering is
pure (a dict in, Markdown out)."""

from __future__ import annotations

import json
from pathlib import Path

MIB = 2**20
GIB = 2**30


def table(rows: list[list], header: list[str]) -> list[str]:
    clean = [[str(c).replace("|", "/").replace("\n", " ") for c in r] for r in rows]
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in clean)]


def _gib(n) -> str:
    return f"{n / GIB:.2f}" if isinstance(n, int | float) and n else ""


def machine_section(report: dict) -> list[str]:
    rows = [
        [
            c["name"],
            "ok" if c["ok"] else ("MISSING" if c["blocking"] else "warning"),
            c["found"],
            c["want"],
            "" if c["ok"] else c["fix"],
        ]
        for c in report["machine"]
    ]
    return ["## Machine", "", *table(rows, ["check", "", "found", "wanted", "fix"])]


def steps_section(report: dict) -> list[str]:
    rows = [
        [
            s["target"],
            s["step"],
            "ok" if s["ok"] else "FAILED",
            s["seconds"],
            _gib(s.get("peak_rss")),
            s["detail"] or s["data"].get("summary", ""),
            s.get("log") or "",
        ]
        for s in report["steps"]
    ]
    rows += [[k["name"], "", "skipped", "", "", k["reason"], ""] for k in report.get("skipped", [])]
    header = ["target", "step", "", "seconds", "peak RSS GiB", "detail", "log"]
    return ["## Targets (each step in its own process)", "", *table(rows, header)]


def monitor_lines(summary: dict) -> list[str]:
    if not summary:
        return []
    if not summary.get("memory") and not summary.get("utilisation"):
        return [f"- neuron-monitor: {summary.get('problem') or 'no core in use during the step'}"]
    cores = sorted(set(summary.get("memory", {})) | set(summary.get("utilisation", {})), key=str)
    cats = ("tensors", "constants", "model_code", "model_shared_scratchpad", "runtime_memory", "total")
    rows = []
    for core in cores:
        mem = summary.get("memory", {}).get(core, {})
        util = summary.get("utilisation", {}).get(core, {})
        rows.append([core, *(f"{mem.get(c, 0) / MIB:.0f}" for c in cats), util.get("mean", ""), util.get("peak", "")])
    header = ["core", *(f"{c} MiB" for c in cats), "util % mean", "util % peak"]
    return [f"neuron-monitor, peak per core over {summary.get('samples', 0)} sample(s):", "", *table(rows, header)]


def roofline_lines(v: dict) -> list[str]:
    if not v:
        return []
    lines = [
        f"- decode at batch 1 over {v['key_bucket']} keys: measured {v.get('measured_tok_s')} tok/s, "
        f"roofline {v['roofline_tok_s']} tok/s" + (f" ({v['of_roofline']:.0%} of it)" if "of_roofline" in v else "")
    ]
    if "roofline_aggregate_tok_s" in v:
        lines.append(
            f"- aggregate: measured {v['measured_aggregate_tok_s']} tok/s, roofline {v['roofline_aggregate_tok_s']} "
            f"tok/s ({v['aggregate_of_roofline']:.0%})"
        )
    return lines


SHOWN = {"summary", "neuron_monitor", "versus_roofline", "streams", "compiler_logs", "server_logs"}


def figures_section(report: dict) -> list[str]:
    out = []
    for s in report["steps"]:
        data = s["data"]
        body = [
            *(f"- {k}: {json.dumps(v)[:300]}" for k, v in data.items() if k not in SHOWN),
            *roofline_lines(data.get("versus_roofline", {})),
        ]
        if data.get("compiler_logs") is not None:
            body.append(f"- compiler logs copied: {len(data['compiler_logs'])} file(s) under {s['target']}/compiler/")
        mon = monitor_lines(data.get("neuron_monitor", {}))
        if body or mon:
            out += ["", f"### {s['target']}: {s['step']}", "", *body, *([""] + mon if mon else [])]
    return out


def render(report: dict) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in sorted(report.get("versions", {}).items())) or "none found"
    lines = [
        f"# gemma4-inf2 doctor, {report['created']}",
        "",
        f"host {report['host']}, Python {report['python']}; toolchain: Neuron SDK {report['sdk']}",
        f"wheels: {versions}",
        "",
        *machine_section(report),
    ]
    if report["missing"]:
        lines += ["", f"Nothing else ran: {len(report['missing'])} prerequisite(s) missing (above)."]
    else:
        lines += ["", *steps_section(report), *figures_section(report)]
    lines += ["", f"Report folder (this report, report.json, versions.txt and every log): {report['work']}"]
    return "\n".join(lines) + "\n"


def write(report: dict, work: Path, distributions: list[str]) -> str:
    """report.md, report.json and versions.txt into the folder; the Markdown, for stdout."""
    text = render(report)
    work.mkdir(parents=True, exist_ok=True)
    (work / "report.md").write_text(text)
    (work / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (work / "versions.txt").write_text("\n".join(distributions) + "\n")
    return text

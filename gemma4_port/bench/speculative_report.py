"""`build.py bench --speculative`: speculative decoding side by side in one run, and what it predicts on inf2.

Measured (speculative.py): the trained tiny-chat pair with transformers, the target alone, with its
drafter and with prompt lookup, on held-out chat prompts and held-out code edits. Predicted
(ops/speculative_gain.py): each shipped manifest variant's per-stream gain on the decode roofline at the
acceptance measured here, with the drafter (chat) and with prompt lookup (code edit)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from contract.tokenizer import load_tokenizer
from gemma4_port.bench import speculative, speculative_server
from gemma4_port.ops.capacity import model_sizes
from gemma4_port.ops.speculative_gain import ASSUMPTIONS, drafter_head, speculation
from gemma4_port.source.configs import drafter_config_source
from gemma4_port.source.manifest import find_manifest, load_manifest, shipped_manifests
from gemma4_port.source.model_sources import is_hub_id
from gemma4_port.source.train_tiny import SHIPPED, TinyChatSpec

METHODS = ("target alone", "drafter", "prompt lookup")
SERVED_VARIANT = "spec"  # tiny-chat's variant built with the drafter and verify graphs
# Workload whose acceptance stands for each way of drafting in the prediction.
PREDICTED = {"drafter": "chat", "prompt lookup": "code edit"}
# Acceptances the prediction is also given at: a tiny model's drafts say little of a real drafter's.
REFERENCE_ACCEPTANCE = (0.5, 0.7)


@dataclass(frozen=True)
class SpecSettings:
    k: int = 3
    chats: int = 12
    edits: int = 4
    chat_tokens: int = 48  # at most, per chat prompt (an answer ends sooner, at <turn|>)
    edit_tokens: int = 160  # at most, per code edit (the whole function again)
    manifests: tuple[str, ...] | None = None  # the shipped manifests to predict for; default: every hub model's
    serve: bool = True  # also measure our own server on the tiny-chat artifact (compiles it: a minute or two)
    server_rounds: int = 2  # alternating rounds with and without speculation, per server


def predictions(measured: dict, k: int, names: tuple[str, ...] | None = None) -> list[dict]:
    """The real (hub) manifests' variants (those `names`, default all) at their smallest and largest
    key bucket, batch 1."""
    rows = []
    for path in shipped_manifests():
        if names is not None and path.stem not in names:
            continue
        manifest = load_manifest(path)
        if manifest.model.source is None or not is_hub_id(manifest.model.source):
            continue  # the tiny models: their step is Python overhead, no roofline says anything of them
        sizes = model_sizes(manifest)  # with its drafter, as plan counts it
        drafter_is = f"{drafter_config_source(manifest)}, {drafter_head(sizes)}" if sizes.drafter_config else None
        for v in manifest.variants:
            for keys in sorted({v.key_buckets[0], v.key_buckets[-1]}):
                for method, workload in PREDICTED.items():
                    a = measured["workloads"][workload][method]["acceptance"]
                    drafter = method == "drafter"
                    s = speculation(sizes, v, keys, k, a, drafter=drafter)
                    at = {str(r): speculation(sizes, v, keys, k, r, drafter=drafter).gain for r in REFERENCE_ACCEPTANCE}
                    rows.append(
                        {
                            "manifest": manifest.name,
                            "variant": v.name,
                            "tp": v.tp,
                            "keys": keys,
                            "method": method,
                            "drafter": drafter_is if drafter else None,
                            "acceptance": a,
                            "tokens_per_round": s.tokens_per_round,
                            "decode_ms": 1e3 * s.decode_s,
                            "draft_ms": 1e3 * s.draft_s,
                            "tok_s": 1 / s.decode_s,
                            "tok_s_speculative": s.per_stream,
                            "gain": s.gain,
                            "gain_at": at,
                        }
                    )
    return rows


def served(works: tuple[speculative.Workload, ...], settings: SpecSettings, work: Path, console: Console) -> dict:
    """Our server on the tiny-chat artifact with its drafter and verify graphs (compiled here, cpu)."""
    from gemma4_port.compile.backends import compile_artifact

    manifest = load_manifest(find_manifest("tiny-chat"))
    variant = manifest.variant(SERVED_VARIANT)
    console.log(f"speculative: compiling tiny-chat/{variant.name} (drafter and verify graphs) into {work}")
    artifact = compile_artifact(manifest, variant, work / "tiny-chat-spec", backend="cpu")
    console.log(f"speculative: two servers of it (drafter, lookup), {settings.server_rounds} rounds with and without")
    return speculative_server.measure(
        artifact, {w.name: w.bodies() for w in works}, work / "logs", settings.server_rounds
    )


def run(folder: Path, settings: SpecSettings, console: Console, work: Path) -> dict:
    console.log(
        f"speculative: {folder}, k={settings.k}, {settings.chats} chat and {settings.edits} code-edit prompts, "
        "transformers greedy alone / with the drafter / with prompt lookup"
    )
    tok = load_tokenizer(folder / "target")
    new_tokens = (settings.chat_tokens, settings.edit_tokens)
    works = speculative.workloads(tok, TinyChatSpec(), settings.chats, settings.edits, new_tokens)
    measured = speculative.measure(folder, settings.k, works)
    return {
        "meta": {
            "pair": str(folder),
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "load_average": os.getloadavg(),
            "settings": asdict(settings),
        },
        "measured": measured,
        "served": served(works, settings, work, console) if settings.serve else None,
        "predicted": predictions(measured, settings.k, settings.manifests),
        "assumptions": ASSUMPTIONS,
    }


def _f(x: float, spec: str) -> str:
    return "-" if x != x else format(x, spec)  # NaN (nothing proposed) as a dash


def _speed_table(title: str, lead: tuple[str, str], ms_column: str) -> Table:
    """A table of each workload's speed per method or side: the columns both speed tables share."""
    table = Table(title=title)
    for col in (*lead, "tokens/target step", "acceptance", "tok/s", ms_column, "chunk gap p50 ms"):
        table.add_column(col)
    return table


def _speed_cells(r: dict, ms: float, gap_p50: float) -> list[str]:
    return [
        _f(r["tokens_per_target_step"], ".2f"),
        _f(r["acceptance"], ".2f"),
        _f(r["tok_s"], ".1f"),
        _f(ms, ".1f"),
        _f(gap_p50, ".1f"),
    ]


def print_report(result: dict, console: Console) -> None:
    m = result["measured"]
    table = _speed_table(
        f"tiny-chat with transformers, k = {m['k']} (side by side, one run)", ("workload", "method"), "ms/token"
    )
    table.add_column("= greedy")
    for name, rows in m["workloads"].items():
        for method in METHODS:
            r = rows[method]
            table.add_row(
                name,
                method,
                *_speed_cells(r, r["ms_per_token"], r["chunk_gap_ms"]["p50"]),
                "-" if r["equals_greedy"] is None else ("yes" if r["equals_greedy"] else "NO"),
            )
    console.print(table)
    if result["served"]:
        served_table(result["served"], console)
    pred = Table(title="predicted per-stream gain on inf2 (decode roofline, batch 1) at the acceptance above")
    for col in ("manifest", "variant", "tp", "keys", "method", "accept", "tok/round", "tok/s", "with", "gain"):
        pred.add_column(col)
    for a in REFERENCE_ACCEPTANCE:
        pred.add_column(f"gain at {a}")
    for r in result["predicted"]:
        pred.add_row(
            r["manifest"],
            r["variant"],
            str(r["tp"]),
            str(r["keys"]),
            r["method"],
            _f(r["acceptance"], ".2f"),
            _f(r["tokens_per_round"], ".2f"),
            f"{r['tok_s']:.0f}",
            f"{r['tok_s_speculative']:.0f}",
            f"{r['gain']:.2f}x",
            *(f"{r['gain_at'][str(a)]:.2f}x" for a in REFERENCE_ACCEPTANCE),
        )
    console.print(pred)
    for manifest, drafter in dict.fromkeys((r["manifest"], r["drafter"]) for r in result["predicted"] if r["drafter"]):
        console.print(f"Drafter of {manifest}: {drafter}")
    console.print(f"Assumptions: {result['assumptions']}. The CPU timings are transformers' eager Python, not ours.")


def served_table(served: dict, console: Console) -> None:
    table = _speed_table(
        "tiny-chat on our server (cpu), with and without speculation (disable_spec_decode)",
        ("workload, method", "side"),
        "ITL ms",
    )
    for name, sides in served.items():
        for label in ("without", "with"):
            r = sides[label]
            table.add_row(name, label, *_speed_cells(r, r["itl_ms"], r["chunk_gap_ms_p50"]))
    console.print(table)


def speculative_main(folder: Path | None, json_out: Path | None, console: Console, settings: SpecSettings) -> int:
    with tempfile.TemporaryDirectory(prefix="gemma4-bench-spec-") as tmp:
        result = run(folder or SHIPPED, settings, console, Path(tmp))
    out = json_out or Path("artifacts/bench-speculative.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_report(result, console)
    console.print(f"wrote {out}")
    return 0

"""What verify shows and writes: the table of rows (with the bf16 yardstick) and the JSON report."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from rich.table import Table

from contract.logit_error import BOUNDS, TOP_K
from gemma4_port.verify.agreement import Row

VERIFY_JSON_FORMAT = 1


def row_json(r: Row) -> dict:
    return {
        "prompt": r.case.name,
        "prompt_len": len(r.case.ids),
        "reused": r.case.reused,
        "steps": r.case.steps,
        "compared": r.compared,
        "verdict": r.verdict,
        "first_divergence": r.first_divergence,
        "note": r.note,
        "worst": r.worst.as_dict() if r.stats else None,
        "per_step": [
            {"step": i, "device_token": d, "reference_token": t} | s.as_dict()
            for i, ((d, t), s) in enumerate(zip(r.tokens, r.stats))
        ],
    }


def report_table(title: str, rows: list[Row], noise: dict | None) -> Table:
    table = Table(title=title)
    for col in (
        "prompt",
        "prompt len",
        "tokens compared",
        "SEQ_MATCH",
        "first divergence",
        "max |logit diff|",
        "min cosine",
        "max KL",
        f"min top-{TOP_K}",
        "note",
    ):
        table.add_column(col)
    for r in rows:
        w = r.worst
        figures = ("-",) * 4 if w is None else (f"{w.max_abs:.3g}", f"{w.cosine:.6g}", f"{w.kl:.3g}", f"{w.topk:.2f}")
        length = f"{len(r.case.ids)} ({r.case.reused} reused)" if r.case.reused else str(len(r.case.ids))
        table.add_row(
            r.case.name,
            length,
            f"{r.compared}/{r.case.steps}",
            {"MATCH": "True", "NEAR-TIE": "near-tie", "LOGITS": "True (logits off)"}.get(r.verdict, "False"),
            "-" if r.first_divergence is None else str(r.first_divergence),
            *figures,
            r.note,
        )
    if noise is not None:
        table.add_row(
            "all steps: device vs transformers bf16",
            "",
            "",
            "True" if noise["passed"] else "False",
            "",
            f"mean {noise['device_mean_max_abs']:.3g}",
            "",
            "",
            "",
            f"{noise['ratio']:.2f} x transformers' own bf16 error "
            f"(mean {noise['reference_bf16_mean_max_abs']:.3g}), bound {noise['bound']:g}",
        )
    return table


def report_json(folder: Path, meta, rows: list[Row], noise: dict | None, passed: bool, seconds: float) -> dict:
    geo = meta.geometry
    return {
        "format": VERIFY_JSON_FORMAT,
        "artifact": {
            "dir": str(folder),
            "name": meta.name,
            "variant": meta.variant,
            "backend": meta.backend,
            "dtype": geo.dtype,
            "tp": geo.tp,
            "batch": geo.batch,
        },
        "bounds": asdict(BOUNDS[geo.dtype]) | {"topk_k": TOP_K},
        "passed": passed,
        "rows": [row_json(r) for r in rows],
        "bf16_noise": noise,
        "wall_seconds": round(seconds, 2),
    }

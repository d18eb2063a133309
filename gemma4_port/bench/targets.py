"""The benchmark's targets: each goal, and the PASS/MISS verdict of one result dict against it (so the
JSON alone reproduces every verdict). Targets are read here, never asserted in tests."""

from __future__ import annotations

from dataclasses import asdict, dataclass

MEMORY_SLACK_MB = 500  # the interpreter, torch, tokenizer, flask and gunicorn on top of tables + graphs
# Decode speed against transformers' generate on the same CPU: per-step overhead dominates a tiny model.
SPEEDUP_GOAL = {"tiny": 2.0, "small": 1.0}
# The two cases measured: greedy, and top-p sampling as temperature + top-p + top-k with the softcap.
# top-p without top-k is measured and shown, not targeted: an exact nucleus needs two transcendental
# passes over the whole vocabulary (~0.6-0.9 ms on the bench CPU), whatever the code around them.
HOST_P50_GOAL_US = {"greedy": 200.0, "top_k_top_p": 1000.0}
GRAMMAR_CASE, GRAMMAR_P50_GOAL_US = "greedy + grammar (json_schema)", 1000.0  # the whole masked choice
BATCH_STREAMS, BATCH_GOAL = 4, 3.0
# Long prompts: a reused prefix must make the second turn's first token faster, and one chunk between
# decode steps must make the running streams' worst gaps shorter than whole-prompt prefills do.
REUSE_TTFT_GOAL, CHUNKED_P99_GOAL = 1.5, 1.2


@dataclass(frozen=True)
class Goal:
    name: str
    value: float | bool
    goal: str
    passed: bool


def level(server: dict, streams: int) -> dict | None:
    return next((row for row in server["levels"] if row["streams"] == streams), None)


def batching_ratio(concurrency: dict) -> float | None:
    b1, b4 = (level(concurrency["servers"][k], BATCH_STREAMS) for k in ("b1", "b4"))
    if b1 is None or b4 is None or not b1["tok_s"]:
        return None
    return b4["tok_s"] / b1["tok_s"]


def targets(result: dict) -> list[Goal]:
    out = []
    tp = result["throughput"]
    goal = SPEEDUP_GOAL[result["meta"]["scale"]]
    out.append(
        Goal(
            f"decode tok/s vs transformers ({result['meta']['scale']})",
            tp["decode_speedup"],
            f">= {goal:g}x",
            tp["decode_speedup"] >= goal,
        )
    )
    for name, us in HOST_P50_GOAL_US.items():
        p50 = result["host_overhead"]["samplers"][name]["step_us"]["p50"]
        out.append(Goal(f"host per step p50, {name} (us)", p50, f"< {us:g}", p50 < us))
    grammar = result["constrained"]["cases"][GRAMMAR_CASE]["step_us"]["p50"]
    out.append(
        Goal(
            f"host per step p50, {GRAMMAR_CASE} (us)",
            grammar,
            f"< {GRAMMAR_P50_GOAL_US:g}",
            grammar < GRAMMAR_P50_GOAL_US,
        )
    )
    ratio = batching_ratio(result["concurrency"])
    if ratio is not None:
        in_process = result["batching"]["ratio_with_prefills"]
        out.append(
            Goal(
                f"batch 4 / batch 1 tok/s at {BATCH_STREAMS} streams",
                ratio,
                f">= {BATCH_GOAL:g}x (in process: {in_process:.2f}x)",
                ratio >= BATCH_GOAL,
            )
        )
    long = result.get("long_context")
    if long:
        reuse, inter = long["reuse"]["ttft_no_reuse_over_reuse"], long["interleave"]["itl_p99_whole_over_chunked"]
        out.append(
            Goal(
                "second-turn TTFT, prefill again / reuse the prefix",
                reuse,
                f">= {REUSE_TTFT_GOAL:g}x",
                reuse >= REUSE_TTFT_GOAL,
            )
        )
        out.append(
            Goal(
                "ITL p99 beside long prompts, whole prompt / chunked",
                inter,
                f">= {CHUNKED_P99_GOAL:g}x",
                inter >= CHUNKED_P99_GOAL,
            )
        )
    mem = result["memory"]
    out.append(
        Goal(
            "slim server RSS (MB)",
            mem["server_rss_mb"],
            f"<= {mem['budget_mb']:.0f}",
            mem["server_rss_mb"] <= mem["budget_mb"],
        )
    )
    clean = all(
        s["imports"]["import_log_armed"] and not s["imports"]["transformers_model_module_imported"]
        for s in result["concurrency"]["servers"].values()
    )
    out.append(Goal("no transformers model in the server", clean, "never imported", clean))
    return out


def with_targets(result: dict) -> dict:
    return result | {"targets": [asdict(t) for t in targets(result)]}

"""`build.py bench` end to end on the tiny artifacts with tiny step counts: the JSON has every section,
its ratios and verdicts follow from its own measured numbers, and the plot is written. No timing is
asserted: the speed targets are read from the benchmark's output, not from unit tests."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from rich.console import Console

from gemma4_port.bench import side_by_side, speculative_server
from gemma4_port.bench.report import print_report, write
from gemma4_port.bench.run import in_child, run_bench
from gemma4_port.bench.server import imported_modules
from gemma4_port.bench.settings import BenchSettings
from gemma4_port.bench.side_by_side import serve_side_by_side, server_env
from gemma4_port.bench.speculative_report import (
    METHODS,
    PREDICTED,
    SpecSettings,
    predictions,
    speculative_main,
)
from gemma4_port.bench.targets import (
    BATCH_STREAMS,
    CHUNKED_P99_GOAL,
    GRAMMAR_CASE,
    GRAMMAR_P50_GOAL_US,
    HOST_P50_GOAL_US,
    MEMORY_SLACK_MB,
    REUSE_TTFT_GOAL,
    SPEEDUP_GOAL,
)
from gemma4_port.ops.capacity import model_sizes
from gemma4_port.ops.speculative_gain import speculation
from gemma4_port.source.manifest import load_manifest
from gemma4_port.source.train_tiny import SHIPPED
from support import MANIFESTS
from support.artifact_copies import with_backend

QUICK = BenchSettings(
    "tiny",
    new_tokens=4,
    repeats=1,
    warmup_calls=1,
    host_steps=20,
    streams=(BATCH_STREAMS,),
    requests_per_stream=1,
    server_passes=2,
    max_tokens=4,
    batching_rounds=1,
    long_rounds=1,
    ready_timeout_s=300,
)


@pytest.fixture(scope="module")
def bench(compiled, tmp_path_factory):
    b1, b4 = compiled("tiny-e2b", "fp32"), compiled("tiny-e2b", "b4")
    work = tmp_path_factory.mktemp("bench")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")  # for the servers: tiny graphs on a busy 2-core box, ~10x faster
        result = run_bench(b1, b1, b4, QUICK, work, Console(quiet=True), image=compiled("tiny-e2b", "image"))
    png = write(result, work / "out" / "bench.json")
    return result, work / "out" / "bench.json", png


def test_json_has_every_section_and_round_trips(bench):
    result, json_path, _ = bench
    saved = json.loads(json_path.read_text())
    assert set(saved) >= {
        "meta",
        "throughput",
        "host_overhead",
        "constrained",
        "batching",
        "concurrency",
        "long_context",
        "images",
        "memory",
        "targets",
        "samples",
        "plot",
    }
    cases = saved["constrained"]["cases"]
    assert saved["constrained"]["vocab"] == 262_144 and cases["greedy + grammar (json_schema)"]["mask_us"]["n"] == 20
    assert set(cases) >= {"greedy step (no constraint)", "logprobs, top 0", "logprobs, top 20"}
    assert saved["throughput"]["new_tokens"] == QUICK.new_tokens
    assert set(saved["host_overhead"]["samplers"]) >= set(HOST_P50_GOAL_US)
    assert saved["host_overhead"]["geometry"]["vocab"] == 262_144
    assert saved["host_overhead"]["geometry"]["ple_width"] == 35 * 256
    for label, batch in (("b1", 1), ("b4", 4)):
        server = saved["concurrency"]["servers"][label]
        assert server["batch"] == batch
        assert [row["streams"] for row in server["levels"]] == list(QUICK.streams)
        rounds = saved["batching"][label]
        assert rounds["batch"] == batch
        assert rounds["step_ms"]["n"] == QUICK.batching_rounds * (QUICK.max_tokens - 1)
        assert rounds["prefill_ms"]["n"] == QUICK.batching_rounds


def test_image_prompts_split_the_encoder_from_prefill_and_hit_the_cache_on_a_repeat(bench):
    """A new image ran the encoder once per round (the bench refuses otherwise) for a part of its
    time to first token; the same image again ran it never and reused its prompt but the last position."""
    images = bench[0]["images"]
    new, same = images["new_image"], images["same_image"]
    assert images["max_soft_tokens"] == 70 and images["prompt_tokens"] > 70
    assert new["ttft_ms"]["n"] == new["encoder_ms"]["n"] == same["ttft_ms"]["n"] == QUICK.long_rounds
    assert 0 < new["encoder_ms"]["p50"] < new["ttft_ms"]["p50"]
    assert math.isclose(new["rest_ms"]["p50"], new["ttft_ms"]["p50"] - new["encoder_ms"]["p50"])  # one round
    assert same["encoder_runs"] == 0 and same["reused_positions"]["min"] == images["prompt_tokens"] - 1
    assert math.isclose(images["ttft_new_over_same"], new["ttft_ms"]["p50"] / same["ttft_ms"]["p50"])


def test_ratios_are_computed_from_the_measured_numbers(bench):
    result, _, _ = bench
    tp = result["throughput"]
    for side in ("ours", "transformers"):
        assert tp[side]["decode_tok_s"] > 0 and tp[side]["ttft_ms"] > 0
    assert math.isclose(tp["decode_speedup"], tp["ours"]["decode_tok_s"] / tp["transformers"]["decode_tok_s"])
    assert math.isclose(tp["ttft_speedup"], tp["transformers"]["ttft_ms"] / tp["ours"]["ttft_ms"])
    at4 = {
        k: next(r for r in s["levels"] if r["streams"] == BATCH_STREAMS)
        for k, s in result["concurrency"]["servers"].items()
    }
    assert math.isclose(result["concurrency"]["b4_over_b1_at_4_streams"], at4["b4"]["tok_s"] / at4["b1"]["tok_s"])
    for row in at4.values():
        assert math.isclose(row["tok_s"], row["tokens"] / row["wall_s"])
        assert row["passes"] == len(row["pass_tok_s"]) == QUICK.server_passes
        assert row["requests"] == BATCH_STREAMS * QUICK.requests_per_stream * QUICK.server_passes
    for s in result["host_overhead"]["samplers"].values():
        assert math.isclose(s["share_of_device_step_p50"], s["step_us"]["p50"] / 22_000)
    bat = result["batching"]
    s1, s4 = bat["b1"]["step_ms"]["p50"], bat["b4"]["step_ms"]["p50"]
    p1, p4, n = bat["b1"]["prefill_ms"]["p50"], bat["b4"]["prefill_ms"]["p50"], bat["new_tokens"]
    assert math.isclose(bat["step_ratio"], 4 * s1 / s4)
    assert math.isclose(bat["ratio_with_prefills"], (4 * n / (4 * p4 + (n - 1) * s4)) / (n / (p1 + (n - 1) * s1)))
    reuse, inter = result["long_context"]["reuse"], result["long_context"]["interleave"]
    assert math.isclose(
        reuse["ttft_no_reuse_over_reuse"], reuse["no_reuse"]["ttft_ms"]["p50"] / reuse["reuse"]["ttft_ms"]["p50"]
    )
    assert reuse["reuse"]["ttft_ms"]["n"] == reuse["no_reuse"]["ttft_ms"]["n"] == QUICK.long_rounds
    assert reuse["reused_tokens"]["no_reuse"] == 0 and reuse["reused_tokens"]["reuse"] >= reuse["shared_tokens"]
    for q in ("p50", "p99"):
        assert math.isclose(
            inter[f"itl_{q}_whole_over_chunked"], inter["whole_prompt"]["itl_ms"][q] / inter["chunked"]["itl_ms"][q]
        )
    mem = result["memory"]
    assert math.isclose(mem["budget_mb"], mem["host_tables_mb"] + mem["graph_files_mb"] + MEMORY_SLACK_MB)


def test_verdicts_follow_the_numbers(bench):
    result, _, _ = bench
    by_name = {t["name"]: t for t in result["targets"]}
    speed = by_name["decode tok/s vs transformers (tiny)"]
    assert speed["passed"] == (result["throughput"]["decode_speedup"] >= SPEEDUP_GOAL["tiny"])
    greedy = by_name["host per step p50, greedy (us)"]
    assert greedy["value"] == result["host_overhead"]["samplers"]["greedy"]["step_us"]["p50"]
    assert greedy["passed"] == (greedy["value"] < HOST_P50_GOAL_US["greedy"])
    grammar = by_name[f"host per step p50, {GRAMMAR_CASE} (us)"]
    assert grammar["value"] == result["constrained"]["cases"][GRAMMAR_CASE]["step_us"]["p50"]
    assert grammar["passed"] == (grammar["value"] < GRAMMAR_P50_GOAL_US)
    rss = by_name["slim server RSS (MB)"]
    assert rss["passed"] == (result["memory"]["server_rss_mb"] <= result["memory"]["budget_mb"])
    reuse = by_name["second-turn TTFT, prefill again / reuse the prefix"]
    assert reuse["value"] == result["long_context"]["reuse"]["ttft_no_reuse_over_reuse"]
    assert reuse["passed"] == (reuse["value"] >= REUSE_TTFT_GOAL)
    chunked = by_name["ITL p99 beside long prompts, whole prompt / chunked"]
    assert chunked["passed"] == (chunked["value"] >= CHUNKED_P99_GOAL)


def test_the_server_served_and_never_built_a_transformers_model(bench):
    result, _, _ = bench
    for server in result["concurrency"]["servers"].values():
        assert server["imports"]["import_log_armed"]  # the check saw the server load its model
        assert not server["imports"]["transformers_model_module_imported"]
        assert server["rss_mb"] > 50 and server["peak_rss_mb"] >= server["rss_mb"] * 0.9
        for row in server["levels"]:
            assert row["errors"] == 0, row["first_error"]
            assert row["completed"] + row["rejected_503"] == row["requests"]
    assert result["memory"]["transformers_loader"]["model_module_imported"]  # the probe can see a model


def test_plot_and_table(bench, capsys):
    result, _, png = bench
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    console = Console(width=200, record=True)
    print_report(result, console)
    text = console.export_text()
    assert "Targets" in text
    rows = {line.split("│")[1].strip(): line for line in text.splitlines() if line.count("│") == 5}
    for target in result["targets"]:  # each target's own row, with the verdict its number earned
        row = rows[target["name"]]
        assert row.rstrip("│ ").endswith("PASS" if target["passed"] else "MISS"), row


def test_on_inf2_the_two_servers_take_a_neuroncore_each(compiled, tmp_path, monkeypatch):
    """The servers the bench starts side by side get a NeuronCore each, from their artifacts' backend
    (neuron here, by artifact.json; nothing is served: the test stops where the bench waits)."""
    folders = {
        label: with_backend(compiled("tiny-e2b", variant), tmp_path / label, "neuron")
        for label, variant in (("b1", "fp32"), ("b4", "b4"))
    }
    started = []

    class Recorded(side_by_side.Server):
        def start(self):
            started.append((self.folder, self.env))
            return self

        def wait_ready(self):
            raise RuntimeError("recorded")

    monkeypatch.setattr(side_by_side, "Server", Recorded)
    with pytest.raises(RuntimeError, match="recorded"):
        serve_side_by_side(folders, QUICK, tmp_path / "logs", Console(quiet=True))
    assert started == [
        (folders["b1"], {"NEURON_RT_VISIBLE_CORES": "0"}),
        (folders["b4"], {"NEURON_RT_VISIBLE_CORES": "1"}),
    ]
    assert server_env("cpu", 1) == {}


def test_a_measurement_in_a_child_process_returns_its_result():
    assert in_child(os.getpid) != os.getpid()


def test_import_log_parser():
    log = (
        "import time: self [us] | cumulative | imported package\n"
        "import time:       120 |        340 |   transformers.modeling_utils\n"
        "[INFO] Booting worker with pid: 7\n"
    )
    assert imported_modules(log) == {"imported package", "transformers.modeling_utils"}


# -- speculative decoding (build.py bench --speculative) ----------------------------------------------

# Without our server (its own test below reuses the tiny spec artifact the session compiles anyway).
SPEC_QUICK = SpecSettings(k=2, chats=1, edits=1, chat_tokens=8, edit_tokens=8, manifests=("gemma-4-e2b",), serve=False)


@pytest.fixture(scope="module")
def speculative_bench(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # transformers' tiny eager steps: a thread pool only stalls on a busy host
    out = tmp_path_factory.mktemp("spec") / "spec.json"
    console = Console(width=200, record=True)
    try:
        assert speculative_main(SHIPPED, out, console, SPEC_QUICK) == 0
    finally:
        torch.set_num_threads(threads)
    return json.loads(out.read_text()), console.export_text()


def test_the_speculative_bench_measures_every_method_side_by_side(speculative_bench):
    result, text = speculative_bench
    assert result["meta"]["settings"]["k"] == SPEC_QUICK.k
    for name in ("chat", "code edit"):
        rows = result["measured"]["workloads"][name]
        assert set(rows) == set(METHODS)
        alone = rows["target alone"]
        assert alone["proposed"] == 0 and alone["new_tokens"] == alone["target_passes"]
        for method, row in rows.items():
            assert row["prompts"] == 1 and 0 < row["new_tokens"] <= 8
            assert row["tokens_per_target_step"] == row["new_tokens"] / row["target_passes"]
            assert row["accepted"] == row["new_tokens"] - row["target_passes"]
            if method != "target alone":
                assert row["equals_greedy"] is True
                assert 0 <= row["accepted"] <= row["proposed"] <= SPEC_QUICK.k * row["target_passes"]
    assert "tiny-chat with transformers" in text and "predicted per-stream gain on inf2" in text
    assert "Drafter of gemma-4-e2b: google/gemma-4-E2B-it-assistant, assumed shapes" in text and "tied head" in text


def test_the_prediction_covers_every_variant_asked_for_at_the_measured_acceptance(speculative_bench):
    result, _ = speculative_bench
    measured = result["measured"]["workloads"]
    predicted = result["predicted"]
    assert {r["manifest"] for r in predicted} == set(SPEC_QUICK.manifests)
    for name in SPEC_QUICK.manifests:
        manifest = load_manifest(MANIFESTS / f"{name}.yaml")
        sizes = model_sizes(manifest)
        for v in manifest.variants:
            rows = [r for r in predicted if (r["manifest"], r["variant"]) == (name, v.name)]
            assert {(r["keys"], r["method"]) for r in rows} == {
                (keys, method) for keys in (v.key_buckets[0], v.key_buckets[-1]) for method in PREDICTED
            }
            for r in rows:
                a = measured[PREDICTED[r["method"]]][r["method"]]["acceptance"]
                s = speculation(sizes, v, r["keys"], SPEC_QUICK.k, a, drafter=r["method"] == "drafter")
                assert r["acceptance"] == a and r["gain"] == pytest.approx(s.gain)
                assert (r["drafter"] is not None) == (r["method"] == "drafter")
                for ref, gain in r["gain_at"].items():
                    at = speculation(sizes, v, r["keys"], SPEC_QUICK.k, float(ref), drafter=r["method"] == "drafter")
                    assert gain == pytest.approx(at.gain)
    # The tiny models' steps are Python overhead: no roofline is predicted for them.
    assert predictions(result["measured"], SPEC_QUICK.k, ("tiny-e2b", "tiny-chat", "small-e2b")) == []


def _served_sides_hold_together(sides: dict, tokens: int) -> None:
    without, with_ = sides["without"], sides["with"]
    assert without["proposed"] == 0 and without["tokens_per_target_step"] == 1.0
    assert 0 <= with_["accepted"] <= with_["proposed"] and with_["new_tokens"] == without["new_tokens"] == tokens
    assert with_["tokens_per_target_step"] == tokens / (tokens - with_["accepted"])
    assert with_["itl_ms"] > 0 and without["itl_ms"] > 0


SERVED_BODIES = [{"messages": [{"role": "user", "content": "Hello world!"}], "max_tokens": 6}]


def test_our_server_measured_with_and_without_the_drafter(compiled, tmp_path):
    """One server of the tiny spec artifact, each side counted from its /metrics: the plain side proposes
    nothing, the drafter drafts every step and its counts hold together, greedy gives as many tokens."""
    artifact = compiled("tiny-e2b", "spec")
    served = speculative_server.measure(artifact, {"chat": SERVED_BODIES}, tmp_path, 1, {"drafter": "chat"})
    assert set(served) == {"chat, drafter"}
    _served_sides_hold_together(served["chat, drafter"], 6)
    assert served["chat, drafter"]["with"]["proposed"] > 0

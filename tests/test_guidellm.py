"""guidellm, the vLLM project's benchmark tool, drives `build.py serve` unchanged: streaming chat
requests with fixed output lengths (it sends `stream_options.continuous_usage_stats` and `ignore_eos`),
one at a time and four at once, and not one request fails. It runs from its own venv
(scripts/guidellm.sh makes it on first use)."""

from __future__ import annotations

import json
import subprocess

import pytest

from gemma4_port.bench.server import Server
from support import ROOT

OUTPUT_TOKENS = 16


@pytest.fixture(scope="module")
def server(compiled, tmp_path_factory):
    with Server(
        compiled("tiny-e2b", "b4"),
        tmp_path_factory.mktemp("guidellm-server"),
        ready_timeout_s=300,
        env={"OMP_NUM_THREADS": "1", "GEMMA4_QUEUE_MAX": "8"},
    ) as s:
        yield s


def guidellm(server: Server, profile: str, requests: int, out) -> dict:
    cmd = [
        "bash",
        str(ROOT / "scripts/guidellm.sh"),
        "run",
        "--backend",
        f"kind=openai_http,target={server.url}",
        "--profile",
        profile,
        "--constraint",
        f"kind=max_requests,count={requests}",
        "--data",
        f"kind=synthetic_text,prompt_tokens=12,output_tokens={OUTPUT_TOKENS}",
        "--tokenizer",
        f"kind=huggingface_auto,model={server.folder / 'tokenizer'}",
        "--output",
        f"kind=json,path={out}",
        "--disable-console-interactive",
    ]
    result = subprocess.run(cmd, cwd=out.parent, capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(out.read_text())["benchmarks"][0]["metrics"]


@pytest.mark.parametrize(
    "profile,requests", [("kind=synchronous", 4), ("kind=concurrent,streams=4", 8)], ids=["synchronous", "concurrent-4"]
)
def test_guidellm_streams_without_a_failed_request(server, tmp_path, profile, requests):
    metrics = guidellm(server, profile, requests, tmp_path / "benchmarks.json")
    totals = metrics["request_totals"]
    assert (totals["successful"], totals["errored"], totals["incomplete"]) == (requests, 0, 0), totals
    # ignore_eos held every request to its fixed length, counted from the streamed usage
    outputs = metrics["output_token_count"]["successful"]
    assert outputs["count"] == requests and outputs["min"] == outputs["max"] == OUTPUT_TOKENS, outputs
    for name in ("time_to_first_token_ms", "inter_token_latency_ms"):
        stats = metrics[name]["successful"]
        assert stats["count"] > 0 and stats["median"] > 0, (name, stats)

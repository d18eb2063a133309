"""Image prompts through a real server of an artifact with an image budget, side by side in one run:

- a new image: the time to first token of a question about an image the server has not seen (it
  is decoded, preprocessed, encoded and prefilled), and its encoder's share of that time, read from
  the server's own `gemma4_encoder_seconds` histogram (the encoder graph's run, apart from prefill);
- the same image again: the same request once more, whose image the slot's KV still holds (keyed by
  the image's bytes): its time to first token, the positions it reused
  (`gemma4_prefix_tokens_reused_total`) and the encoder runs it caused (none, when the cache hits).

Each round asks about an image of its own (seeded noise, one size) and then repeats it; round 0 is a
warm-up (TorchScript optimises a graph on its second call). The time to first token is a one-token
request's latency: what a client waits for the first token, with no stream parsing in between."""

from __future__ import annotations

import base64
import io
import time
from pathlib import Path

import numpy as np
import requests
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from contract.artifact import load_meta
from gemma4_port.bench.bench_error import BenchError
from gemma4_port.bench.server import Server
from gemma4_port.bench.stats import ratio, summary

TIMEOUT_S = 600.0
IMAGE_SIZE = (320, 240)  # width, height: the processor scales it to the artifact's soft-token budget
QUESTION = "What is in this picture?"


def image_url(seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 255, (IMAGE_SIZE[1], IMAGE_SIZE[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def metrics(url: str) -> dict[str, float]:
    """The samples of the server's /metrics the benchmark reads, by name (labels as `name{kind}`)."""
    text = requests.get(url + "/metrics", timeout=30).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name + (f"{{{s.labels['kind']}}}" if "kind" in s.labels else "")] = s.value
    return out


ENCODER_SUM, ENCODER_RUNS = "gemma4_encoder_seconds_sum{image}", "gemma4_encoder_seconds_count{image}"
REUSED = "gemma4_prefix_tokens_reused_total"


def ask(server: Server, url: str) -> tuple[float, int, dict[str, float]]:
    """One greedy one-token question about the image at `url`: (seconds, prompt tokens, what /metrics
    counted for it: encoder seconds and runs, reused positions)."""
    before = metrics(server.url)
    body = {
        "model": server.model,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": url}}],
            }
        ],
        "max_tokens": 1,
        "temperature": 0,
    }
    t0 = time.perf_counter()
    r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=TIMEOUT_S)
    seconds = time.perf_counter() - t0
    if r.status_code != 200:
        raise BenchError(f"{server.url}: an image request got {r.status_code}: {r.text[:200]}")
    after = metrics(server.url)
    counted = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in (ENCODER_SUM, ENCODER_RUNS, REUSED)}
    return seconds, r.json()["usage"]["prompt_tokens"], counted


def measure(folder: Path, logs: Path, rounds: int, ready_timeout_s: float) -> dict:
    geo = load_meta(folder).geometry
    if geo.vision is None:
        raise BenchError(f"{folder} has no image encoder; the image benchmark needs an artifact with an image budget")
    new: dict[str, list[float]] = {"ttft": [], "encoder": [], "prefill": []}
    repeat: dict[str, list[float]] = {"ttft": [], "reused": [], "encoder_runs": []}
    env = {"GEMMA4_PREFIX_REUSE": "true"}
    with Server(folder, logs, ready_timeout_s, env) as server:
        for r in range(rounds + 1):
            url = image_url(r)
            seconds, prompt_tokens, counted = ask(server, url)
            if counted[ENCODER_RUNS] != 1:
                raise BenchError(f"a new image ran the encoder {counted[ENCODER_RUNS]:g} times, not once")
            again, _, kept = ask(server, url)
            if r:
                new["ttft"].append(seconds)
                new["encoder"].append(counted[ENCODER_SUM])
                new["prefill"].append(seconds - counted[ENCODER_SUM])  # the rest: preprocessing, prefill, a step
                repeat["ttft"].append(again)
                repeat["reused"].append(kept[REUSED])
                repeat["encoder_runs"].append(kept[ENCODER_RUNS])
    out = {
        "artifact": str(folder),
        "image_size": list(IMAGE_SIZE),
        "max_soft_tokens": geo.vision.max_soft_tokens,
        "prompt_tokens": prompt_tokens,
        "rounds": rounds,
        "new_image": {
            "ttft_ms": summary(new["ttft"], 1e3),
            "encoder_ms": summary(new["encoder"], 1e3),
            "rest_ms": summary(new["prefill"], 1e3),
        },
        "same_image": {
            "ttft_ms": summary(repeat["ttft"], 1e3),
            "reused_positions": summary(repeat["reused"]),
            "encoder_runs": int(sum(repeat["encoder_runs"])),
        },
    }
    out["ttft_new_over_same"] = ratio(out["new_image"]["ttft_ms"]["p50"], out["same_image"]["ttft_ms"]["p50"])
    return out

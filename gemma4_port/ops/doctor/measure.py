"""TTFT and decode speed through the served OpenAI API, held against plan's decode roofline.

A streamed chat request at temperature 0: TTFT is the time from the request to the first content
chunk, the decode rate (completion tokens - 1) over the time from that chunk to the last. One stream
at a time gives the per-stream rate (batch 1); `batch` streams at once the aggregate. The prompts are
short, so every decode step runs over the smallest key bucket: the roofline at that bucket is the
ceiling to compare with (ops/roofline.py: weights and KV over HBM bandwidth, compute not counted).
"""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import requests

from gemma4_port.ops.roofline import roofline
from gemma4_port.source.variant import Variant

PROMPT = "Write three sentences about the sea."


@dataclass(frozen=True)
class Stream:
    ttft_s: float
    decode_tok_s: float | None  # None when fewer than two tokens came
    completion_tokens: int


def rates(start: float, arrivals: list[float], completion_tokens: int) -> Stream:
    """From the request's start, each content chunk's arrival time and the usage's token count."""
    if not arrivals:
        raise ValueError("the stream carried no content")
    first, last = arrivals[0], arrivals[-1]
    decode = (completion_tokens - 1) / (last - first) if completion_tokens > 1 and last > first else None
    return Stream(first - start, decode, completion_tokens)


def stream_once(url: str, model: str, api_key: str, max_tokens: int, timeout_s: float = 600) -> Stream:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    arrivals, tokens = [], 0
    with requests.post(
        f"{url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {api_key}"},
        stream=True,
        timeout=timeout_s,
    ) as r:
        r.raise_for_status()
        for line in r.iter_lines(decode_unicode=True):
            if not line or not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
                arrivals.append(time.perf_counter())
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return rates(start, arrivals, tokens)


def measure(url: str, model: str, api_key: str, batch: int, runs: int = 3, max_tokens: int = 64) -> dict:
    """Median TTFT and per-stream decode rate over `runs` lone streams; at batch > 1 also `batch` at once."""
    alone = [stream_once(url, model, api_key, max_tokens) for _ in range(runs)]
    out = {"streams": [asdict(s) for s in alone], **_medians(alone)}
    if batch > 1:
        with ThreadPoolExecutor(batch) as pool:
            t0 = time.perf_counter()
            together = list(pool.map(lambda _: stream_once(url, model, api_key, max_tokens), range(batch)))
            wall = time.perf_counter() - t0
        out["batch"] = {
            "streams": batch,
            "aggregate_tok_s": round(sum(s.completion_tokens for s in together) / wall, 2),
            **_medians(together),
        }
    return out


def _medians(streams: list[Stream]) -> dict:
    rates_ = [s.decode_tok_s for s in streams if s.decode_tok_s]
    return {
        "ttft_ms": round(statistics.median(s.ttft_s for s in streams) * 1e3, 1),
        "decode_tok_s": round(statistics.median(rates_), 2) if rates_ else None,
    }


def versus_roofline(measured: dict, sizes, variant: Variant) -> dict:
    """The measured rates beside the roofline's ceiling at the smallest key bucket, and their ratio."""
    keys = variant.key_buckets[0]
    one = roofline(sizes, variant, keys, 1)
    out = {
        "key_bucket": keys,
        "roofline_tok_s": round(one.per_stream(), 1),
        "measured_tok_s": measured.get("decode_tok_s"),
    }
    if out["measured_tok_s"]:
        out["of_roofline"] = round(out["measured_tok_s"] / out["roofline_tok_s"], 3)
    if "batch" in measured:
        b = measured["batch"]["streams"]
        agg = roofline(sizes, variant, keys, b).aggregate()
        out |= {
            "roofline_aggregate_tok_s": round(agg, 1),
            "measured_aggregate_tok_s": measured["batch"]["aggregate_tok_s"],
        }
        out["aggregate_of_roofline"] = round(out["measured_aggregate_tok_s"] / agg, 3)
    return out

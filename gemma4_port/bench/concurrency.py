"""Aggregate tok/s of the real server under N concurrent streaming clients, with time to first token
and the gaps between streamed chunks as each client sees them; passes at one concurrency add up.
A 503 (queue full) is counted as a rejection, not an error: it is the server's documented answer
to more load than it can queue."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import requests

from gemma4_port.bench.stats import summary

PROMPTS = (
    "The capital of France is",
    "Hello world!",
    "def fibonacci(n):",
    "Inferentia2 has two NeuronCores and",
)


def sse_chunks(response: requests.Response) -> Iterator[dict]:
    """A streamed OpenAI response's events, each parsed, the closing [DONE] left out."""
    for line in response.iter_lines():
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            yield json.loads(line[6:])


@dataclass
class Outcome:
    status: int  # HTTP status; 0 when the request itself failed
    ttft: float | None = None  # seconds to the first streamed text
    gaps: list[float] = field(default_factory=list)  # seconds between text chunks
    tokens: int = 0  # completion tokens (the server's usage count)
    error: str = ""

    @property
    def completed(self) -> bool:
        return self.status == 200 and not self.error


def stream_completion(
    session: requests.Session, url: str, model: str, prompt: str, max_tokens: int, timeout_s: float
) -> Outcome:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    try:
        with session.post(url + "/v1/completions", json=body, stream=True, timeout=timeout_s) as r:
            if r.status_code != 200:
                return Outcome(r.status_code, error=r.text[:200])
            stamps, tokens = [], 0
            for chunk in sse_chunks(r):
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                if chunk.get("error"):
                    return Outcome(r.status_code, error=chunk["error"].get("message", "")[:200])
                if chunk["choices"] and chunk["choices"][0].get("text"):
                    stamps.append(time.perf_counter())
    except requests.RequestException as exc:
        return Outcome(0, error=f"{type(exc).__name__}: {exc}"[:200])
    if not stamps:
        return Outcome(200, tokens=tokens)
    return Outcome(200, stamps[0] - t0, [b - a for a, b in zip(stamps, stamps[1:])], tokens)


@dataclass
class StreamsPass:
    """One pass of `streams` clients: every request's outcome and the wall time of the pass."""

    streams: int
    outcomes: list[Outcome]
    wall_s: float


def drive(
    url: str, model: str, streams: int, requests_per_stream: int, max_tokens: int, timeout_s: float = 600.0
) -> StreamsPass:
    """`streams` clients, each sending `requests_per_stream` streamed completions back to back."""
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    start = threading.Barrier(streams + 1)

    def client(i: int) -> None:
        with requests.Session() as session:
            start.wait()
            for j in range(requests_per_stream):
                out = stream_completion(session, url, model, PROMPTS[(i + j) % len(PROMPTS)], max_tokens, timeout_s)
                with lock:
                    outcomes.append(out)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(streams)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return StreamsPass(streams, outcomes, time.perf_counter() - t0)


def level(runs: list[StreamsPass]) -> tuple[dict, list[float]]:
    """Passes at one concurrency -> (one JSON row: tok/s of all of them together, and each pass's;
    the chunk gaps in ms for the histogram)."""
    outcomes = [o for run in runs for o in run.outcomes]
    wall = sum(run.wall_s for run in runs)
    done = [o for o in outcomes if o.completed]
    tokens = sum(o.tokens for o in done)
    errors = [o for o in outcomes if o.status not in (200, 503) or o.error]
    row = {
        "streams": runs[0].streams,
        "passes": len(runs),
        "requests": len(outcomes),
        "completed": len(done),
        "rejected_503": sum(o.status == 503 for o in outcomes),
        "errors": len(errors),
        "first_error": errors[0].error if errors else "",
        "tokens": tokens,
        "wall_s": wall,
        "tok_s": tokens / wall,
        "pass_tok_s": [round(sum(o.tokens for o in run.outcomes if o.completed) / run.wall_s, 2) for run in runs],
        "ttft_ms": summary((o.ttft for o in done if o.ttft is not None), 1e3),
        "chunk_gap_ms": summary((g for o in done for g in o.gaps), 1e3),
    }
    return row, [g * 1e3 for o in done for g in o.gaps]

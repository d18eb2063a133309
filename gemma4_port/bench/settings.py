"""The bench's settings: how much each measurement runs, per model scale (tiny, small)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BenchSettings:
    scale: str
    new_tokens: int  # per throughput run
    repeats: int  # interleaved runs per prompt and side
    warmup_calls: int  # untimed runs per prompt first: TorchScript optimises a graph on its second call
    host_steps: int  # decode steps timed per sampler
    streams: tuple[int, ...]
    requests_per_stream: int
    server_passes: int  # passes per concurrency level and server, alternating between the servers
    max_tokens: int  # per server request, and per request of the in-process batching rounds
    batching_rounds: int  # interleaved in-process rounds per artifact, every slot busy
    long_rounds: int  # alternating rounds per pair of long-prompt servers (reuse or not, chunked or not)
    ready_timeout_s: float = 900.0


SCALES = {
    "tiny": BenchSettings(
        "tiny",
        new_tokens=32,
        repeats=5,
        warmup_calls=3,
        host_steps=1000,
        streams=(1, 2, 4, 8),
        requests_per_stream=4,
        server_passes=3,
        max_tokens=24,
        batching_rounds=6,
        long_rounds=6,
    ),
    "small": BenchSettings(
        "small",
        new_tokens=24,
        repeats=3,
        warmup_calls=3,
        host_steps=1000,
        streams=(1, 2, 4, 8),
        requests_per_stream=2,
        server_passes=2,
        max_tokens=16,
        batching_rounds=3,
        long_rounds=3,
    ),
}

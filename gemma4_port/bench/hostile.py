"""Hostile clients against a real server on loopback, and what the well-behaved ones see meanwhile.

Three kinds of connection that cost a threaded server a thread each (issue: slow and idle clients):
- slow: a request line and `Host`, then one header line every `trickle_s` (the slow-header attack);
- idle: connect and send nothing;
- closers: a whole request with `Connection: close`, after which the client never closes its side.
Every kind is bounded in count and in time; a connection the server closes is opened again, so the
pressure stays constant. Meanwhile a probe asks `/health` on a fresh connection every `probe_s`
(as a kubelet does) and completions run one after another; the same is measured on the idle server
first, so the result is a ratio measured side by side.

    python -m gemma4_port.bench.hostile ARTIFACT_DIR [--slow 200] [--idle 200] [--closers 0.67] [--rounds 3]"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing
import os
import random
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from gemma4_port.bench.stats import summary

HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
CLOSER = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
MAX_CONNECTIONS = 1000  # hard cap on the sockets this module opens at once
BIG_PROMPT_BYTES = 1_000_000  # under the server's default body limit (1 MiB)


@dataclass
class Attack:
    slow: int = 200
    idle: int = 200
    closers_per_s: float = 0.0  # new Connection: close clients a second (each held open for the run)
    big: int = 0  # clients posting 1 MB prompts back to back (the server must refuse them cheaply)
    trickle_s: float = 2.0

    def __post_init__(self):
        if self.slow + self.idle > MAX_CONNECTIONS:
            raise ValueError(f"at most {MAX_CONNECTIONS} hostile connections, asked for {self.slow + self.idle}")


@dataclass
class Pressure:
    """Hostile sockets held open from a thread of their own until `stop()`."""

    host: str
    port: int
    attack: Attack
    model: str = ""  # the served model, for requests that must get as far as the prompt
    reopened: int = 0  # connections the server closed (a timeout working) and were opened again
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list = field(default_factory=list)

    def _open(self, first: bytes = b"") -> socket.socket | None:
        try:
            s = socket.create_connection((self.host, self.port), timeout=2)
            if first:
                s.sendall(first)
            s.setblocking(False)
            return s
        except OSError:
            return None

    def _alive(self, s: socket.socket) -> bool:
        try:
            s.recv(65536)  # the server closed it, or answered (a 408): this client is done either way
        except BlockingIOError:
            return True
        except OSError:
            pass
        return False

    def _hold(self, count: int, first: bytes, line: bytes | None) -> None:
        socks = [self._open(first) for _ in range(count)]
        while not self._stop.wait(self.attack.trickle_s):
            for i, s in enumerate(socks):
                ok = s is not None and self._alive(s)
                if ok and line:
                    try:
                        s.send(line)
                    except OSError:
                        ok = False
                if not ok:
                    if s is not None:
                        s.close()
                        self.reopened += 1
                    socks[i] = self._open(first)
        for s in socks:
            if s is not None:
                s.close()

    def _closers(self) -> None:
        held = []
        while not self._stop.wait(1 / self.attack.closers_per_s):
            if len(held) < MAX_CONNECTIONS // 4:
                s = self._open(CLOSER)
                if s is not None:
                    held.append(s)
        for s in held:
            s.close()

    def _big_prompts(self) -> None:
        # Words that differ (a tokenizer caches repeated words): what real text costs to tokenize.
        words = random.Random(0).randbytes(BIG_PROMPT_BYTES // 3).hex(" ", 4)[:BIG_PROMPT_BYTES]
        body = json.dumps({"model": self.model, "prompt": words}).encode()
        while not self._stop.is_set():
            conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            try:
                conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
                conn.getresponse().read()
            except OSError:
                time.sleep(0.1)
            finally:
                conn.close()

    def start(self) -> Pressure:
        jobs = [(self.attack.slow, HEAD, b"X-Trickle: 1\r\n"), (self.attack.idle, b"", None)]
        self._threads = [threading.Thread(target=self._hold, args=job, daemon=True) for job in jobs if job[0]]
        if self.attack.closers_per_s:
            self._threads.append(threading.Thread(target=self._closers, daemon=True))
        self._threads += [threading.Thread(target=self._big_prompts, daemon=True) for _ in range(self.attack.big)]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


def _timed(
    host: str,
    port: int,
    method: str,
    path: str,
    timeout: float,
    body: str | None = None,
    headers: dict[str, str] | None = None,
) -> float | None:
    """Seconds for one request on a new connection; None when it failed, was not a 200, or took
    longer than timeout."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body, headers or {})
        resp = conn.getresponse()
        resp.read()
        return time.perf_counter() - start if resp.status == 200 else None
    except OSError:
        return None
    finally:
        conn.close()


def probe(host: str, port: int, timeout: float = 5.0) -> float | None:
    """Seconds for GET /health on a new connection; None when it failed or took longer than timeout."""
    return _timed(host, port, "GET", "/health", timeout)


def complete(
    host: str, port: int, model: str, headers: dict[str, str], max_tokens: int = 16, timeout: float = 60.0
) -> float | None:
    body = json.dumps({"model": model, "prompt": "hello world", "max_tokens": max_tokens, "temperature": 0})
    headers = {"Content-Type": "application/json"} | headers
    return _timed(host, port, "POST", "/v1/completions", timeout, body, headers)


def measure(
    host: str, port: int, model: str, seconds: float, probe_s: float = 0.1, headers: dict[str, str] | None = None
) -> tuple[list, list]:
    """/health on fresh connections every probe_s and completions back to back, for `seconds` ->
    (probe seconds, completion seconds), None for each one that failed."""
    probes, completions = [], []
    stop = time.monotonic() + seconds

    def completer():
        while time.monotonic() < stop:
            completions.append(complete(host, port, model, headers or {}))

    worker = threading.Thread(target=completer, daemon=True)
    worker.start()
    while time.monotonic() < stop:
        probes.append(probe(host, port))
        time.sleep(probe_s)
    worker.join(90)
    return probes, completions


def _summary(probes: list, completions: list, cpu_s: float) -> dict:
    ok_probes = [p for p in probes if p is not None]
    ok_completions = [c for c in completions if c is not None]
    return {
        "health_ms": summary(ok_probes, 1e3),
        "health_failed": len(probes) - len(ok_probes),
        "completion_ms": summary(ok_completions, 1e3),
        "completion_failed": len(completions) - len(ok_completions),
        "worker_cpu_s": cpu_s,
    }


def _hold(host: str, port: int, attack: Attack, model: str, stop, reopened) -> None:
    """The hostile clients, in a process of their own at low priority: on one small machine they stand
    in for other machines, so they must not take the CPU or the interpreter from the measured ones."""
    os.nice(10)
    pressure = Pressure(host, port, attack, model).start()
    stop.wait()
    pressure.stop()
    reopened.value = pressure.reopened


def run(
    host: str,
    port: int,
    model: str,
    attack: Attack,
    seconds: float,
    rounds: int = 3,
    warmup_s: float = 4.0,
    headers: dict[str, str] | None = None,
    worker: psutil.Process | None = None,
) -> dict:
    """Rounds of the idle server, then the same under attack (after warmup_s for the connections to
    pile up), alternating, as the load of a shared machine drifts. With the server's worker process:
    its CPU seconds in each condition, too."""
    cpu = (lambda: sum(worker.cpu_times()[:2])) if worker is not None else (lambda: float("nan"))
    ctx = multiprocessing.get_context("spawn")
    samples = {"idle": ([], [], [0.0]), "attacked": ([], [], [0.0])}
    reopened = 0
    for _ in range(rounds):
        for condition in ("idle", "attacked"):
            hostile = stop = count = None
            if condition == "attacked":
                stop, count = ctx.Event(), ctx.Value("i", 0)
                hostile = ctx.Process(target=_hold, args=(host, port, attack, model, stop, count), daemon=True)
                hostile.start()
                time.sleep(warmup_s)
            try:
                start = cpu()
                probes, completions = measure(host, port, model, seconds, headers=headers)
                kept = samples[condition]
                kept[0].extend(probes)
                kept[1].extend(completions)
                kept[2][0] += cpu() - start
            finally:
                if hostile is not None:
                    stop.set()
                    hostile.join(60)
                    reopened += count.value
    out = {c: _summary(p, q, cpu_s[0]) for c, (p, q, cpu_s) in samples.items()}
    ratio = out["attacked"]["completion_ms"]["p50"] / out["idle"]["completion_ms"]["p50"]
    return (
        {"attack": vars(attack), "rounds": rounds, "seconds": seconds}
        | out
        | {"completion_ratio_p50": ratio, "reopened": reopened}
    )


def main(argv: list[str] | None = None) -> int:
    from gemma4_port.bench.server import Server

    p = argparse.ArgumentParser(prog="python -m gemma4_port.bench.hostile", description=__doc__.split("\n\n")[0])
    p.add_argument("artifact", type=Path, help="a compiled artifact directory to serve")
    p.add_argument("--slow", type=int, default=200, help="slow-header connections (default 200)")
    p.add_argument("--idle", type=int, default=200, help="idle connections (default 200)")
    p.add_argument(
        "--closers",
        type=float,
        default=0.0,
        help="new `Connection: close` clients a second that never close (default 0)",
    )
    p.add_argument("--big", type=int, default=0, help="clients posting 1 MB prompts back to back (default 0)")
    p.add_argument("--seconds", type=float, default=10.0, help="length of each measurement (default 10)")
    p.add_argument("--rounds", type=int, default=3, help="idle/attacked rounds, alternating (default 3)")
    p.add_argument("--logs", type=Path, default=Path("artifacts/hostile-logs"), help="server logs")
    args = p.parse_args(argv)
    attack = Attack(args.slow, args.idle, args.closers, big=args.big)
    with Server(args.artifact, args.logs, env={"OMP_NUM_THREADS": "1"}) as server:
        result = run("127.0.0.1", server.port, server.model, attack, args.seconds, args.rounds, worker=server.worker)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

"""runtime/http/worker.py (with closing.py and framing.py): requests are read by gunicorn's main loop,
so slow and idle clients cost a socket, never a thread; HTTP edge cases get their 4xx at once, as
OpenAI JSON. The framing rules (framing.py) are pure and tested alone; the rest against the real server
(`build.py serve`) over raw sockets."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import pytest
import requests
from flask import Flask

from gemma4_port.bench.hostile import Attack, Pressure, complete, probe
from gemma4_port.bench.server import Server
from runtime.api.state import ServerState, install, server_state
from runtime.http.framing import MAX_HEAD_BYTES, READY, framing
from runtime.http.worker import HEADER_TIMEOUT_S, ReadAheadWorker

LIMIT = 65536
HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"


def chunked(*parts: bytes, sizes: list[bytes] | None = None) -> bytes:
    sizes = sizes or [b"%x" % len(p) for p in parts]
    return b"".join(s + b"\r\n" + p + b"\r\n" for s, p in zip(sizes, parts)) + b"0\r\n\r\n"


@pytest.mark.parametrize(
    "raw, verdict",
    [
        (HEAD, None),  # the head has not ended
        (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", READY),
        (HEAD + b"Content-Length: 10\r\n\r\n12345", None),
        (HEAD + b"Content-Length: 10\r\n\r\n1234567890", READY),
        (HEAD + b"Content-Length: 99999999\r\n\r\n", READY),  # refused by the app before a byte is read
        (HEAD + b"Content-Length: 10\r\nExpect: 100-continue\r\n\r\n", READY),  # the client waits for us
        (HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(b"hello", b"world"), READY),
        (HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(b"hello")[:-2], None),  # no final empty line yet
        (HEAD + b"Transfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n", READY),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * (MAX_HEAD_BYTES + 1), READY),  # gunicorn's parser names the limit
    ],
)
def test_framing_waits_for_the_whole_request(raw, verdict):
    assert framing(raw, LIMIT) == verdict


@pytest.mark.parametrize(
    "sizes, status",
    [
        ([b"zz"], 400),
        ([b"-5"], 400),
        ([b""], 400),
        ([b"0x5"], 400),
        ([b"ffffffffffff"], 413),  # a huge size is refused from its size line, not waited for
    ],
)
def test_framing_refuses_broken_or_oversized_chunks_at_once(sizes, status):
    raw = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"".join(s + b"\r\n" for s in sizes)
    assert framing(raw, LIMIT)[0] == status


def test_framing_sums_the_chunks_against_the_limit():
    first = b"8000\r\n" + b"a" * 0x8000 + b"\r\n"
    raw = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + first + b"8001\r\n"  # each fits, their sum does not
    assert framing(raw, LIMIT)[0] == 413


def test_framing_refuses_chunk_data_without_crlf():
    raw = HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n"
    assert framing(raw, LIMIT)[0] == 400


@pytest.fixture(scope="module")
def server(compiled, tmp_path_factory):
    env = {"GEMMA4_MAX_BODY_BYTES": str(LIMIT), "GEMMA4_QUEUE_MAX": "2", "OMP_NUM_THREADS": "1"}
    with Server(compiled("tiny-e2b", "fp32"), tmp_path_factory.mktemp("httpworker-logs"), 300, env) as s:
        yield s


def exchange(server, raw: bytes, timeout: float = 10.0) -> tuple[int, dict, float]:
    """Send raw bytes, read until the server closes -> (status, JSON body, seconds to the answer)."""
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as s:
        s.sendall(raw)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
            data = data.removeprefix(b"HTTP/1.1 100 Continue\r\n\r\n")
            if b"\r\n\r\n" in data:
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    None,
                )
                if length is not None and len(body) >= length:
                    break
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), data[:300]
    return int(head.split()[1]), json.loads(body), time.perf_counter() - start


def request_body(server) -> bytes:
    return json.dumps({"model": server.model, "prompt": "hello", "max_tokens": 2, "temperature": 0}).encode()


def test_slow_and_idle_clients_leave_health_and_completions_working(server):
    """More slow-header and idle connections than the worker has threads (queue 2 + 32)."""
    pressure = Pressure("127.0.0.1", server.port, Attack(slow=60, idle=60, trickle_s=1.0)).start()
    try:
        time.sleep(2.5)  # every connection is open and the slow ones have sent a few lines
        probes = [probe("127.0.0.1", server.port, timeout=5) for _ in range(10)]
        assert all(p is not None for p in probes), probes
        assert complete("127.0.0.1", server.port, server.model, {}, max_tokens=4, timeout=30) is not None
    finally:
        pressure.stop()


def test_a_slow_head_gets_a_408_after_the_header_timeout(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=HEADER_TIMEOUT_S + 5) as s:
        s.sendall(HEAD)
        start = time.perf_counter()
        for _ in range(3):
            time.sleep(1)
            s.sendall(b"X-Slow: 1\r\n")
        answer = s.recv(65536)
        waited = time.perf_counter() - start
    assert answer.startswith(b"HTTP/1.1 408 ") and b'"code": "request_timeout"' in answer
    assert HEADER_TIMEOUT_S - 2 < waited < HEADER_TIMEOUT_S + 3


def test_connection_close_clients_that_never_close_do_not_stall_the_server(server):
    """gthread's graceful close blocked the main loop up to 2 s for each such client."""
    held = []
    start = time.perf_counter()
    for _ in range(5):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
        held.append(s)  # never closed by us until the end
    assert probe("127.0.0.1", server.port) is not None
    elapsed = time.perf_counter() - start
    for s in held:
        s.close()
    assert elapsed < 3.0, f"5 lingering closes took {elapsed:.1f} s"


@pytest.mark.parametrize(
    "body, status",
    [
        (b"zz\r\nhello\r\n0\r\n\r\n", 400),
        (b"-5\r\nhello\r\n0\r\n\r\n", 400),
        (b"ffffffffffffff\r\n", 413),  # the client would go on sending: answered from the size line
        (b"%x\r\n" % (3 * LIMIT) + b" " * 1000, 413),
    ],
)
def test_malformed_or_oversized_chunked_bodies_are_refused_at_once(server, body, status):
    got, error, seconds = exchange(server, HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + body)
    assert got == status and error["error"]["message"]
    assert seconds < 2.0


@pytest.mark.parametrize(
    "body, status",
    [
        (b"zz\r\nhello\r\n0\r\n\r\n", 400),
        (b"-5\r\nhello\r\n0\r\n\r\n", 400),
        (b"%x\r\n" % (LIMIT + 10) + b" " * (LIMIT + 10) + b"\r\n0\r\n\r\n", 413),
    ],
)
def test_a_body_read_by_the_app_after_100_continue_gets_its_4xx_too(server, body, status):
    """`Expect: 100-continue` bodies are not read ahead (the client waits for the 100 first)."""
    got, error, seconds = exchange(server, HEAD + b"Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n" + body)
    assert got == status and error["error"]["message"] and seconds < 5.0


def test_a_padded_chunked_body_over_the_limit_is_a_413_not_cut(server):
    padded = request_body(server)[:-1] + b"," + b" " * (3 * LIMIT) + b'"x": 1}'
    parts = [padded[i : i + 8192] for i in range(0, len(padded), 8192)]
    status, error, _ = exchange(server, HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(*parts))
    assert status == 413 and error["error"]["code"] == "request_entity_too_large"


def test_a_well_formed_chunked_body_is_served(server):
    body = request_body(server)
    status, answer, _ = exchange(
        server,
        HEAD + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunked(body[:10], body[10:]),
        timeout=60,
    )
    assert status == 200 and answer["choices"][0]["text"] is not None


@pytest.mark.parametrize(
    "raw, status",
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        (b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(120)) + b"\r\n", 431),
        (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\nContent-Length: 2\r\n\r\n{}", 417),
    ],
)
def test_gunicorns_own_errors_are_openai_json(server, raw, status):
    got, error, _ = exchange(server, raw)
    assert got == status and set(error["error"]) == {"message", "type", "param", "code"}


def test_keepalive_requests_on_one_connection_are_read_ahead_too(server):
    with requests.Session() as session:
        for _ in range(3):
            assert session.get(f"{server.url}/health", timeout=10).status_code == 200


def test_sigterm_drains_new_requests_get_503_in_flight_ones_finish(server):
    """Last in the module: it stops the server. gthread stopped accepting at once: new connections
    waited in the backlog until the exit and were reset, and /ready could not answer; a request whose
    body was still uploading at SIGTERM got a 503."""
    # The whole context, never ended early by an end token: three such streams one after another
    # outlast the drain's checks by far (a shorter greedy reply could end them all within 0.1 s).
    body = {
        "model": server.model,
        "prompt": [2],
        "max_tokens": 62,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    results: list = []
    first = threading.Event()

    def stream():
        with requests.post(f"{server.url}/v1/completions", json=body, stream=True, timeout=60) as resp:
            lines = []
            for ln in resp.iter_lines():
                first.set()
                if ln.startswith(b"data: "):
                    lines.append(ln)
            results.append((resp.status_code, lines[-1] if lines else None))

    streams = [threading.Thread(target=stream) for _ in range(3)]  # one in the slot, two queued
    for t in streams:
        t.start()
    assert first.wait(30)
    time.sleep(0.05)  # the two others reach the queue
    # A request whose head is in before SIGTERM and whose body is still on its way: it is served.
    uploading = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    late_body = request_body(server)
    uploading.sendall(HEAD + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(late_body))
    assert probe("127.0.0.1", server.port) is not None  # the head has been read by now (one main loop, in order)
    server.proc.send_signal(15)
    deadline = time.monotonic() + 5  # the main loop turns at least once a second; it is woken at once
    while (ready := requests.get(f"{server.url}/ready", timeout=5)).status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.01)
    start = time.perf_counter()
    refused = requests.post(f"{server.url}/v1/completions", json=body, timeout=5)
    refused_s = time.perf_counter() - start
    deadline = time.monotonic() + 60
    while not results and time.monotonic() < deadline:  # a stream has ended: the queue (2) has room again
        time.sleep(0.01)
    uploading.sendall(late_body)
    late = uploading.recv(65536)
    uploading.close()
    for t in streams:
        t.join(60)
    assert ready.status_code == 503 and ready.json()["state"] == "draining"
    assert refused.status_code == 503 and refused.headers["Retry-After"]
    assert refused.json()["error"]["code"] == "draining" and refused_s < 1.0
    assert late.startswith(b"HTTP/1.1 200"), late[:200]
    assert results == [(200, b"data: [DONE]")] * 3
    assert server.proc.wait(60) == 0
    with pytest.raises(ConnectionRefusedError):  # the listener is closed: refused at once, not reset later
        socket.create_connection(("127.0.0.1", server.port), timeout=5)


class _Engine:
    def __init__(self, served: bool, problem: str | None):
        self.served, self._problem = served, problem

    def problem(self) -> str | None:
        return self._problem


@pytest.mark.parametrize(
    "served, problem, exits",
    [
        (True, "the engine thread is not running", True),  # it died serving: a new worker loads again
        (True, "a device call has not returned for 61 s (bound 60 s)", True),
        (True, None, False),
        (False, "the engine thread is not running", False),  # it never came up: /ready says why
    ],
)
def test_a_worker_whose_engine_died_while_serving_exits_for_a_new_one(served, problem, exits):
    worker = object.__new__(ReadAheadWorker)
    worker.alive, worker.log = True, logging.getLogger("test")
    app = Flask("test")
    install(app, ServerState.__new__(ServerState))
    server_state(app).engine = _Engine(served, problem)
    worker.wsgi = app
    worker._check_engine()
    assert worker.alive is not exits

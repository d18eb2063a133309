"""What the hostile-request tests share: a case, sending it to a real server, the OpenAI error shape
every refusal must have, and the watch that keeps /health and a normal completion going meanwhile."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

import requests

from gemma4_port.bench.hostile import complete, probe
from gemma4_port.bench.server import Server

KEY = "hostile-secret-key"
MODEL = "tiny-e2b"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_ERROR_BYTES = 2048


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    body: dict | bytes
    status: int  # 200: served (within every limit), else the error expected
    says: str = ""  # in the error's message (the limit's variable, or what is wrong)


class Watch:
    """/health and a normal completion, one after another, for as long as the corpus runs."""

    def __init__(self, server: Server):
        self.server, self.failures, self.rounds = server, [], 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            if probe("127.0.0.1", self.server.port, timeout=5) is None:
                self.failures.append("health")
            if complete("127.0.0.1", self.server.port, MODEL, AUTH, max_tokens=2, timeout=30) is None:
                self.failures.append("completion")
            self.rounds += 1

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)


def send(server: Server, case: Case) -> requests.Response:
    data = case.body if isinstance(case.body, bytes) else json.dumps(case.body).encode()
    headers = AUTH | {"Content-Type": "application/json"}
    return requests.post(server.url + case.path, data=data, headers=headers, timeout=60)


def assert_openai_error(resp: requests.Response, status: int, says: str = "") -> dict:
    assert resp.status_code == status, resp.text[:500]
    assert len(resp.content) < MAX_ERROR_BYTES, f"{len(resp.content)} bytes: {resp.text[:300]}"
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == {401: "authentication_error", 500: "server_error", 503: "service_unavailable_error"}.get(
        status, "invalid_request_error"
    )
    assert says in error["message"], error["message"]
    return error

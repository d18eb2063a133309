"""The API's test fixtures over Flask's test client: one batch-1 engine with a queue of one, and
the checks every OpenAI-shaped response gets (SSE events, error bodies)."""

from __future__ import annotations

import json

import httpx2
import openai
import pytest

from runtime.http.app import create_app
from runtime.settings import ServerSettings
from support.engines import ready

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MODEL = "tiny-e2b"
HI = [{"role": "user", "content": "Capital of France?"}]


@pytest.fixture(scope="module")
def engine(compiled):
    """Batch 1, a queue of one: a third concurrent request is refused."""
    with ready(ServerSettings(artifact=compiled("tiny-e2b", "fp32"), queue_max=1)) as eng:
        yield eng


@pytest.fixture(scope="module")
def settings(engine):
    return engine.settings


@pytest.fixture(scope="module")
def client(settings, engine):
    return create_app(settings, engine).test_client()


def openai_client(engine, **settings) -> openai.OpenAI:
    """The official client, on the app in process (WSGI), as it would talk to the server; `settings`
    replace the engine's own for the app (its limits)."""
    app = create_app(engine.settings.model_copy(update=settings), engine)
    return openai.OpenAI(
        base_url="http://app.test/v1",
        api_key="unused",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.WSGITransport(app=app)),
    )


def sse_events(data: bytes) -> list:
    lines = [ln[len("data: ") :] for ln in data.decode().split("\n\n") if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


def assert_error(resp, status: int, param: str | None = None, code: str | None = None) -> dict:
    assert resp.status_code == status, resp.get_data(as_text=True)
    assert resp.is_json
    err = resp.get_json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    return err

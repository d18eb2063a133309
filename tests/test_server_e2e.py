"""The real thing: `build.py serve` (gunicorn) on loopback, driven by the official `openai` client
and by raw HTTP. Two servers per module, started in parallel: batch 1 (fp32) and batch 4 (b4)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Literal

import openai
import pydantic
import pytest
import requests

from contract.artifact import load_meta
from contract.tokenizer import load_tokenizer
from gemma4_port.bench.server import Server, free_port
from gemma4_port.verify.reference import load_reference, reference_greedy
from support import ROOT

KEY = "e2e-secret"
MODEL = "tiny-e2b"
STEPS = 12
CHATS = ("Write a haiku.", "Capital of Italy?")


class KeyedServer(Server):
    """The server as a user starts it, with an API key, a small queue and a body limit."""

    def __init__(self, artifact: Path, logs: Path):
        super().__init__(
            artifact,
            logs,
            ready_timeout_s=300,
            env={
                "GEMMA4_API_KEY": KEY,
                "GEMMA4_QUEUE_MAX": "2",
                "GEMMA4_MAX_BODY_BYTES": "65536",
                "OMP_NUM_THREADS": "1",  # tiny graphs on a busy 2-core box: one thread is ~10x faster
            },
        )

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=KEY, **kw)

    def post(self, path: str, body, **kw) -> requests.Response:
        data = body if isinstance(body, bytes) else json.dumps(body)
        return requests.post(
            f"{self.url}{path}", data=data, headers={"Authorization": f"Bearer {KEY}"}, timeout=60, **kw
        )

    def metric(self, name: str) -> float:
        for line in requests.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)


@pytest.fixture(scope="module")
def servers(compiled, tmp_path_factory):
    logs = tmp_path_factory.mktemp("serve-logs")
    started = {v: KeyedServer(compiled("tiny-e2b", v), logs / v).start() for v in ("fp32", "b4")}
    try:
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(scope="module")
def expected(servers):
    """The float reference's greedy text for each chat prompt (transformers, from the checkpoint)."""
    folder = servers["fp32"].folder
    meta = load_meta(folder)
    tok = load_tokenizer(folder / "tokenizer")
    ref = load_reference(Path(meta.checkpoint))
    out = {}
    for text in CHATS:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        tokens = reference_greedy(ref, list(ids), STEPS)[0]
        cut = next((i + 1 for i, t in enumerate(tokens) if t in meta.eos_token_ids), len(tokens))
        out[text] = (tok.decode(tokens[:cut], skip_special_tokens=True), cut, len(ids))
    return out


def chat(client: openai.OpenAI, text: str, stream: bool, **kw) -> tuple[str, str, object]:
    args = dict(model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=STEPS, temperature=0) | kw
    if not stream:
        r = client.chat.completions.create(**args)
        return r.choices[0].message.content, r.choices[0].finish_reason, r.usage
    pieces, finish, usage = [], None, None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args):
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return "".join(pieces), finish, usage


def test_ready_only_after_the_self_test(servers):
    for server in servers.values():
        log = server.stderr_path.read_text()
        states = [s for s in ("engine state: loading", "engine state: self-test", "engine state: ready") if s in log]
        assert len(states) == 3 and log.index(states[0]) < log.index(states[1]) < log.index(states[2])
        body = requests.get(f"{server.url}/ready", timeout=10).json()
        assert body["state"] == "ready" and body["model"] == MODEL


@pytest.mark.parametrize("variant", ["fp32", "b4"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_greedy_chat_equals_the_float_reference(servers, expected, variant, stream):
    client = servers[variant].client()
    for text in CHATS:
        want, completion_tokens, prompt_tokens = expected[text]
        got, finish, usage = chat(client, text, stream)
        assert got == want
        assert finish == ("length" if completion_tokens == STEPS else "stop")
        assert (usage.prompt_tokens, usage.completion_tokens) == (prompt_tokens, completion_tokens)


@pytest.mark.parametrize("variant", ["fp32", "b4"])
def test_eight_concurrent_clients_get_the_answer_or_a_503(servers, expected, variant):
    server = servers[variant]
    outcomes: list = [None] * 8

    def one(i):
        text = CHATS[i % 2]
        try:
            got = chat(server.client(max_retries=0), text, stream=i % 4 < 2)[0]
            outcomes[i] = "ok" if got == expected[text][0] else f"wrong text {got!r}"
        except openai.APIStatusError as exc:
            outcomes[i] = exc.status_code
        except Exception as exc:  # noqa: BLE001 - a dropped connection or a broken stream is a failure too
            outcomes[i] = repr(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(o in ("ok", 503) for o in outcomes), outcomes
    assert "ok" in outcomes
    assert requests.get(f"{server.url}/ready", timeout=10).status_code == 200


def test_a_client_disconnect_mid_stream_frees_its_slot(servers):
    server = servers["b4"]
    before = server.metric("gemma4_tokens_generated_total")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 48, "stream": True}
    with server.post("/v1/chat/completions", body, stream=True) as resp:
        lines = resp.iter_lines()
        chunks = []
        for line in lines:  # the role chunk, then the first token
            if line.startswith(b"data: "):
                chunks.append(line)
            if len(chunks) == 2:
                break
        assert server.metric("gemma4_busy_slots") == 1
    deadline = time.monotonic() + 30
    while server.metric("gemma4_busy_slots") != 0:
        assert time.monotonic() < deadline, "the slot was not freed"
        time.sleep(0.05)
    assert server.metric("gemma4_tokens_generated_total") - before < 40  # cancelled, not run to max_tokens


BAD = [
    (b"{oops", 400, "invalid_json"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": "7"}, 400, "invalid_value"),
    ({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}, 404, "model_not_found"),
    ({"model": MODEL, "messages": []}, 400, "invalid_value"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hello world " * 40}]}, 400, "context_length_exceeded"),
    (
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 60},
        400,
        "context_length_exceeded",
    ),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 0}, 400, "invalid_value"),
    ({"model": MODEL, "prompt": "x" * 70_000}, 413, "request_entity_too_large"),
]


def test_every_bad_input_gets_its_4xx_over_http(servers):
    server = servers["fp32"]
    for body, status, code in BAD:
        resp = server.post("/v1/chat/completions", body)
        assert resp.status_code == status, (repr(body)[:80], resp.text)
        assert resp.headers["Content-Type"] == "application/json" and resp.json()["error"]["code"] == code
    for method, path, status in (
        ("GET", "/v1/nothing", 404),
        ("GET", "/v1/chat/completions", 405),
        ("DELETE", "/v1/models", 405),
    ):
        resp = requests.request(method, f"{server.url}{path}", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
        assert resp.status_code == status and resp.json()["error"]["message"]
    assert requests.get(f"{server.url}/ready", timeout=10).status_code == 200
    assert server.metric("gemma4_ready") == 1


def test_api_key_is_required_except_for_probes(servers):
    server = servers["fp32"]
    resp = requests.get(f"{server.url}/v1/models", timeout=10)
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).models.list()
    assert [m.id for m in server.client().models.list()] == [MODEL]
    for path in ("/health", "/ready", "/metrics"):
        assert requests.get(f"{server.url}{path}", timeout=10).status_code == 200


def test_seed_stop_and_finish_reasons_through_the_client(servers):
    client = servers["b4"].client()
    hot = dict(temperature=1.5, top_p=0.95, seed=7)
    first = chat(client, CHATS[0], stream=False, **hot)[0]
    assert chat(client, CHATS[0], stream=True, **hot)[0] == first  # same seed, same text, streamed or not
    text, finish, _ = chat(client, CHATS[1], stream=False)
    assert finish == "length"
    stop = text[2:5]
    stopped, finish, _ = chat(client, CHATS[1], stream=True, stop=[stop])
    assert finish == "stop" and stopped == text[: text.find(stop)]


class Place(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=12)
    rank: int = pydantic.Field(ge=1, le=9)
    kind: Literal["town", "capital"]


def test_the_client_parses_structured_output_into_its_model(servers):
    client = servers["b4"].client()
    for seed in range(3):
        r = client.chat.completions.parse(
            model=MODEL,
            messages=[{"role": "user", "content": "A place?"}],
            response_format=Place,
            max_tokens=40,
            seed=seed,
        )
        place = r.choices[0].message.parsed
        assert isinstance(place, Place) and r.choices[0].finish_reason == "stop"


def test_n_and_logprobs_through_the_client(servers):
    client = servers["b4"].client()
    args = dict(model=MODEL, messages=[{"role": "user", "content": CHATS[0]}], max_tokens=8)
    greedy = client.chat.completions.create(n=3, temperature=0, logprobs=True, top_logprobs=2, **args)
    assert [c.index for c in greedy.choices] == [0, 1, 2]
    assert len({c.message.content for c in greedy.choices}) == 1
    content = greedy.choices[0].logprobs.content
    assert b"".join(bytes(t.bytes) for t in content).decode(errors="replace") == greedy.choices[0].message.content
    assert all(t.top_logprobs[0].token == t.token for t in content)
    sampled = [
        [c.message.content for c in client.chat.completions.create(n=3, temperature=1.5, seed=5, **args).choices]
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1] and len(set(sampled[0])) > 1
    text = client.completions.create(model=MODEL, prompt="hello", max_tokens=5, temperature=0, logprobs=2)
    assert "".join(text.choices[0].logprobs.tokens) == text.choices[0].text


def test_sigterm_finishes_the_request_in_flight_then_exits(servers):
    """Last in the module: it stops the batch-1 server."""
    server = servers["fp32"]
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 40,
        "stream": True,
        "temperature": 0,
    }
    with server.post("/v1/chat/completions", body, stream=True) as resp:
        lines = (line for line in resp.iter_lines() if line.startswith(b"data: "))
        next(lines)  # the request is in flight
        server.proc.send_signal(signal.SIGTERM)
        rest = list(lines)
    assert rest[-1] == b"data: [DONE]"
    assert json.loads(rest[-2][len(b"data: ") :])["choices"][0]["finish_reason"] == "length"
    assert server.proc.wait(90) == 0


def test_serve_refuses_bad_settings_in_one_line():
    result = subprocess.run(
        [sys.executable, "build.py", "serve", "/no/such/artifact", "--port", str(free_port())],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: GEMMA4_ARTIFACT='/no/such/artifact'") and result.stderr.count("\n") == 1


def test_serve_on_a_port_in_use_is_one_line(compiled):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "build.py", "serve", str(compiled("tiny-e2b", "fp32")), "--port", str(port)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert (
        result.stderr.startswith("error: GEMMA4_HOST=127.0.0.1 GEMMA4_PORT=") and "cannot listen there" in result.stderr
    )


# -- long prompts on a server with buckets of 8 and 16 in a context of 128 ------------------------


@pytest.fixture(scope="module")
def long_server(compiled, tmp_path_factory):
    server = KeyedServer(compiled("tiny-e2b", "chunks"), tmp_path_factory.mktemp("serve-long")).start()
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def _ids(n: int, seed: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(8, 1024) for _ in range(n)]


def _greedy_text(server, ids: list[int], steps: int) -> str:
    meta = load_meta(server.folder)
    tokens = reference_greedy(load_reference(Path(meta.checkpoint)), ids, steps)[0]
    cut = next((i for i, t in enumerate(tokens) if t in meta.eos_token_ids), len(tokens))
    return load_tokenizer(server.folder / "tokenizer").decode(tokens[:cut], skip_special_tokens=True)


def _stream(server, ids: list[int], steps: int) -> str:
    out = server.client().completions.create(model=MODEL, prompt=ids, max_tokens=steps, temperature=0, stream=True)
    return "".join(chunk.choices[0].text for chunk in out if chunk.choices)


def test_a_prompt_five_times_the_largest_bucket_streams_the_reference_continuation(long_server):
    ids = _ids(5 * 16, 0)  # 80 tokens: five chunks of 16, through a sliding ring of 8 + 16
    assert _stream(long_server, ids, STEPS) == _greedy_text(long_server, ids, STEPS)


def test_a_reused_prefix_answers_as_a_fresh_prefill_alone_and_beside_others(long_server):
    base = _ids(60, 1)
    first, second, other = base + _ids(2, 2), base + _ids(10, 3), _ids(70, 4)
    want = {
        name: _greedy_text(long_server, ids, STEPS)
        for name, ids in (("first", first), ("second", second), ("other", other))
    }
    before = long_server.metric("gemma4_prefix_tokens_reused_total")
    _stream(long_server, base, 2)  # the slot keeps its KV
    assert _stream(long_server, first, STEPS) == want["first"]  # alone, reusing the 60 shared tokens
    got = {}
    threads = [
        threading.Thread(target=lambda n=n, i=i: got.__setitem__(n, _stream(long_server, i, STEPS)))
        for n, i in (("other", other), ("second", second))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == {"other": want["other"], "second": want["second"]}  # beside an unrelated long prompt
    assert long_server.metric("gemma4_prefix_tokens_reused_total") - before >= 2 * 60

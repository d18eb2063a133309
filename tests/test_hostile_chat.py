"""Hostile chat requests against the real server (`build.py serve` of the tiny chat artifact, kv_max 1024:
room for tool declarations), on loopback:
- tool schemas built to blow the tool-call grammar up (a type list at every level multiplies a grammar
  made by copying; wide anyOf, deep and fanned-out $refs, many tools, deep arguments): each gets its
  200 or its 4xx quickly, and the worker's RSS stays within RSS_BOUND;
- a request's own chat template (the operator trusts them here) that loops forever: answered at the
  deadline, the process rendering it killed, the worker idle afterwards;
- the engine thread dying (a decode fault injected by tests/support/faults, matched on a marked
  prompt): liveness fails, gunicorn replaces the worker, the new one serves.
Meanwhile /health and a normal completion keep answering (until the engine is killed, last)."""

from __future__ import annotations

import json
import os
import time

import psutil
import pytest
import requests

from gemma4_port.bench.server import Server
from support import ROOT
from support.hostile import AUTH, KEY, MODEL, Case, Watch, assert_openai_error, send

RSS_BOUND = 96 << 20  # the worker's RSS after the tool corpus, over its RSS before it (warmed up)
RENDER_TIMEOUT_S = 2.0  # a normal render takes milliseconds, a loaded machine's some more
FAULT_PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]  # token ids no prompt of the self-test or the watch begins with
CHAT = "/v1/chat/completions"
SILENT_FOREVER = (  # 10^15 iterations that write nothing: no check between output chunks ever runs
    "{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}"
    "{% endfor %}{% endfor %}{% endfor %}"
)


def chat(tools=None, choice="required", messages=None, **fields) -> dict:
    body = {"model": MODEL, "messages": messages or [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return body | ({"tools": tools, "tool_choice": choice} if tools else {}) | fields


def tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def nested_types(levels: int) -> dict:
    """The 952-byte schema that once grew the worker to 21.7 GB: 6 types at each of `levels` levels."""
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": ["object", "array", "string", "number", "boolean", "null"], "properties": {"a": schema}}
    return {"type": "object", "properties": {"a": schema}}


def wide_any_of(branches: int) -> dict:
    options = [
        {"type": "object", "properties": {f"p{i}": {"type": "integer"}}, "required": [f"p{i}"]} for i in range(branches)
    ]
    return {"type": "object", "properties": {"a": {"anyOf": options}}}


def ref_fan_out(levels: int) -> dict:
    """Each definition refers to the next twice: 2^levels paths through a schema of `levels` nodes."""
    defs = {
        f"d{i}": {
            "type": "object",
            "properties": {"l": {"$ref": f"#/$defs/d{i + 1}"}, "r": {"$ref": f"#/$defs/d{i + 1}"}},
        }
        for i in range(levels)
    }
    return {"type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}}, "$defs": defs | {f"d{levels}": {}}}


def ref_chain(links: int) -> dict:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(links)} | {f"d{links}": {"type": "string"}}
    return {"type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}}, "$defs": defs}


RECURSIVE_TYPES = {
    "type": "object",
    "properties": {"a": {"$ref": "#/$defs/n"}},
    "$defs": {
        "n": {
            "type": ["object", "array", "null"],
            "properties": {"a": {"$ref": "#/$defs/n"}},
            "items": {"$ref": "#/$defs/n"},
        }
    },
}
COUNTED_ARRAYS: dict = {"type": "integer"}
for _ in range(6):  # at least 200^6 items: a counted repetition nested six times
    COUNTED_ARRAYS = {"type": "array", "items": COUNTED_ARRAYS, "minItems": 200, "maxItems": 256}
DEEP = "[" * 5000 + "]" * 5000


def called(arguments: str) -> list[dict]:
    return [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}],
        },
    ]


TOOL_CORPUS = [
    Case("nested-type-lists-8x6", CHAT, chat([tool("f", nested_types(8))]), 200),
    Case("nested-type-lists-8x6-one-call", CHAT, chat([tool("f", nested_types(8))], parallel_tool_calls=False), 200),
    Case("nested-type-lists-60x6", CHAT, chat([tool("f", nested_types(60))]), 400, "GEMMA4_SCHEMA_MAX_DEPTH"),
    Case("wide-any-of-12", CHAT, chat([tool("f", wide_any_of(12))]), 200),
    Case("wide-any-of-2000", CHAT, chat([tool("f", wide_any_of(2000))]), 400, "prompts are never truncated"),
    Case("ref-fan-out-12", CHAT, chat([tool("f", ref_fan_out(12))]), 200),
    Case("ref-chain-30", CHAT, chat([tool("f", ref_chain(30))]), 200),
    Case("ref-chain-200", CHAT, chat([tool("f", ref_chain(200))]), 400, "GEMMA4_SCHEMA_MAX_REF_DEPTH"),
    Case("recursive-type-lists", CHAT, chat([tool("f", RECURSIVE_TYPES)]), 200),
    Case(
        "counted-arrays-6-deep", CHAT, chat([tool("f", {"type": "object", "properties": {"a": COUNTED_ARRAYS}})]), 200
    ),
    Case("tools-64-small", CHAT, chat([tool(f"f{i}", nested_types(1)) for i in range(64)]), 400, "never truncated"),
    Case("tools-65", CHAT, chat([tool(f"f{i}", {"type": "object"}) for i in range(65)]), 400, "GEMMA4_MAX_TOOLS"),
    Case("parameters-not-an-object", CHAT, chat([tool("f", {"type": ["string", "boolean"]})]), 400, '"object"'),
    Case("arguments-5000-deep", CHAT, chat(messages=called(DEEP)), 400, "nests too deeply"),
    Case(  # too deep for Python's JSON decoder (once a 500): passed on as text, which the context refuses
        "tool-result-1200-deep",
        CHAT,
        chat(messages=[*called("{}"), {"role": "tool", "tool_call_id": "c1", "content": "[" * 1200 + "]" * 1200}]),
        400,
        "never truncated",
    ),
    Case(
        "arguments-200-deep-in-tokenize",  # the template's recursion runs out before the value's end
        "/tokenize",
        {"model": MODEL, "messages": called('{"a":' * 200 + "1" + "}" * 200)[1:]},
        400,
        "nests too deeply",
    ),
]


@pytest.fixture(scope="module")
def server(compiled, tmp_path_factory):
    faults = str(ROOT / "tests" / "support" / "faults")
    env = {
        "GEMMA4_API_KEY": KEY,
        "GEMMA4_QUEUE_MAX": "4",
        "GEMMA4_TRUST_REQUEST_CHAT_TEMPLATE": "true",
        "GEMMA4_RENDER_TIMEOUT_S": str(RENDER_TIMEOUT_S),
        "GEMMA4_TEST_FAULT_PROMPT": ",".join(map(str, FAULT_PROMPT)),
        "PYTHONPATH": os.pathsep.join(filter(None, [faults, os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
    }
    with Server(compiled("tiny-e2b", "chat"), tmp_path_factory.mktemp("hostile-chat-logs"), 300, env) as s:
        yield s


def cpu_s(process: psutil.Process) -> float:
    return sum(process.cpu_times()[:2])


def test_tool_schemas_built_to_blow_the_grammar_up_are_served_or_refused_quickly(server, capsys):
    warm = send(server, Case("warm", CHAT, chat([tool("f", nested_types(1))]), 200))  # the grammar compiler
    assert warm.status_code == 200, warm.text[:300]
    pid, rss_start = server.worker.pid, server.rss()
    seen = {}
    with Watch(server) as watch:
        for case in TOOL_CORPUS:
            t = time.perf_counter()
            resp = send(server, case)
            seen[case.name] = (resp.status_code, round(time.perf_counter() - t, 2), len(json.dumps(case.body)))
            if case.status == 200:
                assert resp.status_code == 200, f"{case.name}: {resp.text[:500]}"
            else:
                assert_openai_error(resp, case.status, case.says)
    rss_end, peak = server.rss(), server.peak_rss()
    with capsys.disabled():
        print(
            f"\nhostile tool schemas: worker pid {pid} -> {server.worker.pid}, RSS {rss_start / 2**20:.0f} -> "
            f"{rss_end / 2**20:.0f} MiB (peak {peak / 2**20:.0f}), {watch.rounds} health+completion rounds, "
            f"failures {watch.failures}; (status, seconds, body bytes): {seen}"
        )
    assert server.worker.is_running() and server.worker.pid == pid
    assert rss_end - rss_start < RSS_BOUND
    assert watch.rounds >= 3 and not watch.failures
    assert max(s for _, s, _ in seen.values()) < 10


def sandboxes(server: Server) -> set[int]:
    return {p.pid for p in server.worker.children()}


def test_a_request_template_looping_forever_is_stopped_with_its_process(server, capsys):
    own = {"chat_template_kwargs": {"chat_template": "{{ bos_token }}{{ messages[0]['content'] }}"}}
    assert send(server, Case("up", CHAT, chat(**own), 200)).status_code == 200  # the sandboxes are up
    before = sandboxes(server)
    assert before  # started with the worker, as the operator trusts request templates
    with Watch(server) as watch:
        t = time.perf_counter()
        resp = send(server, Case("loop", CHAT, chat(chat_template_kwargs={"chat_template": SILENT_FOREVER}), 400))
        took = time.perf_counter() - t
        assert_openai_error(resp, 400, "GEMMA4_RENDER_TIMEOUT_S")
        bomb = send(
            server, Case("bomb", CHAT, chat(chat_template_kwargs={"chat_template": "{{ 'x' * 3000000000 }}"}), 400)
        )
        assert_openai_error(bomb, 400, "GEMMA4_REQUEST_TEMPLATE_MAX_MEMORY")
    after = sandboxes(server)
    killed = before - after
    assert len(killed) == 1 and len(after) == len(before)  # one killed, one in its place
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in killed)
    assert send(server, Case("again", CHAT, chat(**own), 200)).status_code == 200  # the replacement is up
    worker, children = server.worker, [psutil.Process(p) for p in after]
    start = cpu_s(worker) + sum(map(cpu_s, children))
    time.sleep(1.0)  # the CPU the worker and its sandboxes spend with nothing asked of them
    idle = cpu_s(worker) + sum(map(cpu_s, children)) - start
    with capsys.disabled():
        print(
            f"\nrunaway request template: 400 after {took:.2f} s (deadline {RENDER_TIMEOUT_S:g} s), sandbox "
            f"{sorted(killed)} killed, {len(after)} sandboxes after; CPU over 1 s afterwards {idle:.3f} s; "
            f"{watch.rounds} health+completion rounds meanwhile, failures {watch.failures}"
        )
    assert took < RENDER_TIMEOUT_S + 3 and idle < 0.3
    assert watch.rounds >= 1 and not watch.failures


def test_a_dead_engine_fails_liveness_and_gunicorn_replaces_the_worker(server, capsys):
    """Last in the module: it ends the worker the other tests use."""
    old = server.worker
    body = {"model": MODEL, "prompt": FAULT_PROMPT, "max_tokens": 4, "ignore_eos": True}
    resp = requests.post(server.url + "/v1/completions", json=body, headers=AUTH, timeout=60)
    assert_openai_error(resp, 503)  # the engine's failure, not the request's: retry elsewhere
    assert resp.json()["error"]["code"] == "engine_error" and "injected" not in resp.text
    t = time.perf_counter()
    # What a probe sees next is a race with the worker's exit: its 503, the connection dropped as it exits,
    # or the new worker's 200 while it loads; the worker's own liveness verdict is in its log (below).
    try:
        health = f"{(r := requests.get(server.url + '/health', timeout=10)).status_code} {r.text.strip()[:80]}"
    except requests.ConnectionError as exc:
        health = f"connection dropped ({type(exc).__name__})"
    old.wait(60)  # it exits for a new one
    server.wait_ready()  # the new worker loaded the artifact and passed the self-test
    replaced = time.perf_counter() - t
    log = server.stderr_path.read_text(errors="replace")
    assert "the engine cannot serve any more (the engine thread is not running)" in log
    assert server.worker.pid != old.pid
    served = requests.post(
        server.url + "/v1/completions",
        json={"model": MODEL, "prompt": "hello", "max_tokens": 2},
        headers=AUTH,
        timeout=60,
    )
    assert served.status_code == 200 and requests.get(server.url + "/health", timeout=10).status_code == 200
    with capsys.disabled():
        print(
            f"\nengine death: 503 engine_error, /health then {health}, "
            f"worker {old.pid} -> {server.worker.pid} ready in {replaced:.1f} s"
        )

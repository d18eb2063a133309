"""Hostile requests against the real server (`build.py serve` of the tiny artifact, on loopback): each
kind that once crashed the worker, stopped the engine, grew its memory without bound, held the model
for long, or leaked a path or a key, sent for real. Every one gets its 4xx (OpenAI-shaped, short,
naming the limit), and meanwhile a normal completion and /health keep answering; at the end the
worker is the same process and its RSS within RSS_BOUND of where it started.

The drain on SIGTERM (it stops the server) is tested in test_httpworker.py."""

from __future__ import annotations

import json
import time

import pytest
import requests

from gemma4_port.bench.server import Server
from support.hostile import KEY, MODEL, Case, Watch, assert_openai_error, send

RSS_BOUND = 96 << 20  # the worker's RSS after the corpus, over its RSS before it (warmed up)
TOTAL_TOKENS = 256  # GEMMA4_MAX_TOTAL_TOKENS here: the tiny model's context (64) makes the default unreachable


def lark_chain(rules: int) -> str:
    return "start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(rules)) + f'r{rules}: "a"'


def ref_chain(defs: int, any_of: bool) -> dict:
    def link(i: int) -> dict:
        ref = {"$ref": f"#/$defs/d{i + 1}"}
        return {"anyOf": [ref, {"type": "null"}]} if any_of else ref

    chain = {f"d{i}": link(i) for i in range(defs)} | {f"d{defs}": {"type": "string"}}
    return {"$ref": "#/$defs/d0", "$defs": chain}


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2} | fields


def completion(**fields) -> dict:
    return {"model": MODEL, "prompt": "hello", "max_tokens": 2} | fields


def tool(name: str, parameters: dict | None = None) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters or {"type": "object"}}}


CORPUS = [
    # grammars the grammar engine once crashed on (native stack overflow), stalled on, or echoed whole
    Case("lark-10k-rule-chain", "/v1/completions", completion(guided_grammar=lark_chain(10_000)), 400, "MAX_BYTES"),
    Case("lark-1500-rules", "/v1/completions", completion(guided_grammar=lark_chain(1_500)), 400, "MAX_RULES"),
    Case("ref-chain-anyof", "/v1/completions", completion(guided_json=ref_chain(1_500, True)), 400, "GEMMA4_GRAMMAR"),
    Case("ref-chain-plain", "/v1/completions", completion(guided_json=ref_chain(5_000, False)), 400, "GEMMA4_GRAMMAR"),
    Case("choice-50k", "/v1/completions", completion(guided_choice=[f"c{i}" for i in range(50_000)]), 400, "GRAMMAR"),
    Case(
        "schema-in-response-format",
        "/v1/chat/completions",
        chat(response_format={"type": "json_schema", "json_schema": {"schema": ref_chain(1_500, True)}}),
        400,
        "GEMMA4_GRAMMAR",
    ),
    # within our limits, what reaches llguidance compiles in bounded time, off the engine thread
    Case(  # llguidance's lexer limit meets it at a step: that request ends, in milliseconds, not seconds
        "regex-a1000x1000",
        "/v1/completions",
        completion(guided_regex="a{1000}{1000}", temperature=0),
        400,
        "too many expressions",
    ),
    Case("lark-900-rule-chain", "/v1/completions", completion(guided_grammar=lark_chain(900)), 200),
    Case("ref-chain-200-anyof", "/v1/completions", completion(guided_json=ref_chain(200, True)), 200),
    # a request's own template, and the template arguments that are the server's own
    Case("chat-template", "/v1/chat/completions", chat(chat_template_kwargs={"chat_template": '{{ "" }}'}), 400),
    *(
        Case(f"template-kwarg-{k}", "/v1/chat/completions", chat(chat_template_kwargs={k: True}), 400, k)
        for k in ("tokenize", "conversation", "tools", "add_generation_prompt", "continue_final_message")
    ),
    # rendering cost under the tokenizer lock
    Case(
        "tokenize-6000-messages",
        "/tokenize",
        {"model": MODEL, "messages": [{"role": "user", "content": ""}] * 6000},
        400,
    ),
    Case("chat-3000-messages", "/v1/chat/completions", chat(messages=[{"role": "user", "content": ""}] * 3000), 400),
    # the cost of one request
    Case("n-128", "/v1/completions", completion(n=128, max_tokens=60, ignore_eos=True), 400, "GEMMA4_MAX_N"),
    Case("best-of-128", "/v1/completions", completion(best_of=128), 400, "GEMMA4_MAX_N"),
    Case("n-x-max-tokens", "/v1/completions", completion(n=8, max_tokens=60), 400, "GEMMA4_MAX_TOTAL_TOKENS"),
    Case("top-logprobs", "/v1/chat/completions", chat(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    Case("tools-100", "/v1/chat/completions", chat(tools=[tool(f"f{i}") for i in range(100)]), 400, "GEMMA4_MAX_TOOLS"),
    Case("stops-17", "/v1/completions", completion(stop=[f"s{i}" for i in range(17)]), 400, "GEMMA4_MAX_STOPS"),
    Case("stop-token-ids", "/v1/completions", completion(stop_token_ids=[1] * 1000), 400, "GEMMA4_MAX_STOP_TOKEN_IDS"),
    # logit_bias keys that pass str.isdigit() and fail int()
    Case("logit-bias-superscript", "/v1/completions", completion(logit_bias={"²": 5}), 400, "logit_bias"),
    Case("logit-bias-5000-digits", "/v1/completions", completion(logit_bias={"9" * 5000: 5}), 400, "logit_bias"),
    # what a client sends back in an error message is cut, whatever its length
    Case("long-model-name", "/v1/completions", completion(model="m" * 100_000), 404, "does not exist"),
    Case("long-function-name", "/v1/chat/completions", chat(tools=[tool("f-" * 50_000)]), 400, "function name"),
    Case("long-unknown-route", "/v1/" + "x" * 3000, completion(), 404, "no route"),
    # the HTTP layer
    Case("bad-utf8", "/v1/completions", b'{"model": "\xff\xfe", "prompt": "x"}', 400),
    Case("deep-json", "/v1/completions", b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400),
    Case("body-over-limit", "/v1/completions", b" " * (2 << 20), 413),
]


@pytest.fixture(scope="module")
def server(compiled, tmp_path_factory):
    env = {
        "GEMMA4_API_KEY": KEY,
        "GEMMA4_QUEUE_MAX": "4",
        "GEMMA4_MAX_TOTAL_TOKENS": str(TOTAL_TOKENS),
        "OMP_NUM_THREADS": "1",
    }
    with Server(compiled("tiny-e2b", "fp32"), tmp_path_factory.mktemp("hostile-logs"), 300, env) as s:
        yield s


def test_the_corpus_gets_its_4xx_while_the_server_keeps_serving(server, capsys):
    # Warm up what the corpus touches first (the grammar compiler, templating), so RSS is compared warm.
    assert send(server, Case("warm", "/v1/completions", completion(guided_regex="[ab]+"), 200)).status_code == 200
    assert send(server, Case("warm", "/v1/chat/completions", chat(), 200)).status_code == 200
    pid, rss_start, start = server.worker.pid, server.rss(), time.perf_counter()
    seen = {}
    with Watch(server) as watch:
        for case in CORPUS:
            t = time.perf_counter()
            resp = send(server, case)
            seen[case.name] = (resp.status_code, round(time.perf_counter() - t, 2))
            if case.status == 200:
                assert resp.status_code == 200, resp.text[:500]
            else:
                assert_openai_error(resp, case.status, case.says)
        # Client-chosen field names: remembered up to a bound, not one per name forever.
        for i in range(10):
            names = {f"field_{i}_{j}": 1 for j in range(20_000)}
            assert send(server, Case("unknown", "/v1/completions", completion(**names), 200)).status_code == 200
    elapsed, rss_end = time.perf_counter() - start, server.rss()
    with capsys.disabled():
        print(
            f"\nhostile corpus: {len(CORPUS) + 10} requests in {elapsed:.1f} s, worker pid {pid} -> "
            f"{server.worker.pid}, RSS {rss_start / 2**20:.0f} -> {rss_end / 2**20:.0f} MiB, "
            f"{watch.rounds} health+completion rounds meanwhile, failures {watch.failures}; {seen}"
        )
    assert server.worker.is_running() and server.worker.pid == pid
    assert rss_end - rss_start < RSS_BOUND
    assert watch.rounds >= 3 and not watch.failures
    log = server.stderr_path.read_text(errors="replace")
    assert log.count("not supported and") < 50  # 200,000 new names: a bounded number of lines


def test_probes_say_the_state_not_paths_or_exceptions(server):
    for path in ("/health", "/ready"):
        body = requests.get(server.url + path, timeout=10).text
        assert str(server.folder) not in body and "Error" not in body and "/" not in json.loads(body).get("reason", "")


def test_a_key_in_the_query_string_never_reaches_the_log(server):
    resp = requests.get(f"{server.url}/v1/models?api_key={KEY}", timeout=10)
    assert_openai_error(resp, 401)
    requests.get(f"{server.url}/health?token={KEY}", timeout=10)
    deadline = time.monotonic() + 10  # the access log's line is written just after the response
    while "/health?token=[redacted]" not in (log := logs(server)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "/v1/models?api_key=[redacted]" in log and KEY not in log


def logs(server: Server) -> str:
    return server.stderr_path.read_text(errors="replace") + server.stdout_path.read_text(errors="replace")


def test_gunicorns_414_is_an_invalid_request_error(server):
    resp = requests.get(server.url + "/" + "a" * 9000, timeout=10)
    assert_openai_error(resp, 414)

"""Response shapes through the app (Flask's test client, a batch-4 engine): n choices, logprobs,
echo, usage in streams, and the sampling controls that change what a reply holds."""

from __future__ import annotations

import json

import pytest

from runtime.app import create_app
from runtime.engine import State
from runtime.settings import Settings

from support.engines import running

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MODEL = "tiny-e2b"
HI = [{"role": "user", "content": "Write a haiku."}]


@pytest.fixture(scope="module")
def engine(compiled):
    with running(Settings(artifact=compiled("tiny-e2b", "b4"), queue_max=8)) as eng:
        assert eng.wait(300) is State.READY, eng.reason
        yield eng


@pytest.fixture(scope="module")
def client(engine):
    return create_app(engine.settings, engine).test_client()


def post(client, path: str, body: dict) -> dict:
    resp = client.post(path, json={"model": MODEL} | body)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    return resp.get_json()


def events(client, path: str, body: dict) -> list[dict]:
    resp = client.post(path, json={"model": MODEL, "stream": True} | body)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    lines = [ln[len("data: "):] for ln in resp.get_data(as_text=True).split("\n\n") if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


def texts(reply: dict) -> list[str]:
    return [c["message"]["content"] if "message" in c else c["text"] for c in reply["choices"]]


def streamed_texts(chunks: list[dict], n: int) -> list[str]:
    out = [""] * n
    for chunk in chunks:
        for c in chunk["choices"]:
            out[c["index"]] += c["delta"].get("content") or "" if "delta" in c else c["text"]
    return out


def test_n_greedy_choices_are_identical(client):
    reply = post(client, CHAT, {"messages": HI, "max_tokens": 10, "temperature": 0, "n": 3})
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2]
    assert len(set(texts(reply))) == 1 and texts(reply)[0]
    assert reply["usage"]["completion_tokens"] == 30
    metrics = client.get("/metrics").get_data(as_text=True)  # the other two choices copied the prompt's KV
    assert float(metrics.split("\ngemma4_forks_total ")[1].split()[0]) >= 2


def test_n_seeded_samples_differ_and_reproduce_streamed_or_not(client):
    body = {"messages": HI, "max_tokens": 12, "temperature": 1.5, "seed": 11, "n": 3}
    first = texts(post(client, CHAT, body))
    assert len(set(first)) > 1
    assert texts(post(client, CHAT, body)) == first
    chunks = events(client, CHAT, body)
    assert streamed_texts(chunks, 3) == first
    finishes = {c["index"]: c["finish_reason"] for e in chunks for c in e["choices"] if c["finish_reason"]}
    assert set(finishes) == {0, 1, 2}


def test_chat_logprobs_match_the_tokens(client, engine):
    body = {"messages": HI, "max_tokens": 10, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    reply = post(client, CHAT, body)
    choice = reply["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == reply["usage"]["completion_tokens"]
    assert bytes(b for e in content for b in e["bytes"]).decode(errors="replace") == choice["message"]["content"]
    for e in content:
        assert e["logprob"] <= 0 and len(e["top_logprobs"]) == 3
        best = e["top_logprobs"][0]
        assert (best["token"], best["logprob"]) == (e["token"], e["logprob"])  # greedy takes the best
        assert [t["logprob"] for t in e["top_logprobs"]] == sorted((t["logprob"] for t in e["top_logprobs"]), reverse=True)
    streamed = [e for chunk in events(client, CHAT, body) for c in chunk["choices"]
                for e in (c["logprobs"] or {}).get("content", [])]
    assert streamed == content


def test_completions_logprobs_echo_and_offsets(client):
    prompt = "The capital of France is"
    reply = post(client, COMPLETIONS, {"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 2})
    lp = reply["choices"][0]["logprobs"]
    text = reply["choices"][0]["text"]
    assert "".join(lp["tokens"]) == text and len(lp["token_logprobs"]) == 6
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(6)]
    assert all(len(top) <= 2 and max(top.values()) >= lp["token_logprobs"][i] - 1e-6
               for i, top in enumerate(lp["top_logprobs"]))
    echoed = post(client, COMPLETIONS, {"prompt": prompt, "max_tokens": 6, "temperature": 0, "echo": True})
    assert texts(echoed) == [prompt + text]
    chunks = events(client, COMPLETIONS, {"prompt": prompt, "max_tokens": 6, "temperature": 0, "echo": True})
    assert streamed_texts(chunks, 1) == [prompt + text]


def test_continuous_usage_stats_count_up_in_every_chunk(client):
    chunks = events(client, COMPLETIONS, {"prompt": "hello", "max_tokens": 7, "temperature": 0, "stream_options": {
        "include_usage": True, "continuous_usage_stats": True}})
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert all("usage" in c for c in chunks) and counts == sorted(counts) and counts[-1] == 7
    assert chunks[-1]["choices"] == []


def test_ignore_eos_min_tokens_and_stop_token_ids(client, engine):
    eos = engine.model.meta.eos_token_ids[0]
    base = {"messages": HI, "max_tokens": 8, "temperature": 0, "logit_bias": {str(eos): 100}}
    stopped = post(client, CHAT, base)["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["message"]["content"] == ""
    held = post(client, CHAT, base | {"min_tokens": 3})
    assert held["choices"][0]["finish_reason"] == "stop" and held["usage"]["completion_tokens"] == 4  # 3 + the EOS
    ignored = post(client, CHAT, base | {"ignore_eos": True})
    assert ignored["choices"][0]["finish_reason"] == "length" and ignored["usage"]["completion_tokens"] == 8
    free = post(client, COMPLETIONS, {"prompt": "hello", "max_tokens": 8, "temperature": 0, "logprobs": 0})
    tokens = free["choices"][0]["logprobs"]["tokens"]
    k = next(i for i, t in enumerate(tokens) if i and t not in tokens[:i])  # the first new token after the first
    token_id = engine.tokenizer(tokens[k], add_special_tokens=False).input_ids[0]
    cut = post(client, COMPLETIONS, {"prompt": "hello", "max_tokens": 8, "temperature": 0, "stop_token_ids": [token_id]})
    assert cut["choices"][0]["finish_reason"] == "stop" and cut["usage"]["completion_tokens"] == k + 1
    assert cut["choices"][0]["text"] == "".join(tokens[:k])


def test_penalties_change_a_repetitive_greedy_reply(client):
    body = {"messages": HI, "max_tokens": 16, "temperature": 0, "logprobs": True}
    plain = post(client, CHAT, body)["choices"][0]["logprobs"]["content"]
    tokens = [e["token"] for e in plain]
    assert len(set(tokens)) < len(tokens)  # the tiny random model repeats itself
    for penalty in ({"frequency_penalty": 2.0}, {"repetition_penalty": 3.0}):  # presence: see test_logits
        shaped = [e["token"] for e in post(client, CHAT, body | penalty)["choices"][0]["logprobs"]["content"]]
        assert max(map(shaped.count, shaped)) < max(map(tokens.count, tokens)), penalty  # repeats less


def test_best_of_returns_the_likeliest_runs(client):
    body = {"prompt": "hello", "max_tokens": 6, "temperature": 1.5, "seed": 3}
    runs = post(client, COMPLETIONS, body | {"n": 4, "logprobs": 0})
    score = {c["text"]: sum(c["logprobs"]["token_logprobs"]) for c in runs["choices"]}
    best = post(client, COMPLETIONS, body | {"n": 2, "best_of": 4})
    assert texts(best) == sorted(score, key=score.get, reverse=True)[:2]
    assert best["choices"][0]["logprobs"] is None and best["usage"]["completion_tokens"] == runs["usage"]["completion_tokens"]
    resp = client.post(COMPLETIONS, json={"model": MODEL, "stream": True, "best_of": 2} | body)
    assert resp.status_code == 400 and resp.get_json()["error"]["param"] == "best_of"


def test_min_p_one_keeps_only_the_best_token_at_any_temperature(client):
    body = {"prompt": "hello", "max_tokens": 8, "seed": 5}
    greedy = texts(post(client, COMPLETIONS, body | {"temperature": 0}))
    assert texts(post(client, COMPLETIONS, body | {"temperature": 2.0, "min_p": 1.0})) == greedy
    assert texts(post(client, COMPLETIONS, body | {"temperature": 2.0})) != greedy  # the premise: 2.0 wanders


def test_stop_strings_wait_for_min_tokens(client):
    body = {"prompt": "hello", "max_tokens": 8, "temperature": 0}
    free = post(client, COMPLETIONS, body | {"logprobs": 0})["choices"][0]
    text, tokens = free["text"], free["logprobs"]["tokens"]
    stop = tokens[0]
    assert stop and free["finish_reason"] == "length"
    cut = post(client, COMPLETIONS, body | {"stop": stop})["choices"][0]
    assert (cut["text"], cut["finish_reason"]) == ("", "stop")
    held = post(client, COMPLETIONS, body | {"stop": stop, "min_tokens": 8})["choices"][0]
    assert (held["text"], held["finish_reason"]) == (text, "length")
    after = post(client, COMPLETIONS, body | {"stop": stop, "min_tokens": 1})["choices"][0]
    at = text.find(stop, len(tokens[0]) - len(stop) + 1)  # a stop must end past the first token's text
    assert after["text"] == (text[:at] if at >= 0 else text)

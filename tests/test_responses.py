"""Response shapes through the app (Flask's test client, a batch-4 engine): n choices, logprobs,
echo, usage in streams, and the sampling controls that change what a reply holds."""

from __future__ import annotations

import json

import pytest

from runtime.http.app import create_app
from runtime.settings import ServerSettings
from support.engines import ready
from support.http import openai_client

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MODEL = "tiny-e2b"
HI = [{"role": "user", "content": "Write a haiku."}]


@pytest.fixture(scope="module")
def engine(compiled):
    with ready(ServerSettings(artifact=compiled("tiny-e2b", "b4"), queue_max=8)) as eng:
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
    lines = [ln[len("data: ") :] for ln in resp.get_data(as_text=True).split("\n\n") if ln.startswith("data: ")]
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
        assert [t["logprob"] for t in e["top_logprobs"]] == sorted(
            (t["logprob"] for t in e["top_logprobs"]), reverse=True
        )
    streamed = [
        e
        for chunk in events(client, CHAT, body)
        for c in chunk["choices"]
        for e in (c["logprobs"] or {}).get("content", [])
    ]
    assert streamed == content


def test_completions_logprobs_echo_and_offsets(client):
    prompt = "The capital of France is"
    reply = post(client, COMPLETIONS, {"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 2})
    lp = reply["choices"][0]["logprobs"]
    text = reply["choices"][0]["text"]
    assert "".join(lp["tokens"]) == text and len(lp["token_logprobs"]) == 6
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(6)]
    assert all(
        len(top) <= 2 and max(top.values()) >= lp["token_logprobs"][i] - 1e-6
        for i, top in enumerate(lp["top_logprobs"])
    )
    echoed = post(client, COMPLETIONS, {"prompt": prompt, "max_tokens": 6, "temperature": 0, "echo": True})
    assert texts(echoed) == [prompt + text]
    chunks = events(client, COMPLETIONS, {"prompt": prompt, "max_tokens": 6, "temperature": 0, "echo": True})
    assert streamed_texts(chunks, 1) == [prompt + text]


def test_continuous_usage_stats_count_up_in_every_chunk(client):
    chunks = events(
        client,
        COMPLETIONS,
        {
            "prompt": "hello",
            "max_tokens": 7,
            "temperature": 0,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    )
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert all("usage" in c for c in chunks) and counts == sorted(counts) and counts[-1] == 7
    assert chunks[-1]["choices"] == []


def test_ignore_eos_min_tokens_and_stop_token_ids(client, engine):
    eos = engine.model.meta.eos_token_ids[0]
    base = {"messages": HI, "max_tokens": 8, "temperature": 0, "logit_bias": {str(eos): 100}}
    stopped = post(client, CHAT, base)["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["message"]["content"] == ""
    held = post(client, CHAT, base | {"min_tokens": 3, "logprobs": True})
    assert held["choices"][0]["finish_reason"] == "stop" and held["usage"]["completion_tokens"] == 4  # 3 + the EOS
    content = held["choices"][0]["logprobs"]["content"]  # one logprob per token, the EOS's too (as vLLM)
    assert len(content) == 4 and content[-1]["token"] == engine.tokenizer.convert_ids_to_tokens(eos)
    ignored = post(client, CHAT, base | {"ignore_eos": True})
    assert ignored["choices"][0]["finish_reason"] == "length" and ignored["usage"]["completion_tokens"] == 8
    free = post(client, COMPLETIONS, {"prompt": "hello", "max_tokens": 8, "temperature": 0, "logprobs": 0})
    tokens = free["choices"][0]["logprobs"]["tokens"]
    k = next(i for i, t in enumerate(tokens) if i and t not in tokens[:i])  # the first new token after the first
    token_id = engine.tokenizer(tokens[k], add_special_tokens=False).input_ids[0]
    cut = post(
        client, COMPLETIONS, {"prompt": "hello", "max_tokens": 8, "temperature": 0, "stop_token_ids": [token_id]}
    )
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
    assert (
        best["choices"][0]["logprobs"] is None
        and best["usage"]["completion_tokens"] == runs["usage"]["completion_tokens"]
    )
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


def prompt_ids(engine, text: str) -> list[int]:
    return engine.tokenizer(text).input_ids


def test_echo_with_logprobs_covers_the_prompt_then_the_completion(client, engine):
    """OpenAI's legacy format, as vLLM fills it: the prompt's tokens first (the first one's logprob and
    alternatives null), then the completion's; the same whole and streamed; the prompt's logprobs
    those of prompt_logprobs."""
    prompt = "The capital of France is"
    ids = prompt_ids(engine, prompt)
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "echo": True, "logprobs": 2}
    reply = post(client, COMPLETIONS, body)
    plain = post(client, COMPLETIONS, {"prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": 2})
    choice, generated = reply["choices"][0], plain["choices"][0]["logprobs"]
    lp = choice["logprobs"]
    assert choice["text"] == prompt + plain["choices"][0]["text"]
    assert len(lp["tokens"]) == len(ids) + 4 and lp["tokens"][len(ids) :] == generated["tokens"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    # teacher-forced KV comes from decode steps, a plain prompt's from the prefill: float32 rounding apart
    assert lp["token_logprobs"][len(ids) :] == pytest.approx(generated["token_logprobs"], abs=1e-4)
    assert all(len(top) == 2 for top in lp["top_logprobs"][1:])
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]
    vllm = post(client, COMPLETIONS, {"prompt": prompt, "max_tokens": 4, "temperature": 0, "prompt_logprobs": 2})
    rows = vllm["choices"][0]["prompt_logprobs"]
    assert rows[0] is None and len(rows) == len(ids)
    assert [row[str(t)]["logprob"] for row, t in zip(rows[1:], ids[1:])] == lp["token_logprobs"][1 : len(ids)]
    chunks = events(client, COMPLETIONS, body)
    streamed = {k: [v for c in chunks for v in (c["choices"][0]["logprobs"] or {}).get(k, [])] for k in lp}
    assert streamed == lp and streamed_texts(chunks, 1) == [choice["text"]]
    assert chunks[0]["choices"][0]["text"] == prompt  # the echo comes first, with the prompt's logprobs


def test_prompt_logprobs_as_vllm_returns_them_for_completions_and_chat(client, engine):
    ids = prompt_ids(engine, "hello world, hello")
    reply = post(client, COMPLETIONS, {"prompt": ids, "max_tokens": 4, "temperature": 0, "prompt_logprobs": 3, "n": 2})
    # n > 1: each choice is fed the prompt itself (no prefill to share), and says what a plain request says
    assert texts(reply) == texts(post(client, COMPLETIONS, {"prompt": ids, "max_tokens": 4, "temperature": 0})) * 2
    rows = [c["prompt_logprobs"] for c in reply["choices"]]
    assert rows[0] == rows[1] and rows[0][0] is None and len(rows[0]) == len(ids)
    for row, token in zip(rows[0][1:], ids[1:]):
        first, *top = row.items()  # the prompt's token first, then the likeliest (those not it)
        assert first[0] == str(token) and first[1]["rank"] >= 1 and first[1]["logprob"] <= 0
        best = sorted(row.values(), key=lambda v: v["rank"])
        assert [v["rank"] for v in best][:3] == [1, 2, 3] and len(row) in (3, 4)
        assert [v["logprob"] for v in best] == sorted((v["logprob"] for v in best), reverse=True)
        assert first[1]["decoded_token"] == engine.tokenizer.decode([token])
    chat = post(client, CHAT, {"messages": HI, "max_tokens": 2, "temperature": 0, "prompt_logprobs": 0})
    assert "prompt_logprobs" not in chat["choices"][0] and chat["prompt_logprobs"][0] is None
    assert len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"]
    assert all(len(row) == 1 for row in chat["prompt_logprobs"][1:])
    assert "prompt_logprobs" not in post(client, CHAT, {"messages": HI, "max_tokens": 2})  # not asked: not there
    for path, body in ((CHAT, {"messages": HI}), (COMPLETIONS, {"prompt": "hi"})):
        resp = client.post(path, json={"model": MODEL, "stream": True, "prompt_logprobs": 1} | body)
        assert resp.status_code == 400 and resp.get_json()["error"]["param"] == "prompt_logprobs"


def test_lm_eval_harness_loglikelihood_request(client, engine):
    """The request lm-evaluation-harness's local-completions sends for loglikelihood (a batch of one
    token-id prompt, echo, logprobs 1, max_tokens 1, greedy) and how it reads the answer: the
    continuation's logprobs are token_logprobs[ctxlen:-1]; greedy if each is its top_logprobs' best."""
    context, continuation = prompt_ids(engine, "The capital of France"), prompt_ids(engine, " is Paris")[1:]
    tokens = context + continuation
    reply = post(
        client,
        COMPLETIONS,
        {"prompt": [tokens], "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True},
    )
    [choice] = reply["choices"]
    lp = choice["logprobs"]
    assert len(lp["token_logprobs"]) == len(tokens) + 1
    ctxlen = len(context)
    logprob = sum(lp["token_logprobs"][ctxlen:-1])
    is_greedy = all(
        t == max(top.values()) for t, top in zip(lp["token_logprobs"][ctxlen:-1], lp["top_logprobs"][ctxlen:-1])
    )
    rows = post(client, COMPLETIONS, {"prompt": tokens, "max_tokens": 1, "prompt_logprobs": 0})["choices"][0][
        "prompt_logprobs"
    ]
    assert logprob == pytest.approx(sum(rows[i][str(tokens[i])]["logprob"] for i in range(ctxlen, len(tokens))))
    assert is_greedy == all(rows[i][str(tokens[i])]["rank"] == 1 for i in range(ctxlen, len(tokens)))
    assert logprob < 0


def test_echo_logprobs_through_the_openai_client(engine):
    oai = openai_client(engine)
    prompt = "Inferentia2 has two NeuronCores"
    n_prompt = len(prompt_ids(engine, prompt))
    whole = oai.completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=1, max_tokens=3, temperature=0)
    lp = whole.choices[0].logprobs
    assert whole.choices[0].text.startswith(prompt) and len(lp.tokens) == n_prompt + 3 == len(lp.token_logprobs)
    assert lp.token_logprobs[0] is None and all(x <= 0 for x in lp.token_logprobs[1:])
    parts = list(
        oai.completions.create(
            model=MODEL, prompt=prompt, echo=True, logprobs=1, max_tokens=3, temperature=0, stream=True
        )
    )
    assert "".join(p.choices[0].text for p in parts) == whole.choices[0].text
    assert [
        t for p in parts if p.choices[0].logprobs for t in p.choices[0].logprobs.token_logprobs
    ] == lp.token_logprobs


def test_max_tokens_zero_with_echo_scores_the_prompt_alone(client, engine):
    """As vLLM: the prompt and its logprobs, nothing generated (older harnesses score this way)."""
    prompt = "hello world, hello"
    body = {"prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 1}
    scored = post(client, COMPLETIONS, body)
    choice = scored["choices"][0]
    longer = post(client, COMPLETIONS, body | {"max_tokens": 2})["choices"][0]["logprobs"]
    n = len(prompt_ids(engine, prompt))
    assert (choice["text"], choice["finish_reason"], scored["usage"]["completion_tokens"]) == (prompt, "length", 0)
    assert choice["logprobs"]["token_logprobs"] == longer["token_logprobs"][:n] and len(longer["tokens"]) == n + 2
    chunks = events(client, COMPLETIONS, body)
    assert streamed_texts(chunks, 1) == [prompt] and chunks[-1]["choices"][0]["finish_reason"] == "length"
    one = post(client, COMPLETIONS, {"prompt": prompt_ids(engine, prompt)[:1], "max_tokens": 0, "prompt_logprobs": 1})
    assert one["choices"][0]["prompt_logprobs"] == [None] and one["usage"]["completion_tokens"] == 0  # nothing to score
    for bad in ({"max_tokens": 0}, {"max_tokens": 0, "echo": True}):
        resp = client.post(COMPLETIONS, json={"model": MODEL, "prompt": prompt} | bad)
        assert resp.status_code == 400 and resp.get_json()["error"]["param"] == "max_tokens"


def test_an_engine_failure_in_a_stream_is_an_openai_error_event_and_a_log_line(caplog):
    """After the 200 a stream can only say it in an event: OpenAI's error shape, which its clients raise;
    the server's log names the reason."""
    from runtime.api.bodies import ResponseSpec, stream
    from runtime.generate.sampling import SamplingParams
    from runtime.generate.sequence import Delta, Failed, Job

    job = Job([1, 2, 3], 8, SamplingParams())
    job.put(Delta("partial", completion_tokens=1))
    job.put(Failed("engine error: the device stopped answering"))
    spec = ResponseSpec("tiny-e2b", lambda tid: b"x")
    with caplog.at_level("ERROR", logger="gemma4.api"):
        chunks = list(stream([job], [spec], 1, include_usage=False, continuous_usage=False))
    assert json.loads(chunks[0].removeprefix("data: "))["choices"][0]["text"] == "partial"
    error = json.loads(chunks[-1].removeprefix("data: "))["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "engine_error"
    assert "the device stopped answering" in error["message"] and "[DONE]" not in "".join(chunks)
    assert any(spec.id in r.getMessage() and "the device stopped answering" in r.getMessage() for r in caplog.records)
    assert job.cancelled  # its slots are freed


# -- a batch of prompts in /v1/completions ------------------------------------------------------------
BATCH = ["The sky is", "A cat", "One two three"]


def test_a_batch_of_prompts_answers_in_openai_order(client, engine):
    """Prompt i's choice j is index i * n + j; each answers its own prompt as if sent alone (greedy),
    and usage sums the batch."""
    kw = {"max_tokens": 3, "temperature": 0}
    reply = post(client, COMPLETIONS, {"prompt": BATCH, "n": 2} | kw)
    assert [c["index"] for c in reply["choices"]] == list(range(6))
    alone = [post(client, COMPLETIONS, {"prompt": p} | kw) for p in BATCH]
    assert texts(reply) == [t for one in alone for t in texts(one) * 2]
    assert reply["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone)
    assert reply["usage"]["completion_tokens"] == sum(2 * a["usage"]["completion_tokens"] for a in alone)
    streamed = events(client, COMPLETIONS, {"prompt": BATCH, "n": 2, "stream_options": {"include_usage": True}} | kw)
    assert streamed_texts(streamed, 6) == texts(reply)
    assert streamed[-1]["usage"] == reply["usage"]


def test_a_batch_of_token_prompts_with_echo_as_lm_eval_sends_it(client, engine):
    """lm-evaluation-harness at --batch_size 4: four token-id prompts, echo and logprobs; each choice
    echoes its own prompt and scores it as the prompt alone does."""
    batch = [prompt_ids(engine, t) for t in ("The capital of France", "Paris is", "Two plus two", "Hello")]
    kw = {"max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0, "seed": 1234}
    reply = post(client, COMPLETIONS, {"prompt": batch} | kw)
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2, 3]
    for tokens, choice in zip(batch, reply["choices"]):
        alone = post(client, COMPLETIONS, {"prompt": tokens} | kw)["choices"][0]
        assert choice["text"] == alone["text"] and choice["text"].startswith(engine.tokenizer.decode(tokens))
        assert choice["logprobs"]["token_logprobs"] == pytest.approx(alone["logprobs"]["token_logprobs"])


def test_a_batch_that_cannot_fit_is_refused_whole(client, engine):
    """One prompt of the batch too long: a 400 naming it, and nothing of the batch runs."""
    too_long = list(range(1, engine.geometry.kv_max + 1))
    resp = client.post(COMPLETIONS, json={"model": MODEL, "prompt": [[1, 2], too_long], "max_tokens": 1})
    assert resp.status_code == 400 and resp.get_json()["error"]["code"] == "context_length_exceeded"
    assert client.get("/ready").status_code == 200

"""The engine on real compiled artifacts: self-test, scheduling, slots, cancellation, sampling."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from contract.artifact import load_meta
from runtime.generate.engine import Engine, NotReady, QueueFull, State
from runtime.generate.sampling import SamplingParams
from runtime.generate.sequence import DoesNotFit, Failed, Finished, Job, token_budget
from runtime.settings import ServerSettings
from support.artifact_copies import with_eos, with_golden_step, with_wrong_golden
from support.engines import ready, running

GREEDY = SamplingParams(temperature=0)
PROMPTS = ("The capital of France is", "hello world", "Inferentia2 has two NeuronCores", "def fibonacci(n):")


@pytest.fixture(scope="module")
def b4(compiled):
    """A batch-4 engine (four KV slots), loaded and self-tested once for the module."""
    with ready(ServerSettings(artifact=compiled("tiny-e2b", "b4"), queue_max=8)) as engine:
        yield engine


def submit(engine: Engine, prompt: str | list[int], max_tokens: int = 12, sampling=GREEDY, **kw) -> Job:
    ids = engine.tokenizer(prompt).input_ids if isinstance(prompt, str) else list(prompt)
    return engine.submit(Job(ids, max_tokens, sampling, **kw))


def collect(job: Job) -> tuple[str, Finished]:
    parts = []
    for event in job.events():
        assert not isinstance(event, Failed), event.message
        if isinstance(event, Finished):
            return "".join(parts), event
        parts.append(event.text)
    raise AssertionError("no Finished event")


def run(engine: Engine, prompt, max_tokens: int = 12, sampling=GREEDY, **kw) -> tuple[str, Finished]:
    return collect(submit(engine, prompt, max_tokens, sampling, **kw))


def wait_idle(engine: Engine, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while engine.busy_slots:
        assert time.monotonic() < deadline, "slots still busy"
        time.sleep(0.01)


def test_greedy_output_is_the_golden_reference_continuation(b4):
    tok = b4.tokenizer
    eos = set(b4.model.meta.eos_token_ids)
    for golden in b4.model.meta.golden:
        expected = list(golden.tokens)  # float32: every step, no near-tie
        text, done = run(b4, list(golden.ids), max_tokens=len(expected))
        cut = next((i for i, t in enumerate(expected) if t in eos), None)
        assert text == tok.decode(expected[:cut], skip_special_tokens=True)
        assert done.reason == ("length" if cut is None else "stop")
        assert (done.prompt_tokens, done.completion_tokens) == (
            len(golden.ids),
            len(expected) if cut is None else cut + 1,
        )


def test_same_prompt_alone_after_others_and_beside_others(b4):
    alone = {p: run(b4, p, max_tokens=20)[0] for p in PROMPTS}
    for p in PROMPTS[1:]:  # other requests first, in slot 0 like the one that follows
        run(b4, p, max_tokens=20)
    assert run(b4, PROMPTS[0], max_tokens=20)[0] == alone[PROMPTS[0]]
    jobs = [submit(b4, p, max_tokens=20) for p in reversed(PROMPTS)]  # all four slots at once
    assert {p: collect(j)[0] for p, j in zip(reversed(PROMPTS), jobs)} == alone


def test_a_finished_request_frees_its_slot_for_the_queue_at_once(b4):
    lengths = [30, 30, 30, 2, 4, 4]  # six requests, four slots: the last two wait for the short one
    alone = [run(b4, PROMPTS[i % 4], max_tokens=n)[0] for i, n in enumerate(lengths)]
    jobs = [submit(b4, PROMPTS[i % 4], max_tokens=n) for i, n in enumerate(lengths)]
    finished_at: dict[int, float] = {}
    texts: dict[int, str] = {}

    def wait(i):
        texts[i] = collect(jobs[i])[0]
        finished_at[i] = time.perf_counter()

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [texts[i] for i in range(len(jobs))] == alone
    # Continuous batching: the queued short requests ran while the long ones were still decoding.
    assert max(finished_at[4], finished_at[5]) < min(finished_at[0], finished_at[1], finished_at[2])


def test_cancel_frees_the_slot(b4):
    job = submit(b4, PROMPTS[0], max_tokens=40)
    events = job.events()
    next(events)  # generation has started
    job.cancel()
    last = list(events)[-1]
    assert isinstance(last, Finished) and last.reason == "cancelled" and last.completion_tokens < 40
    wait_idle(b4)
    assert run(b4, PROMPTS[1], max_tokens=3)[1].reason == "length"  # and the engine carries on


def test_full_queue_refuses_and_the_rest_is_served(b4):
    accepted, refused = [], 0
    for _ in range(4 + 8 + 3):  # slots + queue + more, faster than any request can finish
        try:
            accepted.append(submit(b4, PROMPTS[0], max_tokens=40))
        except QueueFull as exc:
            refused += 1
            assert "retry" in str(exc)
    assert refused >= 3 and len(accepted) <= 12
    for job in accepted:
        job.cancel()
    assert all(isinstance(list(j.events())[-1], Finished) for j in accepted)
    wait_idle(b4)


def test_stop_string_and_finish_reasons(b4):
    text, done = run(b4, PROMPTS[0], max_tokens=12)
    assert done.reason == "length" and done.completion_tokens == 12 and len(text) > 6
    stop = text[3:6]
    stopped, done = run(b4, PROMPTS[0], max_tokens=12, stop=(stop,))
    assert done.reason == "stop" and stopped == text[: text.find(stop)]


def test_a_stop_string_matched_only_by_the_final_flush_finishes_with_stop(b4):
    """U+FFFD is released only by the flush at the end (an unfinished UTF-8 character): a stop
    string holding it cut the text but reported "length"."""
    hot = SamplingParams(temperature=1.0)
    for seed in range(80):
        prompt = [(seed * 7919 + j * 104729) % b4.geometry.vocab for j in range(5)]
        job = submit(b4, prompt, 20, hot, seed=seed)
        parts = [e.text for e in job.events() if not isinstance(e, Finished)]
        if len(parts) > 1 and "\ufffd" in parts[-1] and "\ufffd" not in "".join(parts[:-1]):
            break
    else:
        raise AssertionError("no sampled run ends in an unfinished character: the premise is gone")
    text = "".join(parts)
    stopped, done = run(b4, prompt, 20, hot, seed=seed, stop=("\ufffd",))
    assert stopped == text[: text.find("\ufffd")] and done.reason == "stop"


def test_same_seed_same_text_and_seeds_matter(b4):
    hot = SamplingParams(temperature=2.0, top_p=0.99, top_k=100)
    first = run(b4, PROMPTS[2], 10, hot, seed=1234)[0]
    assert run(b4, PROMPTS[2], 10, hot, seed=1234)[0] == first
    assert len({run(b4, PROMPTS[2], 10, hot, seed=s)[0] for s in range(5)}) > 1


def test_token_budget_never_truncates(b4):
    geo = b4.geometry  # buckets (16, 32), kv_max 64
    assert token_budget(geo, 10, 54) == 54
    assert token_budget(geo, 10, None) == 54
    assert token_budget(geo, 10, None, default=16) == 16
    assert token_budget(geo, 32, None, default=100) == 32
    assert token_budget(geo, 63, None) == 1  # longer than every bucket: prefilled in chunks
    with pytest.raises(
        DoesNotFit,
        match=r"64 tokens; the context of this model is 64 tokens, so a prompt may have "
        r"at most 63",
    ):
        token_budget(geo, 64, 1)
    with pytest.raises(DoesNotFit, match=r"prompt \(10 tokens\) \+ max_tokens \(55\) = 65 exceeds the context of 64"):
        token_budget(geo, 10, 55)


def test_wrong_golden_token_fails_the_self_test_for_good(compiled, tmp_path):
    folder = with_wrong_golden(compiled("tiny-e2b", "fp32"), tmp_path / "planted")
    with running(ServerSettings(artifact=folder)) as engine:
        assert engine.wait(300) is State.FAILED
        name = load_meta(folder).golden[0].name
        assert f"golden prompt {name!r}" in engine.reason and "step 0: the logits" in engine.reason
        with pytest.raises(NotReady, match="failed"):
            submit(engine, [2, 3, 4])


def planted_near_tie(src, dst):
    """A copy whose stored reference calls the device's own runner-up best, by 0.0005, at the golden
    step where the device's top two are closest: what a bf16 build meets by luck on a near-tie,
    which compile cannot see without a device."""
    from contract.greedy import softcap
    from runtime.model.loader import load_artifact

    model = load_artifact(src)
    golden, geo = model.meta.golden[0], model.meta.geometry
    _, raw = model.runner.greedy(list(golden.ids), len(golden.tokens))
    model.close()
    tops = [softcap(r.double(), geo.softcap).topk(8) for r in raw]
    step = min(range(len(tops)), key=lambda i: float(tops[i].values[0] - tops[i].values[1]))
    ids, values = tops[step].indices.tolist(), tops[step].values.tolist()
    mid = (values[0] + values[1]) / 2
    ids[0], ids[1] = ids[1], ids[0]
    return with_golden_step(src, dst, 0, step, ids, [mid + 0.0005, mid] + values[2:], ids[0])


def test_self_test_passes_a_near_tie_known_only_from_the_reference_gap(compiled, tmp_path):
    with running(ServerSettings(artifact=planted_near_tie(compiled("tiny-e2b", "bf16"), tmp_path / "tie"))) as engine:
        assert engine.wait(300) is State.READY, engine.reason


def test_float32_self_test_allows_no_such_near_tie(compiled, tmp_path):
    with running(ServerSettings(artifact=planted_near_tie(compiled("tiny-e2b", "fp32"), tmp_path / "tie"))) as engine:
        assert engine.wait(300) is State.FAILED
        assert "more than the float32 bound" in engine.reason


def test_an_eos_token_ends_the_request_with_stop(compiled, tmp_path):
    src = compiled("tiny-e2b", "fp32")
    golden = load_meta(src).golden[0]
    tokens = list(golden.tokens)
    step = next(i for i in range(1, len(tokens)) if tokens[i] not in tokens[:i])  # a token not seen before it
    with ready(ServerSettings(artifact=with_eos(src, tmp_path / "eos", tokens[step]))) as engine:
        text, done = run(engine, list(golden.ids), max_tokens=len(tokens))
        assert (done.reason, done.completion_tokens) == ("stop", step + 1)
        assert text == engine.tokenizer.decode(tokens[:step], skip_special_tokens=True)


# -- long prompts: chunks between decode steps, the slot states, prefix reuse --------------------


def _calls(engine: Engine):
    """Record every graph call of the engine's backend as (graph, slot states at the call)."""
    runner, seen = engine.model.runner, []

    def recorded(graph, call):
        def run(*args):
            seen.append(
                (graph, [s.state.value + (f" chunk {s.chunk}" if s.chunk < len(s.plan) else "") for s in runner.slots])
            )
            return call(*args)

        return run

    return seen, recorded


@pytest.fixture
def recorder(b4, monkeypatch):
    runner = b4.model.runner
    seen, recorded = _calls(b4)
    monkeypatch.setattr(runner.backend, "prefill", recorded("prefill", runner.backend.prefill))
    monkeypatch.setattr(runner.backend, "decode", recorded("decode", runner.backend.decode))
    return seen


def _reference(engine: Engine, ids: list[int], steps: int) -> str:
    from gemma4_port.verify.reference import load_reference, reference_greedy

    tokens = reference_greedy(load_reference(Path(engine.model.meta.checkpoint)), ids, steps)[0]
    eos = set(engine.model.meta.eos_token_ids)
    cut = next((i for i, t in enumerate(tokens) if t in eos), len(tokens))
    return engine.tokenizer.decode(tokens[:cut], skip_special_tokens=True)


def _random(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(8, 1024, (n,), generator=g)]


def test_a_prompt_longer_than_every_bucket_runs_in_chunks_between_decode_steps(b4, recorder):
    """A stream is decoding when a 56-token prompt (buckets 16, 32) arrives: its two chunks run one per
    step, a decode step between them, and its text is the float reference's."""
    wait_idle(b4)
    stream = submit(b4, PROMPTS[0], max_tokens=30)
    while not any(graph == "decode" for graph, _ in recorder):
        time.sleep(0.005)
    long = _random(56, 0)
    text, done = run(b4, long, max_tokens=6)
    collect(stream)
    assert done.prompt_tokens == 56 and text == _reference(b4, long, 6)
    prefills = [i for i, (graph, _) in enumerate(recorder) if graph == "prefill"]
    assert len(prefills) == 3  # the stream's prompt, then the long one's two chunks
    first, second = prefills[1:]
    assert recorder[first + 1][0] == "decode" and second > first + 1  # the stream decoded in between
    states = recorder[first][1]
    assert "prefilling chunk 0" in states and "decoding" in states  # the long prompt's first chunk, beside the stream
    assert "prefilling chunk 1" in recorder[second][1] and "decoding" in recorder[second][1]


def test_whole_prompt_prefill_runs_every_chunk_before_the_next_decode(compiled):
    with ready(ServerSettings(artifact=compiled("tiny-e2b", "b4"), prefill_chunks_per_step=0)) as engine:
        seen, recorded = _calls(engine)
        backend = engine.model.runner.backend
        backend.prefill, backend.decode = recorded("prefill", backend.prefill), recorded("decode", backend.decode)
        stream = submit(engine, PROMPTS[0], max_tokens=30)
        while not any(graph == "decode" for graph, _ in seen):
            time.sleep(0.005)
        collect(submit(engine, _random(56, 0), max_tokens=2))
        collect(stream)
    graphs = [graph for graph, _ in seen]
    first = graphs.index("prefill", graphs.index("decode"))
    assert graphs[first : first + 2] == ["prefill", "prefill"]  # both chunks at once: the stream waited


def test_a_finished_request_leaves_its_slot_retained_and_a_shared_prefix_is_reused(b4, recorder):
    """The second turn of a conversation keeps the first turn's KV: it prefills only its new tokens,
    into the slot that holds them, and says what the float reference says."""
    wait_idle(b4)
    first = _random(40, 1)
    run(b4, first, max_tokens=4)
    runner = b4.model.runner
    held = [s for s in runner.slots if s.state.value == "retained" and s.tokens[:40] == first]
    assert len(held) == 1 and len(held[0].tokens) == 43  # the prompt and three of the four reply tokens
    reused = b4.metrics.registry.get_sample_value("gemma4_prefix_tokens_reused_total")
    follow = held[0].tokens + _random(9, 2)  # the conversation so far, and the next user turn
    calls = len(recorder)
    text, _ = run(b4, follow, max_tokens=6)
    assert text == _reference(b4, follow, 6)
    gained = b4.metrics.registry.get_sample_value("gemma4_prefix_tokens_reused_total") - reused
    assert gained == 43
    prefills = [states for graph, states in recorder[calls:] if graph == "prefill"]
    assert len(prefills) == 1  # len(follow) - gained <= 16 tokens: one chunk
    assert b4.metrics.registry.get_sample_value("gemma4_prefix_hit_rate") > 0


def test_reuse_gives_what_no_reuse_gives_alone_and_beside_others(b4, compiled):
    base = _random(45, 3)
    prompts = [base + _random(5, 4), base + _random(12, 5), _random(50, 6)]
    with ready(ServerSettings(artifact=compiled("tiny-e2b", "b4"), prefix_reuse=False)) as plain:
        want = [run(plain, p, max_tokens=8)[0] for p in prompts]
    wait_idle(b4)
    run(b4, base, max_tokens=3)  # retained: the next two reuse it
    assert run(b4, prompts[0], max_tokens=8)[0] == want[0]  # alone
    jobs = [submit(b4, p, max_tokens=8) for p in (prompts[2], prompts[1])]  # beside an unrelated long prompt
    assert [collect(j)[0] for j in jobs] == [want[2], want[1]]


def _choices(job: Job, n: int) -> list[str]:
    """The text of each of a request's n choices, by index."""
    parts, done = [""] * n, set()
    for event in job.events(n):
        assert not isinstance(event, Failed), event.message
        if isinstance(event, Finished):
            done.add(event.index)
        else:
            parts[event.index] += event.text
    assert done == set(range(n))
    return parts


def _forks(engine: Engine) -> tuple[float, float]:
    get = engine.metrics.registry.get_sample_value
    return get("gemma4_forks_total"), get("gemma4_fork_tokens_saved_total")


def test_n_greedy_choices_prefill_once_and_say_what_the_reference_says(b4, recorder):
    wait_idle(b4)
    ids = _random(21, 7)
    forks, saved = _forks(b4)
    calls = len(recorder)
    texts = _choices(b4.submit(Job(ids, 8, GREEDY), 3), 3)
    assert texts == [_reference(b4, ids, 8)] * 3
    assert [graph for graph, _ in recorder[calls:]].count("prefill") == 1  # 21 tokens: one chunk, once
    assert _forks(b4) == (forks + 2, saved + 2 * 21)


def test_n_seeded_choices_differ_reproduce_and_are_what_their_seeds_give_alone(b4):
    """Choice i draws with seed + i from the same first logits: what a request of seed + i gives alone."""
    wait_idle(b4)
    sampled = SamplingParams(temperature=1.5)
    ids = _random(12, 8)
    first = _choices(b4.submit(Job(ids, 10, sampled, seed=40), 3), 3)
    assert len(set(first)) == 3
    assert _choices(b4.submit(Job(ids, 10, sampled, seed=40), 3), 3) == first
    assert [run(b4, ids, 10, sampled, seed=40 + i)[0] for i in range(3)] == first


def test_a_request_behind_choices_waiting_for_their_prompt_takes_a_free_slot_meanwhile(b4, recorder, monkeypatch):
    """n = 3 on a two-chunk prompt: while its first choice prefills, the other two wait for its KV and
    the request queued behind them prefills beside it in a free slot; the two then fork (copy graph,
    no prefill) and every text is the reference's."""
    wait_idle(b4)
    backend = b4.model.runner.backend
    gate, prefill, copies = threading.Event(), backend.prefill, []
    monkeypatch.setattr(backend, "prefill", lambda *args: (gate.wait(30), prefill(*args))[1])
    monkeypatch.setattr(
        backend, "copy", lambda keys, inputs, copy=backend.copy: (copies.append(keys), copy(keys, inputs))[1]
    )
    ids, other = _random(40, 12), _random(12, 13)  # 40 tokens: chunks of 32 and 8 (buckets 16, 32)
    forks, _ = _forks(b4)
    calls = len(recorder)
    job = b4.submit(Job(ids, 6, GREEDY), 3)
    behind = b4.submit(Job(other, 6, GREEDY))  # while the first choice's first chunk is held at the gate
    gate.set()
    assert _choices(job, 3) == [_reference(b4, ids, 6)] * 3 and collect(behind)[0] == _reference(b4, other, 6)
    prefills = [states for graph, states in recorder[calls:] if graph == "prefill"]
    assert (
        len(prefills) == 3
        and max(states.count("prefilling chunk 0") + states.count("prefilling chunk 1") for states in prefills) == 2
    )
    assert _forks(b4)[0] == forks + 2 and copies == [64, 64]  # 40 positions: the copy over 64 keys


def test_more_choices_than_slots_fork_when_a_slot_frees_or_prefill_past_the_ring(b4, recorder):
    """Six choices on four slots: the last two wait for a slot and fork a finished choice's retained
    KV (no prefill). With 40 tokens each the finished choices' sliding rings (40 positions, window 8)
    no longer hold what the prompt's end reads: the fifth prefills again; all say the reference."""
    wait_idle(b4)
    ids = _random(10, 9)
    forks, _ = _forks(b4)
    calls = len(recorder)
    assert _choices(b4.submit(Job(ids, 6, GREEDY), 6), 6) == [_reference(b4, ids, 6)] * 6
    assert [graph for graph, _ in recorder[calls:]].count("prefill") == 1 and _forks(b4)[0] == forks + 5
    calls = len(recorder)
    assert _choices(b4.submit(Job(ids, 40, GREEDY), 5), 5) == [_reference(b4, ids, 40)] * 5
    assert [graph for graph, _ in recorder[calls:]].count("prefill") == 2


def test_prompt_logprobs_are_the_references_log_softmax_at_every_prompt_position(b4, recorder):
    """Teacher forcing: a prompt whose logprobs are asked for prefills its first token only and is fed
    one decode step per token beside a running stream, which goes on undelayed by a prefill; every
    prompt token's logprob, rank and top ids are those of transformers' log_softmax of the softcapped
    reference logits (float32 artifact: within twice the logit bound), and the reply that follows is
    the one of a plain request."""
    from contract.logit_error import BOUNDS
    from gemma4_port.verify.reference import load_reference

    wait_idle(b4)
    ids = _random(40, 7)
    plain_text, _ = run(b4, ids, max_tokens=6)
    calls = len(recorder)
    stream = submit(b4, PROMPTS[0], max_tokens=45)
    while not any(graph == "decode" for graph, _ in recorder[calls:]):
        time.sleep(0.005)
    calls = len(recorder)
    job = submit(b4, ids, max_tokens=6, prompt_logprobs=3)
    events = list(job.events())
    collect(stream)
    [prompt] = [e.prompt_logprobs for e in events if getattr(e, "prompt_logprobs", ())]
    assert "".join(e.text for e in events if hasattr(e, "text")) == plain_text
    prefills = [states for graph, states in recorder[calls:] if graph == "prefill"]
    assert len(prefills) == 1  # the first token only; the other 39 came in decode steps beside the stream
    with torch.no_grad():
        reference = load_reference(Path(b4.model.meta.checkpoint))(input_ids=torch.tensor([ids])).logits[0]
    want = torch.log_softmax(reference.double(), -1)  # (S, V): position i scores token i + 1
    bound = 2 * BOUNDS["float32"].max_abs  # a log_softmax moves at most twice its logits' error
    assert [e.token for e in prompt] == ids[1:]
    for i, e in enumerate(prompt):
        row = want[i]
        assert abs(e.logprob - float(row[ids[i + 1]])) <= bound, i
        assert e.rank == 1 + int((row > row[ids[i + 1]]).sum())
        assert [t for t, _ in e.top] == row.topk(3).indices.tolist()
        assert max(abs(lp - float(row[t])) for t, lp in e.top) <= bound


def test_n_choices_on_one_slot_run_one_after_another_from_the_retained_prompt(compiled):
    """Batch 1: the choices wait for the one slot and decode on from the KV the previous one left
    there (no copy, no prefill), as long as its ring still holds the prompt's end."""
    with ready(ServerSettings(artifact=compiled("tiny-e2b", "fp32"))) as engine:
        seen, recorded = _calls(engine)
        engine.model.runner.backend.prefill = recorded("prefill", engine.model.runner.backend.prefill)
        ids = _random(14, 10)
        assert _choices(engine.submit(Job(ids, 6, GREEDY), 3), 3) == [_reference(engine, ids, 6)] * 3
        assert [graph for graph, _ in seen].count("prefill") == 1 and _forks(engine) == (2, 28)


def test_a_grammar_dead_end_finishes_the_choice_cleanly_and_says_why_in_the_log(b4, monkeypatch, caplog):
    """A grammar that allows no next token ends that choice with "stop" and a
    log line naming the reason; the request is not failed and the engine serves on."""
    import numpy as np

    from runtime.generate.grammar import Grammar, GrammarMatcher

    grammar = b4.grammars.get().compile(Grammar.regex("[a-z ]{40}"))
    mask, calls = GrammarMatcher.mask, []

    def mask_then_nothing(self, x):  # two tokens as the grammar allows them, then no token at all
        calls.append(1)
        return mask(self, x) if len(calls) <= 2 else np.copyto(x, np.float32(-np.inf))

    monkeypatch.setattr(GrammarMatcher, "mask", mask_then_nothing)
    with caplog.at_level("WARNING", logger="gemma4.engine"):
        text, done = run(b4, "hello world", 8, SamplingParams(temperature=1.0), seed=3, grammar=grammar)
    assert (done.reason, done.completion_tokens) == ("stop", 2)
    assert any("allows no token here" in r.getMessage() and "'stop'" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    assert run(b4, "hello world", 4)[1].reason in ("stop", "length")  # the engine serves on

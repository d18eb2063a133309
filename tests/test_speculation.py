"""Speculative decoding through the real engine, on the tiny artifact built with a random drafter (k 3,
4 slots, kv_max 64): greedy output with speculation is the plain output and transformers' greedy (the
artifact's golden continuations) token for token and logprob for logprob, at batch 1 and 4 beside
chunked prefills, with a grammar, with stop strings, at max_tokens and at the kv_max edge, after prefix
reuse and in n > 1 forks; the drafter and prompt lookup both; /metrics counts what was drafted and kept.
(That the sampled output keeps the target's distribution is tests/test_acceptance.py's.)"""

from __future__ import annotations

import pytest

from runtime.generate.engine import Engine
from runtime.generate.grammar import Grammar
from runtime.generate.logits import Controls
from runtime.generate.sampling import SamplingParams
from runtime.generate.sequence import Failed, Finished, Job
from runtime.generate.speculation import resolve
from runtime.settings import ServerSettings, SettingsError, SpeculativeSettings
from support.engines import ready

GREEDY = SamplingParams(temperature=0)
LOGPROBS = Controls(logprobs=0)  # each token's id and logprob come back


@pytest.fixture(scope="module")
def artifact(compiled):
    return compiled("tiny-e2b", "spec")


@pytest.fixture(scope="module")
def drafter(artifact):
    with ready(ServerSettings(artifact=artifact, queue_max=16)) as engine:
        assert engine._scheduler.speculator.method == "drafter"
        yield engine


@pytest.fixture(scope="module")
def lookup(artifact):
    with ready(ServerSettings(artifact=artifact, queue_max=16, speculative=SpeculativeSettings(method="lookup"))) as e:
        assert e._scheduler.speculator.method == "lookup"
        yield e


@pytest.fixture(params=["drafter", "lookup"])
def engine(request) -> Engine:
    return request.getfixturevalue(request.param)


def random_ids(n: int, seed: int) -> list[int]:
    return [(seed * 7919 + j * 104729) % 1000 + 10 for j in range(n)]


def collect(job: Job, choices: int = 1) -> list[tuple[list[tuple[int, float]], str, Finished]]:
    """Per choice: (token, logprob) pairs, text and the Finished event."""
    out: list = [([], "", None) for _ in range(choices)]
    for event in job.events(choices):
        assert not isinstance(event, Failed), event.message
        tokens, text, _ = out[event.index]
        if isinstance(event, Finished):
            out[event.index] = (tokens + [(lp.token, lp.logprob) for lp in event.logprobs], text, event)
        else:
            out[event.index] = (tokens + [(lp.token, lp.logprob) for lp in event.logprobs], text + event.text, None)
    return out


def submit(engine: Engine, ids: list[int], max_tokens: int, speculate: bool = True, choices: int = 1, **kw) -> Job:
    kw.setdefault("controls", LOGPROBS)
    kw.setdefault("sampling", GREEDY)
    return engine.submit(Job(list(ids), max_tokens, speculate=speculate, **kw), choices)


def run(engine: Engine, ids: list[int], max_tokens: int, speculate: bool = True, **kw):
    return collect(submit(engine, ids, max_tokens, speculate, **kw))[0]


def counted(engine: Engine) -> tuple[float, float]:
    """(proposed, accepted) drafted tokens so far."""
    get, method = engine.metrics.registry.get_sample_value, engine._scheduler.speculator.method
    labels = {"method": method}
    return (
        get("gemma4_spec_proposed_tokens_total", labels) or 0.0,
        get("gemma4_spec_accepted_tokens_total", labels) or 0.0,
    )


def same(a, b) -> None:
    """Two runs gave the same tokens, logprobs (to float32 rounding: a verify row and a decode row come
    from different graphs), text and ending."""
    assert [t for t, _ in a[0]] == [t for t, _ in b[0]]
    assert [lp for _, lp in a[0]] == pytest.approx([lp for _, lp in b[0]], abs=1e-4)
    assert (a[1], a[2].reason, a[2].completion_tokens) == (b[1], b[2].reason, b[2].completion_tokens)


def test_greedy_is_the_reference_and_the_plain_output_at_batch_1_and_4(engine):
    eos = set(engine.model.meta.eos_token_ids)
    before = counted(engine)
    for golden in engine.model.meta.golden:
        expected = list(golden.tokens)
        cut = next((i + 1 for i, t in enumerate(expected) if t in eos), len(expected))
        got = run(engine, list(golden.ids), len(expected))
        assert [t for t, _ in got[0]] == expected[:cut]  # transformers' greedy of the target alone
        same(got, run(engine, list(golden.ids), len(expected), speculate=False))
    # Batch 4 and a queue: six or seven requests, one of them a 50-token prompt prefilled in two chunks
    # while the others take speculative steps. (The random drafter's drafts are all rejected, and on the
    # CPU a drafter step costs about a decode step: fewer tokens for it.)
    short = engine._scheduler.speculator.method == "drafter"
    extra = (5, 50, 20) if short else (5, 12, 50, 20)
    prompts = [list(g.ids) for g in engine.model.meta.golden] + [random_ids(n, n) for n in extra]
    budgets = [min(10 if short else 24, engine.geometry.kv_max - len(p)) for p in prompts]
    plain = [run(engine, p, n, speculate=False) for p, n in zip(prompts, budgets, strict=True)]
    jobs = [submit(engine, p, n) for p, n in zip(prompts, budgets, strict=True)]
    for job, want in zip(jobs, plain, strict=True):
        same(collect(job)[0], want)
    proposed, accepted = counted(engine)
    assert proposed > before[0] and accepted <= proposed
    if engine._scheduler.speculator.method == "lookup":  # a random model repeats itself: drafts are kept
        assert accepted > before[1]


def test_a_request_can_turn_it_off(lookup):
    ids = random_ids(9, 3)
    before = counted(lookup)
    run(lookup, ids, 30, speculate=False)
    assert counted(lookup) == before
    run(lookup, ids, 30)
    assert counted(lookup)[0] > before[0]


def test_stop_strings_max_tokens_and_the_kv_max_edge(lookup):
    ids = random_ids(8, 5)
    full = run(lookup, ids, 40, speculate=False)
    text = full[1]
    assert len(text) > 12
    for stop in (text[4:7], text[-5:-2]):
        same(run(lookup, ids, 40, stop=(stop,)), run(lookup, ids, 40, speculate=False, stop=(stop,)))
    for n in range(1, 6):  # never more than max_tokens, whatever a step keeps
        got = run(lookup, ids, n)
        assert got[2].completion_tokens == n and [t for t, _ in got[0]] == [t for t, _ in full[0][:n]]
    kv_max = lookup.geometry.kv_max
    for length in (30, kv_max - 5, kv_max - 2):  # the last new token lands at position kv_max - 1
        prompt = random_ids(length, length)
        got = run(lookup, prompt, kv_max - length)
        same(got, run(lookup, prompt, kv_max - length, speculate=False))
        assert got[2].completion_tokens == kv_max - length or got[2].reason == "stop"


def test_a_grammar_constrains_each_checked_position(engine):
    grammar = engine.grammars.get().compile(Grammar.regex("[a-z]{3,12}( [a-z]{2,8}){0,4}"))
    n = 12 if engine._scheduler.speculator.method == "drafter" else 30
    for seed in (1, 2):
        ids = random_ids(10, seed)
        got = run(engine, ids, n, grammar=grammar)
        same(got, run(engine, ids, n, speculate=False, grammar=grammar))
        assert got[1].replace(" ", "").isalpha()


def test_prefix_reuse_and_forks(lookup):
    get = lookup.metrics.registry.get_sample_value
    base = random_ids(24, 9)
    run(lookup, base, 6)  # retained: the next one reuses its prefix
    reused = get("gemma4_prefix_tokens_reused_total")
    longer = base + random_ids(6, 10)
    same(run(lookup, longer, 16), run(lookup, longer, 16, speculate=False, controls=LOGPROBS))
    assert get("gemma4_prefix_tokens_reused_total") > reused
    ids = random_ids(11, 11)
    want = run(lookup, ids, 20, speculate=False)
    for choice in collect(submit(lookup, ids, 20, choices=3), 3):
        same(choice, want)


def test_seeded_sampling_with_prompt_lookup_draws_what_it_draws_without(lookup):
    """A point-mass draft is checked by the plain step's own draw: the same tokens, choice by choice."""
    hot = SamplingParams(temperature=1.0, top_k=50)
    ids = random_ids(7, 12)
    got = collect(submit(lookup, ids, 30, sampling=hot, seed=5, choices=2), 2)
    want = collect(submit(lookup, ids, 30, speculate=False, sampling=hot, seed=5, choices=2), 2)
    for a, b in zip(got, want, strict=True):
        same(a, b)


def test_the_drafter_in_seeded_sampling_and_in_forks(drafter):
    """The rejection rule draws its own uniforms: a seeded request repeats itself (speculating at the same
    steps), not the plain output."""
    hot = SamplingParams(temperature=1.0, top_k=50)
    ids = random_ids(7, 12)
    first, again = (run(drafter, ids, 10, sampling=hot, seed=5) for _ in range(2))
    same(first, again)
    assert first[2].completion_tokens <= 10 and len(first[0]) == first[2].completion_tokens
    want = run(drafter, ids, 8, speculate=False)  # forks draft from the prompt's kept hidden state
    for choice in collect(submit(drafter, ids, 8, choices=2), 2):
        same(choice, want)


def test_a_fork_of_part_of_a_slot_drafts_at_its_first_step(drafter):
    """Six greedy choices on four slots: the last two fork slots that went on past the prompt (their
    choices done), from the prompt's kept logits and hidden state. Every choice is the plain output,
    and each drafts exactly what a lone request drafts, the first step included."""
    ids = random_ids(13, 14)
    want = run(drafter, ids, 8, speculate=False)
    before = counted(drafter)[0]
    same(run(drafter, ids, 8), want)
    alone = counted(drafter)[0] - before
    forks = drafter.metrics.registry.get_sample_value("gemma4_forks_total") or 0.0
    for choice in collect(submit(drafter, ids, 8, choices=6), 6):
        same(choice, want)
    assert alone > 0 and counted(drafter)[0] - before - alone == 6 * alone
    assert drafter.metrics.registry.get_sample_value("gemma4_forks_total") - forks == 5


def test_the_method_follows_the_settings_and_the_artifact():
    s = SpeculativeSettings
    assert resolve(s(), verify_max=4, draft_k=3) == ("drafter", 3)
    assert resolve(s(), verify_max=4, draft_k=None) == ("lookup", 3)  # lookup's 4 capped by the graphs
    assert resolve(s(k=2), verify_max=4, draft_k=3) == ("drafter", 2)
    assert resolve(s(method="lookup"), verify_max=6, draft_k=3) == ("lookup", 4)
    assert resolve(s(), verify_max=0, draft_k=None) == (None, 0)  # no verify graphs: plain decoding
    assert resolve(s(method="off"), verify_max=4, draft_k=3) == (None, 0)
    for settings, verify_max, draft_k, match in [
        (s(method="drafter"), 4, None, "no drafter"),
        (s(method="lookup"), 0, None, "no verify graphs"),
        (s(k=5), 4, 3, "at most 3"),
    ]:
        with pytest.raises(SettingsError, match=match):
            resolve(settings, verify_max, draft_k)

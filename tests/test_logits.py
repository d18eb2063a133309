"""runtime.generate.logits: penalties, bias, min_tokens and the grammar mask against dense references (a
masked token's probability exactly zero at the real vocabulary), and logprobs against torch's
log_softmax of the softcapped row."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from contract.greedy import softcap
from runtime.generate.grammar import GrammarDeadEnd
from runtime.generate.logits import Controls, TokenChooser, capped_row
from runtime.generate.logprobs import logprobs, prompt_logprob
from runtime.generate.sampling import SamplingParams, distribution, sample
from support import rows as real

V, CAP = 4096, 30.0
EOS = (1, 5)
GREEDY = SamplingParams(temperature=0.0)


def rows(n: int, seed: int = 0, dtype=torch.float32) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(V, generator=gen) * 12).to(dtype) for _ in range(n)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logprobs_are_log_softmax_of_the_softcapped_row(dtype):
    for row in rows(5, dtype=dtype):
        want = torch.log_softmax(softcap(row.float(), CAP).double(), -1)
        got = logprobs(row, 7, 5, CAP)
        assert got.token == 7 and got.logprob == pytest.approx(float(want[7]), abs=1e-4)
        ids = [i for i, _ in got.top]
        # The 5 best, best first; ties (bf16 has many) may come in either order and either may be cut.
        best = torch.topk(want, 5).values
        assert len(set(ids)) == 5 and want[ids].tolist() == best.tolist()
        assert set(torch.nonzero(want > best[-1]).flatten().tolist()) <= set(ids)
        assert [lp for _, lp in got.top] == pytest.approx(want[ids].tolist(), abs=1e-4)
    assert logprobs(row, 7, 0, CAP).top == ()
    for token, lp in logprobs(row, 7, 5, CAP).top:  # a token among the best has exactly its listed logprob
        assert logprobs(row, token, 5, CAP).logprob == lp


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prompt_tokens_logprob_carries_its_rank(dtype):
    for row in rows(3, seed=1, dtype=dtype):
        want = torch.log_softmax(softcap(row.float(), CAP).double(), -1)
        for token in (int(want.argmax()), 7, int(want.argmin())):
            got, plain = prompt_logprob(row, token, 2, CAP), logprobs(row, token, 2, CAP)
            assert (got.token, got.logprob, got.top) == (token, plain.logprob, plain.top)
            # 1 + the ids likelier than it under log_softmax(softcap): ties (bf16 has many) share a rank
            assert got.rank == 1 + int((want > want[token]).sum())
    assert prompt_logprob(row, int(row.float().argmax()), 0, CAP).rank == 1


def test_capped_row_is_the_softcap_and_leaves_the_input_alone():
    row = rows(1)[0]
    before = row.clone()
    assert np.allclose(capped_row(row, CAP), softcap(row, CAP).numpy(), atol=1e-4)
    capped_row(row, None)[:] = 0
    assert torch.equal(row, before)


def dense_reference(row: torch.Tensor, c: Controls, prompt: list[int], out: list[int]) -> torch.Tensor:
    """The same processing written densely over the whole vocabulary (and HF's repetition processor)."""
    x = softcap(row.float(), CAP).clone()
    if c.repetition_penalty != 1.0:
        ids = torch.tensor([prompt + out])
        x = RepetitionPenaltyLogitsProcessor(c.repetition_penalty)(ids, x[None])[0]
    counts = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=V).float() if out else torch.zeros(V)
    x = x - c.frequency_penalty * counts - c.presence_penalty * (counts > 0).float()
    for i, b in c.logit_bias:
        x[i] += b
    return x


@pytest.mark.parametrize(
    "controls",
    [
        Controls(frequency_penalty=1.5),
        Controls(presence_penalty=2.0, frequency_penalty=-0.5),
        Controls(repetition_penalty=1.8),
        Controls(repetition_penalty=1.3, presence_penalty=0.5, logit_bias=((3, 5.0), (9, -100.0))),
    ],
)
def test_penalised_greedy_picks_the_dense_reference_argmax(controls):
    prompt = [11, 12, 13, 12]
    chooser, out = TokenChooser(controls, prompt, EOS), []
    gen = torch.Generator()
    for row in rows(30, seed=1):
        # Make repeats likely: the previous tokens get a lift the penalties must fight.
        for t in out[-3:]:
            row[t] += 20
        want = int(dense_reference(row, controls, prompt, out).argmax())
        token, _ = chooser.choose(row, GREEDY, CAP, gen)
        assert token == want
        out.append(token)
    assert len(set(out)) > 1


def test_no_controls_is_plain_sampling():
    params = SamplingParams(temperature=0.9, top_p=0.9, top_k=40)
    a, b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    chooser = TokenChooser(Controls(), [1, 2], EOS)
    for row in rows(10):
        assert chooser.choose(row, params, CAP, a)[0] == sample(row, params, CAP, b)


def test_bias_forces_and_bans_and_min_tokens_hold_back_eos():
    row = rows(1)[0]
    row[EOS[0]] = 100.0  # the model wants to stop at once
    gen = torch.Generator().manual_seed(0)
    chooser = TokenChooser(Controls(min_tokens=3, stop_token_ids=(42,), logit_bias=((42, 1000.0),)), [2], EOS)
    tokens = [chooser.choose(row, SamplingParams(temperature=1.0), CAP, gen)[0] for _ in range(4)]
    assert EOS[0] not in tokens[:3] and 42 not in tokens[:3] and tokens[3] == 42
    assert chooser.ends_generation(42) and chooser.ends_generation(EOS[1])
    assert not TokenChooser(Controls(ignore_eos=True), [2], EOS).ends_generation(EOS[0])
    assert TokenChooser(Controls(ignore_eos=True, stop_token_ids=(42,)), [2], EOS).ends_generation(42)


def test_logprobs_come_with_the_token_and_ignore_the_shaping():
    row = rows(1)[0]
    chooser = TokenChooser(Controls(logprobs=3, logit_bias=((77, 1000.0),)), [2], EOS)
    token, lp = chooser.choose(row, GREEDY, CAP, torch.Generator())
    assert token == 77 and lp.token == 77
    assert lp.logprob == pytest.approx(logprobs(row, 77, 3, CAP).logprob) and len(lp.top) == 3
    assert lp.top[0][0] == int(row.argmax())  # the model's distribution, not the biased one


# -- the grammar mask at the real vocabulary -----------------------------------------------------------
class FixedMask:
    """A grammar matcher's interface (GrammarMatcher: mask, accept, finished) allowing a fixed set of ids:
    llguidance takes seconds to read a 262,144-token vocabulary, and the mask is applied the same way."""

    finished = False

    def __init__(self, allowed: np.ndarray, vocab: int = real.V):
        self.forbidden = np.ones(vocab, dtype=bool)
        self.forbidden[allowed] = False

    def mask(self, x: np.ndarray) -> np.ndarray:
        np.copyto(x, np.float32(-np.inf), where=self.forbidden)
        return x

    def accept(self, token: int) -> None:
        assert not self.forbidden[token], f"a forbidden token was chosen: {token}"


MASKED_PARAMS = [
    SamplingParams(temperature=t, top_p=p, top_k=k, min_p=m)
    for t in (0.3, 1.0, 2.0)
    for p in (1.0, 0.9)
    for k in (0, 50)
    for m in (0.0, 0.05)
]


def masked_case(seed: int) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """A real-vocabulary row whose best tokens are all forbidden and whose few allowed ids lie far below
    them (the grammar wants what the model finds unlikely: the worst case for a mask that leaks). The
    row, the allowed ids and the best (forbidden) ones."""
    row = real.peaky(seed)
    best = torch.topk(row, 64).indices.numpy()
    allowed = np.setdiff1d(np.random.default_rng(seed).choice(real.V, 12, replace=False), best)
    row[allowed] -= 25.0
    return row, allowed, best


def masked_chooser(controls: Controls, allowed: np.ndarray, best: np.ndarray) -> tuple[FixedMask, TokenChooser]:
    matcher = FixedMask(allowed)
    chooser = TokenChooser(controls, [int(best[0]), int(allowed[0])], EOS, matcher)  # type: ignore[arg-type]
    chooser.counts = {int(best[1]): 3, int(allowed[1]): 1}  # generated before: the penalties act on both
    return matcher, chooser


def masked_controls(best: np.ndarray) -> list[Controls]:
    return [
        Controls(),
        Controls(presence_penalty=-2.0, frequency_penalty=-2.0, repetition_penalty=0.5),  # repeats lifted
        Controls(logit_bias=((int(best[2]), 100.0),), min_tokens=5),
    ]


def test_a_masked_token_has_probability_exactly_zero_under_every_sampling_control():
    for seed in range(2):
        row, allowed, best = masked_case(seed)
        for controls in masked_controls(best):
            matcher, chooser = masked_chooser(controls, allowed, best)
            x = chooser.allowed_row(row, CAP)
            for params in MASKED_PARAMS:
                weights, ids = distribution(x.copy(), params, None)
                ids = np.arange(real.V) if ids is None else ids
                assert weights.sum() > 0, params
                assert not weights[matcher.forbidden[ids]].any(), (seed, controls, params)


def test_sampling_under_a_mask_never_draws_a_forbidden_token_over_many_seeds():
    chosen = set()
    for seed in range(48):
        row, allowed, best = masked_case(seed)
        matcher, chooser = masked_chooser(masked_controls(best)[seed % 3], allowed, best)
        token, _ = chooser.choose(
            row, MASKED_PARAMS[seed % len(MASKED_PARAMS)], CAP, torch.Generator().manual_seed(seed)
        )
        assert not matcher.forbidden[token]  # FixedMask.accept checked it too
        chosen.add(token)
    assert len(chosen) > 16  # sampled among each row's allowed ids, not one fallback token


def test_a_grammar_that_allows_nothing_is_a_dead_end_not_a_draw():
    row = rows(1)[0]
    chooser = TokenChooser(Controls(), [2], EOS, FixedMask(np.array([], dtype=np.int64), V))  # type: ignore[arg-type]
    with pytest.raises(GrammarDeadEnd, match="allows no token"):
        chooser.choose(row, SamplingParams(temperature=1.0), CAP, torch.Generator())

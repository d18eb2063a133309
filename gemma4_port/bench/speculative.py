"""Speculative decoding measured with transformers alone, on the trained tiny-chat pair: greedy
`generate` of the target, with its drafter (`assistant_model`) and with prompt lookup
(`prompt_lookup_num_tokens`), side by side on held-out prompts: chat (tiny_corpus.held_out) and
code edits of standard-library files the model never saw (their answers repeat the request's code).

Per method: tokens per target step (new tokens / target forward passes, the prefill's included),
acceptance (accepted drafted tokens / proposed ones; a target pass over n + 1 tokens checks n
proposals, and each pass emits one token of its own besides those it accepts), tok/s and the gaps
between streamed chunks, and whether every output equals the target's own greedy one. Counting is
read from the target's calls (a forward pre-hook sees each pass's input length), not from
transformers' internals."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gemma4_port.bench.stats import ratio, summary
from gemma4_port.source import tiny_corpus
from gemma4_port.source.train_tiny import TinyChatSpec


@dataclass
class Generation:
    tokens: list[int]  # the new tokens
    passes: list[int] = field(default_factory=list)  # input length of each target forward pass
    stamps: list[float] = field(default_factory=list)  # seconds from the call to each streamed chunk
    wall_s: float = 0.0

    @property
    def proposed(self) -> int:
        return sum(n - 1 for n in self.passes[1:])  # the first pass is the prefill

    @property
    def accepted(self) -> int:
        return len(self.tokens) - len(self.passes)


def _clock():
    from transformers.generation.streamers import BaseStreamer

    class Clock(BaseStreamer):
        """Timestamps each push from generate() after the prompt's."""

        def __init__(self, start: float):
            self.start, self.stamps, self.prompt_seen = start, [], False

        def put(self, value):
            if self.prompt_seen:
                self.stamps.append(time.perf_counter() - self.start)
            self.prompt_seen = True

        def end(self):
            pass

    return Clock


@torch.no_grad()
def generate(target, ids: list[int], max_new_tokens: int, **speculation) -> Generation:
    """One greedy generate call, counted: `speculation` is `assistant_model=...` or
    `prompt_lookup_num_tokens=...`, or nothing for the target alone."""
    passes: list[int] = []
    hook = target.register_forward_pre_hook(
        lambda _m, _a, kwargs: passes.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    start = time.perf_counter()
    clock = _clock()(start)
    try:
        out = target.generate(
            torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False, streamer=clock, **speculation
        )
    finally:
        hook.remove()
    wall = time.perf_counter() - start
    return Generation(out[0, len(ids) :].tolist(), passes, clock.stamps, wall)


def _until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


@dataclass(frozen=True)
class Workload:
    name: str
    conversations: tuple[tiny_corpus.Conversation, ...]
    prompts: tuple[tuple[int, ...], ...]  # each conversation's prompt, tokenized as the server does
    max_new_tokens: int

    def bodies(self) -> list[dict]:
        """The same prompts as OpenAI chat requests, for the server."""
        return [
            {"messages": c.prompt(), "max_tokens": self.max_new_tokens} | ({"tools": list(c.tools)} if c.tools else {})
            for c in self.conversations
        ]


def workloads(tok, spec: TinyChatSpec, chats: int, edits: int, new_tokens: tuple[int, int]) -> tuple[Workload, ...]:
    """Held-out chat prompts and held-out code-edit prompts, tokenized as the server would."""
    training = tiny_corpus.conversations(spec.seed, spec.conversations)
    chat = tiny_corpus.held_out(spec.held_out_seed, chats, training, tok)
    edit = tiny_corpus.edits(spec.held_out_seed, edits, tiny_corpus.HELD_OUT_STDLIB)

    def work(name, convs, n):
        ids = (tuple(tok(tiny_corpus.render_prompt(tok, c), add_special_tokens=False)["input_ids"]) for c in convs)
        return Workload(name, tuple(convs), tuple(ids), n)

    return work("chat", chat, new_tokens[0]), work("code edit", edit, new_tokens[1])


def measure_method(target, work: Workload, eos: set[int], greedy: list[list[int]] | None, **speculation) -> dict:
    runs = [generate(target, list(p), work.max_new_tokens, **speculation) for p in work.prompts]
    outputs = [_until_eos(r.tokens, eos) for r in runs]
    tokens = sum(len(r.tokens) for r in runs)
    passes = sum(len(r.passes) for r in runs)
    proposed, accepted = sum(r.proposed for r in runs), sum(r.accepted for r in runs)
    # Decode: from the first new token on (the prefill is the same work for every method).
    decode_s = sum(r.stamps[-1] - r.stamps[0] for r in runs if len(r.stamps) > 1)
    decode_tokens = sum(len(r.tokens) - 1 for r in runs if len(r.stamps) > 1)
    gaps = [b - a for r in runs for a, b in zip(r.stamps, r.stamps[1:], strict=False)]
    return {
        "prompts": len(runs),
        "new_tokens": tokens,
        "target_passes": passes,
        "tokens_per_target_step": ratio(tokens, passes),
        "proposed": proposed,
        "accepted": accepted,
        "acceptance": ratio(accepted, proposed),
        "tok_s": ratio(tokens, sum(r.wall_s for r in runs)),
        "decode_tok_s": ratio(decode_tokens, decode_s),
        "ms_per_token": 1e3 * ratio(decode_s, decode_tokens),
        "chunk_gap_ms": summary(gaps, 1e3),
        "equals_greedy": None if greedy is None else outputs == greedy,
        "outputs": outputs,
    }


def load_pair(folder: Path, k: int):
    """The target (transformers' float reference loader, float32) and its drafter, drafting k."""
    from transformers import Gemma4AssistantForCausalLM

    from gemma4_port.verify.reference import load_reference

    target = load_reference(folder / "target")
    drafter = Gemma4AssistantForCausalLM.from_pretrained(str(folder / "drafter"), dtype=torch.float32).eval()
    drafter.generation_config.num_assistant_tokens = k
    return target, drafter


def measure(folder: Path, k: int, works: tuple[Workload, ...]) -> dict:
    """Every workload with the target alone, with the drafter and with prompt lookup, each drafting k."""
    from contract.tokenizer import load_tokenizer

    target, drafter = load_pair(folder, k)
    tok = load_tokenizer(folder / "target")
    eos = set(target.generation_config.eos_token_id or [])
    out: dict = {"k": k, "workloads": {}}
    for work in works:
        plain = measure_method(target, work, eos, None)
        rows = {"target alone": plain}
        rows["drafter"] = measure_method(target, work, eos, plain["outputs"], assistant_model=drafter)
        rows["prompt lookup"] = measure_method(target, work, eos, plain["outputs"], prompt_lookup_num_tokens=k)
        for row in rows.values():
            row["sample"] = tok.decode(row.pop("outputs")[0])
        out["workloads"][work.name] = rows
    return out

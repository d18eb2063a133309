"""The server's paths through a Runner that a one-prompt greedy run does not take: a second turn that reuses
the first one's KV, slots prefilled and decoded together, and a fork into another slot."""

from __future__ import annotations

import torch

from contract.greedy import argmax
from gemma4_port.verify.agreement import Case


def run_continuation(runner, first: list[int], replies: int, follow: list[int], steps: int):
    """A second turn that reuses the first turn's KV: the first prompt and its greedy reply, then a
    prompt of both plus `follow`, prefilled only past the positions the slot still holds."""
    reply, _ = runner.greedy(first, replies)
    ids = first + reply + follow
    reused = runner.reusable(0, ids)
    return Case("turns:reuse-prefix", ids, steps, reused=reused), runner.greedy(ids, steps, reused=reused)


def run_slots_together(runner, cases: list[Case]) -> list[tuple[list[int], list[torch.Tensor]]]:
    """Prompts admitted into different slots one step apart, prefilled one chunk per step (round-robin
    over the slots still prefilling) while the slots already decoding decode together: long prompts
    are at different chunk stages at once, as the server runs them."""
    out = [([], []) for _ in cases]
    waiting = list(range(len(cases)))  # slots not yet admitted, then prefilling
    live: dict[int, torch.Tensor] = {}
    step = 0
    while waiting or live:
        if step < len(cases):
            runner.start(step, cases[step].ids)
        prefilling = [slot for slot in waiting if slot <= step]
        if prefilling:
            slot = prefilling[step % len(prefilling)]
            logits = runner.prefill_step(slot)
            if logits is not None:
                waiting.remove(slot)
                live[slot] = logits
        for slot, logits in list(live.items()):
            toks, seen = out[slot]
            toks.append(argmax(logits))
            seen.append(logits.float())
            if len(toks) == cases[slot].steps:
                del live[slot]
                runner.free(slot)
        if live:
            live.update(runner.decode({slot: out[slot][0][-1] for slot in live}))
        step += 1
    return out


def run_fork(runner, case: Case) -> tuple[list[int], list[torch.Tensor]]:
    """A prompt prefilled in the first slot and continued in the last, which forks it (the copy graph
    over the smallest key bucket holding it); the source is freed first, so it decodes alone."""
    target = len(runner.slots) - 1
    logits = runner.prefill_prompt(0, case.ids)
    runner.fork(0, target)
    runner.free(0)
    return runner.greedy_on(target, logits, case.steps)

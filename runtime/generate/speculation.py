"""The speculative part of a step (engine thread only): which decoding slots draft, and how many tokens.

Decode on inf2 reads every weight once per step whether it checks one token or five, so a step that
checks a drafted continuation of k tokens and keeps the right ones generates up to k + 1 tokens for
the price of one. The method is the server's (ServerSettings.speculative): the artifact's drafter, or
prompt lookup. Per slot, at each step: a choice that may speculate (its request did not turn it off,
its prompt is in, there is room before max_tokens and kv_max) drafts up to k tokens; the others feed
their one next token in the same verify pass. A step where no slot has a draft is a plain decode step."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Literal

from runtime.generate.acceptance import Draft
from runtime.generate.drafts import DrafterDraft, lookup_draft, room
from runtime.generate.sequence import Running
from runtime.model.runner import ModelRunner
from runtime.model.slots import Slot
from runtime.settings import SettingsError, SpeculativeSettings

Method = Literal["drafter", "lookup"]
LOOKUP_K = 4  # prompt lookup's drafts per step unless GEMMA4_SPEC_K says otherwise


def resolve(settings: SpeculativeSettings, verify_max: int, draft_k: int | None) -> tuple[Method | None, int]:
    """The method a server runs and its k, from its settings and the artifact: the tokens its verify
    graphs take per slot (k + 1; 0: none) and its drafter's k (None: no drafter)."""
    if settings.method == "off" or verify_max < 2:
        if settings.method in ("drafter", "lookup"):
            raise SettingsError(
                f"GEMMA4_SPEC_METHOD={settings.method}, but this artifact has no verify graphs (build it "
                "from a manifest with `speculative:`); use auto or off"
            )
        return None, 0
    if settings.method == "drafter" and draft_k is None:
        raise SettingsError(
            "GEMMA4_SPEC_METHOD=drafter, but this artifact has no drafter (its manifest's `speculative:` "
            "names none); use auto or lookup"
        )
    most = verify_max - 1
    if settings.k is not None and settings.k > most:
        raise SettingsError(f"GEMMA4_SPEC_K={settings.k}, but this artifact verifies at most {most} drafted tokens")
    if settings.method == "lookup" or draft_k is None:
        return "lookup", settings.k or min(LOOKUP_K, most)
    return "drafter", settings.k or min(draft_k, most)


class Speculator:
    def __init__(self, settings: SpeculativeSettings, runner: ModelRunner):
        self.method, self.k = resolve(settings, runner.verify_max, runner.draft_k)
        self.settings = settings
        self.runner = runner

    def budget(self, slot: Slot) -> int:
        """Drafted tokens the slot's choice may verify at this step."""
        live: Running = slot.request
        job = live.job
        if self.method is None or not job.speculate or live.fed < len(job.prompt):
            return 0
        if self.method == "drafter" and slot.hidden is None:  # forked with no hidden state: one plain step first
            return 0
        return room(self.k, live.generated, job.max_tokens, slot.position, self.runner.geo.kv_max)

    def drafts(
        self,
        slots: list[Slot],
        alone: Callable[[Running], contextlib.AbstractContextManager],
        device: Callable[..., Any],
    ) -> dict[int, Draft]:
        """Each decoding slot's draft this step (none: a slot that does not speculate, or found nothing
        to draft); `alone(live)` runs one choice's own work so that its failure is its alone, `device(call,
        *args)` a runner call (timed for the liveness check)."""
        budgets = {s.index: n for s in slots if (n := self.budget(s))}
        if self.method == "lookup":
            out = {}
            for slot, n in budgets.items():
                live: Running = self.runner.slots[slot].request
                assert live.context is not None  # kept for every choice that may speculate
                with alone(live):
                    s = self.settings
                    draft = lookup_draft(live.context, n, s.lookup_min, s.lookup_max, live.chooser)
                    if draft.tokens:
                        out[slot] = draft
            return out
        return self._drafter(budgets, alone, device) if budgets else {}

    def _drafter(
        self,
        budgets: dict[int, int],
        alone: Callable[[Running], contextlib.AbstractContextManager],
        device: Callable[..., Any],
    ) -> dict[int, Draft]:
        """Drafter steps for every slot that drafts, batched: a token per slot per step, each drawn as the
        request's own processing of the drafter's row would draw it, inside the chooser's trial (taken
        back at the end: the verify step commits what it keeps)."""
        slots = self.runner.slots
        lives: dict[int, Running] = {slot: slots[slot].request for slot in budgets}
        drafting = {
            slot: DrafterDraft(live.chooser, live.job.sampling, None, live.generator)  # the drafter has no softcap
            for slot, live in lives.items()
        }
        for live in lives.values():
            live.chooser.begin_trial()
        try:
            feed = {slot: live.last for slot, live in lives.items()}
            while feed:
                rows = device(self.runner.draft, feed)
                feed = {}
                for slot, row in rows.items():
                    d = drafting[slot]
                    with alone(lives[slot]):
                        d.step(row)
                    if slots[slot].request is lives[slot] and not d.done and len(d.tokens) < budgets[slot]:
                        feed[slot] = d.tokens[-1]
        finally:
            for slot, live in lives.items():
                if slots[slot].request is live:  # a choice that failed meanwhile has left its slot
                    with alone(live):
                        live.chooser.end_trial()
        return {slot: d.draft() for slot, d in drafting.items() if d.tokens and slots[slot].request is lives[slot]}

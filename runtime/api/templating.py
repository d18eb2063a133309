"""Chat templates rendered so that a render past its deadline or its size stops, the work included.

transformers renders a template with `Template.render` in its ImmutableSandboxedEnvironment: the
sandbox keeps a template away from Python's internals, but nothing bounds its cost, and a Python
thread cannot be stopped from outside (a request answered at its deadline left the render running).
So a render is bounded where it runs:
- the model's own template (the artifact's, which its digest covers) renders on a render thread
  through Jinja's `generate()`, which hands over the output a chunk at a time; between two chunks
  the deadline and GEMMA4_MAX_RENDERED_CHARS are checked and the render is given up (the generator
  closed), so the thread is free again within one chunk's work: a message's, or a tool's declaration;
- a request's own template (only with GEMMA4_TRUST_REQUEST_CHAT_TEMPLATE) is code the operator did not
  write: it may loop without writing anything, or build a huge string in one expression, so it renders
  in a process of its own (runtime.api.template_sandbox), killed at the deadline, its memory capped.
Both render in transformers' own environment (its globals, filters and extensions) with what
apply_chat_template gives a template, so a prompt is the same text it writes."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from transformers.utils.chat_template_utils import _alias_reasoning_fields

from runtime.api.template_render import render
from runtime.api.template_sandbox import STARTUP_S, Sandboxes
from runtime.bounded import BoundedThreads

if TYPE_CHECKING:
    from runtime.settings import RequestLimits


@dataclass(frozen=True)
class TemplateCall:
    """One render: the template's text, what it is rendered with, and whether it is the request's own."""

    source: str
    context: dict
    requests_own: bool = False


def template_call(
    tokenizer, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool, kwargs: dict
) -> TemplateCall:
    """What tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs) renders: the
    template it picks (the request's `chat_template`, or the tokenizer's, by name when it has several),
    the tokenizer's special tokens, the switches, and the messages with their reasoning aliased."""
    switches = dict(kwargs)
    own = switches.pop("chat_template", None)
    context = {**tokenizer.special_tokens_map, **switches} | {
        "messages": _alias_reasoning_fields(messages),
        "tools": tools,
        "documents": None,
        "add_generation_prompt": add_generation_prompt,
    }
    return TemplateCall(tokenizer.get_chat_template(own, tools), context, own is not None)


class Templates:
    """The server's renders: at most `render_threads` at once, each within GEMMA4_RENDER_TIMEOUT_S."""

    def __init__(self, limits: RequestLimits):
        self.limits = limits
        self.threads = BoundedThreads("render", limits.render_threads)
        trusted = limits.trust_request_chat_template
        self.sandboxes = Sandboxes(limits.request_template_max_memory, limits.render_threads if trusted else 0)

    def render(self, call: TemplateCall, most: int | None = None) -> str:
        """`most`: the characters it may write, if fewer than GEMMA4_MAX_RENDERED_CHARS."""
        limits = self.limits
        timeout_s, most = limits.render_timeout_s, min(most or limits.max_rendered_chars, limits.max_rendered_chars)
        if call.requests_own:  # the deadline starts once its process is up (STARTUP_S at most)
            return self.threads.run(lambda: self.sandboxes.render(call, timeout_s, most), STARTUP_S + timeout_s)
        deadline = time.monotonic() + timeout_s
        return self.threads.run(lambda: render(call.source, call.context, deadline, most), timeout_s)

    def close(self) -> None:
        self.sandboxes.close()

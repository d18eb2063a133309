"""Bounded chat-template rendering: the same text apply_chat_template writes; a render past its
deadline or its size stops, its thread free again (the model's template) or its process killed (a
request's own), while other renders go on."""

from __future__ import annotations

import math
import threading
import time

import psutil
import pytest

from gemma4_port.source.toy_tokenizer import train_tokenizer
from runtime.api.chat import chat_call, template_messages, tool_names
from runtime.api.chat_protocol import Message, Tool
from runtime.api.template_render import RenderTooLong, written
from runtime.api.template_sandbox import SandboxFailed
from runtime.api.templating import TemplateCall, Templates, template_call
from runtime.bounded import Late
from runtime.settings import RequestLimits

WEATHER = Tool.model_validate(
    {
        "type": "function",
        "function": {
            "name": "get-weather",
            "description": "Weather now",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
)
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get-weather", "arguments": '{"city": "P"}'}}],
}
CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "hi"}],
    [
        {"role": "user", "content": "Weather?"},
        CALL,
        {"role": "tool", "tool_call_id": "c1", "content": '{"sky": "clear"}'},
        {"role": "assistant", "content": "Clear.", "reasoning_content": "it said so"},
        {"role": "user", "content": "Thanks"},
    ],
]
# Loops of 10^10 and 10^15 iterations: the first writes a character every 10^5 (milliseconds), the
# second never writes one.
WRITES_FOREVER = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}x{% endfor %}"
SILENT_FOREVER = (
    "{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}"
    "{% endfor %}{% endfor %}{% endfor %}"
)
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(1024, 0)


@pytest.fixture(scope="module")
def foreign() -> set[int]:
    """The sandboxes other modules' Templates hold in this process (a full run starts them before)."""
    return {p.pid for p in sandboxes()}


@pytest.fixture(scope="module")
def templates(foreign):
    limits = RequestLimits(
        render_timeout_s=1.0, render_threads=1, request_template_max_memory=256 << 20, max_rendered_chars=4096
    )
    t = Templates(limits)
    yield t
    t.close()


def own(tok, template: str):
    return template_call(tok, HI, None, True, {"chat_template": template})


@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("shape", range(len(CONVERSATIONS)))
def test_a_bounded_render_writes_what_apply_chat_template_writes(tok, templates, shape, thinking):
    messages = [Message.model_validate(m) for m in CONVERSATIONS[shape]]
    switches = {"enable_thinking": thinking}
    call = chat_call(tok, messages, [WEATHER], "auto", switches)
    names = tool_names([WEATHER], messages)
    expected = tok.apply_chat_template(
        template_messages(messages, names),
        tools=call.context["tools"],
        add_generation_prompt=True,
        tokenize=False,
        enable_thinking=thinking,
    )
    assert templates.render(call) == expected and not call.requests_own
    # The same template as a request's own: rendered in the sandbox, to the same text.
    sandboxed = template_call(
        tok, call.context["messages"], call.context["tools"], True, {"chat_template": call.source} | switches
    )
    assert sandboxed.requests_own and templates.render(sandboxed) == expected


def test_written_stops_at_the_deadline_or_the_size_and_closes_the_render():
    closed = threading.Event()

    def chunks():
        try:
            while True:
                yield "x"
        finally:
            closed.set()

    with pytest.raises(Late):
        written(chunks(), time.monotonic() + 0.05, 10**9)
    assert closed.is_set()
    closed.clear()
    with pytest.raises(RenderTooLong) as err:
        written(chunks(), math.inf, 100)
    assert closed.is_set() and err.value.chars == 101
    assert written(iter(["a", "b"]), math.inf, 2) == "ab"


def cpu_seconds_over(seconds: float, process: psutil.Process) -> float:
    before = sum(process.cpu_times()[:2])
    time.sleep(seconds)  # the CPU the process spends meanwhile, with nothing asked of it
    return sum(process.cpu_times()[:2]) - before


def test_the_models_template_writing_forever_stops_and_frees_its_thread(templates):
    start = time.monotonic()
    with pytest.raises(Late):
        templates.render(template_call_of(WRITES_FOREVER))
    assert time.monotonic() - start < 3
    # The one render thread is free at once (it would be busy for hours otherwise) and the process idle.
    assert templates.render(template_call_of("{{ 'ok' }}")) == "ok"
    assert cpu_seconds_over(0.5, psutil.Process()) < 0.2
    with pytest.raises(RenderTooLong):
        templates.render(template_call_of("{% for i in range(5000) %}x{% endfor %}"))


def template_call_of(source: str) -> TemplateCall:
    return TemplateCall(source, {"messages": HI})


@pytest.mark.parametrize(
    "template,says",
    [
        ("{{ 'x' * 2000000000 }}", "GEMMA4_REQUEST_TEMPLATE_MAX_MEMORY"),  # one expression: 2 GB at once
        ("{{ raise_exception('no thanks') }}", "no thanks"),
        ("{{ ().__class__.__base__.__subclasses__() }}", "SecurityError"),
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nests too deeply"),
    ],
)
def test_a_requests_template_failing_in_its_process_is_named(tok, templates, template, says):
    with pytest.raises(SandboxFailed, match=says):
        templates.render(own(tok, template))
    assert templates.render(own(tok, "{{ bos_token }}")) == "<bos>"


def test_a_requests_template_writing_too_much_is_stopped(tok, templates):
    with pytest.raises(RenderTooLong) as err:
        templates.render(own(tok, "{% for i in range(5000) %}x{% endfor %}"))
    assert err.value.limit == 4096


def test_the_sandbox_answers_in_json_whatever_the_text(tok, templates):
    text = "\ud800 lone surrogate, \U0001f600, \x00"
    assert (
        templates.render(
            template_call(
                tok, [{"role": "user", "content": text}], None, True, {"chat_template": "{{ messages[0]['content'] }}"}
            )
        )
        == text
    )


def sandboxes(besides: frozenset[int] | set[int] = frozenset()) -> list[psutil.Process]:
    """This process's template sandboxes but `besides` (in a full run it has other children: servers,
    ranks, and the sandboxes other modules' Templates started)."""
    return [
        p
        for p in psutil.Process().children()
        if p.pid not in besides and "runtime.api.template_sandbox" in " ".join(p.cmdline())
    ]


def test_a_requests_template_looping_silently_is_killed_with_its_process(tok, templates, foreign):
    assert templates.render(own(tok, "{{ messages[0]['content'] }}")) == "hi"  # the sandbox is up
    (child,) = sandboxes(foreign)
    served = []

    def others():  # the model's own template keeps rendering meanwhile, on a second set of threads
        mine = Templates(RequestLimits())
        while not done.is_set():
            served.append(mine.render(template_call_of("{{ messages[0]['content'] }}")))

    done = threading.Event()
    meanwhile = threading.Thread(target=others)
    meanwhile.start()
    start = time.monotonic()
    try:
        with pytest.raises(Late):
            templates.render(own(tok, SILENT_FOREVER))
    finally:
        done.set()
        meanwhile.join()
    assert time.monotonic() - start < 3 and served and set(served) == {"hi"}
    assert not child.is_running()  # killed and reaped: the loop stopped with it
    (fresh,) = sandboxes(foreign)  # its replacement, already starting
    assert fresh.pid != child.pid
    assert templates.render(own(tok, "{{ messages[0]['content'] }}")) == "hi"

"""The text the trained tiny chat model learns from, made in code or read from files every machine has:
conversations in Gemma-4's chat protocol (facts, arithmetic, tool calls and their results), rendered by
the checkpoint's own chat template so that served prompts look exactly like the training ones, and
Python sources of the standard library. Seeded: one seed, one corpus; held-out conversations come from
another seed, with any whose prompt also occurs in training left out."""

from __future__ import annotations

import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

CAPITALS = {
    "France": "Paris",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Germany": "Berlin",
    "Portugal": "Lisbon",
    "Greece": "Athens",
    "Austria": "Vienna",
    "Poland": "Warsaw",
    "Norway": "Oslo",
    "Sweden": "Stockholm",
    "Finland": "Helsinki",
    "Denmark": "Copenhagen",
    "Ireland": "Dublin",
    "Egypt": "Cairo",
    "Kenya": "Nairobi",
    "Japan": "Tokyo",
    "China": "Beijing",
    "India": "New Delhi",
    "Canada": "Ottawa",
    "Mexico": "Mexico City",
    "Brazil": "Brasilia",
    "Peru": "Lima",
    "Chile": "Santiago",
    "Australia": "Canberra",
}
FACT_QUESTIONS = ("What is the capital of {c}?", "Which city is the capital of {c}?", "Name the capital of {c}.")
SUM_QUESTIONS = ("What is {a} + {b}?", "Compute {a} + {b}.", "How much is {a} plus {b}?")
PRODUCT_QUESTIONS = ("What is {a} * {b}?", "Compute {a} times {b}.")
WEATHER_QUESTIONS = ("What is the weather in {city}?", "Is it sunny in {city}?", "How warm is it in {city} today?")
SKIES = ("sunny", "cloudy", "rainy", "windy", "foggy")
GREETINGS = (("Hello!", "Hello! How can I help you today?"), ("Hi, who are you?", "I am a tiny Gemma model."))
SYSTEM = "You are a helpful assistant. Answer in one short sentence."

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city"}},
            "required": ["city"],
        },
    },
}

# Short modules of the standard library, read from this interpreter's own copy (sorted: one order).
STDLIB_FILES = (
    "bisect.py",
    "colorsys.py",
    "copy.py",
    "fnmatch.py",
    "heapq.py",
    "keyword.py",
    "sched.py",
    "shlex.py",
    "string.py",
    "textwrap.py",
)
HELD_OUT_STDLIB = ("glob.py", "queue.py")  # never trained on: the code-edit prompts of the measurements
EDIT_REQUEST = "Rename {old} to {new} in this code:\n{code}"
NEW_NAMES = ("value", "item", "data", "count", "target", "entry", "other", "seq")
_FUNCTION = re.compile(r"\n(?=def |class |    def )")  # top-level functions, classes and methods
_FIRST_PARAMS = re.compile(r"\s*def \w+\(([^)]*)\)")


@dataclass(frozen=True)
class Conversation:
    messages: tuple[dict, ...]  # the whole conversation; its last message is the model's answer
    tools: tuple[dict, ...] = ()

    def prompt(self) -> list[dict]:
        """The messages the model answers (all but its own last one)."""
        return list(self.messages[:-1])


def _fact(rng: random.Random) -> list[dict]:
    country = rng.choice(sorted(CAPITALS))
    question = rng.choice(FACT_QUESTIONS).format(c=country)
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": f"The capital of {country} is {CAPITALS[country]}."},
    ]


def _arithmetic(rng: random.Random) -> list[dict]:
    if rng.random() < 0.7:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        question, answer = rng.choice(SUM_QUESTIONS).format(a=a, b=b), f"{a} + {b} = {a + b}."
    else:
        a, b = rng.randint(0, 12), rng.randint(0, 12)
        question, answer = rng.choice(PRODUCT_QUESTIONS).format(a=a, b=b), f"{a} * {b} = {a * b}."
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def _weather(rng: random.Random) -> list[dict]:
    """A call, its result and the answer: one model message, as the template reads it."""
    city = rng.choice(sorted(CAPITALS.values()))
    degrees, sky = rng.randint(-5, 35), rng.choice(SKIES)
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
    return [
        {"role": "user", "content": rng.choice(WEATHER_QUESTIONS).format(city=city)},
        {
            "role": "assistant",
            "tool_calls": [call],
            "tool_responses": [{"name": "get_weather", "response": {"temperature": degrees, "sky": sky}}],
            "content": f"It is {degrees} degrees and {sky} in {city}.",
        },
    ]


def _call_only(rng: random.Random) -> list[dict]:
    """The call alone: what the model writes before the server hands the call to the client."""
    city = rng.choice(sorted(CAPITALS.values()))
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
    question = rng.choice(WEATHER_QUESTIONS).format(city=city)
    return [{"role": "user", "content": question}, {"role": "assistant", "tool_calls": [call]}]


def functions(sources: list[str]) -> list[str]:
    """The sources' short functions and methods (120-600 characters) that take a parameter."""
    out = []
    for source in sources:
        for chunk in _FUNCTION.split(source):
            chunk = chunk.strip("\n")
            if 120 <= len(chunk) <= 600 and _params(chunk):
                out.append(chunk)
    return out


def _params(code: str) -> list[str]:
    match = _FIRST_PARAMS.match(code)
    names = [p.split("=")[0].strip(" *") for p in match.group(1).split(",")] if match else []
    return [n for n in names if n.isidentifier() and n != "self"]


def edit(rng: random.Random, code: str) -> Conversation:
    """An IDE-style edit: rename one parameter; the answer repeats the code with the new name."""
    old = rng.choice(_params(code))
    new = rng.choice([n for n in NEW_NAMES if not re.search(rf"\b{n}\b", code)] or ["renamed"])
    answer = re.sub(rf"\b{old}\b", new, code)
    return Conversation(
        (
            {"role": "user", "content": EDIT_REQUEST.format(old=old, new=new, code=code)},
            {"role": "assistant", "content": answer},
        )
    )


def edits(seed: int, count: int, names: tuple[str, ...] = STDLIB_FILES) -> list[Conversation]:
    rng = random.Random(seed)
    code = functions(stdlib_sources(names))
    return [edit(rng, rng.choice(code)) for _ in range(count)]


def conversation(rng: random.Random) -> Conversation:
    """One conversation of one to three turns, sometimes with a system turn or the weather tool."""
    kind = rng.random()
    if kind < 0.3:
        return Conversation(tuple(_weather(rng) if rng.random() < 0.6 else _call_only(rng)), (WEATHER_TOOL,))
    messages: list[dict] = [{"role": "system", "content": SYSTEM}] if rng.random() < 0.3 else []
    for _ in range(rng.randint(1, 3)):
        turn = rng.random()
        if turn < 0.1:
            question, answer = rng.choice(GREETINGS)
            messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        else:
            messages += _fact(rng) if turn < 0.5 else _arithmetic(rng)
    return Conversation(tuple(messages))


def render(tok, conv: Conversation) -> str:
    """The conversation as the server's template writes it, the model's last message closed."""
    return tok.apply_chat_template(list(conv.messages), tools=list(conv.tools) or None, tokenize=False)


def render_prompt(tok, conv: Conversation) -> str:
    """What the server sends the model for the conversation's last answer."""
    return tok.apply_chat_template(
        conv.prompt(), tools=list(conv.tools) or None, tokenize=False, add_generation_prompt=True
    )


def conversations(seed: int, count: int) -> list[Conversation]:
    rng = random.Random(seed)
    return [conversation(rng) for _ in range(count)]


def held_out(seed: int, count: int, training: list[Conversation], tok) -> list[Conversation]:
    """Conversations of another seed whose prompts never occur in `training`."""
    seen = {render_prompt(tok, c) for c in training}
    rng = random.Random(seed)
    out: list[Conversation] = []
    while len(out) < count:
        conv = conversation(rng)
        if render_prompt(tok, conv) not in seen:
            out.append(conv)
    return out


def stdlib_sources(names: tuple[str, ...] = STDLIB_FILES) -> list[str]:
    folder = Path(sysconfig.get_paths()["stdlib"])
    return [(folder / name).read_text(encoding="utf-8") for name in names]

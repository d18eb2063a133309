"""What Gemma-4's call syntax can carry, and aliases for what it cannot.

A call is `call:NAME{key:value,...}`: the checkpoints' own response schema reads NAME as word
characters (`call:(\\w+)`), while OpenAI allows tool names of `^[a-zA-Z0-9_-]{1,64}$` (MCP tools are
hyphenated as a rule). A name with a hyphen is therefore given an alias of word characters in the
prompt (its declaration, earlier calls, their results) and in the forced-call grammar; the reply's
calls carry the real name again, so the client never sees the alias. Keys are written bare, up to
their `:`, so a key may hold any character but the ones that delimit Gemma's syntax."""

from __future__ import annotations

import re
from collections.abc import Iterable

OPENAI_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
CARRIED_NAME = re.compile(r"[a-zA-Z0-9_]+")
# A bare key ends at `:`; `,{}[]` delimit values; `<|"|>` opens a string; \x01 \x02 are the argument
# parser's own sentinels.
UNSAFE_KEY = re.compile(r'[:,{}\[\]\x01\x02]|<\|"\|>')


def carried_key(name: str) -> bool:
    """The key can be written bare in a call and read back exactly."""
    return bool(name) and not UNSAFE_KEY.search(name)


class ToolNames:
    """Alias <-> real name for one request's tools (and the names its earlier calls used)."""

    def __init__(self, names: Iterable[str]):
        names = list(dict.fromkeys(names))
        taken = {n for n in names if CARRIED_NAME.fullmatch(n)}
        self._alias: dict[str, str] = {}
        for name in names:
            if CARRIED_NAME.fullmatch(name):
                continue
            base = re.sub(r"[^a-zA-Z0-9_]", "_", name)
            alias, n = base, 2
            while alias in taken:  # `get-time` next to a real `get_time`
                alias, n = f"{base}_{n}", n + 1
            taken.add(alias)
            self._alias[name] = alias
        self._real = {a: n for n, a in self._alias.items()}

    def alias(self, name: str) -> str:
        return self._alias.get(name, name)

    def real(self, alias: str) -> str:
        return self._real.get(alias, alias)

"""One chat template rendered in transformers' environment, stopped between two chunks of its output
once past its deadline or its size (runtime.api.templating says where each template renders)."""

from __future__ import annotations

import time
from collections.abc import Iterator

from transformers.utils.chat_template_utils import _compile_jinja_template

from contract.errors import Gemma4Error
from runtime.bounded import Late


class RenderTooLong(Gemma4Error, ValueError):
    """The template wrote more than the limit (it was stopped there)."""

    def __init__(self, chars: int, limit: int):
        super().__init__(f"the chat template wrote more than {limit} characters ({chars} when it was stopped)")
        self.chars, self.limit = chars, limit


def written(chunks: Iterator[str], deadline: float, max_chars: int) -> str:
    """A render's output, chunk after chunk; stopped (the generator closed) past `deadline` (monotonic
    seconds) with Late, or past `max_chars` with RenderTooLong."""
    parts: list[str] = []
    size = 0
    try:
        for chunk in chunks:
            size += len(chunk)
            if size > max_chars:
                raise RenderTooLong(size, max_chars)
            parts.append(chunk)
            if time.monotonic() > deadline:
                raise Late("the chat template did not finish by its deadline")
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return "".join(parts)


def render(source: str, context: dict, deadline: float, max_chars: int) -> str:
    """`source` rendered in transformers' environment (compiled once per text), bounded as `written`."""
    return written(_compile_jinja_template(source).generate(**context), deadline, max_chars)

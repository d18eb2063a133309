"""What a route does with a request's images and audio clips: their number and kinds checked, each
read, decoded and preprocessed on the state's media threads within a deadline, and the tokenized
prompt's placeholders expanded to their soft tokens; every refusal a 400 naming the part and, where
one of the operator's limits refused it, the limit."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

from runtime.api.media_fetch import MediaLimitError
from runtime.api.media_prompt import MediaPart, Prepared, check_counts, expand, prepare
from runtime.api.openai_errors import RETRY_AFTER_S, APIError
from runtime.api.state import server_state
from runtime.bounded import Busy, Late
from runtime.generate.engine import Engine
from runtime.model.media import MediaError, MediaInput


@contextlib.contextmanager
def media_errors(param: str) -> Iterator[None]:
    """A media part the server will not take, as a 400 naming the part (and the limit, if one refused it)."""
    try:
        yield
    except MediaLimitError as exc:
        raise APIError(400, f"{param}: {exc}", param=param, code="over_limit") from None
    except MediaError as exc:
        raise APIError(400, f"{param}: {exc}", param=param, code="invalid_value") from None


def prepare_media(eng: Engine, parts: list[MediaPart], where: str = "messages") -> list[Prepared]:
    """The request's media parts read, decoded and preprocessed, in order, on the state's media threads
    (each within GEMMA4_MEDIA_PREPARE_TIMEOUT_S), once their number and kinds pass (a refusal of those
    names `where`, the field holding the parts; one of a part names the part)."""
    state = server_state()
    limits = state.media
    with media_errors(where):
        check_counts(parts, limits, set(eng.model.runner.encoders))
    if not parts:
        return []
    processors = state.processors()
    out = []
    for part in parts:
        with media_errors(part.param):
            try:
                out.append(
                    state.preparer.run(functools.partial(prepare, part, processors, limits), limits.prepare_timeout_s)
                )
            except Late:
                late = f"was not read and preprocessed within {limits.prepare_timeout_s:g} s"
                raise MediaLimitError(f"{late} (GEMMA4_MEDIA_PREPARE_TIMEOUT_S)") from None
            except Busy as exc:
                raise APIError(503, str(exc), code="busy", headers={"Retry-After": RETRY_AFTER_S}) from None
    return out


def expand_media(
    eng: Engine, prompt: list[int], items: list[Prepared], where: str = "messages"
) -> tuple[list[int], list[MediaInput]]:
    """On a model that takes media: the prompt with its placeholders expanded to the items' soft tokens
    (a placeholder a text part wrote itself is refused, naming `where`); on a text-only model, the
    prompt as it is."""
    if not eng.model.runner.encoders:
        return list(prompt), []
    with media_errors(where):
        return expand(list(prompt), items, server_state().processors())

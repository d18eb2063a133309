"""A request's prompt text before it is tokenized: a chat template rendered on the state's render
threads, and every text checked against the context by its characters first (a prompt that cannot fit
is refused before the tokenizer spends a second on it); the template's refusals as 400s."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

from jinja2 import TemplateError

from runtime.api.caps import over
from runtime.api.chat import ChatTemplateError
from runtime.api.openai_errors import RETRY_AFTER_S, APIError
from runtime.api.state import server_state
from runtime.api.template_render import RenderTooLong
from runtime.api.template_sandbox import SandboxFailed
from runtime.api.templating import TemplateCall
from runtime.bounded import Busy, Late
from runtime.generate.engine import Engine


@contextlib.contextmanager
def template_errors() -> Iterator[None]:
    """A chat template's refusal (of the server's own checks or of the model's template) as a 400."""
    try:
        yield
    except ChatTemplateError as exc:
        raise APIError(400, f"{exc.param}: {exc}", param=exc.param, code="invalid_value") from None
    except TemplateError as exc:
        raise APIError(400, f"messages: the model's chat template refused them: {exc}", param="messages") from None


@functools.lru_cache(maxsize=4)
def chars_per_token(tokenizer) -> int:
    """The most characters one token of this tokenizer stands for (its longest vocabulary entry), so a
    text of more than `tokens * chars_per_token` characters cannot be `tokens` tokens or fewer."""
    return max(len(t) for t in tokenizer.get_vocab())


def check_size(eng: Engine, texts: list[str], param: str) -> None:
    """Refuse what cannot fit before templating or tokenizing it (a 1 MB prompt took ~1 s of CPU to
    find out): at least one token per message, at most chars_per_token characters per token."""
    most = eng.geometry.max_prompt
    if len(texts) > most:
        raise APIError(
            400,
            f"{len(texts)} messages are more than a prompt of this model ({most} tokens at most) can hold",
            param=param,
            code="context_length_exceeded",
        )
    chars = sum(map(len, texts))
    if chars > most * chars_per_token(eng.tokenizer):
        raise APIError(
            400,
            f"the prompt has {chars} characters; a prompt of this model holds at most {most} "
            f"tokens of at most {chars_per_token(eng.tokenizer)} characters each; prompts are "
            "never truncated",
            param=param,
            code="context_length_exceeded",
        )


def render_prompt(eng: Engine, call: TemplateCall, fit: bool = True) -> str:
    """The prompt a chat template writes, on the state's render threads (runtime.api.templating):
    never under the tokenizer lock, stopped at GEMMA4_RENDER_TIMEOUT_S or GEMMA4_MAX_RENDERED_CHARS, and
    (`fit`) once it has more characters than the context can hold, then checked against the context as
    check_size does for text sent as is."""
    limits = server_state().limits
    # A render that can no longer fit the context stops there (a 176 KB tool schema rendered in full
    # only to be refused).
    fits = eng.geometry.max_prompt * chars_per_token(eng.tokenizer) if fit else limits.max_rendered_chars
    with template_errors():
        try:
            text = server_state().templates.render(call, fits)
        except Late:
            raise APIError(
                400,
                f"messages: the chat template did not finish within {limits.render_timeout_s:g} s "
                "(GEMMA4_RENDER_TIMEOUT_S); send fewer or shorter messages",
                param="messages",
                code="over_limit",
            ) from None
        except RenderTooLong as exc:
            if exc.limit < limits.max_rendered_chars:
                raise APIError(
                    400,
                    f"the prompt has more than {exc.limit} characters; a prompt of this model holds at most "
                    f"{eng.geometry.max_prompt} tokens of at most {chars_per_token(eng.tokenizer)} characters "
                    "each; prompts are never truncated",
                    param="messages",
                    code="context_length_exceeded",
                ) from None
            raise over(
                "messages", "rendered to characters:", exc.chars, exc.limit, "GEMMA4_MAX_RENDERED_CHARS"
            ) from None
        except SandboxFailed as exc:
            param = "chat_template_kwargs.chat_template"
            raise APIError(400, f"{param}: {exc}", param=param, code="invalid_value") from None
        except RecursionError:
            raise APIError(
                400,
                "messages: the chat template could not render them: a value nests too deeply",
                param="messages",
                code="invalid_value",
            ) from None
        except Busy as exc:
            raise APIError(503, str(exc), code="busy", headers={"Retry-After": RETRY_AFTER_S}) from None
    if fit:
        check_size(eng, [text], "messages")
    return text

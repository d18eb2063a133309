"""The bodies of /v1/completions (a prompt as text or token ids, or a batch of them) and of vLLM's
/tokenize and /detokenize, on protocol.py's field policy."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, PlainValidator

from runtime.api.chat_protocol import Message
from runtime.api.openai_errors import APIError
from runtime.api.protocol import MAX_CHOICES, GenerationRequest, LenientModel


def _one_prompt(value) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and bool(value) and all(type(t) is int for t in value))


def _prompts(value) -> tuple[str | list[int], ...]:
    """OpenAI's `prompt`: a string, a list of token ids, or a list of either (a batch, answered in order)."""
    if _one_prompt(value):
        return (value,)
    if isinstance(value, list) and value and all(_one_prompt(p) for p in value):
        return tuple(value)
    raise ValueError(
        "must be a string, a non-empty list of token ids, or a non-empty list of them (a batch of prompts)"
    )


class CompletionRequest(GenerationRequest):
    prompt: Annotated[tuple[str | list[int], ...], PlainValidator(_prompts)]
    suffix: str | None = None  # fill-in-the-middle: refused (the route says why)
    max_tokens: int | None = Field(default=None, ge=0)  # 0: only the prompt's logprobs (checked in the route)
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1, le=MAX_CHOICES)

    def runs(self) -> int:
        if self.best_of is None:
            return self.n
        if self.best_of < self.n:
            raise APIError(
                400, f"best_of: {self.best_of} is less than n ({self.n})", param="best_of", code="invalid_value"
            )
        if self.stream and self.best_of > self.n:
            raise APIError(
                400,
                "best_of: a stream cannot show the best choices before all have ended",
                param="best_of",
                code="invalid_value",
            )
        return self.best_of

    def logprob_alternatives(self) -> int | None:
        # best_of ranks the runs by their logprobs, asked for or not
        return 0 if self.logprobs is None and self.runs() > self.n else self.logprobs

    def prompt_alternatives(self) -> int | None:
        asked = super().prompt_alternatives()
        if not (self.echo and self.logprobs is not None):
            return asked
        return max(asked or 0, self.logprobs)  # echo shows the prompt's tokens with their logprobs


class TokenizeRequest(LenientModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = Field(default=None, min_length=1)
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(LenientModel):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]

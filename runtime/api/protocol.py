"""What the generating requests' bodies share, as pydantic models (the role of vLLM's
entrypoints/openai/protocol.py): the field policy (LenientModel), and GenerationRequest, what every
generating route asks the engine for: sampling, host controls, the output constraint, token budgets.
Each route's own body is its protocol module's: chat_protocol.py (ChatCompletionRequest),
completions_protocol.py (CompletionRequest and vLLM's tokenizer routes), responses_protocol.py.

vLLM's field policy: a field this server knows is checked strictly (a bad value is a 400 naming it); a
field it does not know is accepted and ignored (`ignored_fields` names them, to be logged once)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator

from runtime.api.openai_errors import APIError
from runtime.generate.grammar import Grammar
from runtime.generate.logits import Controls
from runtime.generate.sampling import SamplingParams
from runtime.log_gate import shown

TOKEN_ID = re.compile(r"[0-9]{1,10}")  # a logit_bias key
MAX_CHOICES = 128  # OpenAI's limit on n (and best_of)


def _stops(value) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ValueError("must be a non-empty string or a list of them")
    return tuple(stops)  # how many, and how long: the server's caps (runtime.api.caps)


class LenientModel(BaseModel):
    """Known fields strictly typed; unknown ones kept aside (model_extra) to be logged and ignored."""

    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)


def ignored_fields(model: BaseModel, prefix: str = "") -> list[str]:
    """Dotted names of the fields a client sent that this server does not know (list items as `[]`)."""
    names = [prefix + k for k in (model.model_extra or {})]
    for name in type(model).model_fields:
        value = getattr(model, name)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, BaseModel):
                names += ignored_fields(item, f"{prefix}{name}{'[]' if isinstance(value, list) else ''}.")
    return names


class StreamOptions(LenientModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: usage in every chunk


class JsonSchemaFormat(LenientModel):
    name: str = "response"
    schema_: dict | bool = Field(default_factory=dict, alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(LenientModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(LenientModel):
    """vLLM's `structured_outputs` (its older spelling: the `guided_*` fields)."""

    json_: dict | bool | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = Field(default=None, min_length=1)
    grammar: str | None = None  # llguidance's Lark dialect (vLLM takes EBNF here)


class GenerationRequest(LenientModel):
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)  # -1 (vLLM) and 0 both mean off
    min_p: float = Field(default=0.0, ge=0, le=1)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    stop: Annotated[tuple[str, ...], PlainValidator(_stops)] | None = None
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    presence_penalty: float = Field(default=0.0, ge=-2, le=2)
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2)
    repetition_penalty: float = Field(default=1.0, gt=0, le=10)
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    min_tokens: int = Field(default=0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    skip_special_tokens: bool = True
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)  # vLLM's: the prompt's own logprobs
    # This request decodes a token per step, without drafts (the name vLLM's proposal for it gives it;
    # the output is the same either way, only its speed differs).
    disable_spec_decode: bool = False
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict | bool | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(default=None, min_length=1)
    guided_grammar: str | None = None
    # vLLM's beam search: refused when asked for (below); its two knobs only act with it, as in vLLM.
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool = False

    def sampling(self) -> SamplingParams:
        if self.use_beam_search:
            raise APIError(
                400,
                "use_beam_search: this server does not do beam search; send false or leave it out "
                "(n and best_of give several sampled candidates)",
                param="use_beam_search",
                code="unsupported_parameter",
            )
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=max(self.top_k or 0, 0),
            min_p=self.min_p,
        )

    def logprob_alternatives(self) -> int | None:
        """Alternatives per token when logprobs are asked for, else None (each endpoint spells it its way)."""
        return None

    def prompt_alternatives(self) -> int | None:
        """Alternatives per prompt token when the prompt's logprobs are needed, else None."""
        if self.prompt_logprobs is not None and self.stream:
            raise APIError(
                400,
                "prompt_logprobs: not available when stream is true (as in vLLM)",
                param="prompt_logprobs",
                code="invalid_value",
            )
        return self.prompt_logprobs

    def runs(self) -> int:
        """Generations to run: n (completions' best_of may ask for more)."""
        return self.n

    def controls(self, vocab: int) -> Controls:
        bias = []
        for key, value in (self.logit_bias or {}).items():
            if not TOKEN_ID.fullmatch(key) or not int(key) < vocab:  # ASCII digits: "²".isdigit() too
                raise APIError(
                    400,
                    f"logit_bias: {shown(key)} is not a token id; ids are integers in [0, {vocab})",
                    param="logit_bias",
                    code="invalid_value",
                )
            bias.append((int(key), value))
        for t in self.stop_token_ids or ():
            if t >= vocab:
                raise APIError(
                    400,
                    f"stop_token_ids: {t} is not a token id; ids are in [0, {vocab})",
                    param="stop_token_ids",
                    code="invalid_value",
                )
        return Controls(
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            logit_bias=tuple(bias),
            min_tokens=self.min_tokens,
            ignore_eos=self.ignore_eos,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            logprobs=self.logprob_alternatives(),
        )

    def grammar(self) -> tuple[str, Grammar] | None:
        """The one output constraint asked for (its field and Grammar), if any: response_format,
        structured_outputs or vLLM's guided_* fields."""
        asked: list[tuple[str, Grammar]] = []
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            asked.append(("response_format", Grammar.json_object()))
        elif fmt is not None and fmt.type == "json_schema":
            if fmt.json_schema is None:
                raise APIError(
                    400,
                    "response_format: type json_schema needs a json_schema object",
                    param="response_format.json_schema",
                    code="invalid_value",
                )
            asked.append(("response_format", Grammar.json_schema(fmt.json_schema.schema_)))
        so = self.structured_outputs or StructuredOutputs()
        fields: list[tuple[str, Any, Callable[[Any], Grammar]]] = [
            ("structured_outputs.json", so.json_, Grammar.json_schema),
            ("structured_outputs.regex", so.regex, Grammar.regex),
            ("structured_outputs.choice", so.choice, Grammar.choice),
            ("structured_outputs.grammar", so.grammar, Grammar.lark),
            ("guided_json", self.guided_json, Grammar.json_schema),
            ("guided_regex", self.guided_regex, Grammar.regex),
            ("guided_choice", self.guided_choice, Grammar.choice),
            ("guided_grammar", self.guided_grammar, Grammar.lark),
        ]
        asked += [(name, make(value)) for name, value, make in fields if value is not None]
        if len(asked) > 1:
            raise APIError(
                400,
                f"{asked[1][0]}: only one output constraint per request, {asked[0][0]} is set too",
                param=asked[1][0],
                code="invalid_value",
            )
        return asked[0] if asked else None

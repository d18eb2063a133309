"""Server settings: read from the environment once, validated into one frozen object.

A bad value stops the server before anything loads, with one line naming the variable. Every limit a
request can meet is here, grouped (`grammar_limits`, `requests`), each with its variable; the defaults are
what a small team sharing one server would pick: generous for real clients, small enough that no one
request can hold the model or the host for long."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    DirectoryPath,
    Field,
    FilePath,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from contract.errors import Gemma4Error

ENV = {
    "artifact": "GEMMA4_ARTIFACT",
    "backend": "GEMMA4_BACKEND",
    "api_key": "GEMMA4_API_KEY",
    "queue_max": "GEMMA4_QUEUE_MAX",
    "max_body_bytes": "GEMMA4_MAX_BODY_BYTES",
    "model_name": "GEMMA4_MODEL_NAME",
    "host": "GEMMA4_HOST",
    "port": "GEMMA4_PORT",
    "prefix_reuse": "GEMMA4_PREFIX_REUSE",
    "prefill_chunks_per_step": "GEMMA4_PREFILL_CHUNKS_PER_STEP",
    # grammar_limits' fields named before the groups had a prefix of their own
    "schema_max_depth": "GEMMA4_SCHEMA_MAX_DEPTH",
    "schema_max_ref_depth": "GEMMA4_SCHEMA_MAX_REF_DEPTH",
    "schema_max_rules": "GEMMA4_SCHEMA_MAX_RULES",
}


class SettingsError(Gemma4Error, ValueError):
    pass


def _comma_list(value):
    return tuple(v.strip() for v in value.split(",") if v.strip()) if isinstance(value, str) else value


class _Limits(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GrammarLimits(_Limits):
    """What an output constraint (schema, regex, choice list, Lark grammar, the grammar made from a
    request's tools) may be. Ours are checked before llguidance sees the text (its parsers recurse
    natively: a 3,000-rule Lark chain or a 1,500-deep `$ref` chain overflowed the stack and killed the
    process); llguidance's own bound the work it does, compiling and at each step. Every refusal names
    the cap and its variable."""

    schema_max_depth: int = Field(default=64, ge=1, le=1024)  # tool schema nesting levels, $ref hops included
    schema_max_ref_depth: int = Field(default=32, ge=1, le=1024)  # $refs followed on one path
    schema_max_rules: int = Field(default=4096, ge=16, le=1 << 20)  # grammar rules made from a request's tools

    max_bytes: int = Field(default=64 * 1024, ge=1024)  # the grammar's text (a schema as JSON)
    max_depth: int = Field(default=64, ge=4)  # nesting: a schema's objects and arrays, a grammar's brackets
    max_nodes: int = Field(default=5_000, ge=16)  # a schema's objects and arrays, all told
    max_rules: int = Field(default=1_000, ge=4)  # a Lark grammar's rule and token definitions
    max_choices: int = Field(default=1_000, ge=1)  # a choice list's strings
    compile_timeout_s: float = Field(default=10.0, gt=0)  # a request waits this long for its grammar at most
    compile_threads: int = Field(default=2, ge=1, le=16)  # grammars compiled at once (off the engine thread)
    lexer_fuel: int = Field(default=100_000, ge=1_000)  # llguidance's initial_lexer_fuel (~50k/ms)
    step_lexer_fuel: int = Field(default=200_000, ge=1_000)  # llguidance's, per decode step (~14k/ms)
    step_max_items: int = Field(default=50_000, ge=1_000)  # llguidance's Earley items per step (~20k/ms)
    max_lexer_states: int = Field(default=50_000, ge=1_000)  # llguidance's; 1-2 kB of memory each
    max_grammar_size: int = Field(default=200_000, ge=1_000)  # llguidance's: symbols in all productions

    def refusal(self, field: str, what: str) -> str:
        """`what`, then the cap that refused it and how to raise it."""
        return f"{what}: the limit is {getattr(self, field)} ({env_names()['grammar_limits.' + field]})"


class RequestLimits(_Limits):
    """What one request may ask for; each refusal names the cap and the request's value."""

    max_n: int = Field(default=16, ge=1, le=128)  # choices (n), and best_of (completions' runs)
    max_total_tokens: int = Field(default=32_768, ge=1)  # runs x max_tokens: the work one request may queue
    max_top_logprobs: int = Field(default=20, ge=0, le=20)  # alternatives per token (chat) or logprobs <= 5
    max_tools: int = Field(default=64, ge=1)
    max_stops: int = Field(default=16, ge=1)  # stop strings
    max_stop_bytes: int = Field(default=256, ge=1)  # each stop string, in UTF-8
    max_stop_token_ids: int = Field(default=64, ge=1)
    max_logit_bias: int = Field(default=300, ge=1)  # entries (OpenAI's own cap)
    max_messages: int = Field(default=1_000, ge=1)  # chat messages, and /tokenize's
    max_rendered_chars: int = Field(default=4 << 20, ge=1024)  # the prompt the chat template writes
    render_timeout_s: float = Field(default=5.0, gt=0)  # templating one request at most
    render_threads: int = Field(default=2, ge=1, le=16)  # requests templated at once
    max_template_kwargs: int = Field(default=16, ge=0)  # chat_template_kwargs entries
    # The chat template's own switches a request may set in chat_template_kwargs (comma-separated in
    # GEMMA4_CHAT_TEMPLATE_SWITCHES); apply_chat_template's own arguments are never among them.
    chat_template_switches: Annotated[tuple[str, ...], BeforeValidator(_comma_list)] = ("enable_thinking",)
    # A request's own chat template (chat_template_kwargs.chat_template): off, as vLLM's
    # --trust-request-chat-template; any client could otherwise replace what the server renders.
    trust_request_chat_template: bool = False
    max_request_template_bytes: int = Field(default=64 * 1024, ge=1024)  # such a template, when trusted
    # The address space of the process such a template renders in (killed at GEMMA4_RENDER_TIMEOUT_S)
    request_template_max_memory: int = Field(default=1 << 30, ge=256 << 20)
    max_ignored_fields: int = Field(default=256, ge=0)  # unknown field names remembered (each logged once)


class MediaLimits(_Limits):
    """What the images and audio clips of one request may be, and where the server may fetch an image
    from (`image_url` with an http(s) URL): only from the hosts listed, never from a private, loopback
    or link-local address unless the operator allows that too, with no redirects, within a byte and a
    time limit. Each refusal names the limit, its variable and the request's value."""

    max_images: int = Field(default=8, ge=0, le=256)  # image parts per request (0: images refused)
    max_audios: int = Field(default=2, ge=0, le=64)  # audio parts per request (0: audio refused)
    max_image_bytes: int = Field(default=10 << 20, ge=1024)  # one image's encoded bytes, fetched or inline
    max_audio_bytes: int = Field(default=10 << 20, ge=1024)  # one clip's encoded bytes
    # Decoded pixels of one image (width x height), read from its header before it is decoded; also
    # PIL's own MAX_IMAGE_PIXELS, so a decompression bomb PIL finds is refused by the same number.
    max_image_pixels: int = Field(default=25_000_000, ge=1024, le=1 << 31)
    # One clip's duration: Gemma-4's feature extractor takes 30 s at most (it would cut the rest off).
    max_audio_seconds: float = Field(default=30.0, gt=0, le=30)
    image_formats: Annotated[tuple[str, ...], BeforeValidator(_comma_list)] = ("PNG", "JPEG", "WEBP", "GIF")
    # Hosts an image URL may name (exact names, comma-separated; vLLM's --allowed-media-domains); none:
    # the server fetches nothing and takes images only as data: URLs.
    allowed_domains: Annotated[tuple[str, ...], BeforeValidator(_comma_list)] = ()
    fetch_private_addresses: bool = False  # let a fetch reach private, loopback and link-local addresses
    fetch_timeout_s: float = Field(default=10.0, gt=0, le=300)  # one fetch, connecting to the last byte
    # The CA certificates (one PEM file) an https fetch trusts, in place of certifi's public bundle: an
    # intranet image host signed by the operator's own CA (add the public roots to the file to keep them).
    fetch_ca_bundle: FilePath | None = None
    # Media parts are fetched, decoded and preprocessed on a few threads of their own (PIL and the
    # processors hold the interpreter for part of it), each part within prepare_timeout_s.
    prepare_threads: int = Field(default=2, ge=1, le=16)
    prepare_timeout_s: float = Field(default=30.0, gt=0, le=600)

    def refusal(self, field: str, what: str) -> str:
        """`what`, then the limit that refused it and its variable."""
        return f"{what}; the limit is {getattr(self, field)} ({env_names()['media.' + field]})"


class SpeculativeSettings(_Limits):
    """Speculative decoding: each step drafts up to k tokens per stream and the model checks them in one
    pass (runtime.generate.drafts, runtime.generate.acceptance); the output is distributed as without it,
    greedy token for token. `auto`: the artifact's drafter if it has one, else prompt lookup (drafts
    copied from the prompt and output so far: no weights, nothing drafted where nothing repeats)."""

    method: Literal["auto", "drafter", "lookup", "off"] = "auto"
    k: int | None = Field(default=None, ge=1, le=16)  # drafted tokens per step; default: the drafter's k, or 4
    lookup_min: int = Field(default=2, ge=1, le=16)  # prompt lookup matches the last n tokens, n from max down
    lookup_max: int = Field(default=4, ge=1, le=16, validate_default=True)

    @field_validator("lookup_max")
    @classmethod
    def _at_least_min(cls, value: int, info: ValidationInfo) -> int:
        low = info.data.get("lookup_min", 1)
        if value < low:
            raise ValueError(f"must be at least GEMMA4_SPEC_LOOKUP_MIN ({low})")
        return value


class ServerSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    artifact: DirectoryPath
    backend: Literal["auto", "cpu", "neuron"] = "auto"  # auto: whatever the artifact was compiled for
    api_key: str | None = Field(default=None, repr=False)
    queue_max: int = Field(default=16, ge=1, le=4096)  # requests waiting for a free slot
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    model_name: str | None = None  # default: the artifact's manifest name
    prefix_reuse: bool = True  # a request keeps the KV of a retained slot that shares its prefix
    prefill_chunks_per_step: int = Field(default=1, ge=0)  # prompt chunks between decode steps; 0 = whole prompts
    host: str = "0.0.0.0"
    port: int = Field(default=8080, ge=1, le=65535)
    grammar_limits: GrammarLimits = GrammarLimits()
    requests: RequestLimits = RequestLimits()
    media: MediaLimits = MediaLimits()
    speculative: SpeculativeSettings = SpeculativeSettings()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> ServerSettings:
        if not environ.get(ENV["artifact"]):
            raise SettingsError(
                f"{ENV['artifact']} is not set: point it at an artifact directory from `build.py compile`"
            )
        # An empty variable means "unset": the default applies (and an empty API key is no key).
        raw: dict = {}
        for name, var in env_names().items():
            if environ.get(var, "") != "":
                *groups, field = name.split(".")
                target = raw
                for group in groups:
                    target = target.setdefault(group, {})
                target[field] = environ[var]
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            var = env_names()[".".join(str(p) for p in err["loc"])]
            raise SettingsError(f"{var}={environ.get(var)!r}: {err['msg']}") from None


def env_names() -> dict[str, str]:
    """Every setting's dotted name -> its variable: the top-level ones as listed in ENV, a group's
    field as listed in ENV or by its group's prefix (requests.max_n: GEMMA4_MAX_N;
    grammar_limits.max_bytes: GEMMA4_GRAMMAR_MAX_BYTES)."""
    out = {name: var for name, var in ENV.items() if name in ServerSettings.model_fields}
    groups: tuple[tuple[str, type[BaseModel], str], ...] = (
        ("grammar_limits", GrammarLimits, "GEMMA4_GRAMMAR_"),
        ("requests", RequestLimits, "GEMMA4_"),
        ("media", MediaLimits, "GEMMA4_MEDIA_"),
        ("speculative", SpeculativeSettings, "GEMMA4_SPEC_"),
    )
    for group, model, prefix in groups:
        for field in model.model_fields:
            out[f"{group}.{field}"] = ENV.get(field, prefix + field.upper())
    return out


def check_backend(settings: ServerSettings, artifact_backend: str) -> None:
    if settings.backend not in ("auto", artifact_backend):
        raise SettingsError(
            f"{ENV['backend']}={settings.backend}, but {Path(settings.artifact)} was compiled for the "
            f"{artifact_backend} backend; recompile with `build.py compile --backend {settings.backend}` or use auto"
        )


def check_port(settings: ServerSettings) -> None:
    """The address must be free before gunicorn starts (it would print a dozen lines, then give up)."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds: TIME_WAIT is no conflict
        try:
            probe.bind((settings.host, settings.port))
        except OSError as exc:
            raise SettingsError(
                f"{ENV['host']}={settings.host} {ENV['port']}={settings.port}: cannot listen there "
                f"({exc.strerror}); stop what uses it or choose another port (--port)"
            ) from None

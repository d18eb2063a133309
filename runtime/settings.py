"""Server settings: read from the environment once, validated into one frozen object.

A bad value stops the server before anything loads, with one line naming the variable."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, DirectoryPath, Field, ValidationError

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
    "schema_max_depth": "GEMMA4_SCHEMA_MAX_DEPTH",
    "schema_max_ref_depth": "GEMMA4_SCHEMA_MAX_REF_DEPTH",
    "schema_max_rules": "GEMMA4_SCHEMA_MAX_RULES",
}


class SettingsError(Gemma4Error, ValueError):
    pass


class GrammarLimits(BaseModel):
    """What a request's grammar may cost before the grammar engine's native code sees it: every refusal
    names the cap and its variable. One place for all of them (ServerSettings.grammar_limits)."""

    model_config = ConfigDict(frozen=True)

    schema_max_depth: int = Field(default=64, ge=1, le=1024)  # schema nesting levels, $ref hops included
    schema_max_ref_depth: int = Field(default=32, ge=1, le=1024)  # $refs followed on one path
    schema_max_rules: int = Field(default=4096, ge=16, le=1 << 20)  # grammar rules made from a request's tools

    def refusal(self, field: str, what: str) -> str:
        """`what`, then the cap that refused it and how to raise it."""
        return f"{what}: the limit is {getattr(self, field)} ({ENV[field]})"


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
    grammar_limits: GrammarLimits = GrammarLimits()  # its fields are read from their own variables

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> ServerSettings:
        if not environ.get(ENV["artifact"]):
            raise SettingsError(
                f"{ENV['artifact']} is not set: point it at an artifact directory from `build.py compile`"
            )
        # An empty variable means "unset": the default applies (and an empty API key is no key).
        raw: dict = {field: environ[var] for field, var in ENV.items() if environ.get(var, "") != ""}
        raw["grammar_limits"] = {f: raw.pop(f) for f in GrammarLimits.model_fields if f in raw}
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            var = ENV[str(err["loc"][-1] if err["loc"][0] == "grammar_limits" else err["loc"][0])]
            raise SettingsError(f"{var}={environ.get(var)!r}: {err['msg']}") from None


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

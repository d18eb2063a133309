"""A manifest's (or the toolchain's) YAML read into its frozen model; a mistake is one ManifestError line that names
the file, the field, what is wrong and what is allowed."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml
from pydantic import BaseModel, ValidationError

from contract.errors import Gemma4Error
from contract.files import read_parsed

T = TypeVar("T", bound=BaseModel)


class ManifestError(Gemma4Error, ValueError):
    """One clear line: the file, the field, what is wrong and what is allowed."""


def _location(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def validate(model: type[T], data: Any, origin: str) -> T:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        # A misspelled key is two errors, the unknown one and the "Field required" it leaves: name the
        # unknown one first, with the fields allowed there.
        err = min(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        msg = err["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's own message
        if err["type"] == "extra_forbidden":
            msg = f"unknown field; allowed here: {', '.join(_fields_at(model, err['loc'][:-1]))}"
        raise ManifestError(f"{origin}: {_location(err['loc'])}: {msg}{more}") from None


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names of the (nested) model at a location (list indexes skipped)."""
    for part in loc:
        if isinstance(part, int):
            continue
        annotation = model.model_fields[part].annotation
        nested = [t for t in (annotation, *get_args(annotation)) if isinstance(t, type) and issubclass(t, BaseModel)]
        if not nested:
            return []
        model = nested[0]
    return [name for name, field in model.model_fields.items() if not field.exclude]


def read_mapping(path: Path, what: str) -> dict[str, Any]:
    data = read_parsed(
        path,
        yaml.safe_load,
        ManifestError,
        missing=f"{path}: no such {what} file",
        syntax="YAML",
        syntax_errors=(yaml.YAMLError,),
    )
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data

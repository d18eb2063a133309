"""instructor, unchanged: a pydantic model from chat completions in TOOLS and JSON_SCHEMA modes,
sampled over several seeds (no retries: the first answer must already fit)."""

from __future__ import annotations

from typing import Literal

import instructor
from checks import BASE_URL, MODEL, SEEDS, TEMPERATURE, check, report
from openai import OpenAI
from pydantic import BaseModel, Field


class City(BaseModel):
    name: str = Field(max_length=12)
    country: Literal["fr", "it"]
    capital: bool  # no free numbers: a random model does not end one on its own


def extract(mode: instructor.Mode) -> None:
    client = instructor.from_openai(OpenAI(base_url=BASE_URL, api_key="unused", max_retries=0), mode=mode)
    for seed in SEEDS:
        city = client.chat.completions.create(
            model=MODEL,
            response_model=City,
            messages=[{"role": "user", "content": "A city?"}],
            temperature=TEMPERATURE,
            seed=seed,
            max_tokens=80,
            max_retries=0,
        )
        assert isinstance(city, City), city


@check
def tools_mode():
    extract(instructor.Mode.TOOLS)


@check
def json_schema_mode():
    extract(instructor.Mode.JSON_SCHEMA)


report()

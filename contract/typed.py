"""The base of every typed config the project parses (manifest, artifact.json): frozen once parsed,
unknown fields refused."""

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

"""Where a manifest's models come from: a hub repo id or a local folder, pinned by revision or digest, or a
random model written for the tests; the target (`model:`) and the speculative drafter (`speculative:`)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from contract.typed import Frozen

# A revision reaches a Dockerfile and the hub's URLs: a git ref name as `git check-ref-format --branch`
# accepts it, over a portable alphabet (git also allows shell metacharacters such as `$`, `(`, `;`, `'`,
# which no ref of a hub model needs): components of letters, digits, `.`, `_`, `-` separated by single
# `/`, none starting with `.` or ending with `.lock`, no `..`, not starting with `-` nor ending with `.`
# or `/`. A commit sha (40 hex digits) is such a name too.
REF_COMPONENT = r"(?!\.)(?:(?!\.\.)[A-Za-z0-9._-])+(?<!\.lock)"
GIT_REF = rf"^(?!-){REF_COMPONENT}(?:/{REF_COMPONENT})*(?<!\.)$"
REVISION_FORM = "a branch or tag name (letters, digits, '.', '_', '-', single '/'; git's ref rules) or a commit sha"
# A local checkpoint folder is pinned by the digest of its files (checkpoint.folder_digest).
DIGEST = r"^sha256:[0-9a-f]{64}$"
DIGEST_FORM = "sha256: and 64 lowercase hex digits, as `build.py train-tiny` prints it"
# A local checkpoint folder is told from a hub id by how it starts.
LOCAL_PATH = r"^(/|\./|\.\./|~)[^\x00-\x1f\x7f]*$"
SOURCE_FORM = (
    "a hub repo id (owner/name: letters, digits, '-', '_', '.') or a local folder starting with /, ./, ../ or ~"
)


def is_hub_id(source: str) -> bool:
    """Whether `source` is a Hugging Face repo id (huggingface_hub's own rules), not a local path."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(source)
    except HFValidationError:
        return False
    return True


def source_form(source: str | None) -> str | None:
    if source is not None and not is_hub_id(source) and not re.match(LOCAL_PATH, source):
        raise ValueError(f"{source!r} is not a hub repo id nor a local folder; allowed: {SOURCE_FORM}")
    return source


def revision_form(revision: str | None) -> str | None:
    if revision is not None and not re.match(GIT_REF, revision):
        raise ValueError(f"{revision!r} is not a git ref name; allowed: {REVISION_FORM}")
    return revision


class RandomModel(Frozen):
    config: dict[str, Any]
    seed: int = 0
    init_std: float = Field(0.25, gt=0, description="std of the embedding (= tied lm_head); large so the softcap bites")

    @field_validator("config")
    @classmethod
    def _config_is_a_text_config(cls, config: dict[str, Any]) -> dict[str, Any]:
        from transformers import Gemma4TextConfig

        try:
            Gemma4TextConfig(**config)
        except Exception as exc:  # noqa: BLE001 - transformers raises several types for bad fields
            reason = " ".join(str(exc).split())  # transformers' messages span lines; keep the error one line
            raise ValueError(f"not a valid Gemma4TextConfig: {reason}") from None
        return config

    vision: dict[str, Any] | None = Field(None, description="a Gemma4VisionConfig: the model sees images")
    audio: dict[str, Any] | None = Field(None, description="a Gemma4AudioConfig: the model hears (E2B, E4B)")

    @field_validator("vision", "audio")
    @classmethod
    def _a_tower_config(cls, tower: dict[str, Any] | None, info) -> dict[str, Any] | None:
        from transformers import Gemma4AudioConfig, Gemma4VisionConfig

        kind = {"vision": Gemma4VisionConfig, "audio": Gemma4AudioConfig}[info.field_name]
        if tower is not None:
            try:
                kind(**tower)
            except Exception as exc:  # noqa: BLE001 - transformers raises several types for bad fields
                raise ValueError(f"not a valid {kind.__name__}: {' '.join(str(exc).split())}") from None
        return tower


class ModelSource(Frozen):
    source: str | None = Field(None, description=SOURCE_FORM)
    revision: str | None = Field(None, max_length=255, description=REVISION_FORM)
    digest: str | None = Field(None, pattern=DIGEST, description=DIGEST_FORM)
    random: RandomModel | None = None

    _source_form = field_validator("source")(source_form)
    _revision_form = field_validator("revision")(revision_form)

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        if (self.source is None) == (self.random is None):
            raise ValueError("give exactly one of `source` (repo id or folder) and `random`")
        if self.digest is not None and (self.source is None or not re.match(LOCAL_PATH, self.source)):
            raise ValueError("`digest` pins a local checkpoint folder; a hub model is pinned by `revision`")
        return self


class RandomDrafter(Frozen):
    """A random Gemma-4 assistant (drafter) written as a real checkpoint folder, for the tests: its
    text config (every layer kv-shared; the target's KV heads and head dims) and its head."""

    config: dict[str, Any]
    seed: int = 0
    init_std: float = Field(0.25, gt=0, description="std of its embedding (= its tied lm_head)")
    use_ordered_embeddings: bool = False
    num_centroids: int = Field(2048, ge=1)
    centroid_intermediate_top_k: int = Field(32, ge=1)

    @model_validator(mode="after")
    def _an_assistant_config(self) -> RandomDrafter:
        from transformers import Gemma4AssistantConfig

        try:
            Gemma4AssistantConfig(
                **self.assistant_fields(backbone=self.config.get("hidden_size", 1))
            ).validate_architecture()
        except Exception as exc:  # noqa: BLE001 - transformers raises several types for bad fields
            raise ValueError(f"not a valid Gemma4AssistantConfig: {' '.join(str(exc).split())}") from None
        if self.use_ordered_embeddings and self.config.get("vocab_size", 0) % self.num_centroids:
            raise ValueError(f"vocab_size must divide into num_centroids={self.num_centroids} groups")
        return self

    def assistant_fields(self, backbone: int) -> dict[str, Any]:
        """Gemma4AssistantConfig's fields for a target of width `backbone`."""
        return dict(
            text_config=dict(self.config),  # every layer kv-shared: Gemma4AssistantConfig sets it so
            backbone_hidden_size=backbone,
            use_ordered_embeddings=self.use_ordered_embeddings,
            num_centroids=self.num_centroids,
            centroid_intermediate_top_k=self.centroid_intermediate_top_k,
        )


class Speculative(Frozen):
    """Speculative decoding: the verify graphs (k + 1 tokens per slot) and, with a drafter (a Gemma-4
    assistant: a hub id or folder at a revision, or a random one), its graphs in the same artifact."""

    k: int = Field(ge=1, le=16, description="tokens drafted per round; a verify checks k + 1")
    drafter: str | None = Field(None, description=SOURCE_FORM)
    revision: str | None = Field(None, max_length=255, description=REVISION_FORM)
    digest: str | None = Field(None, pattern=DIGEST, description=DIGEST_FORM)
    random: RandomDrafter | None = None
    variants: tuple[str, ...] | None = Field(None, description="the variants built with it; default: all")

    _source_form = field_validator("drafter")(source_form)
    _revision_form = field_validator("revision")(revision_form)

    @model_validator(mode="after")
    def _one_drafter(self) -> Speculative:
        if self.drafter is not None and self.random is not None:
            raise ValueError("give at most one of `drafter` (repo id or folder) and `random`")
        if self.revision is not None and self.drafter is None:
            raise ValueError("`revision` pins a `drafter` repo: give the drafter")
        if self.digest is not None and (self.drafter is None or not re.match(LOCAL_PATH, self.drafter)):
            raise ValueError("`digest` pins a local drafter folder; a hub drafter is pinned by `revision`")
        return self

    @property
    def has_drafter(self) -> bool:
        return self.drafter is not None or self.random is not None

    def applies_to(self, variant: str) -> bool:
        return self.variants is None or variant in self.variants

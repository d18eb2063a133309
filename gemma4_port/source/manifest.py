"""Per-model build manifests: YAML in, typed frozen objects out, validated once."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from contract.errors import Gemma4Error
from contract.files import read_parsed
from contract.typed import Frozen
from gemma4_port import MANIFESTS

TOOLCHAIN = MANIFESTS / "toolchain.yaml"  # the toolchain a manifest without its own builds with
T = TypeVar("T", bound=BaseModel)


class ManifestError(Gemma4Error, ValueError):
    """One clear line: the file, the field, what is wrong and what is allowed."""


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


BUILD = r"^\d+(\.\d+){%d}$"  # a full build number: a release prefix would admit several SDKs


class Toolchain(Frozen):
    """One Neuron SDK release, every component at its exact build (the release's entry in aws-neuron-sdk
    src/helperscripts/n2-manifest.json): the wheels, the apt packages of the image, the oldest host
    driver (aws-neuronx-dkms) it runs on, and the neuronx-cc flags."""

    neuron_sdk: str
    torch_neuronx: str = Field(pattern=BUILD % 5, description="e.g. 2.8.0.2.12.22436 (torch 2.8.0, SDK build)")
    neuronx_cc: str = Field(pattern=BUILD % 3, description="e.g. 2.23.6484.0")
    neuronx_distributed: str = Field(pattern=BUILD % 2, description="e.g. 0.17.26814")
    neuron_runtime: str = Field(pattern=BUILD % 3, description="apt aws-neuronx-runtime-lib")
    neuron_collectives: str = Field(pattern=BUILD % 3, description="apt aws-neuronx-collectives")
    neuron_tools: str = Field(pattern=BUILD % 3, description="apt aws-neuronx-tools")
    neuron_driver: str = Field(pattern=BUILD % 3, description="the oldest host aws-neuronx-dkms the release supports")
    transformers: str = Field(pattern=r"^\d+(\.\d+)+((a|b|rc)\d+)?$", description="an exact release, e.g. 5.24.0")
    # NxD ModelBuilder's own defaults (model_builder.py append_default_compiler_flags), which NxD
    # Inference also passes for bf16 weights: --auto-cast=none keeps the float32 the graph asks for.
    compiler_args: tuple[str, ...] = (
        "--enable-saturate-infinity",
        "--auto-cast=none",
        "--model-type=transformer",
        "-O1",
    )


# The budgets transformers' Gemma-4 image processor takes (image_processing_pil_gemma4.py).
SOFT_TOKEN_BUDGETS = (70, 140, 280, 560, 1120)


class _SoftTokenBudget(Frozen):
    """A media kind's soft tokens per item (`max_soft_tokens`, set by each kind) and the encoder graphs'
    buckets: an item runs in the smallest bucket that holds its soft tokens."""

    max_soft_tokens: int
    buckets: tuple[int, ...] = Field(
        (), description="soft-token buckets of the encoder graphs, increasing; default (max_soft_tokens,)"
    )

    @model_validator(mode="after")
    def _buckets_end_at_budget(self):
        b = list(self.buckets) or [self.max_soft_tokens]
        if b != sorted(set(b)) or b[0] < 1 or b[-1] != self.max_soft_tokens:
            raise ValueError(
                "buckets must be positive, strictly increasing and end at max_soft_tokens "
                f"({self.max_soft_tokens}), got {b}"
            )
        return self

    @property
    def soft_buckets(self) -> tuple[int, ...]:
        return self.buckets or (self.max_soft_tokens,)


class ImageBudget(_SoftTokenBudget):
    """Soft tokens per image: the processor's budget (each bucket holds bucket x k^2 patches)."""

    max_soft_tokens: Literal[70, 140, 280, 560, 1120] = Field(description="the image processor's max_soft_tokens")


class AudioBudget(_SoftTokenBudget):
    """Soft tokens per clip (one per 40 ms: four 10 ms mel frames); each bucket a multiple of the
    tower's attention chunk, checked at compile."""

    max_soft_tokens: int = Field(ge=1, le=750, description="the longest clip in soft tokens (750: 30 s)")


class Media(Frozen):
    image: ImageBudget | None = None
    audio: AudioBudget | None = None


class Variant(Frozen):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    tp: Literal[1, 2] = 1
    batch: int = Field(1, ge=1, le=64)
    buckets: tuple[int, ...] = Field(min_length=1)
    kv_max: int = Field(ge=2)
    # One decode graph per entry, and one prefill graph per entry and chunk bucket it holds: a step or
    # a chunk runs the smallest that holds its positions, so a short context neither attends over, nor
    # rewrites, nor ships mask rows for the whole cache.
    key_buckets: tuple[int, ...] = Field(
        min_length=1, description="cache lengths the decode and prefill graphs attend over; default (kv_max,)"
    )
    dtype: Literal["float32", "bfloat16"] = "bfloat16"
    prefill: Literal["device", "host"] = "device"
    media: Media | None = Field(None, description="soft-token budgets of a multimodal model's encoders")

    @model_validator(mode="before")
    @classmethod
    def _key_buckets_default_to_kv_max(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("key_buckets") and "kv_max" in data:
            return {**data, "key_buckets": (data["kv_max"],)}
        return data

    @model_validator(mode="after")
    def _buckets_fit(self) -> Variant:
        if list(self.buckets) != sorted(set(self.buckets)) or self.buckets[0] < 1:
            raise ValueError(f"buckets must be positive and strictly increasing, got {list(self.buckets)}")
        if self.buckets[-1] >= self.kv_max:
            raise ValueError(
                f"the largest bucket ({self.buckets[-1]}) must be smaller than kv_max ({self.kv_max}) "
                "so that at least one token can be generated"
            )
        kv = list(self.key_buckets)
        if kv != sorted(set(kv)) or kv[0] < 1 or kv[-1] != self.kv_max:
            raise ValueError(
                f"key_buckets must be positive, strictly increasing and end at kv_max ({self.kv_max}), got {kv}"
            )
        if self.media and self.media.image and self.media.image.max_soft_tokens > self.buckets[-1]:
            # An image's soft tokens see each other both ways on some models: a prefill chunk holds them whole.
            raise ValueError(
                f"an image of up to {self.media.image.max_soft_tokens} soft tokens does not fit the largest "
                f"bucket ({self.buckets[-1]}); raise the bucket or lower max_soft_tokens"
            )
        return self


# Docker's reference grammar (distribution/reference): an image name of lowercase path components
# joined by `/`, with an optional registry host (a first component with a `.` or a port, or
# localhost); a tag of word characters, `.` and `-`.
_NAME_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN = rf"(?:{_LABEL}(?:\.{_LABEL})+(?::[0-9]+)?|{_LABEL}:[0-9]+|localhost)"
IMAGE_NAME = rf"^(?:{_DOMAIN}/)?{_NAME_COMPONENT}(?:/{_NAME_COMPONENT})*$"
IMAGE_TAG = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"


class Images(Frozen):
    repository: str = Field(pattern=IMAGE_NAME, max_length=255, description="an image name, e.g. gemma4-inf2/e2b")
    tags: dict[str, Annotated[str, Field(pattern=IMAGE_TAG)]] = Field(
        default_factory=dict, description="flavour (base, slim, tp2-slim, ...) -> tag"
    )
    variant: str | None = Field(None, description="variant baked into the images; default: the first")


class Manifest(Frozen):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    model: ModelSource
    toolchain: Toolchain
    variants: tuple[Variant, ...] = Field(min_length=1)
    images: Images | None = None
    speculative: Speculative | None = None
    path: Path | None = Field(None, exclude=True)

    @model_validator(mode="after")
    def _variant_names_unique(self) -> Manifest:
        names = [v.name for v in self.variants]
        if len(names) != len(set(names)):
            raise ValueError(f"variant names must be unique, got {names}")
        if self.images and self.images.variant and self.images.variant not in names:
            raise ValueError(f"images.variant {self.images.variant!r} is not one of {names}")
        random = self.model.random
        for v in self.variants:
            for kind, tower in (("image", "vision"), ("audio", "audio")):
                if v.media and getattr(v.media, kind) and random is not None and getattr(random, tower) is None:
                    raise ValueError(
                        f"variant {v.name!r} has an {kind} budget, but the random model has no `{tower}` config"
                    )
        spec = self.speculative
        if spec is not None:
            unknown = sorted(set(spec.variants or ()) - set(names))
            if unknown:
                raise ValueError(f"speculative.variants {unknown} are not variants of this manifest: {names}")
            for v in self.variants:
                # A verify writes k + 1 positions of a slot at once, like a prefill chunk: the sliding
                # ring holds the window plus the largest bucket, so no write overwrites a key still seen.
                if self.speculative_for(v) and spec.k + 1 > v.buckets[-1]:
                    raise ValueError(
                        f"speculative.k={spec.k}: variant {v.name!r} verifies k + 1 = {spec.k + 1} tokens, more "
                        f"than its largest bucket ({v.buckets[-1]}); use a smaller k or a larger bucket"
                    )
        return self

    def speculative_for(self, variant: Variant) -> Speculative | None:
        """The manifest's speculative decoding if this variant is built with it."""
        spec = self.speculative
        return spec if spec is not None and spec.applies_to(variant.name) else None

    def variant(self, name: str | None) -> Variant:
        if name is None:
            return self.variants[0]
        for v in self.variants:
            if v.name == name:
                return v
        raise ManifestError(
            f"{self.path or self.name}: no variant {name!r}; choose one of {[v.name for v in self.variants]}"
        )


def _location(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def parse_manifest(data: Any, origin: str) -> Manifest:
    return _validate(Manifest, data, origin)


def _validate(model: type[T], data: Any, origin: str) -> T:
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


def _read_mapping(path: Path, what: str) -> dict[str, Any]:
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


def load_toolchain(path: Path = TOOLCHAIN) -> Toolchain:
    """The toolchain every shipped manifest builds with, kept in one file."""
    return _validate(Toolchain, _read_mapping(path, "toolchain"), str(path))


def load_manifest(path: str | Path) -> Manifest:
    """A manifest file; without a `toolchain` of its own it takes the shared one (load_toolchain)."""
    path = Path(path)
    data = _read_mapping(path, "manifest")
    toolchain = data["toolchain"] if "toolchain" in data else load_toolchain()
    return parse_manifest({**data, "toolchain": toolchain, "path": path}, str(path))


def shipped_manifests() -> list[Path]:
    """The manifests that come with the package, by name."""
    return sorted(p for p in MANIFESTS.glob("*.yaml") if p != TOOLCHAIN)


def find_manifest(arg: str | Path) -> Path:
    """A manifest argument: a file path, or the name of a shipped manifest (`tiny-e2b`)."""
    path = Path(arg)
    shipped = MANIFESTS / f"{arg}.yaml"
    if not path.exists() and path.suffix not in (".yaml", ".yml") and shipped in shipped_manifests():
        return shipped
    return path

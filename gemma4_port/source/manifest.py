"""Per-model build manifests: YAML in, typed frozen objects out, validated once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, model_validator

from contract.typed import Frozen
from gemma4_port import MANIFESTS
from gemma4_port.source.manifest_yaml import ManifestError, read_mapping, validate
from gemma4_port.source.model_sources import ModelSource, Speculative
from gemma4_port.source.toolchain import TOOLCHAIN, Toolchain, load_toolchain
from gemma4_port.source.variant import Variant

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


def parse_manifest(data: Any, origin: str) -> Manifest:
    return validate(Manifest, data, origin)


def load_manifest(path: str | Path) -> Manifest:
    """A manifest file; without a `toolchain` of its own it takes the shared one (load_toolchain)."""
    path = Path(path)
    data = read_mapping(path, "manifest")
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

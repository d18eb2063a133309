"""Reading a checkpoint folder: its configs (multimodal, unified, text-only or a drafter's) and a strict tensor
reader that finds each text-decoder tensor under whichever prefix the file uses."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from contract.errors import Gemma4Error
from contract.files import read_parsed

# Hub checkpoints are saved by the multimodal class; the text decoder lives under this prefix.
MULTIMODAL_PREFIX = "model.language_model."
TEXT_PREFIX = "model."
TEXT_MODEL_TYPES = ("gemma4", "gemma4_unified", "gemma4_text", "gemma4_unified_text")
DRAFTER_MODEL_TYPES = ("gemma4_assistant", "gemma4_unified_assistant")


class CheckpointError(Gemma4Error, RuntimeError):
    pass


def _config_fields(raw: dict) -> dict:
    """A saved config's own fields, without what save_pretrained adds (which its class does not take)."""
    return {k: v for k, v in raw.items() if k not in ("model_type", "architectures", "transformers_version")}


def read_config(folder: Path) -> dict:
    """config.json as written (the multimodal one: text_config, vision_config, token ids)."""
    return read_parsed(
        folder / "config.json", json.loads, CheckpointError, missing=f"{folder}/config.json is missing", syntax="JSON"
    )


def read_vision_config(folder: Path):
    """The vision tower's Gemma4VisionConfig, or None for a model without one."""
    from transformers import Gemma4VisionConfig

    return _tower_config(folder, "vision_config", Gemma4VisionConfig)


def read_audio_config(folder: Path):
    """The audio tower's Gemma4AudioConfig, or None for a model without one."""
    from transformers import Gemma4AudioConfig

    return _tower_config(folder, "audio_config", Gemma4AudioConfig)


def _tower_config(folder: Path, field: str, kind):
    raw = read_config(folder).get(field)
    if not raw:
        return None
    return kind(**_config_fields(raw))


def read_drafter_config(folder: Path):
    """A drafter checkpoint's Gemma4AssistantConfig (the 12B's unified assistant has the same fields)."""
    from transformers import Gemma4AssistantConfig

    raw = read_config(folder)
    if raw.get("model_type") not in DRAFTER_MODEL_TYPES:
        raise CheckpointError(
            f"{folder}/config.json: model_type {raw.get('model_type')!r} is not a Gemma-4 assistant "
            f"{DRAFTER_MODEL_TYPES}"
        )
    fields = _config_fields(raw)
    text = _config_fields(fields.pop("text_config", {}))
    text.setdefault("hidden_size_per_layer_input", 0)  # the unified text config has no PLE fields
    return Gemma4AssistantConfig(**fields, text_config=text)


def read_text_config(folder: Path):
    """The text-decoder config, whether the checkpoint is multimodal, unified or text-only."""
    from transformers import Gemma4TextConfig

    raw = read_config(folder)
    model_type = raw.get("model_type")
    if model_type not in TEXT_MODEL_TYPES:
        raise CheckpointError(f"{folder}/config.json: model_type {model_type!r} is not one of {TEXT_MODEL_TYPES}")
    text = _config_fields(raw.get("text_config", raw))
    if model_type.startswith("gemma4_unified"):
        # The unified (12B) text config has no PLE fields; Gemma4TextConfig's default would turn PLE on.
        text.setdefault("hidden_size_per_layer_input", 0)
    return Gemma4TextConfig(**text)


class CheckpointReader:
    """Tensors by text-decoder key ("layers.0.self_attn.q_proj.weight"), under any known prefix."""

    PREFIXES = (MULTIMODAL_PREFIX, TEXT_PREFIX, "")

    def __init__(self, folder: Path):
        from safetensors import safe_open

        self.folder = folder
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{folder}: no *.safetensors files")
        self._handles = [safe_open(str(f), framework="pt") for f in files]
        self._where = {k: h for h in self._handles for k in h.keys()}

    def _resolve(self, key: str) -> str | None:
        for prefix in self.PREFIXES:
            if prefix + key in self._where:
                return prefix + key
        return None

    def get(self, key: str) -> torch.Tensor:
        full = self._resolve(key)
        if full is None:
            raise CheckpointError(
                f"{self.folder}: checkpoint has no tensor {key!r} (looked under prefixes {self.PREFIXES})"
            )
        return self._where[full].get_tensor(full)

    def get_slice(self, key: str, dim: int, start: int, stop: int) -> torch.Tensor:
        """Only the rows/columns one tensor-parallel rank owns, without reading the rest."""
        full = self._resolve(key)
        if full is None:
            return self.get(key)
        sl = self._where[full].get_slice(full)
        index = [slice(None)] * len(sl.get_shape())
        index[dim] = slice(start, stop)
        return sl[tuple(index)]

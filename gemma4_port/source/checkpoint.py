"""Checkpoints: random ones materialised as real Hugging Face folders, real ones downloaded with
huggingface_hub, and a strict reader that finds each tensor under whichever prefix the file uses."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from contract.errors import Gemma4Error
from contract.files import read_parsed
from gemma4_port.source.manifest import Manifest
from gemma4_port.source.model_sources import RandomDrafter, RandomModel, Speculative, is_hub_id
from gemma4_port.source.toy_tokenizer import (
    EOS_ID,
    TEMPLATE_FILE,
    TOOL_RESPONSE,
    TURN_END,
    save_tokenizer,
    train_tokenizer,
)

# Hub checkpoints are saved by the multimodal class; the text decoder lives under this prefix.
MULTIMODAL_PREFIX = "model.language_model."
TEXT_PREFIX = "model."
TEXT_MODEL_TYPES = ("gemma4", "gemma4_unified", "gemma4_text", "gemma4_unified_text")
DRAFTER_MODEL_TYPES = ("gemma4_assistant", "gemma4_unified_assistant")
# Part of a random checkpoint's cache key: bump it when the writer's output changes, so that a cache
# made by an older writer (e.g. one with Gemma-3's chat tokens) is never reused.
RANDOM_FORMAT = "3"  # 3: vision / audio towers and their processors when the manifest gives their configs
AUDIO_PROCESSOR = "audio_processor"  # the feature extractor's folder in a checkpoint and an artifact


class CheckpointError(Gemma4Error, RuntimeError):
    pass


def cache_root() -> Path:
    return Path(os.environ.get("GEMMA4_INF2_CACHE", Path.home() / ".cache" / "gemma4-inf2"))


def resolve_checkpoint(manifest: Manifest, progress=None) -> Path:
    """The local folder holding the manifest's checkpoint, creating or downloading it if needed."""
    src = manifest.model
    if src.random is not None:
        # The chat template is written into the checkpoint too: a change to it makes a new one.
        made_of = RANDOM_FORMAT + src.random.model_dump_json() + TEMPLATE_FILE.read_text()
        key = hashlib.sha256(made_of.encode()).hexdigest()[:12]
        folder = cache_root() / "random" / f"{manifest.name}-{key}"
        if not folder.is_dir():
            # Written aside and renamed: concurrent builds never see (or write) a half-made checkpoint.
            folder.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
            write_random_checkpoint(src.random, tmp)
            try:
                tmp.rename(folder)
            except OSError:  # another process finished first; its bytes are the same
                shutil.rmtree(tmp)
        return folder
    folder = local_folder(manifest)
    if folder is not None:
        return _pinned(folder, src.digest, "model.digest")
    return _local_or_download(src.source, src.revision)


def resolve_drafter(manifest: Manifest, spec: Speculative, backbone: int) -> Path:
    """The local folder holding the speculative drafter's checkpoint (a random one is written for a
    target of width `backbone`, like a random target)."""
    if spec.random is not None:
        random = spec.random
        return _random_folder(
            f"{manifest.name}-drafter",
            random.model_dump_json() + f"/{backbone}",
            lambda tmp: write_random_drafter(random, backbone, tmp),
        )
    assert spec.drafter is not None  # Speculative.has_drafter, checked by the caller
    folder = _local_source(manifest, spec.drafter, "speculative.drafter")
    if folder is not None:
        return _pinned(folder, spec.digest, "speculative.digest")
    return _local_or_download(spec.drafter, spec.revision)


def _pinned(folder: Path, digest: str | None, field: str) -> Path:
    """`folder`, if its files are what the manifest's `field` pins (or nothing is pinned)."""
    if digest is not None and (found := folder_digest(folder)) != digest:
        raise CheckpointError(
            f"{folder}: its files' digest is {found}, but the manifest pins {digest} "
            f"(the folder changed since the manifest was written: restore it, or update {field})"
        )
    return folder


def _random_folder(name: str, spec_json: str, write) -> Path:
    key = hashlib.sha256((RANDOM_FORMAT + spec_json).encode()).hexdigest()[:12]
    folder = cache_root() / "random" / f"{name}-{key}"
    if not folder.is_dir():
        # Written aside and renamed: concurrent builds never see (or write) a half-made checkpoint.
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        write(tmp)
        try:
            tmp.rename(folder)
        except OSError:  # another process finished first; its bytes are the same
            shutil.rmtree(tmp)
    return folder


def _local_or_download(source: str, revision: str | None) -> Path:
    if Path(source).expanduser().is_dir():
        return Path(source).expanduser()
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(
                source,
                revision=revision,
                allow_patterns=["*.json", "*.safetensors", "*.jinja", "tokenizer*"],
            )
        )
    except Exception as exc:  # noqa: BLE001 - the hub raises HTTP, OS and value errors alike: one line for all
        raise CheckpointError(
            f"cannot download {source}@{revision or 'main'}: {exc} "
            "(gated models need `huggingface-cli login` or HF_TOKEN)"
        ) from None


def local_folder(manifest: Manifest) -> Path | None:
    """The manifest's local checkpoint folder, a relative one taken from the manifest's own folder
    (so that a shipped manifest finds the checkpoint shipped beside it); None for a hub id."""
    return _local_source(manifest, manifest.model.source, "model.source")


def _local_source(manifest: Manifest, source: str | None, field: str) -> Path | None:
    """`source` as a local folder, a relative one taken from the manifest's own folder; None for a hub id."""
    if source is None or is_hub_id(source) and not Path(source).is_dir():
        return None
    folder = Path(source).expanduser()
    if not folder.is_absolute() and manifest.path is not None and (manifest.path.parent / folder).is_dir():
        folder = manifest.path.parent / folder
    if not folder.is_dir():
        raise CheckpointError(f"{manifest.path or manifest.name}: {field} {source!r}: no such folder")
    return folder.resolve()


def folder_digest(folder: Path) -> str:
    """sha256 over the folder's files, by relative path and content: what `model.digest` pins (and
    `speculative.digest`, the drafter's)."""
    outer = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        outer.update(path.relative_to(folder).as_posix().encode() + b"\0")
        outer.update(hashlib.sha256(path.read_bytes()).digest())
    return "sha256:" + outer.hexdigest()


def _randomise(model: torch.nn.Module, text: torch.nn.Module, spec: RandomModel | RandomDrafter) -> None:
    """Weights that exercise what matters (layer_scalar far from 1, logits past the softcap) while
    staying as well-conditioned as a trained model, so that bf16 can be judged against float32.
    `text` is the text decoder inside `model`."""
    gen = torch.Generator().manual_seed(spec.seed)

    def normal(shape, std=1.0, mean=0.0):
        return mean + std * torch.randn(shape, generator=gen)

    text_params = list(text.named_parameters())
    if not spec.config.get("tie_word_embeddings", True):
        text_params.append(("lm_head.weight", model.lm_head.weight))
    with torch.no_grad():
        for name, p in text_params:
            if name.endswith("norm.weight"):
                p.copy_(normal(p.shape, 0.2, 1.0))
            elif "embed_tokens" in name:
                p.copy_(normal(p.shape, spec.init_std))
            else:  # fan-in scaling keeps activations O(1)
                p.copy_(normal(p.shape) / p.shape[-1] ** 0.5)
        text.norm.weight.copy_(3.0 + 2.0 * torch.rand(text.norm.weight.shape, generator=gen))
        residual = 1.0  # scale of the residual stream entering each layer, relative to the embedding
        for layer in text.layers:
            attn = layer.self_attn
            for norm in (attn.q_norm, getattr(attn, "k_norm", None)):
                if norm is not None:  # softer attention: one-hot attention makes any rounding flip the output
                    norm.weight.mul_(0.5)
            # Each layer adds a small update relative to the residual it receives, as a trained one does;
            # at full gain the random net is chaotic and bf16 could not be judged against float32.
            for norm in ("post_attention_layernorm", "post_feedforward_layernorm", "post_per_layer_input_norm"):
                if hasattr(layer, norm):
                    getattr(layer, norm).weight.mul_(residual)
            # Far from 1 on both sides (a loader that skips buffers leaves 1.0): alternating shrink and
            # growth keeps the residual well above RMSNorm's eps however many layers there are.
            scalar = 0.25 + 0.35 * torch.rand(1, generator=gen)
            layer.layer_scalar.copy_(scalar if layer.self_attn.layer_idx % 2 == 0 else 1.0 / scalar)
            residual *= float(layer.layer_scalar)
        _randomise_media(model, text, spec)


def _randomise_media(model: torch.nn.Module, text: torch.nn.Module, spec: RandomModel) -> None:
    """The vision tower and embedder, from a generator of their own (the text weights stay those of
    the same model without them): fan-in scaled weights, norms near 1, standardization and clipping
    bounds that bite (a port that skips them differs)."""
    gen = torch.Generator().manual_seed(spec.seed + 1)
    text_names = {id(p) for p in text.parameters()}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if id(p) in text_names or name == "lm_head.weight":
                continue
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("position_embedding_table"):
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
        for name, b in model.named_buffers():
            if name.endswith("std_bias"):
                b.copy_(0.5 * torch.randn(b.shape, generator=gen))
            elif name.endswith("std_scale"):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))
            elif name.endswith(("input_min", "output_min")):
                b.fill_(-1.5)
            elif name.endswith(("input_max", "output_max")):
                b.fill_(1.5)


def write_random_checkpoint(spec: RandomModel, folder: Path) -> None:
    """A folder laid out like a hub download of `Gemma4ForConditionalGeneration`, same bytes per seed."""
    from transformers import (
        Gemma4AudioConfig,
        Gemma4Config,
        Gemma4ForCausalLM,
        Gemma4ForConditionalGeneration,
        Gemma4TextConfig,
        Gemma4VisionConfig,
    )

    text = Gemma4TextConfig(**spec.config)
    # E2B/E4B (the models with per-layer inputs) open a non-thinking turn bare, the others with an
    # empty thought block, as the real templates do.
    tok = train_tokenizer(text.vocab_size, spec.seed, empty_thought_block=not text.hidden_size_per_layer_input)
    if spec.vision is None and spec.audio is None:
        model = Gemma4ForCausalLM(text)
        _randomise(model, model.model, spec)
    else:  # the hub's own class: its state dict is the hub's key layout already
        vision = Gemma4VisionConfig(**spec.vision) if spec.vision is not None else None
        audio = Gemma4AudioConfig(**spec.audio) if spec.audio is not None else None
        model = Gemma4ForConditionalGeneration(
            Gemma4Config(text_config=text, vision_config=vision, audio_config=audio, **media_token_ids(tok))
        )
        _randomise(model, model.model.language_model, spec)
    write_checkpoint(model, tok, folder)


def write_checkpoint(model, tok, folder: Path, dtype: torch.dtype | None = None) -> None:
    """A `Gemma4ForCausalLM` (or a whole `Gemma4ForConditionalGeneration`) and its tokenizer as a hub
    download of `Gemma4ForConditionalGeneration` lays them out: multimodal tensor names
    (model.language_model.*, model.{vision,audio}_tower.*, model.embed_{vision,audio}.*), the
    multimodal config with the tokenizer's media ids, the image processor's and feature extractor's
    settings where there are towers, a generation config and the tokenizer."""
    from safetensors.torch import save_file
    from transformers import Gemma4Config, GenerationConfig

    if hasattr(model.model, "language_model"):  # the multimodal class
        full, state = model.config, model.state_dict()
    else:
        full = Gemma4Config(text_config=model.config, vision_config=None, audio_config=None, **media_token_ids(tok))
        state = {
            MULTIMODAL_PREFIX + k.removeprefix(TEXT_PREFIX) if k.startswith(TEXT_PREFIX) else k: v
            for k, v in model.state_dict().items()
        }
    text = full.text_config
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for key, value in state.items():
        if key == "lm_head.weight" and text.tie_word_embeddings:
            continue
        value = value.to(dtype) if dtype is not None and value.is_floating_point() else value
        tensors[key] = value.contiguous().clone()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    full.architectures = ["Gemma4ForConditionalGeneration"]
    full.save_pretrained(folder)
    if full.vision_config is not None:
        from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

        vision = full.vision_config
        Gemma4ImageProcessorPil(
            patch_size=vision.patch_size, pooling_kernel_size=vision.pooling_kernel_size
        ).save_pretrained(folder)
    if full.audio_config is not None:  # beside the image processor's preprocessor_config.json (same name)
        from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

        Gemma4AudioFeatureExtractor().save_pretrained(folder / AUDIO_PROCESSOR)
    # A reply ends at <turn|>, and a tool call at <|tool_response> (the caller runs the tool).
    GenerationConfig(
        bos_token_id=text.bos_token_id,
        pad_token_id=text.pad_token_id,
        do_sample=False,
        eos_token_id=[EOS_ID, *tok.convert_tokens_to_ids([TURN_END, TOOL_RESPONSE])],
    ).save_pretrained(folder)
    save_tokenizer(tok, folder)


def media_token_ids(tok) -> dict[str, int]:
    """Gemma4Config's marker and placeholder ids, from the tokenizer's named tokens (a tiny vocabulary
    holds them at small ids; the config's defaults are the real vocabulary's)."""
    names = {
        "boi_token_id": "boi_token",
        "eoi_token_id": "eoi_token",
        "image_token_id": "image_token",
        "video_token_id": "video_token",
        "boa_token_id": "boa_token",
        "eoa_token_index": "eoa_token",
        "audio_token_id": "audio_token",
    }
    # a tokenizer without Gemma-4's named media tokens leaves the config's defaults
    return {
        field: tok.convert_tokens_to_ids(getattr(tok, name))
        for field, name in names.items()
        if getattr(tok, name, None)
    }


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
    return kind(**{k: v for k, v in raw.items() if k not in ("model_type", "architectures", "transformers_version")})


def write_random_drafter(spec: RandomDrafter, backbone: int, folder: Path) -> None:
    """A folder laid out like a hub download of a Gemma-4 assistant (Gemma4AssistantForCausalLM) for a
    target of width `backbone`, same bytes per seed; its centroid head's vocabulary order is a random
    permutation."""
    from safetensors.torch import save_file
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

    config = Gemma4AssistantConfig(**spec.assistant_fields(backbone))
    model = Gemma4AssistantForCausalLM(config)
    _randomise(model, model.model, spec)
    if model.masked_embedding is not None:
        order = torch.randperm(config.text_config.vocab_size, generator=torch.Generator().manual_seed(spec.seed))
        model.masked_embedding.token_ordering.copy_(order)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config.architectures = ["Gemma4AssistantForCausalLM"]
    config.save_pretrained(folder)


def read_drafter_config(folder: Path):
    """A drafter checkpoint's Gemma4AssistantConfig (the 12B's unified assistant has the same fields)."""
    from transformers import Gemma4AssistantConfig

    raw = read_parsed(
        folder / "config.json", json.loads, CheckpointError, missing=f"{folder}/config.json is missing", syntax="JSON"
    )
    if raw.get("model_type") not in DRAFTER_MODEL_TYPES:
        raise CheckpointError(
            f"{folder}/config.json: model_type {raw.get('model_type')!r} is not a Gemma-4 assistant "
            f"{DRAFTER_MODEL_TYPES}"
        )
    fields = {k: v for k, v in raw.items() if k not in ("model_type", "architectures", "transformers_version")}
    text = {k: v for k, v in fields.pop("text_config", {}).items() if k not in ("model_type", "architectures")}
    text.setdefault("hidden_size_per_layer_input", 0)  # the unified text config has no PLE fields
    return Gemma4AssistantConfig(**fields, text_config=text)


def read_text_config(folder: Path):
    """The text-decoder config, whether the checkpoint is multimodal, unified or text-only."""
    from transformers import Gemma4TextConfig

    raw = read_config(folder)
    model_type = raw.get("model_type")
    if model_type not in TEXT_MODEL_TYPES:
        raise CheckpointError(f"{folder}/config.json: model_type {model_type!r} is not one of {TEXT_MODEL_TYPES}")
    text = raw.get("text_config", raw)
    text = {k: v for k, v in text.items() if k not in ("model_type", "architectures", "transformers_version")}
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

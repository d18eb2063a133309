"""Writing a checkpoint folder as a hub download lays it out: random weights that exercise what matters (for the
test models), or a trained model's, with its config, processors, generation config and tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from gemma4_port.source.checkpoint_files import MULTIMODAL_PREFIX, TEXT_PREFIX
from gemma4_port.source.model_sources import RandomDrafter, RandomModel
from gemma4_port.source.toy_tokenizer import EOS_ID, TOOL_RESPONSE, TURN_END, save_tokenizer, train_tokenizer


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
    _save_processors(folder, full)
    # A reply ends at <turn|>, and a tool call at <|tool_response> (the caller runs the tool).
    GenerationConfig(
        bos_token_id=text.bos_token_id,
        pad_token_id=text.pad_token_id,
        do_sample=False,
        eos_token_id=[EOS_ID, *tok.convert_tokens_to_ids([TURN_END, TOOL_RESPONSE])],
    ).save_pretrained(folder)
    save_tokenizer(tok, folder)


def _save_processors(folder: Path, full) -> None:
    """The processors' settings as a hub checkpoint saved by transformers 5 holds them: one
    processor_config.json with each processor's settings (its own JSON) under its attribute name, as
    ProcessorMixin.to_dict writes it (Gemma4Processor itself cannot be built without torchvision, for its
    video processor); transformers' `from_pretrained` of each class reads its own section from the folder."""
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    sections: dict[str, dict] = {}
    if full.vision_config is not None:
        vision = full.vision_config
        image = Gemma4ImageProcessorPil(patch_size=vision.patch_size, pooling_kernel_size=vision.pooling_kernel_size)
        sections["image_processor"] = json.loads(image.to_json_string())
    if full.audio_config is not None:
        sections["feature_extractor"] = json.loads(Gemma4AudioFeatureExtractor().to_json_string())
    if sections:
        config = {**sections, "processor_class": "Gemma4Processor"}
        (folder / "processor_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


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

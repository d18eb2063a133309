"""The independent float reference: transformers' own Gemma-4 on the CPU, in float32."""

from __future__ import annotations

from pathlib import Path

import torch

from gemma4_port.source.checkpoint_files import (
    MULTIMODAL_PREFIX,
    CheckpointError,
    read_audio_config,
    read_text_config,
    read_vision_config,
)

# Without this mapping, from_pretrained on a hub checkpoint loads nothing and raises nothing.
KEY_MAPPING = {r"^" + MULTIMODAL_PREFIX.replace(".", r"\."): "model."}


def load_reference(folder: Path):
    """Gemma4ForConditionalGeneration where the checkpoint has a vision tower (it takes pixel_values),
    else the text model alone."""
    from transformers import Gemma4ForCausalLM, Gemma4ForConditionalGeneration

    if read_vision_config(folder) is not None or read_audio_config(folder) is not None:
        model, info = Gemma4ForConditionalGeneration.from_pretrained(
            str(folder), dtype=torch.float32, attn_implementation="eager", output_loading_info=True
        )
        config = model.config.get_text_config()
    else:
        config = read_text_config(folder)
        config._attn_implementation = "eager"
        model, info = Gemma4ForCausalLM.from_pretrained(
            str(folder),
            config=config,
            key_mapping=KEY_MAPPING,
            dtype=torch.float32,
            output_loading_info=True,
        )
    missing = [k for k in info["missing_keys"] if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing:
        raise CheckpointError(f"{folder}: the reference model did not find {len(missing)} tensors, e.g. {missing[:3]}")
    return model.eval()


def media_inputs(model, ids: list[int], images=(), clips=()) -> dict[str, torch.Tensor]:
    """Gemma4ForConditionalGeneration's media inputs for a prompt: the processors' features of its
    images and audio clips, in order (clips padded to the longest, as the feature extractor pads a
    batch), and the mm_token_type_ids the processor gives (1 on each image soft token: the blocks
    that see each other both ways where the model says so)."""
    out = {}
    if images:
        out |= {
            "pixel_values": torch.cat([f["pixel_values"] for f in images]),
            "image_position_ids": torch.cat([f["image_position_ids"] for f in images]),
            "mm_token_type_ids": (torch.tensor([ids]) == model.config.image_token_id).long(),
        }
    if clips:
        F = max(f["input_features"].shape[1] for f in clips)

        def pad(t, value=0):
            return torch.nn.functional.pad(
                t, (0, 0, 0, F - t.shape[1]) if t.dim() == 3 else (0, F - t.shape[1]), value=value
            )

        out |= {
            "input_features": torch.cat([pad(f["input_features"]) for f in clips]),
            "input_features_mask": torch.cat([pad(f["input_features_mask"]) for f in clips]),
        }
    return out


@torch.no_grad()
def reference_greedy(model, ids: list[int], steps: int, images=(), clips=()) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens and the (softcapped) logits that chose each, ignoring EOS so lengths are fixed.
    images: the processor's features of each image in the prompt, in order (pixel_values,
    image_position_ids), and of each audio clip (input_features, input_features_mask), for a
    Gemma4ForConditionalGeneration."""
    from transformers import DynamicCache

    media = media_inputs(model, ids, images, clips)
    # transformers 5.24 renamed forward's `past_key_values` to `cache` (the old name goes in 5.40).
    cache = DynamicCache(config=model.config.get_text_config())  # filled in place by every call
    out = model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=1, **media)
    tokens, logits = [], []
    for i in range(steps):
        step = out.logits[0, -1].float()
        logits.append(step)
        tokens.append(int(step.argmax()))
        if i + 1 < steps:
            out = model(input_ids=torch.tensor([[tokens[-1]]]), cache=cache, use_cache=True)
    return tokens, logits

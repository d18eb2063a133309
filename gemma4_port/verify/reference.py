"""The independent float reference: transformers' own Gemma-4 on the CPU, in float32."""

from __future__ import annotations

from pathlib import Path

import torch

from gemma4_port.source.checkpoint import MULTIMODAL_PREFIX, CheckpointError, read_text_config

# Without this mapping, from_pretrained on a hub checkpoint loads nothing and raises nothing.
KEY_MAPPING = {r"^" + MULTIMODAL_PREFIX.replace(".", r"\."): "model."}


def load_reference(folder: Path):
    from transformers import Gemma4ForCausalLM

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


@torch.no_grad()
def reference_greedy(model, ids: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens and the (softcapped) logits that chose each, ignoring EOS so lengths are fixed."""
    from transformers import DynamicCache

    # transformers 5.24 renamed forward's `past_key_values` to `cache` (the old name goes in 5.40).
    cache = DynamicCache(config=model.config)  # filled in place by every call
    out = model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=1)
    tokens, logits = [], []
    for i in range(steps):
        step = out.logits[0, -1].float()
        logits.append(step)
        tokens.append(int(step.argmax()))
        if i + 1 < steps:
            out = model(input_ids=torch.tensor([[tokens[-1]]]), cache=cache, use_cache=True)
    return tokens, logits

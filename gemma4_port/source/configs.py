"""The text config of a manifest's model without its weights: planning and sharding need shapes
only. Random models carry their config; hub models have their config.json fetched alone, or, with
no network, the published shapes of the three real checkpoints below (and their assistants' assumed
ones: ASSUMED_DRAFTER_CONFIGS)."""

from __future__ import annotations

from gemma4_port.source.manifest import Manifest


def _pattern(sliding: int, repeats: int) -> list[str]:
    return (["sliding_attention"] * sliding + ["full_attention"]) * repeats


_COMMON = dict(
    vocab_size=262_144,
    vocab_size_per_layer_input=262_144,
    head_dim=256,
    global_head_dim=512,
    final_logit_softcapping=30.0,
    tie_word_embeddings=True,
    hidden_activation="gelu_pytorch_tanh",
)

# The published checkpoints' config.json shapes, used when config.json cannot be fetched.
KNOWN_TEXT_CONFIGS: dict[str, dict] = {
    "google/gemma-4-E2B-it": _COMMON
    | dict(
        hidden_size=1536,
        intermediate_size=6144,
        num_hidden_layers=35,
        layer_types=_pattern(4, 7),
        num_attention_heads=8,
        num_key_value_heads=1,
        hidden_size_per_layer_input=256,
        num_kv_shared_layers=20,
        sliding_window=512,
        use_double_wide_mlp=True,
    ),
    "google/gemma-4-E4B-it": _COMMON
    | dict(
        hidden_size=2560,
        intermediate_size=10240,
        num_hidden_layers=42,
        layer_types=_pattern(5, 7),
        num_attention_heads=8,
        num_key_value_heads=2,
        hidden_size_per_layer_input=256,
        num_kv_shared_layers=18,
        sliding_window=512,
    ),
    "google/gemma-4-12B-it": _COMMON
    | dict(
        hidden_size=3840,
        intermediate_size=15360,
        num_hidden_layers=48,
        layer_types=_pattern(5, 8),
        num_attention_heads=16,
        num_key_value_heads=8,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        hidden_size_per_layer_input=0,
        num_kv_shared_layers=0,
        sliding_window=1024,
    ),
}


def _assistant(target: str, ordered: bool) -> dict:
    """An assistant's Gemma4AssistantConfig fields as assumed for `target` (see ASSUMED_DRAFTER_CONFIGS)."""
    t = KNOWN_TEXT_CONFIGS[target]
    text = {
        key: t[key]
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")
        + ("head_dim", "global_head_dim", "sliding_window", "final_logit_softcapping", "hidden_activation")
        + tuple(k for k in ("num_global_key_value_heads", "attention_k_eq_v") if k in t)  # the 12B's 1 global KV head
    }
    layers = t["layer_types"][-4:]  # the target's last four: sliding ones, then a full one
    text |= dict(
        num_hidden_layers=4,
        layer_types=layers,
        num_kv_shared_layers=4,
        vocab_size_per_layer_input=0,
        hidden_size_per_layer_input=0,
        use_double_wide_mlp=False,
        tie_word_embeddings=True,
    )
    return dict(backbone_hidden_size=t["hidden_size"], use_ordered_embeddings=ordered, text_config=text)


# The hub assistants' shapes as ASSUMED here, for `plan` and the manifest checks with no network (a
# compile reads the real config.json): transformers 5.24's Gemma4AssistantConfig rules (every layer
# kv-shared, no PLE, a single-wide MLP, backbone_hidden_size = the target's width, 2,048 centroids of
# which 32 are kept) with 4 layers shaped as the target's last four (the kv-shared layers read the
# target's caches, so their head shapes must be the target's). The E2B and E4B assistants with the
# tied head, the 12B's (Gemma4UnifiedAssistantConfig) with the centroid-masked ordered head. Their
# real widths, layer count, head and weights are known only from their checkpoints.
ASSUMED_DRAFTER_CONFIGS: dict[str, dict] = {
    "google/gemma-4-E2B-it-assistant": _assistant("google/gemma-4-E2B-it", ordered=False),
    "google/gemma-4-E4B-it-assistant": _assistant("google/gemma-4-E4B-it", ordered=False),
    "google/gemma-4-12B-it-assistant": _assistant("google/gemma-4-12B-it", ordered=True),
}


def vision_config_for(manifest: Manifest, offline: bool = True):
    """The vision tower's Gemma4VisionConfig, or None for a random model without one. The published
    checkpoints' towers, offline, take transformers' default Gemma4VisionConfig (16 layers at width
    768, patch 16, pooling kernel 3): their config.json is read only online."""
    from transformers import Gemma4VisionConfig

    src = manifest.model
    if src.random is not None:
        return Gemma4VisionConfig(**src.random.vision) if src.random.vision is not None else None
    if src.source in KNOWN_TEXT_CONFIGS and offline:
        return Gemma4VisionConfig()
    from gemma4_port.source.checkpoint import resolve_checkpoint
    from gemma4_port.source.checkpoint_files import read_vision_config

    return read_vision_config(resolve_checkpoint(manifest))


def audio_config_for(manifest: Manifest, offline: bool = True):
    """The audio tower's Gemma4AudioConfig, or None (a random model without one; the 12B has none).
    The published E2B / E4B towers, offline, take transformers' default Gemma4AudioConfig."""
    from transformers import Gemma4AudioConfig

    src = manifest.model
    if src.random is not None:
        return Gemma4AudioConfig(**src.random.audio) if src.random.audio is not None else None
    if src.source in KNOWN_TEXT_CONFIGS and offline:
        return None if KNOWN_TEXT_CONFIGS[src.source]["hidden_size_per_layer_input"] == 0 else Gemma4AudioConfig()
    from gemma4_port.source.checkpoint import resolve_checkpoint
    from gemma4_port.source.checkpoint_files import read_audio_config

    return read_audio_config(resolve_checkpoint(manifest))


def text_config_for(manifest: Manifest, offline: bool = True):
    """A Gemma4TextConfig for the manifest's model, reading no weights."""
    from transformers import Gemma4TextConfig

    src = manifest.model
    if src.random is not None:
        return Gemma4TextConfig(**src.random.config)
    if src.source in KNOWN_TEXT_CONFIGS and offline:
        return Gemma4TextConfig(**KNOWN_TEXT_CONFIGS[src.source])
    from gemma4_port.source.checkpoint import resolve_checkpoint
    from gemma4_port.source.checkpoint_files import read_text_config

    return read_text_config(resolve_checkpoint(manifest))


def drafter_config_source(manifest: Manifest, offline: bool = True) -> str | None:
    """Where drafter_config_for takes the drafter's config from, in words (None without a drafter)."""
    spec = manifest.speculative
    if spec is None or not spec.has_drafter:
        return None
    if spec.random is not None:
        return "the manifest's random drafter"
    if spec.drafter in ASSUMED_DRAFTER_CONFIGS and offline:
        return f"{spec.drafter}, assumed shapes (source/configs.py ASSUMED_DRAFTER_CONFIGS)"
    from gemma4_port.source.checkpoint import drafter_folder

    folder = drafter_folder(manifest)
    return f"{folder / 'config.json'}" if folder is not None else f"{spec.drafter}'s config.json on the hub"


def drafter_config_for(manifest: Manifest, offline: bool = True):
    """The Gemma4AssistantConfig of the manifest's speculative drafter, reading no weights (a hub
    drafter's config.json alone is fetched; offline, a shipped one's assumed shapes); None without one."""
    spec = manifest.speculative
    if spec is None or not spec.has_drafter:
        return None
    from transformers import Gemma4AssistantConfig

    if spec.random is not None:
        return Gemma4AssistantConfig(**spec.random.assistant_fields(text_config_for(manifest).hidden_size))
    if spec.drafter in ASSUMED_DRAFTER_CONFIGS and offline:
        return Gemma4AssistantConfig(**ASSUMED_DRAFTER_CONFIGS[spec.drafter])
    from pathlib import Path

    from gemma4_port.source.checkpoint import drafter_folder
    from gemma4_port.source.checkpoint_files import CheckpointError, read_drafter_config

    folder = drafter_folder(manifest)  # a relative folder from the manifest's own
    if folder is None:
        from huggingface_hub import hf_hub_download

        try:
            folder = Path(hf_hub_download(spec.drafter, "config.json", revision=spec.revision)).parent
        except Exception as exc:  # noqa: BLE001 - the hub raises HTTP, OS and value errors alike: one line for all
            raise CheckpointError(f"cannot fetch the drafter's config.json from {spec.drafter}: {exc}") from None
    return read_drafter_config(folder)

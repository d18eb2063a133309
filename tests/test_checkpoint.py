import json

import pytest
import torch
from safetensors import safe_open
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

from contract.artifact import sha256
from contract.tokenizer import load_tokenizer
from gemma4_port.source.checkpoint import resolve_checkpoint
from gemma4_port.source.checkpoint_files import MULTIMODAL_PREFIX, CheckpointError, CheckpointReader, read_text_config
from gemma4_port.source.checkpoint_writer import write_random_checkpoint
from gemma4_port.source.manifest import load_manifest
from gemma4_port.verify.reference import load_reference, reference_greedy
from support import MANIFESTS

TINY = ["tiny-e2b", "tiny-e4b", "tiny-12b"]


def _ckpt(name):
    return resolve_checkpoint(load_manifest(MANIFESTS / f"{name}.yaml"))


def test_random_checkpoint_has_the_hub_layout():
    folder = _ckpt("tiny-e2b")
    names = {p.name for p in folder.iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    } <= names
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "gemma4" and config["architectures"] == ["Gemma4ForConditionalGeneration"]
    assert config["text_config"]["num_kv_shared_layers"] == 5
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    # Gemma4ForConditionalGeneration's own layout: the text decoder, the vision and audio towers and their embedders.
    towers = ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio.")
    assert all(k.startswith((MULTIMODAL_PREFIX, *towers)) for k in keys)
    assert "model.audio_tower.layers.0.self_attn.relative_k_proj.weight" in keys
    # The processors' settings as a hub checkpoint holds them, each read from the folder by its own class.
    image, audio = Gemma4ImageProcessorPil.from_pretrained(folder), Gemma4AudioFeatureExtractor.from_pretrained(folder)
    assert image.patch_size == config["vision_config"]["patch_size"]
    assert audio.to_json_string() == Gemma4AudioFeatureExtractor().to_json_string()
    assert f"{MULTIMODAL_PREFIX}layers.0.layer_scalar" in keys  # buffers are in the checkpoint
    assert "model.vision_tower.std_scale" in keys and "model.embed_vision.embedding_projection.weight" in keys
    # The tiny vocabulary holds the media markers and placeholders, and the tokenizer names them so.
    tok = load_tokenizer(folder)
    assert config["image_token_id"] == tok.image_token_id < config["text_config"]["vocab_size"]
    assert (config["boi_token_id"], config["eoi_token_id"]) == (tok.boi_token_id, tok.eoi_token_id)


def test_a_vision_tower_leaves_the_text_weights_as_they_were(tmp_path):
    """The vision weights come from a generator of their own: the same seed's text decoder is the
    same with or without them (the text-only artifacts' goldens do not move)."""
    spec = load_manifest(MANIFESTS / "tiny-12b.yaml").model.random
    write_random_checkpoint(spec.model_copy(update={"vision": None}), tmp_path / "text")
    with safe_open(str(tmp_path / "text" / "model.safetensors"), "pt") as bare:
        with safe_open(str(_ckpt("tiny-12b") / "model.safetensors"), "pt") as full:
            assert set(bare.keys()) < set(full.keys())
            for key in bare.keys():
                assert torch.equal(bare.get_tensor(key), full.get_tensor(key)), key


def test_same_seed_same_bytes(tmp_path):
    spec = load_manifest(MANIFESTS / "tiny-12b.yaml").model.random
    write_random_checkpoint(spec, tmp_path / "a")
    write_random_checkpoint(spec, tmp_path / "b")
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in files:
        assert sha256(tmp_path / "a" / name) == sha256(tmp_path / "b" / name), name


@pytest.mark.parametrize("name", TINY)
def test_weights_exercise_layer_scalar_and_softcap(name):
    folder = _ckpt(name)
    reader = CheckpointReader(folder)
    config = read_text_config(folder)
    scalars = [float(reader.get(f"layers.{i}.layer_scalar")) for i in range(config.num_hidden_layers)]
    assert min(abs(s - 1.0) for s in scalars) > 0.4, scalars
    model = load_reference(folder)
    model.config.final_logit_softcapping = None  # raw logits, to see how far past the cap they reach
    _, logits = reference_greedy(model, [2, 100, 200, 300], 4)
    raw = torch.stack(logits)
    capped = torch.tanh(raw / 30.0) * 30.0
    assert float(raw.abs().max()) > 15.0
    assert float((raw - capped).abs().max()) > 1.0  # the cap changes the values, not just in theory


def test_naive_load_of_the_multimodal_layout_is_silently_random_and_ours_is_not():
    from transformers import Gemma4ForCausalLM

    folder = _ckpt("tiny-e2b")
    reader = CheckpointReader(folder)
    want = reader.get("layers.3.self_attn.q_proj.weight")
    naive = Gemma4ForCausalLM.from_pretrained(str(folder), config=read_text_config(folder))
    assert not torch.equal(naive.model.layers[3].self_attn.q_proj.weight, want)  # the pitfall is real
    ours = load_reference(folder).model.language_model  # a checkpoint with a vision tower: the multimodal class
    assert torch.equal(ours.layers[3].self_attn.q_proj.weight, want)
    assert torch.equal(ours.layers[3].layer_scalar, reader.get("layers.3.layer_scalar"))


def test_reader_names_a_missing_key():
    reader = CheckpointReader(_ckpt("tiny-12b"))
    with pytest.raises(CheckpointError, match="no tensor 'layers.99.mlp.up_proj.weight'"):
        reader.get("layers.99.mlp.up_proj.weight")


def test_reader_slices_without_reading_the_rest():
    reader = CheckpointReader(_ckpt("tiny-12b"))
    full = reader.get("layers.0.mlp.gate_proj.weight")
    assert torch.equal(reader.get_slice("layers.0.mlp.gate_proj.weight", 0, 64, 128), full[64:128])
    assert torch.equal(
        reader.get_slice("layers.0.mlp.down_proj.weight", 1, 0, 64), reader.get("layers.0.mlp.down_proj.weight")[:, :64]
    )


def test_config_errors_name_the_file(tmp_path):
    with pytest.raises(CheckpointError, match="config.json is missing"):
        read_text_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CheckpointError, match="model_type 'llama'"):
        read_text_config(tmp_path)


def test_unified_12b_config_reads_as_a_text_config_without_ple(tmp_path):
    from transformers import Gemma4UnifiedConfig, Gemma4UnifiedTextConfig

    from gemma4_port.source.configs import KNOWN_TEXT_CONFIGS

    shapes = {
        k: v
        for k, v in KNOWN_TEXT_CONFIGS["google/gemma-4-12B-it"].items()
        if k not in ("hidden_size_per_layer_input", "vocab_size_per_layer_input")
    }
    Gemma4UnifiedConfig(text_config=Gemma4UnifiedTextConfig(**shapes)).save_pretrained(tmp_path)
    config = read_text_config(tmp_path)
    assert config.hidden_size_per_layer_input == 0
    assert config.per_layer_config[5].num_key_value_heads == 1 and config.per_layer_config[0].num_key_value_heads == 8

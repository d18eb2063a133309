"""verify judges the logits, not only the argmax: each subtle graph bug planted in a copy of a
compiled artifact passes a token-for-token check and fails verify, with the reason in its row."""

import io
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console

from contract.artifact import load_meta
from contract.logit_error import BOUNDS
from gemma4_port.compile.backends import compile_artifact
from gemma4_port.port.decoder import Gemma4Decoder
from gemma4_port.source.manifest import load_manifest
from gemma4_port.verify.run import verify_artifact
from runtime.model.loader import SelfTestFailed, load_artifact
from support import MANIFESTS
from support.artifact_copies import with_rope_scaled


def verify_json(folder: Path, tmp_path: Path, long: bool = False) -> tuple[int, dict]:
    out = tmp_path / "verify.json"
    code = verify_artifact(folder, long=long, console=Console(file=io.StringIO(), width=250), json_out=out)
    return code, json.loads(out.read_text())


def passed_before(report: dict) -> list[dict]:
    """The rows the old token-for-token check passed: every greedy token equals the reference's."""
    return [row for row in report["rows"] if row["first_divergence"] is None]


def compiled_with(monkeypatch, tmp_path, name: str, variant: str, target, attr: str, planted) -> Path:
    """A copy of the graph with one bug planted, made without compile's own self-test (as an artifact
    built elsewhere, or by an older build, would be)."""
    monkeypatch.setattr(target, attr, planted)
    monkeypatch.setattr("gemma4_port.compile.pipeline.self_test_here", lambda folder: None)
    manifest = load_manifest(MANIFESTS / f"{name}.yaml")
    return compile_artifact(manifest, manifest.variant(variant), tmp_path / "planted")


def test_global_rotary_raised_3_percent_fails_though_every_token_matches(compiled, tmp_path):
    """The case to catch: float32 tiny-e2b, geometry.rope.full.inv_freq raised by 3%."""
    code, report = verify_json(with_rope_scaled(compiled("tiny-e2b", "fp32"), tmp_path / "rope", 1.03), tmp_path)
    assert code == 1 and not report["passed"]
    bent = [row for row in passed_before(report) if row["verdict"] == "LOGITS"]
    assert len(bent) >= len(report["rows"]) // 2
    assert all("max |logit diff|" in row["note"] and "float32 bound" in row["note"] for row in bent)
    assert max(row["worst"]["max_abs"] for row in bent) > 100 * BOUNDS["float32"].max_abs


def test_missed_scale_in_the_graph_fails(compiled, monkeypatch, tmp_path):
    """The PLE mix without its 2 ** -0.5: a norm after it hides most of the error (1e-3 of the logits)."""

    def project_ple_unscaled(self, h, ple):
        B, S, _ = h.shape
        proj = self.per_layer_model_projection(h) * (self.shard.hidden**-0.5)  # (B, S, L*P)
        shard = self.shard
        return self.per_layer_projection_norm(proj.view(B, S, shard.num_layers, shard.ple_dim)) + ple  # (B, S, L, P)

    folder = compiled_with(
        monkeypatch, tmp_path, "tiny-e2b", "fp32", Gemma4Decoder, "project_ple", project_ple_unscaled
    )
    code, report = verify_json(folder, tmp_path)
    assert code == 1 and any(row["verdict"] == "LOGITS" for row in passed_before(report))


def test_final_norm_in_bf16_fails_a_float32_artifact(compiled, monkeypatch, tmp_path):
    """A compiler's auto-cast of the final RMSNorm to bf16 in a float32 graph."""

    def rows_bf16_norm(self, h):
        normed = self.norm(h.to(torch.bfloat16)).to(h.dtype)
        return torch.cat((self.lm_head(normed), normed), dim=-1)

    folder = compiled_with(monkeypatch, tmp_path, "tiny-12b", "fp32", Gemma4Decoder, "rows", rows_bf16_norm)
    code, report = verify_json(folder, tmp_path)
    assert code == 1 and passed_before(report)
    assert all(row["verdict"] == "LOGITS" for row in passed_before(report))


def test_global_rotary_raised_3_percent_fails_a_bf16_artifact(compiled, tmp_path):
    """bf16 noise hides the bent logits step by step (tiny-12b: max 1.96 against 0.62 when correct, the
    bound is 4); the mean over every step, against transformers' own bf16 run, does not."""
    code, report = verify_json(with_rope_scaled(compiled("tiny-12b", "bf16"), tmp_path / "rope", 1.03), tmp_path)
    assert all(row["verdict"] in ("MATCH", "NEAR-TIE") for row in report["rows"])  # each row alone passes
    noise = report["bf16_noise"]
    assert code == 1 and not noise["passed"] and noise["ratio"] > noise["bound"]


def test_garbage_fails_every_row_even_where_a_token_matches(compiled, monkeypatch, tmp_path):
    original = Gemma4Decoder.load_weights

    def scrambled(self, reader):
        original(self, reader)
        generator = torch.Generator().manual_seed(0)
        for name, p in self.named_parameters():
            if p.dim() == 2 and name != "lm_head.weight":
                p.copy_(p[torch.randperm(p.shape[0], generator=generator)])

    folder = compiled_with(monkeypatch, tmp_path, "tiny-12b", "bf16", Gemma4Decoder, "load_weights", scrambled)
    code, report = verify_json(folder, tmp_path)
    assert code == 1
    assert all(row["verdict"] in ("MISMATCH", "LOGITS") for row in report["rows"])
    assert all("bfloat16 bound" in row["note"] for row in report["rows"])
    model = load_artifact(folder)
    try:
        with pytest.raises(SelfTestFailed, match="golden prompt .* more than the bfloat16 bound"):
            model.self_test()  # and the server's self-test refuses it
    finally:
        model.close()


def test_json_report_has_every_step(compiled, tmp_path):
    code, report = verify_json(compiled("tiny-e2b", "fp32"), tmp_path)
    assert code == 0 and report["passed"] and report["format"] == 1
    assert report["artifact"]["dtype"] == "float32" and report["bounds"]["max_abs"] == BOUNDS["float32"].max_abs
    for row in report["rows"]:
        assert len(row["per_step"]) == row["compared"] == row["steps"]
        assert set(row["per_step"][0]) == {"step", "device_token", "reference_token", "max_abs", "cosine", "kl", "topk"}
        assert row["worst"]["max_abs"] == max(s["max_abs"] for s in row["per_step"])


def test_golden_steps_come_from_the_reference_alone(compiled):
    """What the self-test judges by is the float reference's, stored at compile time: no device run
    goes into it, so a compile where the graphs cannot run (Neuron inside `docker build`) stores the
    same data."""
    from contract.logit_error import GOLDEN_TOP
    from gemma4_port.verify.reference import load_reference, reference_greedy

    meta = load_meta(compiled("tiny-e2b", "bf16"))
    reference = load_reference(Path(meta.checkpoint))
    for golden in meta.golden:
        tokens, logits = reference_greedy(reference, list(golden.ids), len(golden.tokens))
        assert tuple(tokens) == golden.tokens and len(golden.steps) == len(tokens)
        for step, row in zip(golden.steps, logits):
            top = row.topk(GOLDEN_TOP)
            assert step.ids == tuple(top.indices.tolist()) and step.ids[0] == int(row.argmax())
            assert step.logits == pytest.approx(top.values.tolist(), abs=1e-6)

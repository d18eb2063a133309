"""Tensor parallelism on the CPU for real: two rank processes in one gloo group, each holding only
its shard of the weights and its own KV, with the all-reduce inside the saved graphs."""

import math
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from contract.artifact import load_meta
from contract.dtypes import DTYPES
from contract.hostside import HostInputs, HostTables
from gemma4_port.port.kv import kv_shapes
from gemma4_port.port.sharding import REPLICATED, SPLIT, shard_model
from gemma4_port.source.checkpoint_files import CheckpointReader, read_text_config
from runtime.model.loader import load_artifact
from runtime.model.ranks import TensorParallelError
from runtime.settings import ServerSettings
from support.cli import verify
from support.copies import check_copied, planted_kv
from support.engines import ready
from support.http import openai_client
from support.processes import gone

# One compile per tiny manifest; tiny-e4b is checked at bf16 with two batch slots, tiny-e2b with its
# random drafter and verify graphs (the speculative rows of `verify` run at tp 2 too).
CASES = [("tiny-e2b", "spec-tp2"), ("tiny-e4b", "tp2-bf16"), ("tiny-12b", "tp2")]
# The rule each tiny model's K/V must get, per attention kind (written out, not taken from the plan).
KV_RULE = {
    "tiny-e2b": {"sliding": REPLICATED, "full": REPLICATED},  # nkv 1
    "tiny-e4b": {"sliding": SPLIT, "full": SPLIT},  # nkv 2
    "tiny-12b": {"sliding": SPLIT, "full": REPLICATED},
}  # nkv 8, global nkv 1 with k_eq_v
DRAFTER_LAYERS = 2  # tiny-e2b's random assistant: its q/o and MLP projections are parallel layers too
HALVED = ("q_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SPLIT_DIM = {"q_proj": 0, "k_proj": 0, "v_proj": 0, "gate_proj": 0, "up_proj": 0, "o_proj": 1, "down_proj": 1}


def rank_weights(folder: Path, rank: int) -> dict[str, torch.Tensor]:
    """The weights rank `rank` actually runs with: the tensors saved with its decode graph."""
    meta = load_meta(folder)
    graphs = torch.jit.load(str(folder / meta.graphs[f"rank{rank}/decode_{meta.geometry.kv_max}"]))
    return {k.removeprefix("decode.decoder."): v for k, v in graphs.state_dict().items() if k.startswith("decode.")}


@pytest.mark.parametrize("name, variant", CASES + [pytest.param("tiny-e4b", "tp2", marks=pytest.mark.slow)])
def test_tp2_compiles_and_verifies_token_for_token(compiled, name, variant):
    folder = compiled(name, variant)
    meta = load_meta(folder)
    assert meta.geometry.tp == 2
    graphs = ("prefill_16_64", "prefill_32_64", "decode_64") + (("copy_64",) if meta.geometry.batch > 1 else ())
    graphs += ("verify_4_64", "draft_64") if meta.geometry.drafter else ()
    assert set(meta.graphs) == {f"rank{r}/{g}" for r in (0, 1) for g in graphs}
    result = verify(folder)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("│")]
    ok = ("│ True ",) if meta.geometry.dtype == "float32" else ("│ True ", "│ near-tie ")
    assert len(rows) >= 8 and all(any(v in row for v in ok) for row in rows), result.stdout
    assert "random:to-kv_max" in result.stdout and "0 failed" in result.stdout
    assert "random:1.5x-bucket" in result.stdout and "random:kv_max-8" in result.stdout
    assert "turns:reuse-prefix" in result.stdout
    assert result.stdout.count("slots:") == (meta.geometry.batch if meta.geometry.batch > 1 else 0)
    if meta.geometry.drafter:  # proposals == Gemma4AssistantForCausalLM's; greedy with speculation == the target's
        assert result.stdout.count("│ draft:") == result.stdout.count("│ verify:") == 3
        assert result.stdout.count("│ speculative:") >= 8


@pytest.mark.parametrize("name, variant", CASES)
def test_each_rank_holds_half_of_the_sharded_weights_and_its_own_kv(compiled, name, variant):
    folder = compiled(name, variant)
    meta = load_meta(folder)
    ckpt = Path(meta.checkpoint)
    reader, config = CheckpointReader(ckpt), read_text_config(ckpt)
    dtype = DTYPES[meta.geometry.dtype]
    ranks = [rank_weights(folder, r) for r in (0, 1)]
    plan = shard_model(config, 2, 0)
    tp1_bytes, rank_bytes = {}, [{}, {}]
    for key in ranks[0]:
        kind = key.split(".")[-2]
        if kind not in SPLIT_DIM:
            continue
        full = reader.get(key).to(dtype)
        tp1_bytes[kind] = tp1_bytes.get(kind, 0) + full.numel() * full.element_size()
        for r in (0, 1):
            rank_bytes[r][kind] = rank_bytes[r].get(kind, 0) + ranks[r][key].numel() * ranks[r][key].element_size()
        rule = SPLIT if kind in HALVED else KV_RULE[name][plan.layers[int(key.split(".")[1])].kind]
        if rule == SPLIT:  # the two ranks' slices are the two halves of the checkpoint tensor, in order
            torch.testing.assert_close(torch.cat([ranks[0][key], ranks[1][key]], SPLIT_DIM[kind]), full, rtol=0, atol=0)
        else:
            for r in (0, 1):
                torch.testing.assert_close(ranks[r][key], full, rtol=0, atol=0)
    for kind in HALVED:
        assert rank_bytes[0][kind] == rank_bytes[1][kind] == tp1_bytes[kind] // 2, kind
    held, total = sum(rank_bytes[0].values()), sum(tp1_bytes.values())
    assert 0.5 <= held / total <= 0.52, (held, total)  # above one half only by the replicated K/V

    # KV buffers: each rank's own shape, halved where K/V are split and whole where replicated
    geo = meta.geometry
    tp1 = kv_shapes(shard_model(config), geo.batch, geo.kv_max, geo.ring)
    for r in (0, 1):
        assert list(geo.kv_shapes) == kv_shapes(shard_model(config, 2, r), geo.batch, geo.kv_max, geo.ring)
    for c, layer in enumerate(plan.cache_layers):
        want = tp1[2 * c][1] // (2 if KV_RULE[name][plan.layers[layer].kind] == SPLIT else 1)
        assert geo.kv_shapes[2 * c][1] == geo.kv_shapes[2 * c + 1][1] == want
    kv_ratio = sum(map(math.prod, geo.kv_shapes)) / sum(map(math.prod, tp1))
    low, high = {"tiny-e2b": (1.0, 1.0), "tiny-e4b": (0.5, 0.5), "tiny-12b": (0.5, 1.0)}[name]
    assert low <= kv_ratio <= high


@pytest.mark.parametrize("name, variant", CASES)
def test_the_saved_rank_graphs_carry_the_all_reduce(compiled, name, variant):
    """Two per layer (after o_proj and after down_proj), recorded in the graph file itself; none in a
    fork's copy, which moves each rank's own heads."""
    folder = compiled(name, variant)
    meta = load_meta(folder)
    for key, rel in meta.graphs.items():
        graph = getattr(torch.jit.load(str(folder / rel)), key.partition("/")[2]).inlined_graph
        reduces = [n for n in graph.nodes() if n.kind() == "gemma4_tp::all_reduce"]
        layers = DRAFTER_LAYERS if "/draft_" in key else meta.geometry.num_layers
        assert len(reduces) == (0 if "/copy_" in key else 2 * layers), key


def test_the_backend_resets_and_closes_cleanly(compiled):
    model = load_artifact(compiled("tiny-12b", "tp2"))
    backend = model.runner.backend
    pids = backend.group.pids
    ids = [5, 80, 300, 7, 21]
    first = model.runner.greedy(ids, 6)[0]
    backend.reset()
    assert model.runner.greedy(ids, 6)[0] == first
    model.close()
    assert gone(pids)
    model.close()  # idempotent
    with pytest.raises(TensorParallelError, match="shut down"):
        model.runner.prefill_prompt(0, ids)


def test_a_fork_copies_every_ranks_own_kv(compiled):
    """tp 2 with two slots: slot 1, forked from slot 0 after its prefill, decodes alone what tp 1
    decodes, to float32 rounding (a rank that kept its old row would break the all-reduce sum)."""
    ids = [(17 * i + 4) % 900 for i in range(21)]  # prefill chunks of 16 and 5 (buckets 8, 16)
    tp1 = load_artifact(compiled("tiny-12b", "fp32"))
    want, want_logits = tp1.runner.greedy(ids, 8)
    tp1.close()
    model = load_artifact(compiled("tiny-12b", "chunks-tp2"))
    try:
        runner = model.runner
        logits = runner.prefill_prompt(0, ids)
        runner.fork(0, 1)
        runner.free(0)
        got = []
        for step in range(8):
            assert torch.allclose(logits, want_logits[step], atol=1e-4), step
            got.append(int(logits.argmax()))
            logits = runner.decode({1: got[-1]})[1]
        assert got == want
    finally:
        model.close()


def test_each_ranks_copy_graphs_copy_its_own_heads_bit_for_bit(compiled):
    """Every rank has its own copy_<T> per key bucket, over its own KV shapes (no all-reduce: it runs
    outside the rank group too)."""
    folder = compiled("tiny-12b", "chunks-tp2")
    meta = load_meta(folder)
    geo = meta.geometry
    host = HostInputs(geo, HostTables(folder, geo))
    for rank in range(geo.tp):
        graphs = torch.jit.load(str(folder / meta.graphs[f"rank{rank}/copy_{geo.kv_max}"]))
        kv = planted_kv(geo.kv_shapes, DTYPES[geo.dtype], seed=rank)
        for keep in (3, 16, 17, 64):
            T = next(t for t in geo.key_buckets if keep <= t)
            _, *out = getattr(graphs, f"copy_{T}")(*host.copy_inputs(1, 0, keep, T), *kv)
            check_copied(kv, out, geo.kv_kinds, 1, 0, keep)


def test_a_killed_rank_is_a_clear_error_not_a_hang(compiled):
    model = load_artifact(compiled("tiny-12b", "tp2"))
    pids = model.runner.backend.group.pids
    model.runner.prefill_prompt(0, [5, 80, 300])
    os.kill(pids[1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(TensorParallelError, match=r"tp rank 1 \(pid \d+\) died during decode with exit code -9"):
        model.runner.decode({0: 7})
    assert time.monotonic() - start < 15
    assert gone(pids)


def test_the_server_at_tp2_speculates_with_its_drafter_and_answers_plain_decodings_tokens(compiled):
    """The engine over the two rank processes, through the openai client: each answer with the drafter
    is the one without, token for token and logprob for logprob, and the drafter did draft."""
    with ready(ServerSettings(artifact=compiled("tiny-e2b", "spec-tp2"), queue_max=4)) as engine:
        assert engine._scheduler.speculator.method == "drafter"
        oai, get = openai_client(engine), engine.metrics.registry.get_sample_value
        for content in ("Capital of Italy?", "Write a haiku."):
            before = get("gemma4_spec_proposed_tokens_total", {"method": "drafter"}) or 0.0
            answers = [
                oai.chat.completions.create(
                    model="tiny-e2b",
                    messages=[{"role": "user", "content": content}],
                    max_tokens=12,
                    temperature=0,
                    logprobs=True,
                    extra_body={"disable_spec_decode": off},
                ).choices[0]
                for off in (True, False)
            ]
            plain, drafted = ([(t.token, t.logprob) for t in a.logprobs.content] for a in answers)
            assert [t for t, _ in drafted] == [t for t, _ in plain] and plain
            assert [lp for _, lp in drafted] == pytest.approx([lp for _, lp in plain], abs=1e-4)
            assert answers[0].message.content == answers[1].message.content
            assert get("gemma4_spec_proposed_tokens_total", {"method": "drafter"}) > before

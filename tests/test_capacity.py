"""`build.py plan`: the byte counts and verdicts for the real E2B / E4B / 12B configs (shapes only,
no weights), pinned against the numbers an earlier inf2 port measured."""

import subprocess
import sys

import pytest

from gemma4_port.ops.capacity import (
    GIB,
    INSTANCES,
    MODEL_CODE_FLOOR,
    PROCESS_BYTES,
    SCRATCHPAD_PAGE,
    compile_swap_gib,
    compile_threads,
    footprint,
    host_verdict,
    model_sizes,
)
from gemma4_port.ops.fitting import fixes, kv_max_limit
from gemma4_port.ops.model_sizes import ModelSizes
from gemma4_port.source.configs import text_config_for
from gemma4_port.source.manifest import load_manifest
from support import MANIFESTS, ROOT

XLARGE, X8LARGE = INSTANCES
# Elements on the device (whole model at tp 1, one rank at tp 2) and in the host tables, counted from
# Gemma4Decoder on the meta device. "E2B" and "E4B" are effective-parameter names, not device sizes.
DEVICE = {
    "e2b": (2_279_759_139, 1_369_070_883),
    "e4b": (4_644_441_130, 2_699_332_650),
    "12b": (11_907_350_320, 6_465_240_880),
}
TABLES = {"e2b": 2_751_463_424, "e4b": 3_489_660_928, "12b": 1_006_632_960}
PUBLISHED_TEXT_PARAMS = {"e2b": 4.63e9, "e4b": 7.46e9, "12b": 11.9e9}  # the model cards' text parameter counts


@pytest.fixture(scope="module")
def real():
    out = {}
    for name in DEVICE:
        manifest = load_manifest(MANIFESTS / f"gemma-4-{name}.yaml")
        out[name] = manifest, ModelSizes(text_config_for(manifest))
    return out


def plan(real, name, variant, **change):
    manifest, sizes = real[name]
    return footprint(sizes, manifest.variant(variant).model_copy(update=change)), sizes


@pytest.mark.parametrize("name", DEVICE)
def test_device_weights_are_counted_from_the_module(real, name):
    _, sizes = real[name]
    assert (sizes.weights(1, 0), sizes.weights(2, 0)) == DEVICE[name]
    assert sizes.weights(2, 1) == sizes.weights(2, 0)
    assert sizes.host_tables() == TABLES[name]
    # The device holds lm_head (the tied embedding) and the host the PLE table: device + PLE = the text model.
    ple = TABLES[name] - sizes.shard(1, 0).vocab * sizes.shard(1, 0).hidden
    assert abs(sizes.weights(1, 0) + ple - PUBLISHED_TEXT_PARAMS[name]) < 0.005 * PUBLISHED_TEXT_PARAMS[name]


def test_e2b_holds_one_copy_of_its_weights_for_every_bucket(real):
    fp, sizes = plan(real, "e2b", "512-128", kv_max=8192, key_buckets=(8192,))
    # One ModelBuilder model, where a torch_neuronx.trace copy per graph held three copies.
    # KV in bf16: 12 sliding caches (1 head of 256) in a ring of 512 + 512, 3 global (1 head of 512) over 8192
    kv = 2 * 2 * (12 * 256 * 1024 + 3 * 512 * 8192)
    assert fp.rank_kv == kv == 62_914_560
    assert fp.per_core == 2 * DEVICE["e2b"][0] + kv + fp.rank_transient and fp.fits_core
    more, _ = plan(real, "e2b", "512-128", kv_max=8192, buckets=(128, 256, 512), key_buckets=(512, 1024, 8192))
    # buckets add graphs, not weights: 3 chunk buckets x 3 key buckets holding them, and 3 decodes
    assert more.per_core == fp.per_core and more.layout.compile_jobs == 12
    fp32, _ = plan(real, "e2b", "512-128", kv_max=8192, key_buckets=(8192,), dtype="float32")
    assert fp32.per_core == 4 * DEVICE["e2b"][0] + 2 * kv + fp32.rank_transient and fp32.fits_core


def test_e4b_fits_one_core_in_bf16_and_tp2_halves_it(real):
    tp1, sizes = plan(real, "e4b", "tp1-48k")
    assert tp1.fits_core and tp1.per_core == 2 * DEVICE["e4b"][0] + tp1.rank_kv + tp1.rank_transient
    fp32, _ = plan(real, "e4b", "tp1-48k", dtype="float32")
    assert not fp32.fits_core
    assert fixes(sizes, fp32)[0] == f"dtype: bfloat16 -> {tp1.counted_core / GIB:.2f} GiB per core"
    tp2, _ = plan(real, "e4b", "tp2-48k", kv_max=8192, key_buckets=(8192,))
    # KV per rank in bf16: 20 sliding caches (1 of 2 heads, 256) in a ring of 1024, 4 global (1 of 2, 512) over 8192
    kv = 2 * 2 * (20 * 256 * 1024 + 4 * 512 * 8192)
    assert tp2.per_core == 2 * DEVICE["e4b"][1] + kv + tp2.rank_transient and tp2.fits_core


def test_12b_fits_only_at_tp2_in_bf16(real):
    tp2, sizes = plan(real, "12b", "tp2-256")
    assert tp2.fits_core and 11.9 < tp2.per_core / GIB < 12.2  # measured: about 12 GB per core at 256
    fp32, _ = plan(real, "12b", "tp2-fp32")
    assert not fp32.fits_core
    assert [f.split(" ->")[0] for f in fixes(sizes, fp32)] == ["dtype: bfloat16"]
    for dtype in ("bfloat16", "float32"):
        tp1, _ = plan(real, "12b", "tp2-256", tp=1, dtype=dtype)
        assert not tp1.fits_core
        assert not plan(real, "12b", "tp2-256", tp=1, dtype=dtype, prefill="host")[0].fits_core


def test_the_largest_graph_is_a_chunk_over_kv_max_keys(real):
    """Its float32 scores (one layer's: query heads x largest bucket x keys) and its rows (mask and
    write per kind, at the variant dtype) sit on the core beside the weights and the KV."""
    fp, _ = plan(real, "e2b", "512-128", kv_max=49152)  # 8 query heads; the ring is 512 + 512
    assert fp.rank_scores == 4 * 8 * 512 * 49152 == 805_306_368
    assert fp.rank_rows == 2 * 512 * 2 * (49152 + 1024)
    tp2, _ = plan(real, "12b", "tp2-256", kv_max=49152, buckets=(128, 512))  # 16 heads, 8 per rank; ring 1024 + 512
    assert tp2.rank_scores == 4 * 8 * 512 * 49152 and tp2.rank_rows == 2 * 512 * 2 * (49152 + 1536)
    assert tp2.per_core == tp2.rank_weights + tp2.rank_kv + tp2.rank_scores + tp2.rank_rows
    host, _ = plan(real, "e4b", "tp2-host", kv_max=49152)  # no prefill on the device: decode's, batch 1
    assert host.rank_scores == 4 * 4 * 1 * 49152 and host.rank_rows == 2 * 1 * 2 * (49152 + 1024)
    short, _ = plan(real, "e2b", "512-128", kv_max=49152, buckets=(128,))
    assert short.rank_scores == fp.rank_scores // 4  # it grows with the chunk bucket, not the batch
    assert plan(real, "e2b", "512-128", kv_max=49152, batch=4)[0].rank_scores == fp.rank_scores


def test_a_kv_max_that_overflows_gets_the_largest_that_fits(real):
    fp, sizes = plan(real, "e2b", "512-128", kv_max=4_194_304)  # only the 3 global caches grow: 6 KiB a position
    assert not fp.fits_core
    (kv_fix,) = [f for f in fixes(sizes, fp) if f.startswith("kv_max")]
    kv_max = int(kv_fix.split()[1])
    assert plan(real, "e2b", "512-128", kv_max=kv_max)[0].fits_core
    assert not plan(real, "e2b", "512-128", kv_max=kv_max + 128)[0].fits_core


def test_the_largest_kv_max_is_bounded_by_the_core_or_the_context_not_by_sbuf(real):
    fp, sizes = plan(real, "e2b", "512-128")
    # attention runs over key blocks: no softmax row grows with kv_max, the model's context bounds it
    assert kv_max_limit(sizes, fp) == "131072 context"
    assert kv_max_limit(*plan(real, "12b", "tp2-48k")[::-1]) == "106752 HBM"  # 12B's KV fills the core first
    crowded, sizes = plan(real, "e2b", "512-128", batch=64)  # 64 slots x 6 KiB per global position
    limit = int(kv_max_limit(sizes, crowded).removesuffix(" HBM"))
    assert plan(real, "e2b", "512-128", batch=64, kv_max=limit)[0].fits_core
    assert not plan(real, "e2b", "512-128", batch=64, kv_max=limit + 128)[0].fits_core
    tp1, sizes = plan(real, "e4b", "tp1-48k", dtype="float32")
    assert kv_max_limit(sizes, tp1) == "-"  # the weights alone overflow: no kv_max helps
    # the chunk's scores grow with kv_max too (8 query heads x the largest bucket x 4 bytes a key)
    fat, sizes = plan(real, "e2b", "512-128", batch=64, buckets=(128, 4096))
    limit = int(kv_max_limit(sizes, fat).removesuffix(" HBM"))
    assert limit < int(kv_max_limit(sizes, crowded).removesuffix(" HBM"))  # a bigger chunk leaves less for the KV
    assert plan(real, "e2b", "512-128", batch=64, buckets=(128, 4096), kv_max=limit)[0].fits_core
    assert not plan(real, "e2b", "512-128", batch=64, buckets=(128, 4096), kv_max=limit + 128)[0].fits_core


def test_the_largest_kv_max_stops_at_the_models_context():
    manifest = load_manifest(MANIFESTS / "gemma-4-e2b.yaml")
    config = text_config_for(manifest)
    assert config.max_position_embeddings == 131072  # what every kv_max up to stays below
    config.max_position_embeddings = 32768
    sizes = ModelSizes(config)
    assert kv_max_limit(sizes, footprint(sizes, manifest.variants[0])) == "32768 context"


@pytest.mark.parametrize(
    "name, variant",
    [
        ("e2b", "512-128"),
        ("e2b", "b4"),
        ("e2b", "tp2-48k"),
        ("e4b", "tp2-48k"),
        ("e4b", "tp2-host"),
        ("e4b", "tp1-48k"),
        ("12b", "tp2-48k"),
    ],
)
def test_the_shipped_long_variants_fit_within_the_kv_max_plan_allows(real, name, variant):
    """kv_max 49,152 is within what plan says the variant could take (the core's memory or the model's
    context), and a short prompt still runs over 4,096 keys."""
    fp, sizes = plan(real, name, variant)
    assert fp.fits_core and fp.variant.kv_max == 49152
    assert int(kv_max_limit(sizes, fp).split()[0]) >= fp.variant.kv_max
    assert fp.variant.key_buckets[0] == 4096 and fp.variant.key_buckets[-1] == fp.variant.kv_max


def test_host_ram_verdicts(real):
    fp, _ = plan(real, "e2b", "512-128")
    # the slim server: tables, and cos and sin of every position for 256- and 512-wide heads
    assert fp.serve == PROCESS_BYTES + 2 * TABLES["e2b"] + 2 * fp.variant.kv_max * 2 * (256 + 512)
    assert fp.load_peak == fp.serve + 2 * DEVICE["e2b"][0]  # the weight file passes through host RAM once
    assert host_verdict(fp, XLARGE) == "yes"
    assert host_verdict(fp, X8LARGE) == "yes"
    host_prefill, _ = plan(real, "e4b", "tp2-host")  # the whole model prefills on the host CPU
    assert host_prefill.serve == PROCESS_BYTES + 2 * (TABLES["e4b"] + DEVICE["e4b"][0]) + host_prefill.host_rope
    assert host_verdict(host_prefill, XLARGE) == "no (host RAM)" and host_verdict(host_prefill, X8LARGE) == "yes"
    assert host_verdict(plan(real, "e4b", "tp1-48k", dtype="float32")[0], X8LARGE) == "no (core)"


def test_a_core_counts_tensors_scratchpad_pages_and_the_model_code_floor(real):
    """neuron-monitor's categories: tensors (weights are inputs, the KV is state), the shared
    scratchpad in 512 MiB pages, >= 96 MiB of model code; runtime memory has no figure."""
    fp, _ = plan(real, "12b", "tp2-48k")
    assert fp.scratchpad % SCRATCHPAD_PAGE == 0 and 0 <= fp.scratchpad - fp.rank_transient < SCRATCHPAD_PAGE
    assert fp.counted_core == fp.rank_weights + fp.rank_kv + fp.scratchpad + MODEL_CODE_FLOOR
    assert fp.counted_core > fp.per_core and fp.fits_core  # 14.1 of 16 GiB: the rest is for what is unknown
    # a variant whose tensors fit but whose counted bytes do not is refused
    edge, sizes = plan(real, "e2b", "512-128", kv_max=4_194_304)
    assert not edge.fits_core


def test_compile_gets_only_the_swap_its_counted_floor_needs(real):
    """neuronx-cc's RAM per graph has no basis with the weights lowered as inputs: only the floor is
    counted (each weighted key's rank module, then the whole checkpoint and a rank's cut), and no
    "no swap" verdict is given."""
    manifest, _ = real["12b"]
    fp, _ = plan(real, "12b", "tp2-48k")
    assert fp.compile_floor == PROCESS_BYTES + 2 * fp.rank_weights + fp.whole_weights + fp.rank_weights
    assert compile_swap_gib(manifest, manifest.variant("tp2-48k")) is None  # 59 GiB counted on 128: unknown
    assert compile_swap_gib(manifest, manifest.variant("tp2-48k"), host_gib=32) == 28
    batch, _ = plan(real, "e2b", "b4")  # the copy key holds no weights
    assert batch.compile_floor == PROCESS_BYTES + 3 * batch.rank_weights + batch.whole_weights
    e2b, _ = real["e2b"]
    alone = e2b.model_copy(update={"speculative": None})  # the target's keys alone
    assert compile_swap_gib(alone, e2b.variant("512-128"), host_gib=XLARGE.host_gib) == 2
    # The shipped manifest's drafter: the verify and draft keys are weighted too (4 rank modules, then the cut)
    spec = footprint(model_sizes(e2b), e2b.variant("512-128"))
    assert spec.compile_floor == PROCESS_BYTES + 5 * spec.rank_weights + spec.whole_weights
    assert compile_swap_gib(e2b, e2b.variant("512-128"), host_gib=XLARGE.host_gib) == 16
    # ModelBuilder's thread pool: min(32, cpus + 4) compiles at once (model_builder.py:710)
    assert (compile_threads(XLARGE), compile_threads(X8LARGE)) == (8, 32)


def test_plan_prints_the_tables_verdicts_and_fixes():
    result = subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "plan", str(MANIFESTS / "gemma-4-12b.yaml"), "--shards"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "gemma-4-12b: per NeuronCore" in out and "gemma-4-12b: host RAM" in out
    assert "tp2-fp32 does not fit a NeuronCore; fixes: dtype: bfloat16 ->" in " ".join(out.split())
    core = {
        line.split("│")[1].strip(): line.split("│")[-2].strip()
        for line in out.splitlines()
        if line.startswith("│") and "%)" in line
    }  # the per-core table: its last column is "fits"
    assert core.pop("tp2-fp32") == "NO" and set(core.values()) == {"yes"} and "tp2-48k" in core


def test_an_image_budget_counts_the_encoder_on_rank_0s_core_and_its_table_on_the_host(real):
    """The vision tower (transformers' default shape, offline) whole on rank 0's core (the encoder model
    is tp 1), its largest graph's working set (the budget's patches) against the decoder's, its weights
    in the first load, and its position table on the host."""
    from transformers import Gemma4VisionConfig

    from gemma4_port.source.variant import Media

    manifest, text = real["e2b"]
    sizes = ModelSizes(text.config, Gemma4VisionConfig())
    variant = manifest.variant("512-128")
    without = footprint(sizes, variant.model_copy(update={"media": None}))
    fp = footprint(sizes, variant.model_copy(update={"media": Media(image={"max_soft_tokens": 280})}))
    weights, transient, table = sizes.encoder(fp.variant)
    assert without.encoder_weights == 0 and fp.encoder_weights == 2 * weights
    assert 1.5e8 < weights < 1.55e8  # 16 layers at width 768 and the 768 x 1536 embedder: 0.153B elements
    assert fp.counted_core >= without.counted_core + fp.encoder_weights
    assert fp.serve == without.serve + 2 * table
    assert fp.load_peak == without.load_peak + 2 * table + fp.encoder_weights
    assert [str(g) for g in fp.layout.encoders] == ["vision_280"] and not without.layout.encoders
    # 2,520 patches: 12 heads x 2,520 x 512 float32 scores beside the inputs, under the decoder's chunk
    assert 4 * transient == fp.encoder_transient and fp.rank_transient == max(without.rank_transient, 4 * transient)


def test_the_verify_and_draft_graphs_working_sets_are_counted():
    """tiny-e2b's spec variant (4 query heads, kv_max 64, ring 40, k 3): a verify holds batch x (k + 1)
    queries' scores and rows, a drafter step batch queries'; the largest of every graph family is the
    one on the core, and the plan names it."""
    manifest = load_manifest(MANIFESTS / "tiny-e2b.yaml")
    sizes = model_sizes(manifest)
    spec = manifest.variant("spec")  # batch 4, buckets up to 32
    sets = sizes.working_sets(1, 0, spec)
    assert sets == {
        "prefill": (4 * 32 * 64, 32 * 2 * (40 + 64)),
        "verify": (4 * 16 * 64, 16 * 2 * (40 + 64)),
        "draft": (4 * 4 * 64, 4 * 2 * (40 + 64)),
    }
    assert footprint(sizes, spec).largest_graph == "prefill"
    wide = footprint(sizes, spec.model_copy(update={"batch": 16}))  # 64 verify queries beside a 32-token chunk
    assert (wide.largest_graph, wide.rank_scores, wide.rank_rows) == ("verify", 4 * 4 * 64 * 64, 4 * 64 * 2 * 104)
    host = footprint(sizes, spec.model_copy(update={"prefill": "host"}))  # decode's 4 queries, the verify's 16
    assert host.largest_graph == "verify" and "draft" in sizes.working_sets(1, 0, host.variant)
    assert "verify" not in sizes.working_sets(1, 0, manifest.variant("fp32"))  # not a speculative variant

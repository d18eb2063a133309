"""The compile pipeline: one start (checkpoint, sharding plan, geometry, host tables, a fresh folder
beside the artifact's), a graph builder per backend, one finish (host tables, golden tokens from the
float reference with its best logits per step, sha256 of every file, artifact.json, the server's
self-test on the saved artifact where the graphs can run here, and the swap into place: outdir.py).

A builder (cpu, cpu tp, neuron) plugs in through `GraphBuilder`: it checks what it needs before any
work, then writes its graphs into the folder and names them."""

from __future__ import annotations

import datetime
import json
import platform
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import torch

from contract.artifact import (
    ARTIFACT_FORMAT,
    AUDIO_PROCESSOR,
    HOST_TABLES,
    IMAGE_PROCESSOR,
    ArtifactMeta,
    Geometry,
    Golden,
    GoldenStep,
    sha256,
    write_meta,
)
from contract.logit_error import golden_steps
from contract.tokenizer import load_tokenizer
from gemma4_port.compile.outdir import check_out, partial_folder, swap_in
from gemma4_port.compile.tracing import (
    CompileError,
    TableBlobs,
    audio_geometry,
    check_drafter_rope,
    geometry,
    host_tables,
    vision_geometry,
)
from gemma4_port.port.sharding import DrafterShard, ModelShard, ShardingError, shard_drafter, shard_model
from gemma4_port.source.checkpoint import resolve_checkpoint, resolve_drafter
from gemma4_port.source.checkpoint_files import (
    CheckpointReader,
    read_audio_config,
    read_config,
    read_drafter_config,
    read_text_config,
    read_vision_config,
)
from gemma4_port.source.manifest import Manifest
from gemma4_port.source.model_sources import Speculative, is_hub_id
from gemma4_port.source.variant import Variant
from gemma4_port.verify.reference import load_reference, reference_greedy
from runtime.model.loader import SelfTestFailed, load_artifact
from runtime.model.neuron_sdk import wheel_versions

GOLDEN_STEPS = 8
GOLDEN_PROMPTS = (
    ("capital", "text", "The capital of France is"),
    ("hello", "text", "hello world"),
    ("chat", "chat", "Capital of France?"),
)


@contextmanager
def step(progress, text: str):
    """One line of the compile's progress display (none without a display)."""
    task = progress.add_task(text, total=None) if progress else None
    yield
    if progress:
        progress.update(task, total=1, completed=1)


@dataclass
class DrafterBuild:
    """The speculative drafter's checkpoint, config and per-rank shards."""

    ckpt: Path
    config: object  # Gemma4AssistantConfig
    reader: CheckpointReader
    shards: list[DrafterShard]  # one per rank, each the drafter beside that rank's target shard


@dataclass
class Build:
    """What every graph builder starts from."""

    manifest: Manifest
    variant: Variant
    out: Path | None  # the folder written into (None: a build looked at, with nothing written: the tests')
    dest: Path | None  # where the finished artifact goes (out is its sibling until then)
    ckpt: Path
    config: object  # Gemma4TextConfig
    reader: CheckpointReader
    shards: list[ModelShard]  # one per rank
    geo: Geometry
    tables: TableBlobs
    vision: object | None = None  # Gemma4VisionConfig where the artifact has image encoder graphs
    audio: object | None = None  # Gemma4AudioConfig where the artifact has audio encoder graphs
    drafter: DrafterBuild | None = None


class GraphBuilder(Protocol):
    backend: Literal["cpu", "neuron"]  # what artifact.json records and the loader picks a backend by

    def check(self) -> dict[str, str]:
        """Before any work: refuse what cannot build; the versions to record in artifact.json."""

    def graphs(self, b: Build, progress) -> dict[str, str]:
        """Write the graphs into b.out; graph name -> path relative to it."""


def run_pipeline(builder: GraphBuilder, manifest: Manifest, variant: Variant, out: Path, progress=None) -> Path:
    versions = builder.check()
    b = start_build(manifest, variant, out, progress)
    try:
        return finish(b, builder.graphs(b, progress), builder.backend, progress, versions)
    except BaseException:
        # A finished artifact that failed its self-test stays for `build.py verify` (the error names
        # it; the next compile to this --out removes it); anything less is removed now.
        if not (b.out / "artifact.json").exists():
            shutil.rmtree(b.out, ignore_errors=True)
        raise


def start_build(manifest: Manifest, variant: Variant, out: Path | None = None, progress=None) -> Build:
    """The checkpoint, the sharding plan (made once: a plan that cannot hold fails before any work),
    the geometry and host tables, and a fresh folder to write the artifact into (unless `out` is None)."""
    if out is not None:
        check_out(out)  # before the checkpoint, which may be a download
    torch.set_grad_enabled(False)
    with step(progress, "checkpoint"):
        ckpt = resolve_checkpoint(manifest)
        config = read_text_config(ckpt)
        reader = CheckpointReader(ckpt)
    shards = [shard_model(config, variant.tp, r) for r in range(variant.tp)]
    vision, audio = read_vision_config(ckpt), read_audio_config(ckpt)
    raw = read_config(ckpt)
    # The media placeholders the vocabulary holds (a text model's config may keep the real ids, past it),
    # only where the checkpoint has a media tower: a text-only Gemma-4 (Gemma4ForCausalLM, the reference
    # then) looks those ids up as any other token, it does not read them as the pad token.
    ids = {kind: raw.get(f"{kind}_token_id") for kind in ("image", "audio", "video")} if vision or audio else {}
    placeholders = {kind: i for kind, i in ids.items() if isinstance(i, int) and 0 <= i < config.vocab_size}
    spec = manifest.speculative_for(variant)
    drafter = start_drafter(manifest, spec, config, shards, progress) if spec and spec.has_drafter else None
    # every rank has the same per-rank shapes and inputs
    geo = geometry(
        config,
        shards[0],
        variant,
        vision_geometry(vision, variant),
        placeholders,
        audio_geometry(audio, variant),
        spec=spec,
        drafter=drafter.shards[0] if drafter else None,
    )
    tmp = _prepare(out, ckpt, geo) if out is not None else None
    tables = host_tables(reader, geo, drafter=drafter.reader if drafter else None)
    return Build(
        manifest,
        variant,
        tmp,
        out,
        ckpt,
        config,
        reader,
        shards,
        geo,
        tables,
        vision if geo.vision else None,
        audio if geo.audio else None,
        drafter,
    )


def start_drafter(manifest: Manifest, spec: Speculative, config, shards: list[ModelShard], progress) -> DrafterBuild:
    """The drafter's checkpoint (a download, or the random one written), checked against the target:
    its width and vocabulary, a target cache of each kind its layers read, the same rope and window."""
    with step(progress, "drafter checkpoint"):
        ckpt = resolve_drafter(manifest, spec, config.hidden_size)
        drafter_config = read_drafter_config(ckpt)
        reader = CheckpointReader(ckpt)
    check_drafter_rope(config, drafter_config)
    try:
        drafters = [shard_drafter(drafter_config, s) for s in shards]
    except ShardingError as exc:
        raise CompileError(f"speculative drafter {spec.drafter or 'random'}: {exc}") from None
    return DrafterBuild(ckpt, drafter_config, reader, drafters)


def recorded_manifest(b: Build) -> dict:
    """The manifest as artifact.json keeps it: a local drafter named by the folder it resolved to (a
    relative one is taken from the manifest's own folder, which the artifact does not record), so that
    `verify` finds it where the build did."""
    spec = b.manifest.speculative
    if b.drafter is not None and spec is not None and spec.drafter is not None and not is_hub_id(spec.drafter):
        spec = spec.model_copy(update={"drafter": str(b.drafter.ckpt)})
    return b.manifest.model_copy(update={"speculative": spec}).model_dump(mode="json")


def _prepare(dest: Path, ckpt: Path, geo: Geometry) -> Path:
    out = partial_folder(dest)
    (out / "graphs").mkdir()
    (out / "host").mkdir()
    tok = load_tokenizer(ckpt)
    tok.save_pretrained(out / "tokenizer")
    shutil.copy(ckpt / "config.json", out / "config.json")
    if geo.audio:  # the server extracts features with the checkpoint's own feature extractor settings
        from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

        Gemma4AudioFeatureExtractor.from_pretrained(str(ckpt)).save_pretrained(out / AUDIO_PROCESSOR)
    if geo.vision:  # the server preprocesses with the checkpoint's own image processor settings
        from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

        Gemma4ImageProcessorPil.from_pretrained(str(ckpt)).save_pretrained(out / IMAGE_PROCESSOR)
    return out


def golden_prompts(tokenizer, max_len: int) -> list[tuple[str, list[int]]]:
    """The fixed prompts that fit the largest bucket (the self-test must not need truncation)."""
    out = []
    for name, kind, text in GOLDEN_PROMPTS:
        if kind == "chat":
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        else:
            ids = tokenizer(text).input_ids
        if len(ids) <= max_len:
            out.append((name, list(ids)))
    if not out:
        raise CompileError(f"no golden prompt fits the largest bucket ({max_len} tokens); use a larger bucket")
    return out


def self_test_here(folder: Path) -> None:
    """The server's own self-test on the saved artifact, loaded as the server loads it: graphs that
    disagree with the reference fail the compile rather than the first server."""
    model = load_artifact(folder)
    try:
        model.self_test()
    except SelfTestFailed as exc:
        raise CompileError(
            f"the compiled graphs disagree with the float reference: {exc}; run "
            f"`build.py verify {folder}` for the full table"
        ) from None
    finally:
        model.close()


def eos_token_ids(ckpt: Path, tokenizer) -> tuple[int, ...]:
    """End-of-turn ids from the checkpoint's generation config (chat models stop on more than <eos>)."""
    ids = {tokenizer.eos_token_id}
    gen = ckpt / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id") or []
        ids |= set(eos if isinstance(eos, list) else [eos])
    return tuple(sorted(i for i in ids if i is not None))


def versions() -> dict[str, str]:
    """The Python and the libraries every artifact records (a Neuron build adds the SDK's)."""
    return {"python": platform.python_version()} | wheel_versions(
        ("torch", "transformers", "tokenizers", "safetensors")
    )


def finish(b: Build, graphs: dict[str, str], backend: str, progress, extra_versions=None) -> Path:
    from safetensors.torch import save_file

    manifest, variant, out, ckpt, geo, tables = b.manifest, b.variant, b.out, b.ckpt, b.geo, b.tables

    save_file(tables.blobs, str(out / HOST_TABLES))
    with step(progress, "golden tokens from the float reference (transformers, CPU)"):
        tok = load_tokenizer(out / "tokenizer")
        ref = load_reference(ckpt)
        golden = []
        for name, ids in golden_prompts(tok, geo.buckets[-1]):
            tokens, logits = reference_greedy(ref, ids, GOLDEN_STEPS)
            steps = tuple(GoldenStep(ids=top, logits=values) for top, values in golden_steps(logits))
            golden.append(Golden(name=name, ids=ids, tokens=tokens, steps=steps))
    with step(progress, "sha256 of every file"):
        files = {}
        for p in sorted(out.rglob("*")):
            if p.is_file():
                p.chmod(0o644)  # safetensors writes 0600; a server running as another user must read it
                files[str(p.relative_to(out))] = sha256(p)
    meta = ArtifactMeta(
        format=ARTIFACT_FORMAT,
        name=manifest.name,
        variant=variant.name,
        backend=backend,
        manifest=recorded_manifest(b),
        versions=versions() | (extra_versions or {}),
        geometry=geo,
        graphs=graphs,
        files=files,
        golden=tuple(golden),
        eos_token_ids=eos_token_ids(ckpt, tok),
        checkpoint=str(ckpt),
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )
    write_meta(out, meta)
    # The self-test needs nothing measured on the device (the reference's logits judge it), so where
    # the graphs cannot run here (a Neuron compile inside `docker build`) the server runs it first.
    if backend == "cpu" or Path("/dev/neuron0").exists():
        with step(progress, "the server's self-test on the saved artifact"):
            self_test_here(out)
    swap_in(out, b.dest)
    return b.dest

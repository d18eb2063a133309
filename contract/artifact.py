"""artifact.json: what `build.py compile` wrote and everything the server needs to know about it,
parsed once into frozen objects. Also the sha256 check that names a corrupted file."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Literal

from pydantic import ValidationError, model_validator

from contract.errors import Gemma4Error
from contract.files import read_parsed
from contract.graph_key import prefill_keys
from contract.typed import Frozen

ARTIFACT_FORMAT = 7  # 2: host tables stored pre-scaled; 3: geometry states kv_max once and its prefill;
# 4: a self-digest, golden steps with the reference's best logits; 5: key buckets for prefill too
# (graphs prefill_<C>_<T>; geometry.key_buckets, was decode_buckets); 6: copy_<T> graphs for a fork;
# 7: geometry.vision (vision_<N> encoder graphs), pad_id and the bidirectional vision rule; every graph's
# rows are logits then the last hidden state; verify_<N>_<T> and draft_<T> graphs
HOST_TABLES = "host/tables.safetensors"
# The checkpoint's own preprocessing settings, saved by the build, read by the server: transformers'
# image processor (save_pretrained) and audio feature extractor, each in its folder of the artifact.
IMAGE_PROCESSOR = "processor"
AUDIO_PROCESSOR = "audio_processor"  # apart from the image processor: both save a preprocessor_config.json


class ArtifactError(Gemma4Error, RuntimeError):
    pass


class Rope(Frozen):
    head_dim: int
    inv_freq: tuple[float, ...]


class VisionGeometry(Frozen):
    """The image encoder's shapes: what the host needs to turn the processor's patches into a
    vision graph's inputs (contract/media_inputs.py)."""

    patch_size: int
    pooling_kernel: int  # k: k x k patches pool into one soft token
    width: int  # the tower's hidden size
    head_dim: int
    rope_theta: float  # axial RoPE over (x, y) patch coordinates
    max_soft_tokens: int  # the processor's budget per image (its max_soft_tokens)
    soft_buckets: tuple[int, ...]  # one graph per entry, of entry x k^2 patches; the last = max_soft_tokens

    @property
    def patches_per_token(self) -> int:
        return self.pooling_kernel**2

    def bucket_for(self, soft_tokens: int) -> int:
        """The smallest soft-token bucket that holds an image of `soft_tokens`."""
        for n in self.soft_buckets:
            if soft_tokens <= n:
                return n
        raise ValueError(f"an image of {soft_tokens} soft tokens is over this model's budget of {self.max_soft_tokens}")


class AudioGeometry(Frozen):
    """The audio encoder's shapes: its chunked attention's geometry and the soft-token buckets (a
    graph of bucket x 4 mel frames: two stride-2 convolutions make one soft token of four frames)."""

    chunk: int  # attention_chunk_size: the frames of one attention block (after the convolutions)
    past: int  # attention_context_left - 1: the keys a query sees back (itself included)
    future: int  # attention_context_right
    max_soft_tokens: int
    soft_buckets: tuple[int, ...]  # each a multiple of `chunk`; the last = max_soft_tokens

    @property
    def context(self) -> int:
        return self.chunk + self.past + self.future

    def bucket_for(self, soft_tokens: int) -> int:
        for n in self.soft_buckets:
            if soft_tokens <= n:
                return n
        raise ValueError(f"a clip of {soft_tokens} soft tokens is over this model's budget of {self.max_soft_tokens}")


class DrafterGeometry(Frozen):
    """The drafter's graphs (draft_<T>): `k` steps per round, each fed the target's word embedding of
    its token beside a hidden state of the target's width (`backbone`); `ordered`: its logits come in
    the vocabulary order of its centroid head (host table `drafter_token_ordering`), the runner puts
    them back in token order."""

    source: str  # the drafter checkpoint: hub id or folder (the manifest's, with its revision)
    revision: str | None
    k: int
    hidden: int  # the drafter's own width
    backbone: int  # the target's hidden width it reads and returns
    ordered: bool


class Geometry(Frozen):
    """Shapes and constants shared by the graphs and the host code that feeds them."""

    hidden: int
    vocab: int
    num_layers: int
    ple_dim: int
    sliding_window: int
    kinds: tuple[str, ...]
    rope: dict[str, Rope]
    kv_heads: tuple[tuple[int, int], ...]  # per rank, per KV tensor (K then V per cache): (KVH, D)
    kv_kinds: tuple[str, ...]  # per KV tensor: the attention kind of the layer that owns it
    embed_scale: float
    ple_scale: float
    softcap: float | None
    dtype: Literal["float32", "bfloat16"]
    batch: int
    buckets: tuple[int, ...]
    ring: int  # positions a sliding layer's cache keeps (a ring over the window plus a chunk)
    key_buckets: tuple[int, ...]  # cache lengths the graphs attend over (decode and prefill), the last = kv_max
    tp: int
    prefill: Literal["device", "host"]  # where a prompt runs (host: a CPU graph of the whole model)
    inputs: dict[str, tuple[str, ...]]  # graph -> input names, in call order
    pad_id: int = 0  # a soft token's placeholder looks up this row (word and PLE tables)
    # The checkpoint's soft-token placeholders by kind (image, audio, video): never text, each stands
    # for one soft token of a media item the runner is given.
    placeholders: dict[str, int] = {}
    vision: VisionGeometry | None = None  # the image encoder, on a model with one
    audio: AudioGeometry | None = None  # the audio encoder (E2B, E4B), on a model with one
    # Where the text config's use_bidirectional_attention is "vision": an image's soft tokens see
    # each other both ways on sliding layers (global layers stay causal).
    bidirectional_vision: bool = False
    verify: int = 0  # tokens per slot of the verify_<N>_<T> graphs (k + 1); 0: none
    drafter: DrafterGeometry | None = None

    @property
    def rows(self) -> int:
        """The width of every graph's output rows: the logits, then the last hidden state (the
        target's width, also for the drafter's rows, whose hidden state is its post-projection)."""
        return self.vocab + self.hidden

    @property
    def kv_max(self) -> int:
        return self.key_buckets[-1]

    @property
    def max_prompt(self) -> int:
        """The longest prompt: one position of the context stays for the first generated token's KV."""
        return self.kv_max - 1

    def prefill_keys(self, bucket: int) -> tuple[int, ...]:
        """The key buckets a prefill chunk of `bucket` tokens has a graph for (see graph_key.prefill_keys)."""
        return prefill_keys(bucket, self.key_buckets)

    def keys_for_chunk(self, bucket: int, end: int) -> int:
        """The smallest key bucket that holds a chunk of `bucket` whose real tokens end before `end`."""
        return next(t for t in self.prefill_keys(bucket) if end <= t)

    def span(self, kind: str) -> int:
        """Cache positions a layer of this attention kind keeps."""
        return self.ring if kind == "sliding" else self.kv_max

    @property
    def kv_shapes(self) -> list[tuple[int, int, int, int]]:
        """Per rank, K then V per cache: (B, KVH, S, D), S = kv_max for a global layer, the ring for a sliding one."""
        return [(self.batch, heads, self.span(kind), dim) for (heads, dim), kind in zip(self.kv_heads, self.kv_kinds)]


class GoldenStep(Frozen):
    """The float reference at one golden step: its best tokens, best first, and their softcapped
    logits, from which the self-test judges a divergence without a device at compile time."""

    ids: tuple[int, ...]
    logits: tuple[float, ...]


class Golden(Frozen):
    name: str
    ids: tuple[int, ...]
    tokens: tuple[int, ...]  # the float reference's greedy continuation
    steps: tuple[GoldenStep, ...]  # one per token


class ArtifactMeta(Frozen):
    format: int
    name: str
    variant: str
    backend: Literal["cpu", "neuron"]
    manifest: dict
    versions: dict[str, str]
    geometry: Geometry
    graphs: dict[str, str]  # a GraphKey's text, "rank{r}/" before it under tp (or "model" on Neuron) -> relative path
    files: dict[str, str]  # relative path -> sha256
    golden: tuple[Golden, ...]
    eos_token_ids: tuple[int, ...]
    checkpoint: str
    created: str

    @model_validator(mode="after")
    def _paths_inside(self) -> ArtifactMeta:
        for rel in self.files:
            inside(rel)
        missing = sorted(set(self.graphs.values()) - set(self.files))
        if missing:
            raise ValueError(f"graphs: {missing} not in the file list: every graph is a listed, hashed file")
        vocab = self.geometry.vocab
        ids = {*self.eos_token_ids, *(i for g in self.golden for i in (*g.ids, *g.tokens))}
        if ids and not 0 <= min(ids) <= max(ids) < vocab:
            raise ValueError(f"token ids up to {max(ids)} (eos or golden) on a vocabulary of {vocab}")
        return self


def inside(rel: str) -> str:
    """A path artifact.json names: relative to the folder, `/`-separated, without `.`, `..` or empty
    parts, so it cannot name a file outside the folder (symlinks are check_files' part)."""
    parts = rel.split("/")
    if rel.startswith("/") or "\\" in rel or any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"{rel!r} is not a path inside the artifact folder (relative, no '..', '/'-separated)")
    return rel


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def digest(raw: dict) -> str:
    """sha256 of artifact.json's content without its own `digest` field, in one canonical form (sorted
    keys, no spaces), so the check is about the facts, not the layout of the file."""
    body = {k: v for k, v in raw.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def load_meta(folder: str | Path) -> ArtifactMeta:
    path = Path(folder) / "artifact.json"
    raw = read_parsed(
        path,
        json.loads,
        ArtifactError,
        syntax="JSON",
        missing=f"{path} is missing: {folder} is not an artifact made by `build.py compile`",
    )
    if not isinstance(raw, dict):
        raise ArtifactError(f"{path}: not an artifact description (a JSON object); corrupted or replaced")
    if raw.get("format") != ARTIFACT_FORMAT:
        raise ArtifactError(f"{path}: artifact format {raw.get('format')!r}, this runtime reads {ARTIFACT_FORMAT}")
    # artifact.json is guarded like the files it lists: its geometry and rotary tables shape every
    # step, and an edit there bends the logits without failing any other check.
    if raw.get("digest") != digest(raw):
        raise ArtifactError(f"{path}: digest mismatch (edited or corrupted since `build.py compile` wrote it)")
    raw = {k: v for k, v in raw.items() if k != "digest"}
    try:
        return ArtifactMeta.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(map(str, err["loc"]))  # empty for a check across fields
        msg = err["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's own message
        raise ArtifactError(f"{path}: {loc + ': ' if loc else ''}{msg}") from None


def check_files(folder: str | Path, meta: ArtifactMeta) -> list[str]:
    """One line per missing, corrupted or unlisted file and per symlink out of the folder; empty
    when the folder holds exactly the files artifact.json lists, each with its sha256. An unlisted
    file is refused too: a loader reads more than the files named (a tokenizer folder's every file)."""
    folder = Path(folder)
    root = folder.resolve()
    problems = []
    for rel, digest in sorted(meta.files.items()):
        p = folder / rel
        if not p.resolve().is_relative_to(root):
            problems.append(f"{rel}: a symlink to {p.resolve()}, outside the artifact folder")
        elif not p.is_file():
            problems.append(f"{rel}: missing")
        elif sha256(p) != digest:
            problems.append(f"{rel}: sha256 mismatch (corrupted or replaced)")
    for rel in unlisted(folder, meta.files):
        problems.append(f"{rel}: not listed in artifact.json (`build.py compile` did not write it; remove it)")
    return problems


def unlisted(folder: Path, files) -> list[str]:
    """The files and symlinks under `folder` (symlinked folders not followed) that `files` does not
    list, besides artifact.json itself: relative, `/`-separated, sorted."""
    present = []
    for top, dirs, names in os.walk(folder):
        links = [d for d in dirs if os.path.islink(os.path.join(top, d))]  # os.walk does not descend into them
        present += [Path(top, name).relative_to(folder).as_posix() for name in names + links]
    return sorted(set(present) - set(files) - {"artifact.json"})


def write_meta(folder: Path, meta: ArtifactMeta) -> None:
    write_raw(folder, meta.model_dump(mode="json"))


def write_raw(folder: Path, raw: dict) -> None:
    """artifact.json with its digest."""
    (folder / "artifact.json").write_text(json.dumps(raw | {"digest": digest(raw)}, indent=1) + "\n")

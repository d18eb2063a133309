"""A traced graph's key: which graph (prefill, decode, a fork's copy, or an image's encoder) at which
bucket sizes. The build traces and names the graphs by it, artifact.json and the Neuron layout list
them by its text (prefill_<C>_<T>, decode_<T>, copy_<T>, vision_<N>), and the server finds the graph
for a call by it: one type, built and parsed here."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from contract.errors import Gemma4Error

GraphKind = Literal["prefill", "decode", "copy", "vision", "audio"]
_TEXT = re.compile(r"(prefill)_([1-9][0-9]*)_([1-9][0-9]*)|(decode|copy|vision|audio)_([1-9][0-9]*)")


class GraphKeyError(Gemma4Error, ValueError):
    pass


@dataclass(frozen=True)
class GraphKey:
    """kind over `keys` cache positions (the key bucket T); a prefill also has its chunk bucket C.
    An encoder (vision, audio) reads no cache: its `keys` are the soft tokens it makes (its patch
    bucket over the pooling kernel's k^2, its frame bucket over 4)."""

    kind: GraphKind
    keys: int
    chunk: int = 0  # prefill only: the tokens of a chunk

    def __post_init__(self):
        if (self.kind == "prefill") != (self.chunk > 0) or self.keys < 1:
            raise GraphKeyError(f"no graph {self.kind} with {self.chunk} chunk tokens over {self.keys} keys")

    @classmethod
    def prefill(cls, chunk: int, keys: int) -> GraphKey:
        return cls("prefill", keys, chunk)

    @classmethod
    def decode(cls, keys: int) -> GraphKey:
        return cls("decode", keys)

    @classmethod
    def copy(cls, keys: int) -> GraphKey:
        return cls("copy", keys)

    @classmethod
    def vision(cls, soft_tokens: int) -> GraphKey:
        return cls("vision", soft_tokens)

    @classmethod
    def audio(cls, soft_tokens: int) -> GraphKey:
        return cls("audio", soft_tokens)

    @classmethod
    def parse(cls, text: str) -> GraphKey:
        """ "prefill_128_2048" -> a chunk of 128 over 2,048 keys; "decode_2048" -> one token per slot
        over 2,048 keys; "copy_2048" -> a slot's first 2,048 positions into another."""
        m = _TEXT.fullmatch(text)
        if m is None:
            raise GraphKeyError(
                f"{text!r} is not a graph name: prefill_<chunk>_<keys>, decode_<keys>, copy_<keys> "
                "or vision_<soft tokens> or audio_<soft tokens>"
            )
        if m[1]:
            return cls.prefill(int(m[2]), int(m[3]))
        return cls(m[4], int(m[5]))  # type: ignore[arg-type]  # the pattern allows only these kinds

    def __str__(self) -> str:
        return f"prefill_{self.chunk}_{self.keys}" if self.kind == "prefill" else f"{self.kind}_{self.keys}"

    @property
    def tokens(self) -> int:
        """Tokens per query row: the chunk for a prefill, 1 for decode, none for a copy or an encoder."""
        return self.chunk if self.kind == "prefill" else int(self.kind == "decode")


def prefill_keys(bucket: int, key_buckets: tuple[int, ...]) -> tuple[int, ...]:
    """A chunk of n tokens padded to C = `bucket`, at positions p .. p+n-1, runs in the smallest key
    bucket T with T >= C and p + n <= T (padding rows write nothing), so its cost and mask rows follow
    the prompt, not kv_max. A chunk bucket has graphs for every T >= C; the last, kv_max, holds any
    chunk (buckets are smaller than kv_max)."""
    return tuple(t for t in key_buckets if t >= bucket)


def prefill_graphs(buckets: tuple[int, ...], key_buckets: tuple[int, ...]) -> tuple[GraphKey, ...]:
    """Every prefill graph: a chunk bucket and each key bucket that holds it."""
    return tuple(GraphKey.prefill(c, t) for c in buckets for t in prefill_keys(c, key_buckets))


def copy_graphs(batch: int, key_buckets: tuple[int, ...]) -> tuple[GraphKey, ...]:
    """Every fork copy graph, one per key bucket: a fork copies the first T positions of a global
    cache, T the smallest key bucket that holds the prompt. None at batch 1, where a fork decodes on
    in the slot that holds the prompt."""
    return () if batch == 1 else tuple(GraphKey.copy(t) for t in key_buckets)


def variant_graphs(
    buckets: tuple[int, ...], key_buckets: tuple[int, ...], batch: int, device_prefill: bool = True
) -> tuple[GraphKey, ...]:
    """Every graph of a variant, in the order they are traced and keyed: the prefills (unless the
    prompt runs on the host), a decode per key bucket, and the copies at batch > 1."""
    prefill = prefill_graphs(buckets, key_buckets) if device_prefill else ()
    return prefill + tuple(GraphKey.decode(t) for t in key_buckets) + copy_graphs(batch, key_buckets)


def encoder_graphs(vision: tuple[int, ...], audio: tuple[int, ...]) -> tuple[GraphKey, ...]:
    """The image and audio encoders' graphs, one per soft-token bucket of each (none without it)."""
    return tuple(GraphKey.vision(n) for n in vision) + tuple(GraphKey.audio(n) for n in audio)

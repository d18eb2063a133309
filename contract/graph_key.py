"""A traced graph's key: which graph (prefill, decode, a fork's copy, an image's encoder, a
speculative verify or a drafter step) at which bucket sizes. The build traces and names the graphs by
it, artifact.json and the Neuron layout list them by its text (prefill_<C>_<T>, decode_<T>, copy_<T>,
vision_<N>, verify_<N>_<T>, draft_<T>), and the server finds the graph for a call by it: one type,
built and parsed here."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from contract.errors import Gemma4Error

GraphKind = Literal["prefill", "decode", "copy", "vision", "audio", "verify", "draft"]
_TEXT = re.compile(r"(prefill|verify)_([1-9][0-9]*)_([1-9][0-9]*)|(decode|copy|vision|audio|draft)_([1-9][0-9]*)")
_CHUNKED = ("prefill", "verify")  # the kinds that feed several tokens per query row


class GraphKeyError(Gemma4Error, ValueError):
    pass


@dataclass(frozen=True)
class GraphKey:
    """kind over `keys` cache positions (the key bucket T); a prefill also has its chunk bucket C, a
    verify its tokens per slot N (a drafted run of k tokens after the slot's next one: N = k + 1).
    An encoder (vision, audio) reads no cache: its `keys` are the soft tokens it makes (its patch
    bucket over the pooling kernel's k^2, its frame bucket over 4)."""

    kind: GraphKind
    keys: int
    chunk: int = 0  # prefill: the tokens of a chunk; verify: the tokens per slot

    def __post_init__(self):
        if (self.kind in _CHUNKED) != (self.chunk > 0) or self.keys < 1:
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
    def verify(cls, tokens: int, keys: int) -> GraphKey:
        return cls("verify", keys, tokens)

    @classmethod
    def draft(cls, keys: int) -> GraphKey:
        return cls("draft", keys)

    @classmethod
    def parse(cls, text: str) -> GraphKey:
        """ "prefill_128_2048" -> a chunk of 128 over 2,048 keys; "decode_2048" -> one token per slot
        over 2,048 keys; "copy_2048" -> a slot's first 2,048 positions into another; "verify_5_2048"
        -> 5 tokens per slot over 2,048 keys; "draft_2048" -> a drafter step per slot over 2,048 keys."""
        m = _TEXT.fullmatch(text)
        if m is None:
            raise GraphKeyError(
                f"{text!r} is not a graph name: prefill_<chunk>_<keys>, decode_<keys>, copy_<keys>, "
                "vision_<soft tokens>, audio_<soft tokens>, verify_<tokens>_<keys> or draft_<keys>"
            )
        if m[1]:
            return cls(m[1], int(m[3]), int(m[2]))  # type: ignore[arg-type]  # the pattern allows prefill or verify
        return cls(m[4], int(m[5]))  # type: ignore[arg-type]  # the pattern allows only these kinds

    def __str__(self) -> str:
        return f"{self.kind}_{self.chunk}_{self.keys}" if self.kind in _CHUNKED else f"{self.kind}_{self.keys}"

    @property
    def tokens(self) -> int:
        """Tokens per query row: the chunk for a prefill, N for a verify, 1 for decode and a drafter
        step, none for a copy or an encoder."""
        return self.chunk if self.kind in _CHUNKED else int(self.kind in ("decode", "draft"))


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


def speculative_graphs(key_buckets: tuple[int, ...], verify: int, drafter: bool) -> tuple[GraphKey, ...]:
    """A verify of `verify` tokens per slot per key bucket (none when 0), and with a drafter a drafter
    step per key bucket."""
    out = tuple(GraphKey.verify(verify, t) for t in key_buckets) if verify else ()
    return out + (tuple(GraphKey.draft(t) for t in key_buckets) if drafter else ())


def variant_graphs(
    buckets: tuple[int, ...],
    key_buckets: tuple[int, ...],
    batch: int,
    device_prefill: bool = True,
    verify: int = 0,
    drafter: bool = False,
) -> tuple[GraphKey, ...]:
    """Every graph of a variant, in the order they are traced and keyed: the prefills (unless the
    prompt runs on the host), a decode per key bucket, the copies at batch > 1, then the speculative
    verifies and drafter steps (speculative_graphs)."""
    prefill = prefill_graphs(buckets, key_buckets) if device_prefill else ()
    decode = tuple(GraphKey.decode(t) for t in key_buckets)
    return prefill + decode + copy_graphs(batch, key_buckets) + speculative_graphs(key_buckets, verify, drafter)


def encoder_graphs(vision: tuple[int, ...], audio: tuple[int, ...]) -> tuple[GraphKey, ...]:
    """The image and audio encoders' graphs, one per soft-token bucket of each (none without it)."""
    return tuple(GraphKey.vision(n) for n in vision) + tuple(GraphKey.audio(n) for n in audio)

"""Element counts of one model on the device, from its configs alone: each rank's Gemma4Decoder (and
speculative drafter) built from the sharding plan on the meta device, its KV buffers, its encoders,
the host tables, and the working set of each graph family (prefill, decode, verify, draft). The bytes,
their places and the verdicts are ops/capacity.py's."""

from __future__ import annotations

import math
from functools import cache, partial

import torch

from contract.dtypes import DTYPES
from gemma4_port.port.audio import AudioEncoder
from gemma4_port.port.decoder import Gemma4Decoder
from gemma4_port.port.drafter import Gemma4Drafter
from gemma4_port.port.kv import kinds_present, kv_shapes, ring_size
from gemma4_port.port.layers import KEY_BLOCK
from gemma4_port.port.sharding import shard_drafter, shard_model
from gemma4_port.port.vision import VisionEncoder
from gemma4_port.source.model_sources import Speculative
from gemma4_port.source.variant import Variant


class ModelSizes:
    """Element counts of one model's device decoder per (tp, rank), each built once on the meta device,
    and of its encoders (`vision`: a Gemma4VisionConfig, `audio`: a Gemma4AudioConfig, or None),
    replicated on every rank."""

    def __init__(self, config, vision=None, audio=None, speculative: Speculative | None = None, drafter_config=None):
        """`speculative`: the manifest's speculative decoding (verify keys for the variants it names),
        with `drafter_config` its drafter's Gemma4AssistantConfig, whose weights join each rank's."""
        self.config = config
        self.vision, self.audio = vision, audio
        self.speculative, self.drafter_config = speculative, drafter_config
        # Memoised per instance (a method-level cache would keep every instance alive).
        self.shard = cache(partial(shard_model, config))
        self.weights = cache(self._weights)
        self.drafter_weights = cache(self._drafter_weights)

    def _weights(self, tp: int, rank: int) -> int:
        """Every parameter and buffer of the rank's device graph: the weights its neffs take as inputs."""
        with torch.device("meta"):
            decoder = Gemma4Decoder(self.shard(tp, rank))
        return sum(t.numel() for t in (*decoder.parameters(), *decoder.buffers()))

    def _drafter_weights(self, tp: int, rank: int) -> int:
        """The drafter's parameters and buffers beside the rank's decoder (0 without a drafter)."""
        if self.drafter_config is None:
            return 0
        with torch.device("meta"):
            drafter = Gemma4Drafter(shard_drafter(self.drafter_config, self.shard(tp, rank)))
        return sum(t.numel() for t in (*drafter.parameters(), *drafter.buffers()))

    def speculation(self, variant: Variant) -> tuple[int, bool]:
        """(verify tokens per slot, whether a drafter comes with them) for the variant."""
        spec = self.speculative
        if spec is None or not spec.applies_to(variant.name):
            return 0, False
        return spec.k + 1, self.drafter_config is not None

    def kv(self, tp: int, rank: int, batch: int, kv_max: int, ring: int) -> int:
        """KV elements: global layers keep kv_max positions, sliding layers a ring of `ring`."""
        return sum(math.prod(s) for s in kv_shapes(self.shard(tp, rank), batch, kv_max, ring))

    def ring(self, variant: Variant) -> int:
        return ring_size(self.shard(1, 0).sliding_window, variant.kv_max, variant.buckets)

    def working_sets(self, tp: int, rank: int, variant: Variant) -> dict[str, tuple[int, int]]:
        """Elements of each device graph family's largest working set: (float32 attention scores, input
        rows at the variant dtype). One layer's scores are alive at a time, the largest: q heads x Q
        queries x T_kind keys (T_kind = kv_max, or the ring for a sliding layer); the rows input is
        Q x 2 (mask, write; a draft's mask and its one key more) x T_kind per attention kind. Q is the
        largest chunk bucket for a prefill (hostside prefill_inputs: one slot), B for a decode (the
        device's largest graph with `prefill: host`), B x (k + 1) for a verify (verify_inputs: rows
        (B*N, 2, T)) and B for a drafter step (draft_inputs: rows (B, 2, T), the drafter's own query
        heads over the target's caches it reads)."""
        shard = self.shard(tp, rank)
        ring = self.ring(variant)
        width = {kind: ring if kind == "sliding" else variant.kv_max for kind in kinds_present(shard)}

        def working_set(queries: int, layers) -> tuple[int, int]:
            scores = max(s.q_heads * queries * width[s.kind] for s in layers)
            return scores, sum(queries * 2 * w for w in width.values())

        B = variant.batch
        out = {"decode": working_set(B, shard.layers)} if variant.prefill == "host" else {}
        out |= {} if variant.prefill == "host" else {"prefill": working_set(variant.buckets[-1], shard.layers)}
        verify, drafter = self.speculation(variant)
        if verify:
            out["verify"] = working_set(B * verify, shard.layers)
        if drafter:
            out["draft"] = working_set(B, shard_drafter(self.drafter_config, shard).model.layers)
        return out

    def transient(self, tp: int, rank: int, variant: Variant) -> tuple[str, int, int]:
        """The largest graph's working set (working_sets): (its graph family, scores, rows), the largest
        in bytes at the variant dtype."""
        size = DTYPES[variant.dtype].itemsize
        sets = self.working_sets(tp, rank, variant)
        graph = max(sets, key=lambda g: 4 * sets[g][0] + size * sets[g][1])
        return graph, *sets[graph]

    def encoder(self, variant: Variant) -> tuple[int, int, int]:
        """Elements of the variant's encoders, 0 without a media budget: (weights, the largest encoder
        graph's working set, their host table). An image graph of the budget's P = max_soft_tokens x k^2
        patches holds one layer's float32 scores of a key block (heads x P x min(P, KEY_BLOCK)) beside
        its inputs (patches, position embeddings, rope, the N x P pooling matrix), and the host keeps the
        tower's 2-D position table; an audio graph of T soft tokens (4T mel frames) holds the first
        convolution's output (c0 x 2T x 64 float32) or one layer's blocked scores (heads x T x context)."""
        media = variant.media
        weights, transient, table = 0, 0, 0
        if media and media.image and self.vision is not None:
            v = self.vision
            with torch.device("meta"):
                encoder = VisionEncoder(v, self.config.hidden_size)
            weights += sum(t.numel() for t in (*encoder.parameters(), *encoder.buffers()))
            P = media.image.max_soft_tokens * v.pooling_kernel_size**2
            inputs = P * (3 * v.patch_size**2 + v.hidden_size + 2 * v.head_dim) + media.image.max_soft_tokens * P
            transient = v.num_attention_heads * P * min(P, KEY_BLOCK) + inputs
            table = 2 * v.position_embedding_size * v.hidden_size
        if media and media.audio and self.audio is not None:
            a, T = self.audio, media.audio.max_soft_tokens
            with torch.device("meta"):
                clip = AudioEncoder(a, self.config.hidden_size)
            weights += sum(t.numel() for t in (*clip.parameters(), *clip.buffers()))
            context = a.attention_chunk_size + a.attention_context_left - 1 + a.attention_context_right
            scores = a.num_attention_heads * T * context
            transient = max(transient, a.subsampling_conv_channels[0] * 2 * T * 64 + scores)
        return weights, transient, table

    def host_tables(self) -> int:
        m = self.shard(1, 0)
        return m.vocab * m.hidden + m.ple_vocab * m.num_layers * m.ple_dim

    def host_rope(self, kv_max: int) -> int:
        """The host's rotary rows, made at load: cos and sin of every position per attention kind
        (contract/hostside.py HostInputs.rope_rows); the mask strips beside them are 8 x ring or kv_max."""
        dims = {s.kind: s.head_dim for s in self.shard(1, 0).layers}
        return kv_max * 2 * sum(dims.values())

"""A Gemma-4 assistant (the multi-token-prediction drafter) as a device graph beside the target.

What transformers' Gemma4AssistantForCausalLM computes for one draft step: the target's word
embedding of the latest token beside a hidden state of the target's width, through `pre_projection`
to the drafter's width; its layers, every one kv-shared, each reading the target's KV buffer of the
last cache-owning target layer of its attention type (DrafterShard); the final norm; then the logits
(a tied head, or the centroid-masked head of ordered embeddings) and `post_projection` back to the
target's width, the next step's hidden state. Every step of a round sits at one position, the
latest token's, and attends to the target's cache before it (the host's mask row of the position
before). It writes no cache.

The centroid head (the 12B's unified assistant): `centroids` scores 2,048 groups of the vocabulary,
the top 32 stay, and only their tokens get logits; the rest sit below the lowest of those. The graph
computes it without a gather or scatter: the lm_head's rows are loaded in the head's own vocabulary
order (`token_ordering`), so each group is a contiguous block of the logits, masked by a select; the
host puts the row back in token order (HostTables.draft_order).

Shapes: B batch slots, H the drafter's width, E the target's (backbone), V vocab, C centroids.
"""

from __future__ import annotations

import torch
from torch import nn

from gemma4_port.port.decoder import Gemma4Decoder, WeightEntry
from gemma4_port.port.layers import Layer, RMSNorm, linear
from gemma4_port.port.sharding import DrafterShard

ORDERING_KEY = "masked_embedding.token_ordering"


class Gemma4Drafter(nn.Module):
    def __init__(self, d: DrafterShard, dtype: torch.dtype = torch.float32, reduce=None):
        super().__init__()
        self.drafter, self.shard = d, d.model
        m = d.model
        self.layers = nn.ModuleList(Layer(s, m) for s in m.layers)
        self.norm = RMSNorm(m.hidden, m.eps)
        self.lm_head = linear(m.hidden, m.vocab)
        self.pre_projection = linear(2 * d.backbone, m.hidden)
        self.post_projection = linear(m.hidden, d.backbone)
        if d.ordered:
            self.centroids = linear(m.hidden, d.centroids)
        self.reduce = reduce or (lambda x: x)  # all-reduce after row-parallel projections; identity on one rank
        self.to(dtype)

    # The layers are the target's own (without PLE: a drafter has none), loaded by the same strict map.
    layer_tail = Gemma4Decoder.layer_tail
    load_decoder_weights = Gemma4Decoder.load_weights

    def weight_map(self) -> list[WeightEntry]:
        """The decoder's entries for the layers, the final norm and the head, and the projections."""
        out = Gemma4Decoder.weight_map(self)  # type: ignore[arg-type]  # reads only .shard
        out += [WeightEntry(f"{n}.weight", f"{n}.weight") for n in ("pre_projection", "post_projection")]
        if self.drafter.ordered:
            out.append(WeightEntry("centroids.weight", "masked_embedding.centroids.weight"))
        return out

    @torch.no_grad()
    def load_weights(self, reader) -> None:
        """As the decoder's, then the head's rows in the centroid head's order (ordered_head)."""
        self.load_decoder_weights(reader)
        if self.drafter.ordered:
            self.lm_head.weight.copy_(ordered_head(self.lm_head.weight, reader))

    def step(self, x, rope, masks, caches):
        """x (B, 1, 2E): cat(target word embedding, hidden state); rope {kind: (cos, sin) (B, 1, D)};
        masks {kind: (B, 1, 1, T)}; caches: the target's KV tensors (B, KVH, T, D), K then V per cache.
        Returns raw logits (B, V) (in the centroid head's vocabulary order when it has one) and the
        next hidden state (B, E)."""
        h = self.pre_projection(x)  # (B, 1, H)
        for layer in self.layers:
            s = layer.shard
            cos, sin = rope[s.kind]
            q = layer.self_attn.query(layer.input_layernorm(h), cos, sin)
            a = layer.self_attn.attend(q, caches[2 * s.cache], caches[2 * s.cache + 1], masks[s.kind])
            h = self.layer_tail(layer, h, a, None)
        h = self.norm(h[:, 0])  # (B, H)
        return self.head(h), self.post_projection(h)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """h (B, H) -> logits (B, V): the tied head, or only the top centroids' tokens, the others at
        the lowest of those less one (as transformers fills them, per row here)."""
        logits = self.lm_head(h)  # (B, V)
        if not self.drafter.ordered:
            return logits
        B, C = h.shape[0], self.drafter.centroids
        scores = self.centroids(h)  # (B, C)
        kth = torch.topk(scores, self.drafter.top_k, dim=-1).values[:, -1:]  # (B, 1)
        keep = (scores >= kth).unsqueeze(-1)  # (B, C, 1)
        groups = logits.view(B, C, -1)  # (B, C, V/C): group c is the head's vocabulary block c
        top = torch.finfo(logits.dtype).max
        floor = torch.where(keep, groups, top).amin(dim=(1, 2), keepdim=True) - 1.0  # (B, 1, 1)
        return torch.where(keep, groups, floor).view(B, -1)  # (B, V)


def ordered_head(weight: torch.Tensor, reader) -> torch.Tensor:
    """The head's rows (V, H) in the centroid head's vocabulary order: row j is token ordering[j]'s."""
    order = reader.get(ORDERING_KEY).long()  # (V,)
    return weight[order]

"""Tensor-parallel sharding rules as data: which tensors split along which dim, per rank.

"Divide everything by tp" is wrong three ways on Gemma-4: kv-shared layers
have no K/V of their own and must agree with their owner; GQA heads split with their query groups
only when the KV heads divide; KV heads that do not divide (nkv 1) are replicated, and the query
groups are recomputed from the *original* head counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rich.table import Table

from contract.errors import Gemma4Error

SPLIT, REPLICATED = "split", "replicated"


class ShardingError(Gemma4Error, ValueError):
    pass


@dataclass(frozen=True)
class LayerShard:
    """One decoder layer as rank `rank` of `tp` holds it. Head counts are this rank's."""

    index: int
    kind: Literal["sliding", "full"]
    head_dim: int
    q_heads_total: int
    kv_heads_total: int
    q_heads: int  # query heads on this rank, rows [q_start, q_start + q_heads) of q_proj's heads
    q_start: int
    kv_rule: Literal["split", "replicated"]
    kv_heads: int  # KV heads held in this rank's buffer (all of them when replicated)
    kv_start: int  # first checkpoint KV head in the buffer
    kv_use_start: int  # first buffer head this rank's queries read
    kv_use: int  # buffer heads this rank's queries read
    groups: int  # query heads per used KV head on this rank
    owns_cache: bool
    cache: int  # ordinal of the KV buffer this layer reads (its own, or its owner's)
    k_eq_v: bool
    intermediate: int  # MLP width on this rank
    intermediate_start: int
    intermediate_total: int


@dataclass(frozen=True)
class ModelShard:
    tp: int
    rank: int
    hidden: int
    vocab: int
    ple_dim: int
    ple_vocab: int
    eps: float
    sliding_window: int
    first_shared: int  # index of the first kv-shared layer (= num layers when none)
    layers: tuple[LayerShard, ...]
    cache_layers: tuple[int, ...]  # layer index owning each KV buffer, by buffer ordinal
    tied: bool

    @property
    def num_layers(self) -> int:
        return len(self.layers)


def _kinds(config) -> list[str]:
    return ["full" if t == "full_attention" else "sliding" for t in config.layer_types]


def _kv_stores(kinds: list[str], owners) -> dict[str, int]:
    """The layer a kv-shared layer of each attention kind reads (the "store"): the last of the cache-owning
    layers `owners` of that kind. The target's shared layers read it, and so do all of a drafter's."""
    return {kinds[j]: j for j in owners}


def shard_model(config, tp: int = 1, rank: int = 0) -> ModelShard:
    """The shard of `config` (a Gemma4TextConfig) that rank `rank` of `tp` holds."""
    if tp < 1 or not 0 <= rank < tp:
        raise ShardingError(f"rank {rank} of tp {tp} is not a valid rank")
    n = config.num_hidden_layers
    kinds = _kinds(config)
    modes = config.kv_sharing_modes
    first_shared = n - config.num_kv_shared_layers
    cache_of_layer: dict[int, int] = {}
    cache_layers: list[int] = []
    for i in range(first_shared):
        cache_of_layer[i] = len(cache_layers)
        cache_layers.append(i)
    stores = _kv_stores(kinds, range(first_shared))
    for i in range(first_shared, n):
        owner = stores[kinds[i]]
        assert modes[owner] == "store", (i, owner, modes)
        cache_of_layer[i] = cache_of_layer[owner]

    nq = config.num_attention_heads
    if nq % tp:
        raise ShardingError(f"{nq} query heads cannot be split over tp={tp}")
    layers = []
    for i in range(n):
        # Read the original head counts from the config, never from a (possibly sharded) module.
        lc = config.per_layer_config[i]
        head_dim, nkv = lc.head_dim, lc.num_key_value_heads
        owner = cache_layers[cache_of_layer[i]]
        if (
            config.per_layer_config[owner].num_key_value_heads != nkv
            or config.per_layer_config[owner].head_dim != head_dim
        ):
            raise ShardingError(f"layer {i} and its KV owner {owner} disagree on KV heads or head_dim")
        heads = _heads(f"layer {i}", nq, nkv, tp, rank)
        inter_total = config.intermediate_size * (2 if config.use_double_wide_mlp and modes[i] == "reuse" else 1)
        if inter_total % tp:
            raise ShardingError(f"layer {i}: MLP width {inter_total} cannot be split over tp={tp}")
        layers.append(
            LayerShard(
                index=i,
                kind=kinds[i],
                head_dim=head_dim,
                q_heads_total=nq,
                kv_heads_total=nkv,
                **heads,
                owns_cache=i < first_shared,
                cache=cache_of_layer[i],
                k_eq_v=bool(config.attention_k_eq_v) and kinds[i] == "full",
                intermediate=inter_total // tp,
                intermediate_start=rank * (inter_total // tp),
                intermediate_total=inter_total,
            )
        )
    return ModelShard(
        tp=tp,
        rank=rank,
        hidden=config.hidden_size,
        vocab=config.vocab_size,
        ple_dim=config.hidden_size_per_layer_input or 0,
        ple_vocab=config.vocab_size_per_layer_input,
        eps=config.rms_norm_eps,
        sliding_window=config.sliding_window,
        first_shared=first_shared,
        layers=tuple(layers),
        cache_layers=tuple(cache_layers),
        tied=bool(config.tie_word_embeddings),
    )


def _heads(what: str, nq: int, nkv: int, tp: int, rank: int) -> dict:
    """The query and KV heads rank `rank` of `tp` holds and reads, for `nq` query heads over `nkv` KV heads."""
    group = nq // nkv
    q_heads, q_start = nq // tp, rank * (nq // tp)
    if nkv % tp == 0:
        rule, kv_heads, kv_start = SPLIT, nkv // tp, rank * (nkv // tp)
        kv_use_start, kv_use = 0, kv_heads
    else:
        rule, kv_heads, kv_start = REPLICATED, nkv, 0
        if group % q_heads:
            raise ShardingError(
                f"{what}: {nkv} KV heads neither divide by tp={tp} nor keep each rank's "
                f"{q_heads} query heads inside one KV group of {group}"
            )
        kv_use_start, kv_use = q_start // group, 1
    return dict(
        q_heads=q_heads,
        q_start=q_start,
        kv_rule=rule,
        kv_heads=kv_heads,
        kv_start=kv_start,
        kv_use_start=kv_use_start,
        kv_use=kv_use,
        groups=q_heads // kv_use,
    )


@dataclass(frozen=True)
class DrafterShard:
    """A Gemma-4 assistant (drafter) as rank `rank` holds it: `model`'s layers are all kv-shared, each
    reading the target's KV buffer of the last non-shared target layer of its attention type (its
    `cache` is that buffer's ordinal among the target's); it maps a target hidden state of width
    `backbone` (with the target's word embedding beside it) to logits and the next such state."""

    model: ModelShard
    backbone: int
    ordered: bool  # the centroid-masked head of ordered embeddings
    centroids: int
    top_k: int  # centroids kept per step
    tied: bool


def shard_drafter(config, target: ModelShard) -> DrafterShard:
    """The shard of drafter `config` (a Gemma4AssistantConfig) that goes with the target's shard
    `target` (the same rank of the same tp)."""
    text, tp, rank = config.text_config, target.tp, target.rank
    if config.backbone_hidden_size != target.hidden:
        raise ShardingError(
            f"the drafter was trained for a target of width {config.backbone_hidden_size}, this one is {target.hidden}"
        )
    if text.vocab_size != target.vocab:
        raise ShardingError(f"the drafter's vocabulary ({text.vocab_size}) is not the target's ({target.vocab})")
    stores = _kv_stores([layer.kind for layer in target.layers], target.cache_layers)
    nq = text.num_attention_heads
    if nq % tp:
        raise ShardingError(f"the drafter's {nq} query heads cannot be split over tp={tp}")
    layers = []
    for i, kind in enumerate(_kinds(text)):
        lc, owner = text.per_layer_config[i], target.layers[stores[kind]] if kind in stores else None
        if owner is None or (lc.head_dim, lc.num_key_value_heads) != (owner.head_dim, owner.kv_heads_total):
            raise ShardingError(
                f"drafter layer {i} ({kind}, {lc.num_key_value_heads} KV heads of {lc.head_dim}) has no target "
                f"cache of its kind and shape to read"
            )
        if text.intermediate_size % tp:
            raise ShardingError(f"drafter layer {i}: MLP width {text.intermediate_size} cannot be split over tp={tp}")
        layers.append(
            LayerShard(
                index=i,
                kind=kind,
                head_dim=lc.head_dim,
                q_heads_total=nq,
                kv_heads_total=lc.num_key_value_heads,
                **_heads(f"drafter layer {i}", nq, lc.num_key_value_heads, tp, rank),
                owns_cache=False,
                cache=owner.cache,
                k_eq_v=False,
                intermediate=text.intermediate_size // tp,
                intermediate_start=rank * (text.intermediate_size // tp),
                intermediate_total=text.intermediate_size,
            )
        )
    model = ModelShard(
        tp=tp,
        rank=rank,
        hidden=text.hidden_size,
        vocab=text.vocab_size,
        ple_dim=0,
        ple_vocab=0,
        eps=text.rms_norm_eps,
        sliding_window=text.sliding_window,
        first_shared=0,
        layers=tuple(layers),
        cache_layers=(),
        tied=bool(config.tie_word_embeddings),
    )
    return DrafterShard(
        model,
        config.backbone_hidden_size,
        bool(config.use_ordered_embeddings),
        config.num_centroids,
        config.centroid_intermediate_top_k,
        bool(config.tie_word_embeddings),
    )


def _span(prefix: str, start: int, count: int) -> str:
    return f"{prefix}{start}" if count == 1 else f"{prefix}{start}-{start + count - 1}"


def shard_table(config, tp: int) -> Table:
    """The plan `build.py plan --shards` prints: per layer, what each of the `tp` ranks holds."""
    ranks = [shard_model(config, tp, r) for r in range(tp)]
    m = ranks[0]
    table = Table(
        title=f"sharding plan: tp={tp}, {m.num_layers} layers, {len(m.cache_layers)} KV caches "
        f"({m.num_layers - m.first_shared} kv-shared layers)",
        caption="q_proj, k/v_proj (when split), gate/up_proj split by output rows; o_proj, down_proj split by "
        "input columns and all-reduced (one each per layer); lm_head, per-layer-input projections and "
        "every norm replicated; word and per-layer embeddings stay on the host.",
    )
    for col in (
        "layer",
        "kind",
        "head_dim",
        "q heads",
        "K/V",
        "KV heads / rank",
        "queries -> KV heads by rank",
        "KV cache",
        "MLP width",
        "replicated",
    ):
        table.add_column(col)
    for i, s in enumerate(m.layers):
        per_rank = [r.layers[i] for r in ranks]
        reads = ", ".join(
            f"r{r}: {_span('q', x.q_start, x.q_heads)}->{_span('kv', x.kv_start + x.kv_use_start, x.kv_use)}"
            for r, x in enumerate(per_rank)
        )
        replicated = ["norms", "layer_scalar"] + (["PLE gate/proj"] if m.ple_dim else [])
        if s.kv_rule == REPLICATED and s.owns_cache:
            replicated.append("k_proj" if s.k_eq_v else "k/v_proj")
        table.add_row(
            str(i),
            s.kind,
            str(s.head_dim),
            f"{s.q_heads_total} -> {s.q_heads}/rank",
            f"{s.kv_rule}{' (v = k)' if s.k_eq_v else ''}",
            f"{s.kv_heads} of {s.kv_heads_total}",
            f"{reads} ({s.groups} q/kv)",
            "own" if s.owns_cache else f"layer {m.cache_layers[s.cache]}'s",
            f"{s.intermediate_total} -> {s.intermediate}/rank",
            ", ".join(replicated),
        )
    return table

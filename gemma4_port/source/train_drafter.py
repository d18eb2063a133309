"""Training a Gemma-4 drafter (transformers' `Gemma4AssistantForCausalLM`) on a frozen target's own states.

At generation time (transformers' SinglePositionMultiTokenCandidateGenerator) a draft round starts at
the last token t the target has emitted: the drafter's input is the target's embedding of that token
next to the target's last hidden state at t - 1 (the state that chose it), at position t, attending to
the target's K/V of positions < t (the last layer of each attention type: every drafter layer is
kv-shared). Each further draft step feeds back the drafter's own projected hidden state and the token
it drafted, at the same position t. Training unrolls those `steps` rounds for every position of a row
at once: one query per position, each behind its own mask, teacher-forced on the row's true tokens
(a drafted token that is wrong ends the round anyway), the loss summed over the steps."""

from __future__ import annotations

import torch
import torch.nn.functional as F

SLIDING, FULL = "sliding_attention", "full_attention"


def drafter_config(target: dict, hidden: int, intermediate: int, heads: int, layers: tuple[str, ...]):
    """An assistant config that fits the target's text config (`target`, as Gemma4TextConfig takes it):
    backbone width = the target's, its head sizes, KV heads and window (its K/V are read as they are),
    its vocabulary; no PLE, every layer kv-shared."""
    from transformers import Gemma4AssistantConfig, Gemma4TextConfig

    text = Gemma4TextConfig(
        vocab_size=target["vocab_size"],
        vocab_size_per_layer_input=0,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=len(layers),
        layer_types=list(layers),
        num_attention_heads=heads,
        num_key_value_heads=target["num_key_value_heads"],
        head_dim=target["head_dim"],
        global_head_dim=target["global_head_dim"],
        sliding_window=target["sliding_window"],
        hidden_size_per_layer_input=0,
        num_kv_shared_layers=len(layers),
        use_double_wide_mlp=False,
        final_logit_softcapping=target["final_logit_softcapping"],
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    return Gemma4AssistantConfig(text_config=text, backbone_hidden_size=target["hidden_size"])


def draft_masks(seq: int, window: int) -> dict[str, torch.Tensor]:
    """Query i (position i + 1) attends to keys 0..i, the last `window` + 1 of them on sliding layers
    (True = attend): what the generator's bidirectional masks give a single query over the cache
    (transformers' bidirectional window is inclusive: distance <= window)."""
    q = torch.arange(seq - 1)[:, None]
    k = torch.arange(seq)[None, :]
    full = k <= q
    sliding = full & (k >= q - window)
    return {FULL: full[None, None], SLIDING: sliding[None, None]}  # (1, 1, seq - 1, seq)


@torch.no_grad()
def target_states(target, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """(last hidden state (B, S, H) after the final norm, the shared K/V by layer type (B, nkv, S, d))."""
    out = target(input_ids=ids, output_hidden_states=True, return_shared_kv_states=True)
    return out.hidden_states[-1], {k: (v[0], v[1]) for k, v in out.shared_kv_states.items()}


def draft_rounds(drafter, embed, ids, hidden, kv, steps: int) -> list[torch.Tensor]:
    """The drafter's logits at draft step 1..`steps` for every start position t = 1..S-1 at once:
    step j predicts token t + j; each (B, S - 1, vocab)."""
    seq = ids.shape[1]
    text = drafter.config.get_text_config()
    masks = {k: m.expand(ids.shape[0], 1, -1, -1) for k, m in draft_masks(seq, text.sliding_window).items()}
    positions = torch.arange(1, seq)[None].expand(ids.shape[0], -1)  # every step of a round sits at t
    state = hidden[:, :-1]  # the target state at t - 1
    out = []
    for j in range(steps):
        token = ids[:, 1 + j :]  # teacher-forced: the true token t + j, as far as the row reaches
        token = F.pad(token, (0, j), value=0)  # (B, S - 1); the padded tail's labels are ignored
        with torch.no_grad():
            token_embedding = embed(token)
        x = drafter.pre_projection(torch.cat([token_embedding, state], dim=-1))  # (B, S-1, 2H) -> (B, S-1, h)
        # output_hidden_states keeps every query through the kv-shared layers: transformers would otherwise
        # slice a multi-query input to its last tokens there (for generate's prefill), and fail without PLE.
        last = drafter.model(
            inputs_embeds=x,
            position_ids=positions,
            attention_mask=masks,
            shared_kv_states=kv,
            use_cache=False,
            output_hidden_states=True,
        ).last_hidden_state
        state = drafter.post_projection(last)
        out.append(drafter.lm_head(last))
    return out


def draft_loss(rounds: list[torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of step j's logits against token t + j, averaged over the steps."""
    losses = []
    for j, logits in enumerate(rounds):
        labels = F.pad(ids[:, 2 + j :], (0, j + 1), value=-100)  # token t + j + 1 for start t = 1..S-1
        losses.append(F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100))
    return torch.stack(losses).mean()


def train_drafter(target, config, batches, lr: float, seed: int, steps: int, log=print):
    """A drafter trained on `batches` (an iterator of (B, S) id rows) against the frozen `target`."""
    from transformers import Gemma4AssistantForCausalLM

    torch.manual_seed(seed)
    drafter = Gemma4AssistantForCausalLM(config).train()
    embed = target.get_input_embeddings()
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=len(batches), pct_start=0.1)
    for i, ids in enumerate(batches):
        hidden, kv = target_states(target, ids)
        loss = draft_loss(draft_rounds(drafter, embed, ids, hidden, kv, steps), ids)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        schedule.step()
        opt.zero_grad(set_to_none=True)
        if i % 25 == 0 or i == len(batches) - 1:
            log(f"drafter step {i + 1}/{len(batches)}: loss {loss.item():.3f}")
    return drafter.eval()

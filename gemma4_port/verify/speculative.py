"""`build.py verify` for an artifact built with speculative decoding: three proofs against
transformers in float32, each a row of the verify table.

- draft: from the same target state (a prompt, its next token, the target's KV and last hidden
  state), our drafter's k proposals and their logits are Gemma4AssistantForCausalLM's, step for step
  (transformers' Gemma-4 assistant, fed as SinglePositionMultiTokenCandidateGenerator feeds it: the
  target's embedding of the latest token beside the hidden state, every step at the position of the
  target's next token, attending to the target's KV before it).
- verify rows: one verify pass over the next token and those proposals gives, at each of the k + 1
  positions, the reference's logits there (teacher-forced), within the dtype's bounds.
- speculative greedy: decoding with speculation (draft, verify, keep the longest drafted prefix the
  target agrees with plus its own next token) gives transformers' greedy output of the target
  alone, token for token, on several prompts at once in the batch's slots.
"""

from __future__ import annotations

from pathlib import Path

import torch

from contract.greedy import argmax
from gemma4_port.source.checkpoint import resolve_drafter
from gemma4_port.source.checkpoint_files import read_drafter_config
from gemma4_port.source.manifest import Manifest
from gemma4_port.verify.agreement import Case, Row, compare
from gemma4_port.verify.reference import reference_greedy

PROPOSAL_CASES = 3  # prompts whose drafter proposals and verify rows are compared


def load_reference_drafter(folder: Path):
    """transformers' own assistant model of the drafter checkpoint, float32, eager attention."""
    from transformers import Gemma4AssistantForCausalLM, Gemma4UnifiedAssistantForCausalLM

    config = read_drafter_config(folder)
    config.text_config._attn_implementation = "eager"
    cls = (
        Gemma4UnifiedAssistantForCausalLM
        if config.model_type == "gemma4_unified_assistant"
        else Gemma4AssistantForCausalLM
    )
    return cls.from_pretrained(str(folder), config=config, dtype=torch.float32).eval()


@torch.no_grad()
def reference_proposals(target, drafter, ids: list[int], k: int) -> tuple[int, list[int], list[torch.Tensor]]:
    """The target's next token after `ids`, then the drafter's k greedy proposals and the raw logits
    (V,) that chose each, from the target's state after `ids`."""
    out = target(input_ids=torch.tensor([ids]), output_hidden_states=True, return_shared_kv_states=True)
    token = int(out.logits[0, -1].argmax())
    hidden = out.hidden_states[-1][:, -1:]  # (1, 1, E): the final-norm hidden state of the last prompt token
    shared = out.shared_kv_states  # per layer type, the store layer's K/V of positions 0 .. len(ids) - 1
    position = torch.tensor([[len(ids)]])
    embed = target.get_input_embeddings()
    proposals, logits = [], []
    latest = token
    for _ in range(k):
        step = drafter(
            inputs_embeds=torch.cat((embed(torch.tensor([[latest]])), hidden), dim=-1),
            position_ids=position,
            shared_kv_states=shared,
        )
        logits.append(step.logits[0, -1].float())
        latest, hidden = int(logits[-1].argmax()), step.last_hidden_state
        proposals.append(latest)
    return token, proposals, logits


def draft_rows(runner, target, drafter, cases: list[Case], dtype: str) -> list[Row]:
    """Per case: our drafter's proposals against the reference's from the same target state, and the
    verify pass over them against the reference's teacher-forced logits."""
    k, cap, rows = runner.draft_k, runner.geo.softcap, []
    for case in cases:
        logits = runner.prefill_prompt(0, case.ids)
        token, want, want_logits = reference_proposals(target, drafter, case.ids, k)
        latest, got, got_logits = argmax(logits), [], []
        for _ in range(k):
            got_logits.append(runner.draft({0: latest})[0].float())
            latest = argmax(got_logits[-1])
            got.append(latest)
        rows.append(compare(Case(f"draft:{case.name}", case.ids, k), got, got_logits, want, want_logits, None, dtype))
        fed = [token, *want]  # the reference's run: both sides verify the same tokens
        verified = runner.verify({0: fed})[0]
        runner.free(0)
        with torch.no_grad():  # the reference's softcapped logits after each fed token: (k + 1, V)
            ref = target(input_ids=torch.tensor([case.ids + fed])).logits[0, len(case.ids) :].float()
        truth = [int(r.argmax()) for r in ref]
        ours = [argmax(v) for v in verified]
        rows.append(
            compare(Case(f"verify:{case.name}", case.ids, k + 1), ours, list(verified), truth, list(ref), cap, dtype)
        )
    return rows


def speculative_greedy(runner, prompts: list[list[int]], steps: int) -> list[tuple[list[int], list[torch.Tensor]]]:
    """Greedy decoding with speculation, prompt i in slot i, every slot's round in one drafter step
    and one verify: draft up to k tokens (fewer near kv_max or the last step), verify the next token
    with them, keep the drafted prefix the target's argmax agrees with and the target's own token
    after it. Without a drafter each round verifies the next token alone. Returns per prompt its
    tokens and the raw logits (V,) that chose each."""
    out = {}
    for slot, ids in enumerate(prompts):
        logits = runner.prefill_prompt(slot, ids)
        out[slot] = ([argmax(logits)], [logits.float()])
    live = [slot for slot in out if steps > 1]
    while live:
        k = {
            s: min(runner.draft_k or 0, steps - len(out[s][0]) - 1, runner.geo.kv_max - runner.slots[s].position - 1)
            for s in live
        }
        drafted = {s: [] for s in live}
        for i in range(max(k.values())):
            stepping = [s for s in live if i < k[s]]
            latest = {s: (drafted[s] or out[s][0])[-1] for s in stepping}
            for s, row in runner.draft(latest).items():
                drafted[s].append(argmax(row))
        rows = runner.verify({s: [out[s][0][-1], *drafted[s]] for s in live})
        for s in live:
            tokens, seen = out[s]
            n = 0  # drafted tokens the target agrees with
            while n < len(drafted[s]) and argmax(rows[s][n]) == drafted[s][n]:
                n += 1
            runner.accept(s, n + 1)
            for i in range(n + 1):
                tokens.append(argmax(rows[s][i]))
                seen.append(rows[s][i].float())
        live = [s for s in live if len(out[s][0]) < steps]
    for slot in out:
        runner.free(slot)
    return [(tokens[:steps], seen[:steps]) for tokens, seen in (out[s] for s in sorted(out))]


def speculative_rows(runner, meta, target, cases: list[Case]) -> list[Row]:
    """Every speculative proof for an artifact with verify graphs (and a drafter): the drafter's
    proposals and the verify rows on the first cases, and greedy with speculation on every case,
    `batch` prompts at a time in the slots (each row against the target's greedy continuation)."""
    geo, rows = meta.geometry, []
    if geo.drafter is not None:
        manifest = Manifest.model_validate(meta.manifest)
        drafter = load_reference_drafter(resolve_drafter(manifest, manifest.speculative, geo.hidden))
        rows += draft_rows(runner, target, drafter, cases[:PROPOSAL_CASES], geo.dtype)
    for first in range(0, len(cases), geo.batch):
        group = cases[first : first + geo.batch]
        steps = min(c.steps for c in group)
        for case, (tokens, logits) in zip(group, speculative_greedy(runner, [c.ids for c in group], steps)):
            want, want_logits = reference_greedy(target, case.ids, steps)
            spec = Case(f"speculative:{case.name}", case.ids, steps)
            rows.append(compare(spec, tokens, logits, want, want_logits, geo.softcap, geo.dtype))
    return rows

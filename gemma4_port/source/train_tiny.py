"""`build.py train-tiny`: the tiny chat model and its drafter, trained on the CPU in minutes.

A Gemma-4 target with E2B's quirks at toy size (per-layer inputs, kv-shared layers, double-wide MLP
on them, one KV head, wider global heads) learns the corpus of tiny_corpus (chat-protocol
conversations and standard-library Python) with a byte-level BPE tokenizer trained on the same text;
then a `Gemma4AssistantForCausalLM` drafter learns to predict the frozen target's next tokens from the
target's own states (train_drafter). Both are written as checkpoint folders (bf16 safetensors) that
the tiny-chat manifest pins by digest. Seeded throughout; a run takes a few minutes of one core."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from gemma4_port.source import tiny_corpus
from gemma4_port.source.checkpoint import folder_digest
from gemma4_port.source.checkpoint_writer import write_checkpoint
from gemma4_port.source.toy_tokenizer import train_tokenizer
from gemma4_port.source.train_drafter import FULL, SLIDING, drafter_config, train_drafter

SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints" / "tiny-chat"  # package data


@dataclass(frozen=True)
class TinyChatSpec:
    seed: int = 0
    vocab: int = 2048
    conversations: int = 6000
    edits: int = 1500  # code-edit conversations (tiny_corpus.edit): the repetitive workload prompt lookup is for
    held_out_seed: int = 1  # the acceptance prompts' seed (tiny_corpus.held_out)
    seq: int = 256  # an edit's request and answer fit one row
    batch: int = 8
    target_steps: int = 320
    target_lr: float = 4e-3
    drafter_steps: int = 200
    drafter_lr: float = 5e-3
    draft_steps: int = 3  # draft rounds unrolled in training (and the generation config's num_assistant_tokens)

    def target_config(self) -> dict:
        s, f = SLIDING, FULL
        return dict(
            vocab_size=self.vocab,
            vocab_size_per_layer_input=self.vocab,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=6,
            layer_types=[s, s, f, s, s, f],
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=32,
            global_head_dim=64,
            sliding_window=128,
            hidden_size_per_layer_input=16,
            num_kv_shared_layers=2,
            use_double_wide_mlp=True,
            final_logit_softcapping=30.0,
            tie_word_embeddings=True,
        )


def corpus_texts(spec: TinyChatSpec, tok) -> list[str]:
    """Every training document as text: the rendered conversations and edits, then the standard-library files."""
    convs = tiny_corpus.conversations(spec.seed, spec.conversations) + tiny_corpus.edits(spec.seed, spec.edits)
    return [tiny_corpus.render(tok, c) for c in convs] + tiny_corpus.stdlib_sources()


def tokenizer_for(spec: TinyChatSpec):
    """The toy tokenizer with merges learnt from the corpus itself (rendered by a first, default one:
    only its template is used)."""
    renderer = train_tokenizer(spec.vocab, spec.seed)
    return train_tokenizer(spec.vocab, spec.seed, texts=corpus_texts(spec, renderer))


def rows(tok, texts: list[str], seq: int, seed: int) -> torch.Tensor:
    """The documents shuffled (seeded), tokenized (each starts with <bos>), concatenated and cut into
    rows of `seq` ids: (N, seq)."""
    docs = list(texts)
    random.Random(seed).shuffle(docs)
    ids: list[int] = []
    for doc in docs:
        ids += tok(doc, add_special_tokens=not doc.startswith(tok.bos_token))["input_ids"]
    n = len(ids) // seq
    return torch.tensor(ids[: n * seq]).view(n, seq)  # (N * seq,) -> (N, seq)


def batches(data: torch.Tensor, batch: int, steps: int, seed: int) -> list[torch.Tensor]:
    """`steps` batches of rows, each epoch in a fresh seeded order."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.cat([torch.randperm(len(data), generator=gen) for _ in range(steps * batch // len(data) + 1)])
    return [data[order[i * batch : (i + 1) * batch]] for i in range(steps)]


def train_target(spec: TinyChatSpec, data: torch.Tensor, log=print):
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    torch.manual_seed(spec.seed)
    model = Gemma4ForCausalLM(Gemma4TextConfig(**spec.target_config(), attn_implementation="sdpa")).train()
    opt = torch.optim.AdamW(model.parameters(), lr=spec.target_lr, weight_decay=0.01)
    plan = batches(data, spec.batch, spec.target_steps, spec.seed)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=spec.target_lr, total_steps=len(plan), pct_start=0.1)
    for i, ids in enumerate(plan):
        logits = model(input_ids=ids).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        opt.zero_grad(set_to_none=True)
        if i % 25 == 0 or i == len(plan) - 1:
            log(f"target step {i + 1}/{len(plan)}: loss {loss.item():.3f}")
    return model.eval()


def write_drafter(drafter, spec: TinyChatSpec, folder: Path) -> None:
    """The drafter as save_pretrained writes it (bf16), its generation config drafting `draft_steps`."""
    from transformers import GenerationConfig

    folder.mkdir(parents=True, exist_ok=True)
    drafter.to(torch.bfloat16).save_pretrained(folder)
    GenerationConfig(num_assistant_tokens=spec.draft_steps, do_sample=False).save_pretrained(folder)


def train_tiny(out: Path, spec: TinyChatSpec = TinyChatSpec(), log=print) -> dict[str, str]:
    """Train the pair and write OUT/target and OUT/drafter. -> each folder's digest."""
    start = time.monotonic()
    # One thread: on a small shared host torch's pool stalls far more than it gains (the steps are small
    # matrices), and one thread's reduction order is the same on every machine.
    torch.set_num_threads(1)
    torch.manual_seed(spec.seed)
    tok = tokenizer_for(spec)
    data = rows(tok, corpus_texts(spec, tok), spec.seq, spec.seed)
    log(f"corpus: {data.numel()} tokens in {len(data)} rows of {spec.seq}; tokenizer of {len(tok)} ids")
    target = train_target(spec, data, log)
    for p in target.parameters():
        p.requires_grad_(False)
    log(f"target trained in {time.monotonic() - start:.0f} s")
    config = drafter_config(spec.target_config(), hidden=64, intermediate=256, heads=4, layers=(SLIDING, FULL))
    plan = batches(data, spec.batch, spec.drafter_steps, spec.seed + 1)
    drafter = train_drafter(target, config, plan, spec.drafter_lr, spec.seed, spec.draft_steps, log)
    log(f"drafter trained; {time.monotonic() - start:.0f} s in all")
    # Rounded to bf16 once: what is shipped is what the acceptance is measured on.
    write_checkpoint(target, tok, out / "target", dtype=torch.bfloat16)
    write_drafter(drafter, spec, out / "drafter")
    return {name: folder_digest(out / name) for name in ("target", "drafter")}


def train_tiny_main(args) -> int:
    out = Path(args.out) if args.out else SHIPPED
    digests = train_tiny(out)
    for name, digest in digests.items():
        print(f"{out / name}: {digest}")
    return 0

"""Host cost per decode step of constrained decoding and logprobs at the real vocabulary (262,144),
next to a plain greedy step, with the runtime's own code (runtime.generate.logits.TokenChooser,
runtime.generate.grammar).

The vocabulary is synthetic, shaped like a multilingual byte-level BPE one: word pieces with and
without a leading space, numbers, punctuation runs, whitespace runs and CJK, Cyrillic, Arabic, Hangul
and Latin-extended pieces. The grammar engine's per-step work depends on how many tokens can continue
a given state, so a vocabulary of the real size and a realistic mix matters more than the exact strings.
A step is what the engine does for one slot: compute the mask, mask the row, choose, advance the matcher.
The logits are random, so the walk is the one a random-weight model takes (it still ends in valid JSON)."""

from __future__ import annotations

import json
import random
import time

import torch

from gemma4_port.bench.host_overhead import DEVICE_STEP_MS, logit_rows, real_geometry
from gemma4_port.bench.stats import summary
from runtime.generate.grammar import Grammar, GrammarCompiler
from runtime.generate.logits import Controls, TokenChooser
from runtime.generate.logprobs import logprobs
from runtime.generate.sampling import SamplingParams, sample

SCHEMA = {  # a typical extraction schema: strings, a bounded integer, an enum, an array, a nested object
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age", "tags", "kind", "ok", "address"],
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
        "kind": {"enum": ["cat", "dog", "bird"]},
        "ok": {"type": "boolean"},
        "address": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city", "zip"],
            "properties": {
                "city": {"type": "string", "maxLength": 16},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
        },
    },
}
GREEDY = SamplingParams(temperature=0.0)
EOS = (1,)


def synthetic_tokenizer(vocab: int, seed: int = 0):
    """A byte-level BPE `PreTrainedTokenizerFast` of exactly `vocab` ids (no merges: only its
    vocabulary is used, by the grammar engine)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    rng = random.Random(seed)
    byte_char = bytes_to_unicode()
    ids: dict[str, int] = {}
    for s in ("<pad>", "<eos>", "<bos>", "<unk>", *(byte_char[b] for b in range(256))):
        ids.setdefault(s, len(ids))
    syllables = [a + b for a in "bcdfghjklmnprstvwxyz" for b in "aeiou"] + ["th", "ng", "qu", "sh", "ch", "st", "er"]
    scripts = (
        (0x4E00, 0x9FFF),
        (0x0400, 0x04FF),
        (0x3040, 0x30FF),
        (0x0600, 0x06FF),
        (0xAC00, 0xD7A3),
        (0x00C0, 0x024F),
    )
    punct = "{}[]\":,.;!?()<>-_/\\'=+*&%$#@`~|^"
    while len(ids) < vocab:
        r = rng.random()
        if r < 0.55:
            w = "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
            w = rng.choice([w, w.capitalize(), w.upper()]) if rng.random() < 0.3 else w
            s = " " + w if rng.random() < 0.5 else w
        elif r < 0.65:
            s = str(rng.randint(0, 99999))[: rng.randint(1, 3)]
        elif r < 0.75:
            s = rng.choice(["", " ", "\n"]) + "".join(rng.choice(punct) for _ in range(rng.randint(1, 3)))
        elif r < 0.78:
            s = rng.choice(" \n\t") * rng.randint(1, 16)
        else:
            lo, hi = rng.choice(scripts)
            s = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 3)))
        ids.setdefault("".join(byte_char[b] for b in s.encode()), len(ids))
    tok = Tokenizer(models.BPE(vocab=ids, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>", pad_token="<pad>"
    )


def constrained_walk(
    grammars: GrammarCompiler, grammar: Grammar, rows: list[torch.Tensor], steps: int, cap: float | None
):
    """Seconds per step: the mask alone (llguidance), and the whole choice (mask, masked row, argmax,
    matcher advance); plus how many outputs completed and parsed."""
    compiled = grammars.compile(grammar)
    mask_s, step_s, done, parsed = [], [], 0, 0
    chooser, out = TokenChooser(Controls(), [], EOS, grammars.matcher(compiled)), []
    gen = torch.Generator()
    for i in range(steps):
        row = rows[i % len(rows)]
        t0 = time.perf_counter()
        chooser.matcher.allowed()
        t1 = time.perf_counter()
        token, _ = chooser.choose(row, GREEDY, cap, gen)  # computes the mask again, as the engine does once
        t2 = time.perf_counter()
        mask_s.append(t1 - t0)
        step_s.append(t2 - t1)
        if token in EOS:
            done += 1
            parsed += _parses(grammars, out)
            chooser, out = TokenChooser(Controls(), [], EOS, grammars.matcher(compiled)), []
        else:
            out.append(token)
    return mask_s, step_s, done, parsed


def _parses(grammars: GrammarCompiler, tokens: list[int]) -> bool:
    try:
        json.loads(grammars.tokenizer.decode_bytes(tokens))
        return True
    except ValueError:
        return False


def measure(steps: int, seed: int = 0) -> dict:
    torch.set_grad_enabled(False)
    geo = real_geometry()
    gen = torch.Generator().manual_seed(seed)
    rows = [
        r[0] for r in logit_rows("peaked", geo.vocab, torch.bfloat16 if geo.dtype == "bfloat16" else torch.float32, gen)
    ]
    t0 = time.perf_counter()
    grammars = GrammarCompiler(synthetic_tokenizer(geo.vocab, seed), geo.vocab, EOS)
    setup_s = time.perf_counter() - t0
    out: dict = {
        "vocab": geo.vocab,
        "steps": steps,
        "device_step_ms": DEVICE_STEP_MS,
        "grammar_engine": "llguidance",
        "tokenizer_setup_s": setup_s,
        "cases": {},
    }
    greedy = []
    for i in range(steps):
        t1 = time.perf_counter()
        sample(rows[i % len(rows)], GREEDY, geo.softcap, gen)
        greedy.append(time.perf_counter() - t1)
    out["cases"]["greedy step (no constraint)"] = {"step_us": summary(greedy, 1e6)}
    for name, grammar in (("json_schema", Grammar.json_schema(SCHEMA)), ("json_object", Grammar.json_object())):
        t1 = time.perf_counter()
        grammars.matcher(grammar)
        first_s = time.perf_counter() - t1
        mask_s, step_s, done, parsed = constrained_walk(grammars, grammar, rows, steps, geo.softcap)
        out["cases"][f"greedy + grammar ({name})"] = {
            "mask_us": summary(mask_s, 1e6),
            "step_us": summary(step_s, 1e6),
            "matcher_setup_ms": first_s * 1e3,
            "outputs_completed": done,
            "outputs_parsed": parsed,
        }
    for k in (0, 20):
        times = []
        for i in range(steps):
            row = rows[i % len(rows)]
            t1 = time.perf_counter()
            logprobs(row, 7, k, geo.softcap)
            times.append(time.perf_counter() - t1)
        out["cases"][f"logprobs, top {k}"] = {"step_us": summary(times, 1e6)}
    return out

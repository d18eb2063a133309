"""A byte-level BPE tokenizer trained in code for random test models."""

from __future__ import annotations

import random

SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>")
PAD_ID, EOS_ID, BOS_ID, UNK_ID, START_TURN_ID, END_TURN_ID = range(len(SPECIAL_TOKENS))

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<start_of_turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{{ message['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

_SEED_TEXT = """\
The capital of France is Paris. The capital of Italy is Rome. Hello world!
Inferentia2 has two NeuronCores and thirty-two gigabytes of high bandwidth memory.
A small team wants its own endpoint for agents and tools, cheap and correct, token for token.
def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)
Les modèles de langue prédisent le mot suivant. Ünïcödé, naïve café, 日本語のテキスト, emoji 🙂🚀.
"""


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    """English-ish seed text plus seeded pseudo-words: enough distinct pairs to fill any vocab."""
    rng = random.Random(seed)
    syllables = [a + b for a in "bcdfghklmnprstvwz" for b in "aeiouy"] + ["th", "ng", "qu", "sh", "ch"]
    out = _SEED_TEXT.splitlines() * 20
    for _ in range(lines):
        words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(3, 12))]
        out.append(" ".join(words).capitalize() + rng.choice(".!?,;"))
    return out


def train_tokenizer(vocab_size: int, seed: int):
    """A `PreTrainedTokenizerFast` whose vocabulary is exactly `vocab_size` ids, with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    # Like Gemma's own tokenizer: plain prompts start with <bos>; the chat template writes its own.
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", BOS_ID)])
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(
            f"the test tokenizer reached {tok.get_vocab_size()} ids, not vocab_size={vocab_size}; "
            f"random models need vocab_size between {len(SPECIAL_TOKENS) + 256} and ~20000"
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>", eos_token="<eos>", unk_token="<unk>", pad_token="<pad>",
        additional_special_tokens=["<start_of_turn>", "<end_of_turn>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast

"""A byte-level BPE tokenizer trained in code for random test models, speaking Gemma-4's chat
protocol: its control tokens (same strings, special, never split), a chat template with tools and
thinking (`chat_template.jinja`, written from the documented rules) and the `response_schema` that
real Gemma-4 checkpoints carry in tokenizer_config.json."""

from __future__ import annotations

import json
import random
from pathlib import Path

from contract.errors import Gemma4Error

# Gemma-4's control tokens. The first four keep Gemma's ids (pad 0, eos 1, bos 2, unk 3).
SPECIAL_TOKENS = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<mask>",
    "<|turn>",
    "<turn|>",
    "<|think|>",
    "<|channel>",
    "<channel|>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
    "<|image>",
    "<image|>",
    "<|audio>",
    "<audio|>",
    "<|image|>",
    "<|audio|>",
    "<|video|>",
)
PAD_ID, EOS_ID, BOS_ID, UNK_ID = range(4)
TURN_END, TOOL_RESPONSE = "<turn|>", "<|tool_response>"

# The names tokenizer_config.json gives them (transformers exposes each as `tok.<name>`).
NAMED_TOKENS = {
    "sot_token": "<|turn>",
    "eot_token": "<turn|>",
    "think_token": "<|think|>",
    "soc_token": "<|channel>",
    "eoc_token": "<channel|>",
    "std_token": "<|tool>",
    "etd_token": "<tool|>",
    "stc_token": "<|tool_call>",
    "etc_token": "<tool_call|>",
    "str_token": "<|tool_response>",
    "etr_token": "<tool_response|>",
    "escape_token": '<|"|>',
    "boi_token": "<|image>",
    "eoi_token": "<image|>",
    "boa_token": "<|audio>",
    "eoa_token": "<audio|>",
    "image_token": "<|image|>",
    "audio_token": "<|audio|>",
}

# The real checkpoints' response_schema: one regex splits a reply into thinking, tool calls and
# content; the arguments are Gemma's syntax ("x-parser"), not JSON.
RESPONSE_SCHEMA = {
    "type": "object",
    "properties": {
        "role": {"const": "assistant"},
        "thinking": {"type": "string"},
        "content": {"type": "string"},
        "tool_calls": {
            "x-regex-iterator": r"<\|tool_call>(.*?)<tool_call\|>",
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "type": {"const": "function"},
                    "function": {
                        "type": "object",
                        "x-regex": r"call\:(?P<name>\w+)(?P<arguments>\{.*\})",
                        "properties": {
                            "name": {"type": "string"},
                            "arguments": {"type": "object", "x-parser": "gemma4-tool-call", "additionalProperties": {}},
                        },
                    },
                },
            },
        },
    },
    "x-regex": (
        r"(\<\|channel\>thought\n(?P<thinking>.*?)\<channel\|\>)?"
        r"(?P<tool_calls>\<\|tool_call\>.*\<tool_call\|\>)?"
        r"(?P<content>(?:(?!\<turn\|\>)(?!\<\|tool_response\>).)+)?(?:\<turn\|\>|\<\|tool_response\>)?"
    ),
}

TEMPLATE_FILE = Path(__file__).with_name("chat_template.jinja")


class TokenizerTrainingError(Gemma4Error, ValueError):
    pass


_SEED_TEXT = """\
The capital of France is Paris. The capital of Italy is Rome. Hello world!
Inferentia2 has two NeuronCores and thirty-two gigabytes of high bandwidth memory.
A small team wants its own endpoint for agents and tools, cheap and correct, token for token.
def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)
Les modèles de langue prédisent le mot suivant. Ünïcödé, naïve café, 日本語のテキスト, emoji 🙂🚀.
"""
# The words of the protocol itself (declarations, calls, results, thoughts), so that tool prompts
# stay short enough for the tiny models' buckets.
_PROTOCOL_TEXT = """\
system
user
model
thought
declaration:get_weather{description:Get the weather,parameters:{properties:{city:{description:The city,
type:STRING}},required:[city],type:OBJECT}}
call:get_weather{city:Paris,unit:celsius,days:3,detailed:true,extra:null}
response:get_weather{value:sunny}
"""


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    """English-ish seed text plus seeded pseudo-words: enough distinct pairs to fill any vocab."""
    rng = random.Random(seed)
    syllables = [a + b for a in "bcdfghklmnprstvwz" for b in "aeiouy"] + ["th", "ng", "qu", "sh", "ch"]
    out = _SEED_TEXT.splitlines() * 20 + _PROTOCOL_TEXT.splitlines() * 40
    for _ in range(lines):
        words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(3, 12))]
        out.append(" ".join(words).capitalize() + rng.choice(".!?,;"))
    return out


def _without_specials(texts: list[str]) -> list[str]:
    """The texts with the control tokens cut out: they are whole ids, never learnt from their pieces."""
    out = []
    for text in texts:
        for special in SPECIAL_TOKENS:
            text = text.replace(special, "\n")
        out.append(text)
    return out


def chat_template(empty_thought_block: bool) -> str:
    """The template for one checkpoint: E2B/E4B open a non-thinking model turn bare, the larger
    Gemma-4 checkpoints with an empty thought block."""
    return TEMPLATE_FILE.read_text().replace("EMPTY_THOUGHT_BLOCK", "true" if empty_thought_block else "false", 1)


# The corpus trains up to ~20,000 ids. A larger vocabulary (a random model of a real checkpoint's
# shapes: 262,144) trains this many and fills the rest with <unused{i}> ids no merge produces, as
# Gemma's own vocabulary holds unused ids: the embedding and lm_head get their real shapes.
TRAINED_MAX = 16384


def _padded(tok, vocab_size: int):
    from tokenizers import Tokenizer

    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    vocab.update({f"<unused{i}>": i for i in range(len(vocab), vocab_size)})
    return Tokenizer.from_str(json.dumps(spec))


def train_tokenizer(vocab_size: int, seed: int, empty_thought_block: bool = False, texts: list[str] | None = None):
    """A `PreTrainedTokenizerFast` whose vocabulary is exactly `vocab_size` ids, with the chat template;
    its merges learnt from `texts` (a trained model's corpus), or by default from seeded pseudo-words."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab_size, TRAINED_MAX),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed) if texts is None else _without_specials(texts), trainer=trainer)
    if vocab_size > TRAINED_MAX:
        tok = _padded(tok, vocab_size)
    # Like Gemma's own tokenizer: plain prompts start with <bos>; the chat template writes its own.
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", BOS_ID)])
    if tok.get_vocab_size() != vocab_size:
        raise TokenizerTrainingError(
            f"the test tokenizer reached {tok.get_vocab_size()} ids, not vocab_size={vocab_size}; "
            f"random models need vocab_size of at least {len(SPECIAL_TOKENS) + 256}"
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
        extra_special_tokens=NAMED_TOKENS | {"video_token": "<|video|>"},
    )
    fast.chat_template = chat_template(empty_thought_block)
    return fast


def save_tokenizer(tok, folder: Path) -> None:
    """save_pretrained, plus the response_schema (transformers drops it on load, real checkpoints carry it)."""
    tok.save_pretrained(folder)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["response_schema"] = RESPONSE_SCHEMA
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")

"""Loading a tokenizer and proving it works: a missing tokenizer.json can leave a tokenizer that
maps every prompt to one id and looked exactly like a device bug."""

from __future__ import annotations

from pathlib import Path

from contract.errors import Gemma4Error


class TokenizerError(Gemma4Error, RuntimeError):
    pass


def load_tokenizer(folder: str | Path):
    """Load a checkpoint's or artifact's tokenizer and prove it is not the empty-vocab impostor."""
    from transformers import AutoTokenizer

    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file():
        raise TokenizerError(f"{folder}/tokenizer.json is missing: the tokenizer cannot be trusted without it")
    try:
        tok = AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:  # noqa: BLE001 - a truncated tokenizer.json raises from deep inside tokenizers
        raise TokenizerError(f"{folder}/tokenizer.json cannot be loaded: {exc}") from None
    check_tokenizer(tok, str(folder))
    return tok


def check_tokenizer(tok, where: str) -> None:
    ids = tok("hello world", add_special_tokens=False).input_ids
    if len(ids) < 2 or len(set(ids)) < 2 or tok.unk_token_id in ids:
        raise TokenizerError(
            f"{where}: the tokenizer maps 'hello world' to {ids}; a working tokenizer gives several distinct ids "
            "(a missing or broken tokenizer.json looks like this)"
        )
    if tok.decode(ids) != "hello world":
        raise TokenizerError(f"{where}: the tokenizer does not round-trip 'hello world' (got {tok.decode(ids)!r})")


def check_vocab(tok, vocab: int, where: str) -> None:
    """Every id the tokenizer can produce (added and special tokens included) indexes the model's
    vocabulary: one past it fails inside the graphs on the first prompt that uses it."""
    ids = tok.get_vocab()  # token -> id, added tokens included
    bad = sorted({i for i in (*ids.values(), *tok.all_special_ids) if not 0 <= i < vocab})
    if bad:
        names = {i: t for t, i in ids.items()}
        shown = ", ".join(f"{names.get(i, '?')!r} = {i}" for i in bad[:3]) + (" ..." if len(bad) > 3 else "")
        raise TokenizerError(
            f"{where}: token ids outside the model's vocabulary of {vocab} (0..{vocab - 1}): {shown}; "
            "a tokenizer of another model, or tokens added after compile"
        )

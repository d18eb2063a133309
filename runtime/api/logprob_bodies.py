"""The logprobs of a response as each API spells them: OpenAI chat's (`logprobs.content` with bytes
and top alternatives), the legacy completions' (tokens, token_logprobs, top_logprobs, text_offset),
and vLLM's `prompt_logprobs` (rank and decoded token per id)."""

from __future__ import annotations

from collections.abc import Callable

TokenBytes = Callable[[int], bytes]  # a token id's own bytes (a byte-level piece may be part of a character)


def _token(tid: int, token_bytes: TokenBytes) -> tuple[str, list[int]]:
    raw = token_bytes(tid)
    return raw.decode("utf-8", errors="replace"), list(raw)


def chat_logprobs(entries, token_bytes: TokenBytes) -> dict:
    """OpenAI chat's `logprobs`: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}."""
    content = []
    for e in entries:
        text, raw = _token(e.token, token_bytes)
        top = []
        for tid, lp in e.top:
            t, b = _token(tid, token_bytes)
            top.append({"token": t, "logprob": lp, "bytes": b})
        content.append({"token": text, "logprob": e.logprob, "bytes": raw, "top_logprobs": top})
    return {"content": content}


def completion_logprobs(entries, token_bytes: TokenBytes, offset: int) -> tuple[dict, int]:
    """The legacy completions `logprobs` (tokens, token_logprobs, top_logprobs, text_offset) and the
    text offset after these tokens."""
    out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in entries:
        text = _token(e.token, token_bytes)[0]
        out["tokens"].append(text)
        out["token_logprobs"].append(e.logprob)
        out["top_logprobs"].append(
            None if e.logprob is None else {_token(tid, token_bytes)[0]: lp for tid, lp in e.top}
        )
        out["text_offset"].append(offset)
        offset += len(text)
    return out, offset


def vllm_prompt_logprobs(entries, k: int, token_bytes: TokenBytes) -> list:
    """vLLM's `prompt_logprobs`: None for the first token, then per token {id: {logprob, rank,
    decoded_token}} for the prompt's token and the k likeliest (ids as JSON keys, the prompt's first)."""
    out: list = []
    for e in entries:
        if e.logprob is None:
            out.append(None)
            continue
        row = {str(e.token): {"logprob": e.logprob, "rank": e.rank, "decoded_token": _token(e.token, token_bytes)[0]}}
        for rank, (tid, lp) in enumerate(e.top[:k], start=1):
            row.setdefault(str(tid), {"logprob": lp, "rank": rank, "decoded_token": _token(tid, token_bytes)[0]})
        out.append(row)
    return out

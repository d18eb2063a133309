"""Token ids in, text out, one token at a time, as a stream a client can be shown at once.

Two things are held back: a byte-level BPE spreads one UTF-8 character over several tokens, so
text ending in U+FFFD waits for the rest of its bytes; and text that could be the start of a stop
string waits until it is clear whether the stop string follows. Everything released is final, so
the concatenated stream equals the whole text."""

from __future__ import annotations

from collections.abc import Sequence


class Detokenizer:
    """Incremental decoding that never splits a character: `tokenizers`' DecodeStream (it decodes
    from a few tokens back, keeping the leading spaces and merges a tokenizer decides from context,
    and holds tokens that end inside a UTF-8 character), plus a flush for the end of a stream."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        from tokenizers.decoders import DecodeStream

        self.tokenizer = tokenizer
        self.backend = tokenizer.backend_tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self.held: list[int] = []  # pushed since the last release
        self.context: list[int] = []  # the token that completed the last release

    def push(self, token: int) -> str:
        text = self.stream.step(self.backend, token)
        if text is None:
            self.held.append(token)
            return ""
        self.held, self.context = [], [token]
        return text

    def flush(self) -> str:
        """The unreleased rest, incomplete characters included (as U+FFFD), at the end of a stream.
        Decoded after the last released token, so a leading space survives as in the stream."""
        before, now = (
            self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens, clean_up_tokenization_spaces=False)
            for ids in (self.context, self.context + self.held)
        )
        self.held = []
        return now[len(before) :]


def stop_prefix_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of `text` that is the start of some stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best


class TextStream:
    """Detokenizer plus stop strings: push tokens, get the text that is safe to show. With
    `skip_special_tokens` off, special tokens come through as their text (a chat reply's parser
    needs them as boundaries).

    `min_tokens`: as vLLM (BaseIncrementalDetokenizer.update in vllm/v1/engine/detokenizer.py), a
    stop string counts only once more than min_tokens tokens were pushed, and only if it ends in the
    text of those later tokens (it may begin earlier)."""

    def __init__(self, tokenizer, stops: Sequence[str] = (), skip_special_tokens: bool = True, min_tokens: int = 0):
        self.detok = Detokenizer(tokenizer, skip_special_tokens)
        self.stops = tuple(stops)
        self.min_tokens = min_tokens
        self.pushed = 0
        self.pending = ""  # decoded, not yet released: might begin a stop string
        self.unchecked = 0  # how much of `pending` the first min_tokens tokens wrote: no stop may end in it
        self.stopped = False

    def push(self, token: int) -> str:
        """Release what is final after this token; sets `stopped` when a stop string completed
        (the stop string and anything after it are never released)."""
        self.pushed += 1
        return self._release(self.detok.push(token), final=False)

    def flush(self) -> str:
        """At the end of generation (EOS or length): everything still held back."""
        return self._release(self.detok.flush(), final=True)

    def _release(self, text: str, final: bool) -> str:
        self.pending += text
        if self.pushed <= self.min_tokens:
            self.unchecked = len(self.pending)
        hits = [i for i in (self.pending.find(s, max(0, self.unchecked - len(s) + 1)) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            out, self.pending = self.pending[: min(hits)], ""
            return out
        keep = 0 if final else stop_prefix_len(self.pending, self.stops)
        out = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(out) :]
        self.unchecked = max(0, self.unchecked - len(out))
        return out

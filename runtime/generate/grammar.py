"""Constrained decoding: a grammar engine (llguidance) masks the host's logits, one matcher per slot.

A `Grammar` says what the output must match: a JSON schema, any JSON object, a regex, one of a list
of strings, or an arbitrary Lark grammar (llguidance's dialect: `<name>` is a special token by its
string, `<[id]>` by its id, `%json {...}` embeds a schema). `GrammarCompiler` is built once per tokenizer
(llguidance reads the vocabulary from the `tokenizers` JSON; ~2.6 s at 262,144 ids) and checks
grammars and makes matchers. A `GrammarMatcher` gives each decode step a boolean mask over the vocabulary
and consumes the sampled token; the end-of-generation ids are allowed exactly when the grammar may
stop, so a constrained output always ends where the grammar lets it.

A grammar is checked against our limits first (runtime/generate/grammar_checks.py), then compiled
under llguidance's own (`LLParserLimits`, terse errors) on a few threads of the compiler's own, with
a large native stack and a deadline, never on the engine thread: what `compile` returns is a matcher
that has computed its first mask (a grammar that cannot start fails there, as a 400), which each of a
request's choices forks in the engine at no cost.

llguidance over xgrammar, measured at vocab 262,144 (docs/performance.md, grammar engines): no per-schema
compile (xgrammar: ~3.8 s for a new schema at this vocabulary), and a lower p99 per step."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from contract.errors import Gemma4Error
from runtime.bounded import BoundedThreads, Late
from runtime.generate import grammar_checks
from runtime.settings import GrammarLimits

Kind = Literal["json_schema", "json_object", "regex", "choice", "lark"]

if TYPE_CHECKING:  # llguidance loads on first use
    from llguidance._lib import JsonCompileOptions

# Compact JSON: a random or weak model would otherwise spend its budget on whitespace the grammar allows.
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}
MAX_MESSAGE_CHARS = 300  # of llguidance's message: it may quote the grammar
MAX_QUOTE_CHARS = 40  # of a quoted piece of the grammar within it
QUOTED = re.compile(f'"[^"]{{{MAX_QUOTE_CHARS + 1},}}"')
# Native stack of a compile thread: llguidance's parsers recurse, and the 8 MB default overflowed on
# grammars our limits allow only just (virtual memory; only the pages a parse touches are resident).
COMPILE_STACK_BYTES = 256 << 20


# Where a JSON schema holds schemas: maps of them, single ones, lists of them.
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_ONE = (
    "additionalProperties",
    "unevaluatedProperties",
    "items",
    "additionalItems",
    "unevaluatedItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
)
SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems", "items")


def strict_objects(schema):
    """A copy of `schema` in which an object that declares properties takes no others unless it says
    so: `additionalProperties: false` where it declares `properties` (or `patternProperties`) and
    neither `additionalProperties` nor `unevaluatedProperties`. xgrammar, vLLM's default backend,
    compiles schemas so; vLLM's llguidance backend does it with `disable_additional_properties`.
    Members of an `allOf` are left as they are (each would refuse the others' properties)."""
    out = json.loads(json.dumps(schema))
    todo = [(out, False)]  # (schema, is it an allOf member)
    while todo:
        node, in_all_of = todo.pop()
        if not isinstance(node, dict):
            continue
        declares = "properties" in node or "patternProperties" in node
        if declares and not in_all_of and not {"additionalProperties", "unevaluatedProperties"} & node.keys():
            node["additionalProperties"] = False
        for word in SCHEMA_MAPS:
            if isinstance(node.get(word), dict):
                todo += [(sub, False) for sub in node[word].values()]
        todo += [(node[word], False) for word in SCHEMA_ONE if isinstance(node.get(word), dict)]
        for word in SCHEMA_LISTS:
            if isinstance(node.get(word), list):
                todo += [(sub, False) for sub in node[word]]
        if isinstance(node.get("allOf"), list):
            todo += [(sub, True) for sub in node["allOf"]]
    return out


class GrammarError(Gemma4Error, ValueError):
    """A grammar llguidance refuses, or a token its matcher cannot take (llguidance's message, on one
    line, shortened: it points at the fault with a caret over several, and may quote the grammar)."""

    def __init__(self, message: str):
        # llguidance quotes the grammar on indented lines under its message (`  12 | rule: ...`, a caret)
        lines = [line for line in message.splitlines() if line.strip() and not line[:1].isspace()]
        text = QUOTED.sub(lambda m: m[0][:MAX_QUOTE_CHARS] + '…"', " ".join(" ".join(lines).split()))
        super().__init__(text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…")


class GrammarDeadEnd(GrammarError):
    """A generation's grammar can go no further: its matcher allows no next token. The generation ends
    there (not the server's nor the client's fault). A matcher that fails (one of llguidance's limits met
    as it computes a mask or takes a token) is a plain GrammarError: the request's own, a 400."""


@dataclass(frozen=True)
class Grammar:
    kind: Kind
    source: str  # the schema as JSON text, the regex, the choices as a JSON list, or the Lark text

    @classmethod
    def json_schema(cls, schema: dict | bool) -> Grammar:
        """Undeclared properties refused unless the schema allows them (strict_objects)."""
        try:
            return cls("json_schema", json.dumps(strict_objects(schema)))
        except RecursionError:  # deeper than any limit: refused by its depth
            raise grammar_checks.GrammarLimitError("the schema nests deeper than Python's JSON encoder goes") from None

    @classmethod
    def json_object(cls) -> Grammar:
        return cls("json_object", json.dumps({"type": "object"}))

    @classmethod
    def regex(cls, pattern: str) -> Grammar:
        return cls("regex", pattern)

    @classmethod
    def choice(cls, options: Sequence[str]) -> Grammar:
        if not options or not all(isinstance(o, str) for o in options):
            raise GrammarError("choice: needs a non-empty list of strings")
        return cls("choice", json.dumps(list(options)))

    @classmethod
    def lark(cls, text: str) -> Grammar:
        return cls("lark", text)

    def llguidance(self) -> str:
        """The grammar as llguidance takes it (LLMatcher's grammar string)."""
        from llguidance import LLMatcher

        if self.kind in ("json_schema", "json_object"):
            return LLMatcher.grammar_from_json_schema(self.source, defaults=JSON_OPTIONS)
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.source)
        if self.kind == "choice":
            # Lark string literals are JSON strings, so any choice text is written exactly.
            return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(o) for o in json.loads(self.source)))
        return LLMatcher.grammar_from_lark(self.source)


class GrammarCompiler:
    """llguidance's view of one tokenizer; checks and compiles a request's grammar into a matcher."""

    def __init__(self, tokenizer, vocab: int, eos_ids: Sequence[int], limits: GrammarLimits | None = None):
        import llguidance.hf
        from llguidance import LLParserLimits

        # n_vocab is the logits' width: a model's rows may be wider than its tokenizer.
        self.vocab = vocab
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=list(eos_ids))
        self.limits = limits = limits or GrammarLimits()
        self.parser_limits = LLParserLimits(
            initial_lexer_fuel=limits.lexer_fuel,
            step_lexer_fuel=limits.step_lexer_fuel,
            step_max_items=limits.step_max_items,
            max_lexer_states=limits.max_lexer_states,
            max_grammar_size=limits.max_grammar_size,
            verbose_errors=False,  # verbose ones carry the grammar and the parser's state
        )
        self._threads = BoundedThreads("grammar", limits.compile_threads, COMPILE_STACK_BYTES)

    def compile(self, grammar: Grammar) -> GrammarMatcher:
        """A matcher at the grammar's start, its first mask computed; GrammarLimitError over one of
        our limits, GrammarError for what llguidance refused (or a deadline missed), Busy."""
        grammar_checks.check(grammar.kind, grammar.source, self.limits)
        try:
            return self._threads.run(lambda: self._build(grammar), self.limits.compile_timeout_s)
        except Late:
            raise GrammarError(
                f"the grammar was not compiled within {self.limits.compile_timeout_s:g} s "
                "(GEMMA4_GRAMMAR_COMPILE_TIMEOUT_S)"
            ) from None

    def _build(self, grammar: Grammar) -> GrammarMatcher:
        from llguidance import LLMatcher

        try:
            text = grammar.llguidance()
        except ValueError as exc:
            raise GrammarError(str(exc)) from None
        error = LLMatcher.validate_grammar(text, self.tokenizer, limits=self.parser_limits)
        if error:
            raise GrammarError(error)
        matcher = GrammarMatcher(self, text)
        matcher.allowed()  # the first mask: a grammar that cannot start fails here, not in the engine
        return matcher

    def matcher(self, grammar: Grammar | GrammarMatcher) -> GrammarMatcher:
        """A fresh matcher: for a Grammar (compiled now), or a copy of one `compile` returned."""
        return grammar.fork() if isinstance(grammar, GrammarMatcher) else self.compile(grammar)


class GrammarMatcher:
    """One generation's place in its grammar."""

    def __init__(self, compiler: GrammarCompiler, compiled: str):
        from llguidance import LLMatcher

        self.vocab = compiler.vocab
        self._m = LLMatcher(compiler.tokenizer, compiled, log_level=0, limits=compiler.parser_limits)
        if self._m.is_error():
            raise GrammarError(self._m.get_error())
        self._bits = np.zeros((vocab_words(self.vocab),), dtype=np.int32)

    def _compute(self) -> np.ndarray:
        """The next token's bitmask, 32 ids per int32 word, bit i of word w = id 32w + i."""
        self._m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        if self._m.is_error():  # a limit of llguidance's met at this step: the grammar's fault, not an end
            raise GrammarError(self._m.get_error())
        return self._bits

    def allowed(self) -> np.ndarray:
        """(V,) bool: the tokens the grammar accepts next (an end-of-generation id once it may stop)."""
        return _unpack(self._compute(), self.vocab)

    def mask(self, x: np.ndarray) -> np.ndarray:
        """-inf, in place, wherever the grammar forbids the next token; x: a float32 row (V,) the caller
        owns. The forbidden ids are unpacked from the inverted bitmask: no (V,) negation pass."""
        np.copyto(x, np.float32(-np.inf), where=_unpack(~self._compute(), self.vocab))
        return x

    def accept(self, token: int) -> None:
        # The token came from the masked row, so a refusal is the matcher failing (one of llguidance's
        # limits met as it lexes, e.g. `a{1000}{1000}`): the grammar's fault, not an end.
        if not self._m.consume_token(token):
            raise GrammarError(f"token {token} is not allowed here: {self._m.get_error()}")

    def rollback(self, n: int) -> None:
        """Take back the last `n` tokens accepted (drafted ones a speculative step did not keep)."""
        if n and not self._m.rollback(n):
            raise GrammarError(f"the grammar could not take back {n} token(s): {self._m.get_error()}")

    @property
    def finished(self) -> bool:
        """The grammar is complete and admits nothing more (only an end-of-generation id is allowed)."""
        return self._m.is_stopped()

    def fork(self) -> GrammarMatcher:
        """An independent copy at the same place (each choice of a request, from the compiled one)."""
        twin = object.__new__(GrammarMatcher)
        twin.vocab, twin._m = self.vocab, self._m.deep_copy()
        twin._bits = np.zeros_like(self._bits)
        return twin


def vocab_words(vocab: int) -> int:
    return (vocab + 31) // 32


def _unpack(bits: np.ndarray, vocab: int) -> np.ndarray:
    return np.unpackbits(bits.view(np.uint8), bitorder="little")[:vocab].view(bool)


class LazyGrammarCompiler:
    """`GrammarCompiler` made on first use (a server whose clients never constrain never pays for it)."""

    def __init__(self, tokenizer, vocab: int, eos_ids: Sequence[int], limits: GrammarLimits | None = None):
        self._args = (tokenizer, vocab, eos_ids, limits)
        self._made: GrammarCompiler | None = None
        self._lock = threading.Lock()

    def get(self) -> GrammarCompiler:
        with self._lock:
            if self._made is None:
                self._made = GrammarCompiler(*self._args)
            return self._made

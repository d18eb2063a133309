"""A tool's JSON Schema as Lark rules for the value Gemma-4 writes in its call syntax (keys bare and in
the template's dictsort order, strings between `<|"|>`): one rule per schema node, made once and
referenced from everywhere that node appears, so the grammar grows linearly with the schema whatever
its branching.

The schema means what JSON Schema means: `$ref` into `$defs` (or anywhere in the schema; a recursive
one becomes a cycle of rules), `allOf` (merged), `anyOf`/`oneOf`, `enum`, `const`, `type` (or a list of
types), `nullable`, objects with `properties`, `required` and `additionalProperties`, arrays with
`items`, `prefixItems`, `minItems`/`maxItems`, string lengths, numeric ranges. Undeclared properties
are refused unless `additionalProperties` allows them, the same policy as structured outputs
(runtime.generate.grammar). Patterns and formats are not enforced. Caps on nesting, `$ref` depth and
rule count (runtime.settings.GrammarLimits) refuse the rest with a 400 before the grammar engine sees
it."""

from __future__ import annotations

import json
import urllib.parse
from typing import NoReturn

from runtime.api.chat import ChatTemplateError
from runtime.api.tool_names import carried_key
from runtime.settings import GrammarLimits

INT = r"/-?(0|[1-9][0-9]{0,15})/"
NUMBER = r"/-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,16})?([eE][-+]?[0-9]{1,2})?/"
FREE_KEY = r"/[A-Za-z_$][A-Za-z0-9_.$-]{0,63}/"  # keys of free-form objects: ones the reply parser reads back
# String text: anything but the two control characters transformers' argument dialect reserves.
TEXT = r"[^\x01\x02]"
# Bounds up to these are enforced, larger ones left open: a string length is a counted regex (cheap at any
# count), an item count a counted rule repetition.
MAX_LENGTH, MAX_ITEMS = 65536, 256
RANGE_WORDS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
TYPES = ("string", "integer", "number", "boolean", "null", "array", "object")
ANNOTATIONS = ("title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly")


def template_order(mapping: dict) -> list[tuple]:
    """Items in the order the chat template writes them: Jinja's dictsort, which ignores case."""
    return sorted(mapping.items(), key=lambda item: item[0].lower())


def key(name: str) -> str:
    """`name:` as a Lark literal (a JSON string, so any property name is written exactly)."""
    return json.dumps(f"{name}:")


def bound(value, default: int | None, top: int) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= top else default


class SchemaRules:
    """Lark rules made from one request's tool schemas, one per schema node."""

    def __init__(self, quote: int, limits: GrammarLimits):
        self.quote, self.limits = quote, limits
        self.lines: list[str] = []
        self.made: dict[int, str] = {}  # id(schema node) -> its rule
        self.kept: list = []  # the nodes behind `made`'s ids, alive so that no id is reused
        self.has_any = False  # the rules for values of any shape are written once, when first needed

    def fail(self, where: str, message: str) -> NoReturn:
        # The path is cut short: a refusal names where, never echoes a schema's worth of it.
        raise ChatTemplateError(where if len(where) <= 160 else where[:160] + "...", message[:400])

    def name(self) -> str:
        if len(self.lines) >= self.limits.schema_max_rules:
            self.fail("tools", self.limits.refusal("schema_max_rules", "the tools' schemas need more grammar rules"))
        self.lines.append("")
        return f"r{len(self.lines) - 1}"

    def add(self, body: str) -> str:
        rule = self.name()
        self.lines[int(rule[1:])] = f"{rule}: {body}"
        return rule

    # -- schema nodes -------------------------------------------------------------------------------
    def value(self, schema, root, where: str, depth: int = 0, refs: int = 0) -> str:
        """The rule for a value `schema` allows; `root` is what its `$ref`s point into."""
        if depth > self.limits.schema_max_depth:
            self.fail(where, self.limits.refusal("schema_max_depth", "the schema nests too deep"))
        if schema is True or (isinstance(schema, dict) and not (schema.keys() - set(ANNOTATIONS))):
            return self.any()
        if schema is False:
            self.fail(where, "the schema `false` admits no value")
        if not isinstance(schema, dict):
            self.fail(where, "must be a JSON schema (an object or a boolean)")
        if id(schema) in self.made:
            return self.made[id(schema)]
        if "$ref" in schema:  # the target's own rule: a recursive schema becomes a cycle of rules
            if refs >= self.limits.schema_max_ref_depth:
                self.fail(where, self.limits.refusal("schema_max_ref_depth", "the schema's $refs chain too deep"))
            target = self.resolve(schema["$ref"], root, where)
            rule = self.value(target, root, f"{where}.$ref", depth + 1, refs + 1)
            self.made[id(schema)] = rule
            self.kept.append(schema)
            return rule
        rule = self.name()  # named before its body, so that a $ref back to this node finds it
        self.made[id(schema)] = rule
        self.kept.append(schema)
        self.lines[int(rule[1:])] = f"{rule}: {self.body(schema, root, where, depth, refs)}"
        return rule

    def body(self, schema: dict, root, where: str, depth: int, refs: int) -> str:
        def sub(s, at: str) -> str:
            return self.value(s, root, f"{where}.{at}", depth + 1, refs)

        if "allOf" in schema:
            return sub(self.merged(schema, root, where), "allOf")
        if "const" in schema:
            return self.literal(schema["const"], where)
        if "enum" in schema:
            if not isinstance(schema["enum"], list) or not schema["enum"]:
                self.fail(f"{where}.enum", "must be a non-empty list")
            return " | ".join(self.literal(v, where) for v in schema["enum"])
        for word in ("anyOf", "oneOf"):
            if word in schema:
                options = schema[word]
                if not isinstance(options, list) or not options:
                    self.fail(f"{where}.{word}", "must be a non-empty list of schemas")
                return " | ".join(sub(s, f"{word}.{i}") for i, s in enumerate(options))
        types = schema.get("type", self.implied_type(schema))
        if schema.get("nullable") is True:
            return f'{sub({k: v for k, v in schema.items() if k != "nullable"}, "nullable")} | "null"'
        if isinstance(types, list):
            kinds = list(dict.fromkeys(types))  # a type named twice is one alternative
            if not kinds:
                self.fail(f"{where}.type", "must name at least one type")
            return " | ".join(sub(schema | {"type": t}, f"type.{t}") for t in kinds)
        match types:
            case "string":
                low = bound(schema.get("minLength"), 0, MAX_LENGTH) or 0
                top = bound(schema.get("maxLength"), None, MAX_LENGTH)
                text = f"/{TEXT}{{{low},{'' if top is None else top}}}/"
                return f"<[{self.quote}]> {text} <[{self.quote}]>"
            case "integer" | "number" if RANGE_WORDS & schema.keys():
                # a bounded number: llguidance's own JSON-schema numbers compile the range into the lexer (a
                # number is written the same in Gemma's call syntax as in JSON)
                return "%json " + json.dumps({k: schema[k] for k in ("type", *RANGE_WORDS) if k in schema})
            case "integer":
                return INT
            case "number":
                return NUMBER
            case "boolean":
                return '"true" | "false"'
            case "null":
                return '"null"'
            case "array":
                return self.array(schema, sub)
            case "object":
                return self.object(schema, sub, where)
            case None:
                return self.any()
        self.fail(f"{where}.type", f"{types!r} is not a JSON Schema type (one of {', '.join(TYPES)})")

    @staticmethod
    def implied_type(schema: dict) -> str | None:
        if "properties" in schema or "additionalProperties" in schema or "required" in schema:
            return "object"
        if "items" in schema or "prefixItems" in schema:
            return "array"
        return None

    def resolve(self, ref, root, where: str):
        """A local `$ref` (`#`, `#/$defs/Name`, any JSON pointer into the schema)."""
        if not isinstance(ref, str) or not ref.startswith("#"):
            self.fail(f"{where}.$ref", f"{ref!r}: only references inside the schema (#/...) are supported")
        node = root
        for part in filter(None, urllib.parse.unquote(ref[1:]).split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                self.fail(f"{where}.$ref", f"{ref!r} points at nothing in the schema")
        return node

    def merged(self, schema: dict, root, where: str) -> dict:
        """`allOf`: the schemas' keywords together, their properties and required keys united."""
        parts = [{k: v for k, v in schema.items() if k != "allOf"}]
        for i, s in enumerate(schema["allOf"] if isinstance(schema["allOf"], list) else ()):
            while isinstance(s, dict) and "$ref" in s:
                s = self.resolve(s["$ref"], root, f"{where}.allOf.{i}")
            if not isinstance(s, dict) or "allOf" in s:
                self.fail(f"{where}.allOf.{i}", "allOf takes schema objects (not nested allOf)")
            parts.append(s)
        out: dict = {}
        for p in parts:
            props = out.get("properties", {}) | p.get("properties", {})
            required = list(dict.fromkeys([*out.get("required", ()), *p.get("required", ())]))
            out |= p
            if props:
                out["properties"] = props
            if required:
                out["required"] = required
        self.kept.append(out)
        return out

    def literal(self, value, where: str, depth: int = 0) -> str:
        """One enum/const value as the template writes it."""
        if depth > self.limits.schema_max_depth:
            self.fail(where, self.limits.refusal("schema_max_depth", "a const or enum value nests too deep"))
        if isinstance(value, str):
            return f"<[{self.quote}]> {json.dumps(value)} <[{self.quote}]>"
        if isinstance(value, bool) or value is None:
            return json.dumps(json.dumps(value))  # `true` as the Lark literal "true"
        if isinstance(value, (int, float)):
            return json.dumps(str(value))  # as Jinja writes a number
        if isinstance(value, list):
            items = ' "," '.join(self.literal(v, where, depth + 1) for v in value)
            return f'"[" {items} "]"' if value else '"[]"'
        pairs = [f"{self.key(k, where)} {self.literal(v, where, depth + 1)}" for k, v in template_order(value)]
        return '"{" ' + ' "," '.join(pairs) + ' "}"' if pairs else '"{}"'

    def key(self, name: str, where: str) -> str:
        if not carried_key(name):
            shown = repr(name) if len(name) <= 60 else repr(name[:60]) + "..."
            self.fail(where, f"property name {shown} cannot be written in Gemma-4's call syntax (keys are bare)")
        return key(name)

    def array(self, schema: dict, sub) -> str:
        """`[v,...]`: `prefixItems` first, then `items` (none past the prefix unless `items` allows them),
        between minItems and maxItems of them in all."""
        prefix: list = schema["prefixItems"] if isinstance(schema.get("prefixItems"), list) else []
        firsts = [sub(s, f"prefixItems.{i}") for i, s in enumerate(prefix)]
        more = schema.get("items", not prefix)
        low, top = bound(schema.get("minItems"), 0, MAX_ITEMS) or 0, bound(schema.get("maxItems"), None, MAX_ITEMS)
        if more is False or top == 0 or (top is not None and top <= len(firsts)):
            items = firsts[: top if top is not None else len(firsts)]
            return '"[" ' + ' "," '.join(items) + ' "]"' if items else '"[]"'
        item = sub(more, "items")
        rest_low = max(low - len(firsts), 0)
        rest_top = None if top is None else top - len(firsts)
        if firsts:
            reps = f"{{{rest_low},{'' if rest_top is None else rest_top}}}"
            return '"[" ' + ' "," '.join(firsts) + f' ("," {item}){reps} "]"'
        reps = f"{{{max(rest_low - 1, 0)},{'' if rest_top is None else rest_top - 1}}}"
        body = f'{item} ("," {item}){reps}'
        return f'"[" {body} "]"' if rest_low else f'"[" ({body})? "]"'

    def object(self, schema: dict, sub, where: str) -> str:
        """`{k:v,...}` in the template's key order; required keys always, the others optional, commas
        between; then undeclared pairs only if `additionalProperties` allows them (absent: only when
        the object declares no properties, the policy structured outputs follow too)."""
        props: dict = schema["properties"] if isinstance(schema.get("properties"), dict) else {}
        declared = "properties" in schema or "patternProperties" in schema
        extra = schema.get("additionalProperties", not declared)
        pair = None if extra is False else f'{FREE_KEY} ":" {sub(extra, "additionalProperties")}'
        items = template_order(props)
        required = set(schema.get("required", ()) if isinstance(schema.get("required"), list) else ())
        values = [sub(s, f"properties.{k}") for k, s in items]
        # tail[i, lead]: the keys from i on, `lead` when a key came before (so a comma goes first).
        tail: dict[tuple[int, bool], str] = {
            (len(items), False): self.add(f'({pair} ("," {pair})*)?') if pair else "",
            (len(items), True): self.add(f'("," {pair})*') if pair else "",
        }
        for i in range(len(items) - 1, -1, -1):
            for lead in (False, True):
                comma = '"," ' if lead else ""
                item = f"{comma}{self.key(items[i][0], where)} {values[i]} {tail[i + 1, True]}".strip()
                rest = tail[i + 1, lead]
                if items[i][0] in required:
                    tail[i, lead] = self.add(item)
                else:
                    tail[i, lead] = self.add(f"({item}) | {rest}" if rest else f"({item})?")
        return f'"{{" {tail[0, False]} "}}"' if tail[0, False] else '"{}"'

    def any(self) -> str:
        if not self.has_any:
            self.has_any = True
            self.lines += [
                f'anyvalue: <[{self.quote}]> /{TEXT}*/ <[{self.quote}]> | {NUMBER} | "true" | "false" | "null" '
                '| anyobject | "[" (anyvalue ("," anyvalue)*)? "]"',
                'anyobject: "{" (anypair ("," anypair)*)? "}"',
                f'anypair: {FREE_KEY} ":" anyvalue',
            ]
        return "anyvalue"

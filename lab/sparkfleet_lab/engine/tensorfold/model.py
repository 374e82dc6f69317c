"""The double's toy "model": deterministic answers a client can check. It is not a language model.

It answers arithmetic exactly (17x19 = 323), writes a reasoning trace only when thinking is on (longer
at a higher effort), calls a tool when the request forces one or its last user message names one,
fills tool arguments and structured output from their JSON schema, and otherwise gives a short reply
derived from the prompt. Prompts are rendered in DeepSeek's message markers and split into tokens
(words, punctuation, markers), so a repeated prefix is a token prefix, as the prompt cache needs.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from fractions import Fraction

_EXPR_CHARS = re.compile("[0-9\\s.()+\\-*/\u00d7x\u00f7\u2212\u00b7^]+")
_OPS = {"\u00d7": "*", "x": "*", "\u00b7": "*", "\u00f7": "/", "\u2212": "-", "^": "**"}
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")
_ONLY_NUMBER = re.compile(r"\b(only|just)\b.{0,20}\b(number|answer|result|digits?)\b", re.I)


class ExpressionError(ValueError):
    pass


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch.isdigit() or ch == ".":
            j = i
            while j < len(text) and (text[j].isdigit() or text[j] == "."):
                j += 1
            out.append(text[i:j])
            i = j
        elif text.startswith("**", i):
            out.append("**")
            i += 2
        else:
            out.append(_OPS.get(ch, ch))
            i += 1
    return out


class _Parser:
    """Recursive descent over + - * / ** and parentheses; exact rational arithmetic, no eval."""

    def __init__(self, tokens: list[str]) -> None:
        self.toks, self.pos = tokens, 0

    def peek(self) -> str | None:
        return self.toks[self.pos] if self.pos < len(self.toks) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ExpressionError("unexpected end of expression")
        self.pos += 1
        return tok

    def parse(self) -> Fraction:
        value = self.expr()
        if self.peek() is not None:
            raise ExpressionError(f"unexpected {self.peek()!r}")
        return value

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op, rhs = self.take(), self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self) -> Fraction:
        value = self.power()
        while self.peek() in ("*", "/"):
            op, rhs = self.take(), self.power()
            if op == "/" and rhs == 0:
                raise ExpressionError("division by zero")
            value = value * rhs if op == "*" else value / rhs
        return value

    def power(self) -> Fraction:
        base = self.unary()
        if self.peek() == "**":
            self.take()
            exp = self.power()
            if exp.denominator != 1 or abs(exp) > 64:
                raise ExpressionError("only small integer exponents")
            return base**exp.numerator
        return base

    def unary(self) -> Fraction:
        if self.peek() == "-":
            self.take()
            return -self.unary()
        if self.peek() == "(":
            self.take()
            value = self.expr()
            if self.take() != ")":
                raise ExpressionError("missing )")
            return value
        tok = self.take()
        try:
            return Fraction(tok)
        except ValueError as exc:
            raise ExpressionError(f"not a number: {tok!r}") from exc


def find_arithmetic(text: str) -> tuple[str, Fraction] | None:
    """The longest arithmetic expression in `text` that has an operator, and its value."""
    best: tuple[str, Fraction] | None = None
    for match in _EXPR_CHARS.finditer(text):
        chunk = match.group(0).strip().rstrip(".").strip()
        toks = _tokens(chunk)
        if len([t for t in toks if t[0].isdigit()]) < 2 or not any(
            t in ("+", "-", "*", "/", "**") for t in toks
        ):
            continue
        try:
            value = _Parser(toks).parse()
        except ExpressionError:
            continue
        if best is None or len(chunk) > len(best[0]):
            best = (chunk, value)
    return best


def format_number(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6g}"


def _pretty(expr: str) -> str:
    return " ".join(_tokens(expr)).replace("*", "\u00d7").replace("( ", "(").replace(" )", ")")


# ---- JSON schema instances -------------------------------------------------------------------


class SchemaError(ValueError):
    pass


@dataclass
class Hints:
    """What the prompt offers to fill a schema: words and a number."""

    words: list[str] = field(default_factory=list)
    number: Fraction | None = None

    def word(self, key: str) -> str:
        if not self.words:
            return key or "value"
        digest = int(hashlib.sha256(key.encode()).hexdigest(), 16)
        return self.words[digest % len(self.words)]


def _resolve(schema: dict, root: dict, depth: int) -> dict:
    ref = schema.get("$ref")
    if not isinstance(ref, str):
        return schema
    if depth > 32 or not ref.startswith("#/"):
        raise SchemaError(f"unsupported $ref {ref!r}")
    node: object = root
    for part in ref[2:].split("/"):
        if not isinstance(node, dict) or part not in node:
            raise SchemaError(f"$ref {ref!r} does not resolve")
        node = node[part]
    if not isinstance(node, dict):
        raise SchemaError(f"$ref {ref!r} is not a schema")
    merged = {**node, **{k: v for k, v in schema.items() if k != "$ref"}}
    return _resolve(merged, root, depth + 1)


def _string(schema: dict, key: str, hints: Hints) -> str:
    fmt = schema.get("format")
    samples = {
        "date": "2026-10-17",
        "date-time": "2026-10-17T12:00:00Z",
        "time": "12:00:00",
        "email": "admin@example.com",
        "uri": "https://example.com/",
        "uuid": "00000000-0000-4000-8000-000000000000",
        "ipv4": "192.0.2.1",
    }
    value = samples.get(fmt, hints.word(key)) if isinstance(fmt, str) else hints.word(key)
    lo = int(schema.get("minLength", 0))
    hi = schema.get("maxLength")
    while len(value) < lo:
        value += "x"
    if isinstance(hi, int):
        value = value[:hi]
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and not re.search(pattern, value):
        for candidate in (key, "a", "A", "0", "abc", "ABC", "a1", "x" * max(lo, 1)):
            if re.search(pattern, candidate):
                return candidate
        raise SchemaError(f"cannot produce a string matching pattern {pattern!r}")
    return value


def _number(schema: dict, integer: bool, hints: Hints) -> int | float:
    lo = schema.get("minimum")
    hi = schema.get("maximum")
    xlo = schema.get("exclusiveMinimum")
    xhi = schema.get("exclusiveMaximum")
    if isinstance(xlo, bool) or isinstance(xhi, bool):  # draft-4 booleans
        xlo = lo if xlo is True else None
        xhi = hi if xhi is True else None
    step = schema.get("multipleOf")
    candidates: list[float] = []
    if hints.number is not None and (not integer or hints.number.denominator == 1):
        candidates.append(float(hints.number))
    candidates += [lo if lo is not None else 0, (xlo + 1) if xlo is not None else 0, 1, 0]
    if hi is not None:
        candidates.append(hi)
    for cand in candidates:
        value = int(cand) if integer else float(cand)
        if integer and value != cand:
            continue
        if step and value % step:
            value = (int(value // step) + 1) * step
        if lo is not None and value < lo:
            continue
        if hi is not None and value > hi:
            continue
        if xlo is not None and value <= xlo:
            continue
        if xhi is not None and value >= xhi:
            continue
        return int(value) if integer else value
    raise SchemaError("no number satisfies the schema's bounds")


def _combined(schema: dict, root: dict) -> dict | None:
    """anyOf/oneOf: the first option; allOf: the parts merged. None when there is no combinator."""
    for combo in ("anyOf", "oneOf"):
        options = schema.get(combo)
        if isinstance(options, list) and options:
            return {**{k: v for k, v in schema.items() if k != combo}, **options[0]}
    if not isinstance(schema.get("allOf"), list):
        return None
    merged: dict = {k: v for k, v in schema.items() if k != "allOf"}
    for raw in schema["allOf"]:
        part = _resolve(raw, root, 0)
        props = {**merged.get("properties", {}), **part.get("properties", {})}
        required = list(dict.fromkeys([*merged.get("required", []), *part.get("required", [])]))
        merged = {**merged, **part, "properties": props, "required": required}
    return merged


def _kind(schema: dict) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    return str(kind)


def _array(schema: dict, hints: Hints, key: str, root: dict, depth: int) -> list:
    if isinstance(schema.get("prefixItems"), list):
        prefix = schema["prefixItems"]
        return [schema_instance(s, hints, f"{key}{i}", root, depth + 1) for i, s in enumerate(prefix)]
    count = max(int(schema.get("minItems", 1)), 1)
    if isinstance(schema.get("maxItems"), int):
        count = min(count, schema["maxItems"])
    items = schema.get("items", {})
    return [schema_instance(items, hints, f"{key}{i}", root, depth + 1) for i in range(count)]


def schema_instance(
    schema: object, hints: Hints | None = None, key: str = "", root: dict | None = None, depth: int = 0
):
    """A JSON value that satisfies `schema` (the subset of JSON Schema that tool and response schemas use)."""
    hints = hints or Hints()
    if schema is True or schema == {}:
        return hints.word(key) if key else {}
    if not isinstance(schema, dict):
        raise SchemaError(f"a schema must be an object, not {type(schema).__name__}")
    if depth > 24:
        raise SchemaError("schema nests too deep")
    root = schema if root is None else root
    schema = _resolve(schema, root, 0)
    if "const" in schema or (isinstance(schema.get("enum"), list) and schema["enum"]):
        return schema["const"] if "const" in schema else schema["enum"][0]
    combined = _combined(schema, root)
    if combined is not None:
        return schema_instance(combined, hints, key, root, depth + 1)
    kind = _kind(schema)
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: schema_instance(sub, hints, name, root, depth + 1) for name, sub in props.items()}
    if kind == "array":
        return _array(schema, hints, key, root, depth)
    scalars = {
        "string": lambda: _string(schema, key, hints),
        "integer": lambda: _number(schema, True, hints),
        "number": lambda: _number(schema, False, hints),
        "boolean": lambda: True,
        "null": lambda: None,
    }
    if kind not in scalars:
        raise SchemaError(f"unsupported schema type {kind!r}")
    return scalars[kind]()


# ---- replies ---------------------------------------------------------------------------------


@dataclass
class Reply:
    content: str | None
    reasoning: str | None = None
    tool_calls: list[dict] = field(default_factory=list)
    finish_reason: str = "stop"


def message_text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def prompt_words(text: str) -> list[str]:
    stop = {
        "the",
        "and",
        "what",
        "with",
        "only",
        "reply",
        "call",
        "please",
        "give",
        "tool",
        "for",
        "that",
        "this",
    }
    return [w for w in _WORD.findall(text) if len(w) > 2 and w.lower() not in stop]


def count_tokens(text: str) -> int:
    """A rough token count: words and punctuation, as a tokenizer would split them."""
    return len(re.findall(r"\w+|[^\w\s]", text))


def generate(
    messages: list[dict],
    *,
    thinking: bool,
    effort: int,
    tools: list[dict] | None = None,
    tool_choice: object = None,
    response_format: dict | None = None,
    mix: int = 0,
    rank_info: str = "",
) -> Reply:
    """One deterministic reply to `messages` (validated by the server)."""
    user = next((message_text(m) for m in reversed(messages) if m.get("role") == "user"), "")
    arithmetic = find_arithmetic(user)
    hints = Hints(words=prompt_words(user), number=arithmetic[1] if arithmetic else None)
    reasoning = None
    if thinking:
        steps = max(1, effort // 25)
        if arithmetic:
            expr, value = arithmetic
            reasoning = (
                f"The user asks for {_pretty(expr)}. Working it out exactly gives {format_number(value)}."
            )
        else:
            reasoning = f"The user wrote {len(user.split())} words; a short direct answer fits."
        reasoning += " Checked." * (steps - 1)

    forced = _forced_tool(tools or [], tool_choice, user)
    if forced is not None:
        fn = forced["function"]
        args = schema_instance(fn.get("parameters") or {"type": "object", "properties": {}}, hints)
        call_id = "call_" + hashlib.sha256(f"{fn['name']}|{user}|{mix}".encode()).hexdigest()[:24]
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": fn["name"], "arguments": json.dumps(args)},
        }
        return Reply(content=None, reasoning=reasoning, tool_calls=[call], finish_reason="tool_calls")

    if response_format and response_format.get("type") == "json_schema":
        schema = response_format["json_schema"].get("schema") or {}
        return Reply(content=json.dumps(schema_instance(schema, hints)), reasoning=reasoning)
    if response_format and response_format.get("type") == "json_object":
        obj: dict = (
            {"answer": format_number(arithmetic[1])} if arithmetic else {"reply": " ".join(hints.words[:5])}
        )
        return Reply(content=json.dumps(obj), reasoning=reasoning)

    if arithmetic:
        expr, value = arithmetic
        answer = format_number(value)
        content = answer if _ONLY_NUMBER.search(user) else f"{_pretty(expr)} = {answer}."
        return Reply(content=content, reasoning=reasoning)
    topic = " ".join(hints.words[:6]) or "your message"
    openers = ["Sure.", "Understood.", "Here is a short answer.", "Hello!"]
    content = (
        f"{openers[mix % len(openers)]} This is the sparkfleet lab's TensorFold double{rank_info}; "
        f"it received {count_tokens(user)} tokens about {topic}."
    )
    return Reply(content=content, reasoning=reasoning)


def _forced_tool(tools: list[dict], tool_choice: object, user: str = "") -> dict | None:
    if tool_choice == "none" or not tools:
        return None
    if tool_choice == "required":
        return tools[0]
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        return next((t for t in tools if t["function"]["name"] == name), None)
    # auto: the model calls a tool its user names (words of the function's name, e.g. "weather")
    text = user.lower()
    for tool in tools:
        words = [w for w in re.split(r"[_\W]+", tool["function"]["name"].lower()) if len(w) > 3]
        if words and any(w in text for w in words if w not in ("get", "set")):
            return tool
    return None


SPECIAL = re.compile("<\uff5c[^\uff5c]*\uff5c>|</?think>|\\w+|[^\\w\\s]")
BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
USER = "<\uff5cUser\uff5c>"
ASSISTANT = "<\uff5cAssistant\uff5c>"
EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"


def tokens(text: str) -> list[str]:
    return SPECIAL.findall(text)


def render(messages: list[dict], tools: list[dict], thinking: bool) -> list[str]:
    """The prompt's tokens: system text (tools joining it), then each turn in DeepSeek's markers."""
    system = " ".join(message_text(m) for m in messages if m.get("role") in ("system", "developer"))
    if tools:
        system += " " + json.dumps([t["function"] for t in tools], sort_keys=True)
    out = [BOS, *tokens(system)]
    for m in messages:
        role = m.get("role")
        if role == "user":
            out += [USER, *tokens(message_text(m))]
        elif role == "assistant":
            calls = json.dumps(m.get("tool_calls") or [], sort_keys=True) if m.get("tool_calls") else ""
            out += [ASSISTANT, *tokens(message_text(m) + calls), EOS]
        elif role == "tool":
            out += ["<\uff5ctool\u2581output\uff5c>", *tokens(message_text(m))]
    return [*out, ASSISTANT, "<think>" if thinking else "</think>"]

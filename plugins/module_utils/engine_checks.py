# What `sparkfleet verify` asks the engine's API: the model list, a request without the key (the engine's
# 401), a chat answer with thinking off, a streamed reply, a forced tool call and a JSON-schema output checked
# against their schemas, and, for an engine whose profile says it refuses them, the 400 of those two. Each
# check gives (ok, result, detail); `verify` runs the named ones and times them, `table` prints them. Used by
# the module engine_api. Standard library only.
from __future__ import annotations

import json
import re
import time

from ansible_collections.sparkfleet.cluster.plugins.module_utils.engine_client import (
    ApiError,
    Client,
    delta_text,
    error_text,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.json_schema import schema_errors

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}, "unit": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}
THINKING_OFF = {"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": False}}


def _chat_body(model: str, prompt: str, **extra) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": 64,
        **THINKING_OFF,
        **extra,
    }


def _message(doc: object) -> dict:
    if not isinstance(doc, dict) or not doc.get("choices"):
        raise ApiError(f"no choices in the reply: {str(doc)[:200]}")
    return doc["choices"][0].get("message") or {}


def _post(client: Client, body: dict) -> dict:
    status, doc = client.json("/v1/chat/completions", body)
    if status != 200:
        raise ApiError(f"HTTP {status}: {error_text(doc)}", status)
    return doc  # type: ignore[return-value]


def check_models(client: Client, model: str) -> tuple[bool, str, str]:
    status, doc = client.json("/v1/models")
    if status != 200:
        return False, f"HTTP {status}", error_text(doc)
    ids = [m.get("id") for m in (doc.get("data") or [])] if isinstance(doc, dict) else []
    return (
        model in ids,
        ", ".join(map(str, ids)) or "(none)",
        "" if model in ids else f"{model!r} is not listed",
    )


def check_chat(client: Client, model: str) -> tuple[bool, str, str]:
    msg = _message(_post(client, _chat_body(model, "What is 17\u00d719? Reply with only the number.")))
    content = (msg.get("content") or "").strip()
    thinking = msg.get("reasoning_content") or msg.get("reasoning")
    if not re.search(r"(?<!\d)323(?!\d)", content):
        return False, repr(content[:60]), "expected 323"
    if thinking:
        return (
            False,
            repr(content[:60]),
            f"thinking was not off: {len(str(thinking))} characters of reasoning",
        )
    return True, f"17\u00d719 = {content[:40]}", ""


def check_stream(client: Client, model: str) -> tuple[bool, str, str]:
    body = _chat_body(model, "What is 12\u00d712? Answer in one short sentence.", stream=True)
    events, first = client.stream("/v1/chat/completions", body)
    errors = [e for e in events if isinstance(e, dict) and e.get("error")]
    if errors:
        return False, "error event", error_text(errors[0])
    pieces = [delta_text(e) for e in events]
    text = "".join(pieces).strip()
    ttft = f", first token {first * 1000:.0f} ms" if first is not None else ""
    result = f"{len([p for p in pieces if p])} chunks{ttft}: {text[:40]!r}"
    if not events or events[-1] != "[DONE]":
        return False, result, "the stream did not end with [DONE]"
    if not re.search(r"(?<!\d)144(?!\d)", text):
        return False, result, "expected 144"
    if len([p for p in pieces if p]) < 2:
        return False, result, "the reply came in one piece: not streamed"
    return True, result, ""


def check_tool(client: Client, model: str) -> tuple[bool, str, str]:
    body = _chat_body(
        model, "What is the weather in Paris right now?", tools=[WEATHER_TOOL], tool_choice="required"
    )
    body["max_tokens"] = 256
    msg = _message(_post(client, body))
    calls = msg.get("tool_calls") or []
    if not calls:
        return False, repr((msg.get("content") or "")[:60]), "no tool call although tool_choice was required"
    fn = calls[0].get("function") or {}
    name, raw = fn.get("name"), fn.get("arguments") or ""
    result = f"{name}({raw[:60]})"
    if name != "get_weather":
        return False, result, "called another tool"
    try:
        args = json.loads(raw)
    except ValueError:
        return False, result, "arguments are not JSON"
    errs = schema_errors(args, WEATHER_TOOL["function"]["parameters"])
    return not errs, result, "; ".join(errs)


def check_json_schema(client: Client, model: str) -> tuple[bool, str, str]:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True}}
    body = _chat_body(model, "What is 17\u00d719? Answer in JSON.", response_format=fmt)
    body["max_tokens"] = 128
    content = (_message(_post(client, body)).get("content") or "").strip()
    try:
        value = json.loads(content)
    except ValueError:
        return False, repr(content[:60]), "not JSON"
    errs = schema_errors(value, ANSWER_SCHEMA)
    if errs:
        return False, content[:60], "; ".join(errs)
    if value.get("answer") != 323:
        return False, content[:60], "valid JSON, but answer is not 323"
    return True, content[:60], ""


def check_auth(client: Client, model: str) -> tuple[bool, str, str]:
    """A request without the key: the engine's 401 (code invalid_api_key, WWW-Authenticate: Bearer)."""
    status, headers, doc = client.call("/v1/models", key=False)
    www = next((v for k, v in headers.items() if k.lower() == "www-authenticate"), "")
    err = doc.get("error") if isinstance(doc, dict) and isinstance(doc.get("error"), dict) else {}
    result = f"HTTP {status} without a key: {err.get('code') or error_text(doc)[:60]}"
    if status != 401:
        return False, result, "the API answers without the key"
    if err.get("code") != "invalid_api_key" or not www.lower().startswith("bearer"):
        return False, result, f"not the engine's 401 (WWW-Authenticate {www!r})"
    return True, result, ""


def _refused(client: Client, body: dict, what: str) -> tuple[bool, str, str]:
    status, doc = client.json("/v1/chat/completions", body)
    if status == 400:
        return True, f"HTTP 400: {error_text(doc)[:80]}", ""
    if status == 200:
        return (
            False,
            "HTTP 200",
            f"the engine took {what}, which its profile says it refuses (400): check the profile",
        )
    return False, f"HTTP {status}", error_text(doc)


def check_tool_refused(client: Client, model: str) -> tuple[bool, str, str]:
    body = _chat_body(model, "What is the weather in Paris?", tools=[WEATHER_TOOL], tool_choice="required")
    return _refused(client, body, "a forced tool call")


def check_json_schema_refused(client: Client, model: str) -> tuple[bool, str, str]:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True}}
    return _refused(
        client, _chat_body(model, "What is 17\u00d719?", response_format=fmt), "a JSON-schema output"
    )


CHECKS = {
    "models": ("model list", check_models),
    "auth": ("no key, 401", check_auth),
    "chat": ("chat 17\u00d719", check_chat),
    "stream": ("streamed reply", check_stream),
    "tool": ("forced tool call", check_tool),
    "json_schema": ("JSON-schema output", check_json_schema),
    "tool_refused": ("forced tool call, 400", check_tool_refused),
    "json_schema_refused": ("JSON schema, 400", check_json_schema_refused),
}


def verify(client: Client, model: str, names: list[str]) -> list[dict]:
    out = []
    for name in names:
        label, fn = CHECKS[name]
        start = time.monotonic()
        try:
            ok, result, detail = fn(client, model)
        except ApiError as exc:
            ok, result, detail = False, "error", str(exc)
        except Exception as exc:  # a broken reply must not hide the other checks
            ok, result, detail = False, "error", f"{type(exc).__name__}: {exc}"
        out.append(
            {
                "name": name,
                "label": label,
                "ok": ok,
                "latency_ms": round((time.monotonic() - start) * 1000, 1),
                "result": result,
                "detail": detail,
            }
        )
    return out


def table(checks: list[dict]) -> list[str]:
    width = max([len(c["label"]) for c in checks] + [5])
    lines = []
    for c in checks:
        verdict = "PASS" if c["ok"] else "FAIL"
        line = f"{verdict}  {c['label'].ljust(width)}  {c['latency_ms']:>8.1f} ms  {c['result']}"
        if c["detail"]:
            line += f"  ({c['detail']})"
        lines.append(line)
    passed = sum(c["ok"] for c in checks)
    lines.append(f"{passed}/{len(checks)} checks passed")
    return lines

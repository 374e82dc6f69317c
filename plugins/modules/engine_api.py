#!/usr/bin/python3
# sparkfleet: the engine's OpenAI-compatible API seen from the head (stdlib only; runs on the node).
from __future__ import annotations

DOCUMENTATION = r"""
module: engine_api
short_description: Probe, wait for, or verify the engine's OpenAI-compatible API with real requests
description:
  - >-
    C(probe) reads C(/health) and C(/v1/models) once. Ready means C(/health) answers 200 with C({"ok": true})
    (C({"status": "ok"}) with API keys on) and C(/v1/models) lists the served model (TensorFold opens its
    port only once the model is loaded, so a closed port while the container runs means C(loading)).
  - >-
    C(wait) probes until the API is ready or I(wait_s) passed; it reports what it waits for in
    C(sparkfleet_progress) (while loading, C(loading, N min of the ~M the first start takes) and rank 0's
    latest log line) and fails at once (C(fatal)) when rank 0's container stopped, with the engine's own
    message from its log. Use it in an C(until) loop for long waits with progress.
  - >-
    C(verify) sends real requests and times each one; I(checks) are the engine profile's - C(models),
    C(auth) (a request without the key gets the engine's 401), C(chat) (17x19 = 323, thinking off),
    C(stream), C(tool) and C(json_schema) (a forced tool call and a JSON-schema output, checked against
    their schemas), C(tool_refused) and C(json_schema_refused) (an engine that refuses them answers 400).
  - >-
    The API key is read from I(api_key_file) on the node and never returned.
options:
  action: {type: str, choices: [probe, wait, verify], default: probe, description: What to do.}
  url: {type: str, required: true, description: "Base URL of the API, e.g. http://127.0.0.1:8888 (no /v1)."}
  model: {type: str, required: true, description: Served model name.}
  api_key_file: {type: path, description: File of accepted keys; the first one is sent as the bearer token.}
  timeout: {type: float, default: 120, description: Seconds per request.}
  wait_s: {type: float, default: 30, description: "action=wait: how long this call waits before it returns."}
  interval_s: {type: float, default: 2, description: "action=wait: seconds between probes."}
  container: {type: str, description: "action=wait: rank 0's container; its exit ends the wait at once."}
  unit: {type: str, description: "action=wait: rank 0's systemd unit; its failure ends the wait at once."}
  docker: {type: str, default: docker, description: The docker CLI (for I(container)).}
  log_rules: {type: dict, default: {}, description: "The engine profile's log lines (engine_node's option)."}
  first_start_minutes: {type: int, default: 15, description: "How long a first start takes (progress)."}
  checks:
    type: list
    elements: str
    default: [models, chat, stream]
    description: Which verify checks to run, in order (the engine profile's C(verify)).
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: Wait for the API to be ready (one call waits up to wait_s; loop for longer)
  sparkfleet.cluster.engine_api:
    action: wait
    url: http://127.0.0.1:18002
    model: deepseek-v4.1-flash
    api_key_file: /etc/sparkfleet/api-keys
    wait_s: 60
    container: sparkfleet-engine
  register: api
  until: api.ready
  retries: 30

- name: Send the verify requests
  sparkfleet.cluster.engine_api:
    action: verify
    url: http://127.0.0.1:18002
    model: deepseek-v4.1-flash
    api_key_file: /etc/sparkfleet/api-keys
"""

RETURN = r"""
ready: {description: /health is 200 with ok true and the model is listed, type: bool, returned: probe, wait}
state: {description: "ok, loading, down, unauthorized or error", type: str, returned: probe, wait}
detail: {description: What the API (or rank 0's log) said, type: str, returned: probe, wait}
health: {description: The /health document, type: dict, returned: probe, wait}
models: {description: Model ids from /v1/models, type: list, returned: probe, wait}
log: {description: "rank 0's log summary (engine_node's C(log))", type: dict, returned: wait}
checks:
  description: "verify: one entry per check: name, ok, latency_ms, result, detail"
  type: list
  returned: verify
table: {description: "verify: the checks as printable lines", type: list, returned: verify}
"""

import json
import re
import subprocess
import time
import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils.api_keys import KeyFileError, parse_key_file
from ansible_collections.sparkfleet.cluster.plugins.module_utils.engine_logs import (
    Patterns,
    read_logs,
    seconds_since,
    summarize,
)

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


class ApiError(Exception):
    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


def read_key(path: str | None) -> str | None:
    """The first key of the engine's key file (what a client sends as its bearer token)."""
    if not path:
        return None
    with open(path, encoding="utf-8") as fh:
        try:
            keys = parse_key_file(fh.read())
        except KeyFileError as exc:
            raise ApiError(f"{path}: {exc}") from exc
    if not keys:
        raise ApiError(f"{path} holds no API key")
    return keys[0][1]


class Client:
    def __init__(self, url: str, key: str | None, timeout: float):
        self.url, self.key, self.timeout = url.rstrip("/"), key, timeout

    def _request(self, path: str, body: dict | None, key: bool = True) -> urllib.request.Request:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.key and key:
            headers["Authorization"] = "Bearer " + self.key
        data = json.dumps(body).encode() if body is not None else None
        return urllib.request.Request(self.url + path, data=data, headers=headers)  # noqa: S310 - the node's API

    def call(
        self, path: str, body: dict | None = None, timeout: float | None = None, key: bool = True
    ) -> tuple[int, dict, object]:
        """(status, headers, parsed body or text) of one request; ApiError when nothing answers."""
        try:
            request = self._request(path, body, key)
            with urllib.request.urlopen(request, timeout=timeout or self.timeout) as resp:  # noqa: S310
                return resp.status, dict(resp.headers), json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                return exc.code, dict(exc.headers), json.loads(raw)
            except ValueError:
                return exc.code, dict(exc.headers), raw.decode(errors="replace")[:300]
        except (OSError, ValueError) as exc:
            raise ApiError(f"{self.url}{path}: {getattr(exc, 'reason', exc)}") from exc

    def json(self, path: str, body: dict | None = None, timeout: float | None = None) -> tuple[int, object]:
        status, _headers, doc = self.call(path, body, timeout)
        return status, doc

    def stream(self, path: str, body: dict) -> tuple[list, float | None]:
        """SSE events (parsed JSON, and the literal '[DONE]') and the time to the first content piece."""
        start = time.monotonic()
        first = None
        events: list = []
        try:
            with urllib.request.urlopen(self._request(path, body), timeout=self.timeout) as resp:  # noqa: S310
                for raw in resp:
                    line = raw.decode(errors="replace").strip()
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        events.append(payload)
                        break
                    event = json.loads(payload)
                    events.append(event)
                    if first is None and _delta_text(event):
                        first = time.monotonic() - start
        except urllib.error.HTTPError as exc:
            raise ApiError(f"HTTP {exc.code}: {_error_text(exc.read())}", exc.code) from exc
        except (OSError, ValueError) as exc:
            raise ApiError(f"{self.url}{path}: {getattr(exc, 'reason', exc)}") from exc
        return events, first


def _error_text(body: object) -> str:
    if isinstance(body, bytes):
        try:
            body = json.loads(body)
        except ValueError:
            return body.decode(errors="replace")[:200]
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", body["error"]))[:300]
    return str(body)[:300]


def _delta_text(event: object) -> str:
    if not isinstance(event, dict):
        return ""
    choices = event.get("choices") or []
    if not choices:
        return ""
    return (choices[0].get("delta") or {}).get("content") or ""


# ---- readiness ----------------------------------------------------------------------------------


def probe(client: Client, model: str) -> dict:
    """One look at /health and /v1/models: ready, state, detail. A closed port is `down` (the caller
    knows whether rank 0's container runs, i.e. whether that means loading)."""
    out = {"ready": False, "state": "down", "detail": "", "health": {}, "models": []}
    try:
        status, health = client.json("/health", timeout=min(client.timeout, 10))
    except ApiError as exc:
        out["detail"] = f"not answering: {exc}"
        return out
    out["health"] = health if isinstance(health, dict) else {}
    # the counters body says {"ok": true, ...}; with API keys on (0.6.6) /health says only {"status": "ok"}
    # (sfxnz/TensorFold src/tensorfold/cuda/http.py @ dc971a2)
    if status != 200 or not (out["health"].get("ok") is True or out["health"].get("status") == "ok"):
        body = json.dumps(health)[:160] if isinstance(health, dict) else str(health)[:160]
        out.update(state="error", detail=f"/health answered {status}: {body}")
        return out
    try:
        status, models = client.json("/v1/models", timeout=min(client.timeout, 10))
    except ApiError as exc:
        out.update(state="error", detail=f"/v1/models: {exc}")
        return out
    if status == 401:
        out.update(
            state="unauthorized", detail=f"/v1/models refused the API key (401): {_error_text(models)}"
        )
        return out
    ids = [m.get("id") for m in (models.get("data") or [])] if isinstance(models, dict) else []
    out["models"] = ids
    if status != 200 or model not in ids:
        out.update(state="error", detail=f"/v1/models ({status}) lists {ids}, not {model!r}")
        return out
    busy = out["health"].get("requests_running")
    out.update(
        ready=True, state="ok", detail=f"{model} served" + (f", {busy} request(s) running" if busy else "")
    )
    return out


def container_state(docker: str, name: str) -> dict | None:
    proc = subprocess.run(
        [docker, "inspect", "--format", "{{json .State}}", name], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout)


def unit_state(unit: str) -> tuple[str, str]:
    """(ActiveState, last journal lines) of a systemd unit."""
    proc = subprocess.run(["systemctl", "is-active", unit], capture_output=True, text=True, check=False)
    active = proc.stdout.strip() or "unknown"
    if active in ("active", "activating", "reloading"):
        return active, ""
    journal = subprocess.run(
        ["journalctl", "--unit", unit, "--lines", "6", "--no-pager", "--output", "cat"],
        capture_output=True,
        text=True,
        check=False,
    )
    return active, journal.stdout.strip()


class Rank0:
    """Rank 0's container and log, as the wait sees them."""

    def __init__(self, docker: str, container: str | None, unit: str | None, rules: dict, first_start: int):
        self.docker, self.container, self.unit = docker, container, unit
        self.rules = Patterns(rules) if rules else None
        self.first_start = first_start

    def log(self, running: bool | None) -> dict:
        if not (self.container and self.rules):
            return {}
        return summarize(read_logs(self.docker, self.container), self.rules, rank=0, running=running)

    def look(self, state: dict, waited_s: float) -> str:
        """Why waiting longer cannot help ('' when it can). A closed port, the container running: loading."""
        info = container_state(self.docker, self.container) if self.container else None
        if info is not None and not info.get("Running") and info.get("Status") != "created":
            log = self.log(False)
            state["log"] = log
            why = log.get("fatal") or log.get("last") or "no log line"
            status, code = info.get("Status"), info.get("ExitCode")
            return f"rank 0's container {self.container} is {status} (exit {code}): {why}"
        if info is None and self.unit:
            active, journal = unit_state(self.unit)
            if active in ("failed", "inactive") and waited_s > 5:
                return f"rank 0's unit {self.unit} is {active}; its journal:\n{journal}"
            if active in ("active", "activating") and state["state"] == "down":
                state["state"] = "starting"
                state["detail"] = f"rank 0's unit {self.unit} runs; docker is creating its container"
        if state["state"] == "down" and info is not None:
            log = self.log(True)
            state["log"] = log
            running = float(seconds_since(str(info.get("StartedAt") or "")) or 0)
            state["state"] = "loading"
            state["detail"] = (
                f"loading, {int(running // 60)} min of the ~{self.first_start} the first start takes"
                + (f": {log['last']}" if log.get("last") else "")
            )
        return ""


def wait(client: Client, model: str, *, wait_s: float, interval_s: float, rank0: Rank0 | None = None) -> dict:
    start = time.monotonic()
    while True:
        state = probe(client, model)
        state["fatal"] = False
        if state["ready"]:
            if rank0 is not None:
                state["log"] = rank0.log(True)
                if state["log"].get("ready"):
                    state["detail"] += f"; {state['log']['ready']}"
            break
        why = rank0.look(state, time.monotonic() - start) if rank0 is not None else ""
        if why:
            state.update(fatal=True, detail=why)
            break
        if time.monotonic() - start + interval_s > wait_s:
            break
        time.sleep(interval_s)
    state["waited_s"] = round(time.monotonic() - start, 1)
    first = state["detail"].splitlines()[0] if state["detail"] else ""
    state["sparkfleet_progress"] = first if state["state"] == "loading" else f"{state['state']}: {first}"
    return state


# ---- a JSON schema subset, enough to check tool arguments and structured output ------------------


JSON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _type_ok(value: object, kind: str) -> bool:
    if isinstance(value, bool):
        return kind == "boolean"
    if kind == "integer":
        return isinstance(value, int)
    if kind == "number":
        return isinstance(value, int | float)
    return kind in JSON_TYPES and isinstance(value, JSON_TYPES[kind])


def _object_errors(value: dict, schema: dict, path: str) -> list[str]:
    props = schema.get("properties") or {}
    errs = [f"{path}: missing {k!r}" for k in schema.get("required", []) if k not in value]
    if schema.get("additionalProperties") is False:
        errs += [f"{path}: unexpected {k!r}" for k in value if k not in props]
    for k, sub in props.items():
        if k in value and isinstance(sub, dict):
            errs += schema_errors(value[k], sub, f"{path}.{k}")
    return errs


def _bound_errors(value: object, schema: dict, path: str) -> list[str]:
    errs = []
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            errs.append(f"{path}: shorter than {schema['minLength']}")
        if len(value) > schema.get("maxLength", len(value)):
            errs.append(f"{path}: longer than {schema['maxLength']}")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if value < schema.get("minimum", value):
            errs.append(f"{path}: {value} < {schema['minimum']}")
        if value > schema.get("maximum", value):
            errs.append(f"{path}: {value} > {schema['maximum']}")
    return errs


def schema_errors(value: object, schema: dict, path: str = "$") -> list[str]:
    """What in `value` breaks `schema` (type, enum, const, properties, required, items, bounds)."""
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind else []
    if kinds and not any(_type_ok(value, k) for k in kinds):
        return [f"{path}: {json.dumps(value)[:40]} is not {'/'.join(kinds)}"]
    errs: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        errs.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        errs.append(f"{path}: {value!r} is not {schema['const']!r}")
    if isinstance(value, dict):
        errs += _object_errors(value, schema, path)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errs += schema_errors(item, schema["items"], f"{path}[{i}]")
    return errs + _bound_errors(value, schema, path)


# ---- verify -------------------------------------------------------------------------------------


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
        raise ApiError(f"HTTP {status}: {_error_text(doc)}", status)
    return doc  # type: ignore[return-value]


def check_models(client: Client, model: str) -> tuple[bool, str, str]:
    status, doc = client.json("/v1/models")
    if status != 200:
        return False, f"HTTP {status}", _error_text(doc)
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
        return False, "error event", _error_text(errors[0])
    pieces = [_delta_text(e) for e in events]
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
    result = f"HTTP {status} without a key: {err.get('code') or _error_text(doc)[:60]}"
    if status != 401:
        return False, result, "the API answers without the key"
    if err.get("code") != "invalid_api_key" or not www.lower().startswith("bearer"):
        return False, result, f"not the engine's 401 (WWW-Authenticate {www!r})"
    return True, result, ""


def _refused(client: Client, body: dict, what: str) -> tuple[bool, str, str]:
    status, doc = client.json("/v1/chat/completions", body)
    if status == 400:
        return True, f"HTTP 400: {_error_text(doc)[:80]}", ""
    if status == 200:
        return (
            False,
            "HTTP 200",
            f"the engine took {what}, which its profile says it refuses (400): check the profile",
        )
    return False, f"HTTP {status}", _error_text(doc)


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


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "action": {"type": "str", "choices": ["probe", "wait", "verify"], "default": "probe"},
            "url": {"type": "str", "required": True},
            "model": {"type": "str", "required": True},
            "api_key_file": {"type": "path"},
            "timeout": {"type": "float", "default": 120},
            "wait_s": {"type": "float", "default": 30},
            "interval_s": {"type": "float", "default": 2},
            "container": {"type": "str"},
            "unit": {"type": "str"},
            "docker": {"type": "str", "default": "docker"},
            "log_rules": {"type": "dict", "default": {}},
            "first_start_minutes": {"type": "int", "default": 15},
            "checks": {"type": "list", "elements": "str", "default": ["models", "chat", "stream"]},
        },
        supports_check_mode=True,
    )
    p = module.params
    unknown = [c for c in p["checks"] if c not in CHECKS]
    if unknown:
        module.fail_json(msg=f"unknown checks {unknown}; known: {list(CHECKS)}")
    try:
        key = read_key(p["api_key_file"])
    except (OSError, ApiError) as exc:
        why = f"cannot read the API key file: {exc}"
        module.fail_json(msg=why, fatal=True, ready=False, state="error", detail=why)
    client = Client(p["url"], key, p["timeout"])
    if p["action"] == "probe":
        module.exit_json(changed=False, **probe(client, p["model"]))
    if p["action"] == "wait":
        docker = module.get_bin_path(p["docker"]) or p["docker"]
        rank0 = Rank0(docker, p["container"], p["unit"], p["log_rules"], p["first_start_minutes"])
        state = wait(client, p["model"], wait_s=p["wait_s"], interval_s=p["interval_s"], rank0=rank0)
        module.exit_json(changed=False, msg=state["sparkfleet_progress"], **state)
    checks = verify(client, p["model"], p["checks"])
    lines = table(checks)
    module.exit_json(
        changed=False,
        checks=checks,
        table=lines,
        passed=sum(c["ok"] for c in checks),
        failed_checks=[c["name"] for c in checks if not c["ok"]],
        msg=lines[-1],
    )


if __name__ == "__main__":
    main()

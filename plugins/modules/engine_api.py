#!/usr/bin/python3
# sparkfleet: the engine's OpenAI-compatible API seen from the head (stdlib only; runs on the node).
from __future__ import annotations

DOCUMENTATION = r"""
module: engine_api
short_description: Probe, wait for, or verify the engine's OpenAI-compatible API with real requests
description:
  - C(probe) reads C(/health) and C(/v1/models) once. C(wait) probes until the API is ready
    (C(/health) 200 and the served model listed) or I(wait_s) passed; it reports what it waits for
    in C(sparkfleet_progress) and fails at once (C(fatal)) when rank 0's container exited or a rank
    was lost. Use it in an C(until) loop for long waits with progress.
  - C(verify) sends real requests and times each one - the model list, a chat with a checkable
    answer (17x19 = 323, thinking off), a streamed reply, a forced tool call whose arguments must
    satisfy the tool's JSON schema, and a JSON-schema structured output.
  - The API key is read from I(api_key_file) on the node and never returned.
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
  checks:
    type: list
    elements: str
    default: [models, chat, stream, tool, json_schema]
    description: Which verify checks to run, in order.
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
ready: {description: /health is 200 and the model is listed, type: bool, returned: probe, wait}
state: {description: "ok, starting, degraded, down, unauthorized or error", type: str, returned: probe, wait}
detail: {description: What the API said, type: str, returned: probe, wait}
health: {description: The /health document, type: dict, returned: probe, wait}
models: {description: Model ids from /v1/models, type: list, returned: probe, wait}
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

    def _request(self, path: str, body: dict | None) -> urllib.request.Request:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.key:
            headers["Authorization"] = "Bearer " + self.key
        data = json.dumps(body).encode() if body is not None else None
        return urllib.request.Request(self.url + path, data=data, headers=headers)  # noqa: S310 - the node's API

    def json(self, path: str, body: dict | None = None, timeout: float | None = None) -> tuple[int, object]:
        try:
            with urllib.request.urlopen(self._request(path, body), timeout=timeout or self.timeout) as resp:  # noqa: S310
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                return exc.code, json.loads(raw)
            except ValueError:
                return exc.code, raw.decode(errors="replace")[:300]
        except (OSError, ValueError) as exc:
            raise ApiError(f"{self.url}{path}: {getattr(exc, 'reason', exc)}") from exc

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
    """One look at /health and /v1/models: ready, state, detail."""
    out = {"ready": False, "state": "down", "detail": "", "health": {}, "models": []}
    try:
        status, health = client.json("/health", timeout=min(client.timeout, 10))
    except ApiError as exc:
        out["detail"] = f"not answering: {exc}"
        return out
    out["health"] = health if isinstance(health, dict) else {}
    reported = out["health"].get("status") if isinstance(health, dict) else None
    if status != 200:
        out["state"] = (
            reported if reported in ("starting", "degraded") else "starting" if status == 503 else "error"
        )
        out["detail"] = (out["health"].get("detail") if out["health"] else "") or f"/health answered {status}"
        return out
    try:
        status, models = client.json("/v1/models", timeout=min(client.timeout, 10))
    except ApiError as exc:
        out.update(state="error", detail=f"/v1/models: {exc}")
        return out
    if status == 401:
        out.update(state="unauthorized", detail="/v1/models refused the API key (401)")
        return out
    ids = [m.get("id") for m in (models.get("data") or [])] if isinstance(models, dict) else []
    out["models"] = ids
    if status != 200 or model not in ids:
        out.update(state="error", detail=f"/v1/models ({status}) lists {ids}, not {model!r}")
        return out
    out.update(ready=True, state="ok", detail=f"ready: {model} served, {_ranks_text(out['health'])}")
    return out


def _ranks_text(health: dict) -> str:
    ranks = health.get("ranks") or []
    if not ranks:
        return "healthy"
    return f"{sum(1 for r in ranks if r.get('state') == 'ok')}/{len(ranks)} ranks ok"


def container_state(docker: str, name: str) -> dict | None:
    proc = subprocess.run(
        [docker, "inspect", "--format", "{{json .State}}", name], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout)


def container_tail(docker: str, name: str, lines: int = 5) -> str:
    proc = subprocess.run(
        [docker, "logs", "--tail", str(lines), name], capture_output=True, text=True, check=False
    )
    return (proc.stdout + proc.stderr).strip()


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


def _fatal(state: dict, container: str | None, unit: str | None, docker: str) -> str:
    """Why waiting longer cannot help, or ''."""
    if state["state"] == "degraded":
        return f"a rank was lost while starting: {state['detail']}"
    if "last refused:" in state["detail"]:  # a refused rank exits; it does not come back by itself
        return f"rank 0 refused a rank: {state['detail']}"
    if container:
        info = container_state(docker, container)
        if info is not None and not info.get("Running"):
            tail = container_tail(docker, container)
            return (
                f"rank 0's container {container} is {info.get('Status')} (exit {info.get('ExitCode')}); "
                f"last log lines:\n{tail}"
            )
    if unit:
        active, journal = unit_state(unit)
        if active in ("failed", "inactive"):
            return f"rank 0's unit {unit} is {active}; its journal:\n{journal}"
    return ""


def wait(
    client: Client,
    model: str,
    *,
    wait_s: float,
    interval_s: float,
    container: str | None = None,
    unit: str | None = None,
    docker: str = "docker",
) -> dict:
    start = time.monotonic()
    while True:
        state = probe(client, model)
        state["fatal"] = False
        if state["ready"]:
            break
        why = _fatal(state, container, unit, docker)
        if why:
            state.update(fatal=True, detail=why)
            break
        if time.monotonic() - start + interval_s > wait_s:
            break
        time.sleep(interval_s)
    state["waited_s"] = round(time.monotonic() - start, 1)
    state["sparkfleet_progress"] = (
        f"{state['state']}: {state['detail'].splitlines()[0] if state['detail'] else ''}"
    )
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


CHECKS = {
    "models": ("model list", check_models),
    "chat": ("chat 17\u00d719", check_chat),
    "stream": ("streamed reply", check_stream),
    "tool": ("forced tool call", check_tool),
    "json_schema": ("JSON-schema output", check_json_schema),
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
            "checks": {"type": "list", "elements": "str", "default": list(CHECKS)},
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
        state = wait(
            client,
            p["model"],
            wait_s=p["wait_s"],
            interval_s=p["interval_s"],
            container=p["container"],
            unit=p["unit"],
            docker=docker,
        )
        if state["fatal"]:
            module.fail_json(msg=state["detail"], **{k: v for k, v in state.items() if k != "detail"})
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

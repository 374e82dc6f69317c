"""Rank 0's OpenAI-compatible HTTP API: /health, /v1/models, /v1/chat/completions.

Every request step does a round trip over the data plane to every rank, so a lost rank turns
into a clean 503 for that request while the server keeps serving; a malformed request gets a 400
and changes nothing. The API key (when a key file is given) is compared in constant time and
never logged.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from . import model
from .cluster import Coordinator, RankUnavailable

MAX_BODY = 8 << 20
EFFORT_LEVELS = {"minimal": 25, "low": 50, "medium": 62, "high": 75, "xhigh": 88, "max": 100}
ROLES = {"system", "developer", "user", "assistant", "tool"}
STREAM_REDUCE_EVERY = 8


class BadRequest(ValueError):
    def __init__(
        self, message: str, param: str | None = None, status: int = 400, kind: str = "invalid_request_error"
    ):
        super().__init__(message)
        self.param, self.status, self.kind = param, status, kind


class CacheDir:
    """A persistent cache directory (prefix cache, spill tier): survives restarts, bounded in size."""

    def __init__(self, kind: str, path: Path, size_gib: float) -> None:
        self.kind, self.path, self.limit = kind, path, int(size_gib * (1 << 30))
        self.lock = threading.Lock()
        self.state_file = path / "tensorfold-cache.json"
        self.index_file = path / "prefix-index.txt"
        if not path.is_dir():
            raise RuntimeError(f"{kind} directory {path} does not exist (is it mounted?)")
        with (path / ".lock").open("a") as lock:  # ranks sharing a directory (tests) count every start
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = json.loads(self.state_file.read_text()) if self.state_file.exists() else {}
            state = {"kind": kind, "size_gib": size_gib, "starts": int(state.get("starts", 0)) + 1}
            tmp = self.state_file.with_suffix(f".{os.getpid()}.partial")
            tmp.write_text(json.dumps(state) + "\n")
            tmp.replace(self.state_file)
        self.starts = state["starts"]
        self.known: set[str] = set()
        if self.index_file.exists():
            self.known = set(self.index_file.read_text().split())

    def lookup_or_add(self, key: str) -> bool:
        """True when `key` was cached before (possibly before a restart); else record it."""
        with self.lock:
            if key in self.known:
                return True
            size = self.index_file.stat().st_size if self.index_file.exists() else 0
            if size + len(key) + 1 <= self.limit:
                with self.index_file.open("a") as fh:
                    fh.write(key + "\n")
                self.known.add(key)
            return False

    def info(self) -> dict:
        return {
            "kind": self.kind,
            "dir": str(self.path),
            "size_gib": self.limit / (1 << 30),
            "starts": self.starts,
            "entries": len(self.known),
        }


@dataclass
class EngineConfig:
    served_model_name: str
    tp: int
    keys: list[str]
    max_model_len: int = 1 << 20
    max_num_seqs: int = 4
    default_thinking: bool = False
    default_effort: int = 75
    default_temperature: float = 1.0
    default_top_p: float = 1.0
    default_top_k: int = -1
    weights_digest: str = ""
    version: str = ""
    caches: list[CacheDir] = field(default_factory=list)


def _effort(value: object) -> int | None:
    """None means thinking off."""
    if value is None:
        return None
    if isinstance(value, str):
        if value == "none":
            return None
        if value in EFFORT_LEVELS:
            return EFFORT_LEVELS[value]
        raise BadRequest(
            f"reasoning_effort {value!r}: expected none, {', '.join(EFFORT_LEVELS)} or 1-100",
            "reasoning_effort",
        )
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 100:
        return value
    raise BadRequest(
        f"reasoning_effort {value!r}: expected a level name or an integer 1-100", "reasoning_effort"
    )


def _number(body: dict, name: str, *, lo: float, hi: float, default: float, integer: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    wrong_type = isinstance(value, bool) or not isinstance(value, int | float)
    if wrong_type or (integer and not isinstance(value, int)):
        raise BadRequest(f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}", name)
    if not lo <= value <= hi:
        raise BadRequest(f"{name} {value} is outside [{lo}, {hi}]", name)
    return value


@dataclass
class ChatRequest:
    messages: list[dict]
    stream: bool
    include_usage: bool
    max_tokens: int | None
    thinking: bool
    effort: int
    temperature: float
    top_p: float
    top_k: int
    tools: list[dict]
    tool_choice: object
    response_format: dict | None


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in ROLES:
            raise BadRequest(f"messages[{i}] needs a role out of {sorted(ROLES)}", "messages")
        content = msg.get("content")
        if content is None and not (msg["role"] == "assistant" and msg.get("tool_calls")):
            raise BadRequest(f"messages[{i}] has no content", "messages")
        if content is not None and not isinstance(content, str | list):
            raise BadRequest(f"messages[{i}].content must be a string or a list of parts", "messages")
    return messages


def _max_tokens(body: dict, messages: list[dict], cfg: EngineConfig) -> int | None:
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise BadRequest(f"max_tokens must be a positive integer, got {max_tokens!r}", "max_tokens")
    prompt_tokens = sum(model.count_tokens(model.message_text(m)) for m in messages)
    if prompt_tokens + (max_tokens or 0) > cfg.max_model_len:
        raise BadRequest(f"{prompt_tokens} prompt tokens + max_tokens exceed {cfg.max_model_len}", "messages")
    return max_tokens


def _thinking(body: dict, cfg: EngineConfig) -> tuple[bool, int]:
    """Thinking on/off and its effort: `thinking`, chat_template_kwargs, reasoning_effort, else defaults."""
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise BadRequest("chat_template_kwargs must be an object", "chat_template_kwargs")
    explicit = [v for v in (body.get("thinking"), kwargs.get("enable_thinking"), kwargs.get("thinking"))]
    thinking = next((v for v in explicit if isinstance(v, bool)), None)
    effort = cfg.default_effort
    if "reasoning_effort" in body:
        level = _effort(body["reasoning_effort"])
        if level is not None:
            effort = level
        if thinking is None:
            thinking = level is not None
    return (cfg.default_thinking if thinking is None else thinking), effort


def _tools(body: dict) -> tuple[list[dict], object]:
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list", "tools")
    names = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(fn, dict) and tool.get("type") == "function"):
            raise BadRequest(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}", "tools")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRequest(f"tools[{i}].function.name is missing", "tools")
        if not isinstance(fn.get("parameters", {}), dict):
            raise BadRequest(f"tools[{i}].function.parameters must be a JSON schema object", "tools")
        names.append(fn["name"])
    choice = body.get("tool_choice")
    if choice == "required" and not tools:
        raise BadRequest("tool_choice 'required' needs tools", "tool_choice")
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name")
        if choice.get("type") != "function" or wanted not in names:
            raise BadRequest(f"tool_choice names the function {wanted!r}, not in tools", "tool_choice")
    elif choice not in (None, "none", "auto", "required"):
        raise BadRequest(
            f"tool_choice {choice!r}: expected none, auto, required or a function", "tool_choice"
        )
    return tools, choice


def _response_format(body: dict) -> dict | None:
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise BadRequest("response_format.type must be text, json_object or json_schema", "response_format")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise BadRequest("response_format.json_schema must be {name, schema}", "response_format")
    return None if kind == "text" else fmt


def parse_chat(body: object, cfg: EngineConfig) -> ChatRequest:
    """Validate a chat completion request; BadRequest names the parameter at fault."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    name = body.get("model")
    if name is not None and name != cfg.served_model_name:
        why = f"the model {name!r} does not exist; this server serves {cfg.served_model_name!r}"
        raise BadRequest(why, "model", 404, "model_not_found")
    messages = _messages(body)
    if body.get("n", 1) != 1:
        raise BadRequest("only n=1 is supported", "n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be true or false", "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise BadRequest("stream_options must be an object", "stream_options")
    thinking, effort = _thinking(body, cfg)
    tools, choice = _tools(body)
    return ChatRequest(
        messages=messages,
        stream=stream,
        include_usage=bool(opts.get("include_usage")),
        max_tokens=_max_tokens(body, messages, cfg),
        thinking=thinking,
        effort=effort,
        temperature=_number(body, "temperature", lo=0, hi=2, default=cfg.default_temperature),
        top_p=_number(body, "top_p", lo=0, hi=1, default=cfg.default_top_p),
        top_k=int(_number(body, "top_k", lo=-1, hi=1 << 20, default=cfg.default_top_k, integer=True)),
        tools=tools,
        tool_choice=choice,
        response_format=_response_format(body),
    )


class Engine:
    def __init__(self, cfg: EngineConfig, coordinator: Coordinator | None, log) -> None:
        self.cfg, self.coordinator, self.log = cfg, coordinator, log
        self.slots = threading.BoundedSemaphore(cfg.max_num_seqs)
        self.started = time.time()
        self.prefix_cache = next((c for c in cfg.caches if c.kind == "prefix-cache"), None)

    def health(self) -> tuple[int, dict]:
        if self.coordinator is None:
            state, detail, ranks = "ok", "single rank", [{"rank": 0, "state": "ok"}]
        else:
            state, detail, ranks = self.coordinator.health()
        doc = {
            "status": state,
            "detail": detail,
            "model": self.cfg.served_model_name,
            "tp": self.cfg.tp,
            "ranks": ranks,
            "weights_digest": self.cfg.weights_digest,
            "version": self.cfg.version,
            "uptime_s": round(time.time() - self.started, 1),
            "caches": [c.info() for c in self.cfg.caches],
        }
        return (200 if state == "ok" else 503), doc

    def reduce(self, payload: str) -> int:
        if self.coordinator is None:
            return int(hashlib.sha256(payload.encode()).hexdigest()[:8], 16)
        return self.coordinator.all_reduce(payload)

    def complete(self, req: ChatRequest) -> tuple[model.Reply, int, int]:
        key = hashlib.sha256(json.dumps(req.messages, sort_keys=True).encode()).hexdigest()
        mix = self.reduce(key)  # rank 0 and every worker take part in every request
        reply = model.generate(
            req.messages,
            thinking=req.thinking,
            effort=req.effort,
            tools=req.tools,
            tool_choice=req.tool_choice,
            response_format=req.response_format,
            mix=mix,
            rank_info=f" (TP{self.cfg.tp})",
        )
        prompt = sum(model.count_tokens(model.message_text(m)) for m in req.messages)
        cached = prompt if self.prefix_cache and self.prefix_cache.lookup_or_add(key) else 0
        return reply, prompt, cached


def _pieces(text: str) -> list[str]:
    out, word = [], ""
    for ch in text:
        word += ch
        if ch == " ":
            out.append(word)
            word = ""
    if word:
        out.append(word)
    return out


class Handler(BaseHTTPRequestHandler):
    server_version = "tensorfold-standin"
    protocol_version = "HTTP/1.1"
    engine: Engine  # set on the subclass by serve()

    # ---- plumbing ------------------------------------------------------------------------------
    def log_message(self, format: str, *args) -> None:
        pass  # one line per request in _done(); the default would print every request line twice

    def _done(self, status: int, start: float) -> None:
        self.engine.log(
            f"{self.command} {self.path.split('?')[0]} {status} {(time.monotonic() - start) * 1000:.1f} ms"
        )

    def _json(self, status: int, doc: dict) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, kind: str, param: str | None = None) -> None:
        self._json(status, {"error": {"message": message, "type": kind, "param": param, "code": status}})

    def _authorized(self) -> bool:
        keys = self.engine.cfg.keys
        if not keys:
            return True
        auth = self.headers.get("Authorization", "")
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        ok = False
        for key in keys:  # no early exit: every key is compared
            ok |= hmac.compare_digest(token.encode(), key.encode())
        return ok

    def _route(self) -> str:
        return self.path.split("?")[0].rstrip("/") or "/"

    # ---- GET -----------------------------------------------------------------------------------
    def do_GET(self) -> None:
        start = time.monotonic()
        status = 500
        try:
            route = self._route()
            if route == "/health":
                status, doc = self.engine.health()
                self._json(status, doc)
            elif route == "/v1/models":
                if not self._authorized():
                    status = 401
                    self._error(401, "missing or invalid API key", "authentication_error")
                else:
                    status = 200
                    cfg = self.engine.cfg
                    entry = {
                        "id": cfg.served_model_name,
                        "object": "model",
                        "created": int(self.engine.started),
                        "owned_by": "sparkfleet-standin",
                        "max_model_len": cfg.max_model_len,
                    }
                    self._json(200, {"object": "list", "data": [entry]})
            else:
                status = 404
                self._error(404, f"no route {route}", "not_found")
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            self._done(status, start)

    # ---- POST ----------------------------------------------------------------------------------
    def do_POST(self) -> None:
        start = time.monotonic()
        status = 500
        try:
            status = self._post()
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # one failed request must not stop the server (fault isolation)
            self.engine.log(f"internal error: {type(exc).__name__}: {exc}")
            with contextlib.suppress(OSError):
                self._error(500, f"internal error: {type(exc).__name__}", "server_error")
        finally:
            self._done(status, start)

    def _read_body(self) -> object:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise BadRequest("a Content-Length header is required", status=411)
        if int(length) > MAX_BODY:
            raise BadRequest(f"the body is larger than {MAX_BODY} bytes", status=413)
        raw = self.rfile.read(int(length))
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BadRequest(f"the body is not valid JSON: {exc}") from exc

    def _post(self) -> int:
        try:
            route = self._route()
            if route != "/v1/chat/completions":
                raise BadRequest(f"no route {route}", status=404, kind="not_found")
            if not self._authorized():
                raise BadRequest("missing or invalid API key", status=401, kind="authentication_error")
            req = parse_chat(self._read_body(), self.engine.cfg)
        except BadRequest as exc:
            self._error(exc.status, str(exc), exc.kind, exc.param)
            self.close_connection = True  # the body may be unread
            return exc.status
        with self.engine.slots:
            try:
                reply, prompt, cached = self.engine.complete(req)
            except RankUnavailable as exc:
                self._error(503, f"the engine cannot serve: {exc}", "engine_unavailable")
                return 503
            except model.SchemaError as exc:
                self._error(
                    400, f"cannot satisfy the schema: {exc}", "invalid_request_error", "response_format"
                )
                return 400
            if req.stream:
                return self._stream(req, reply, prompt, cached)
            return self._whole(req, reply, prompt, cached)

    def _truncate(self, req: ChatRequest, reply: model.Reply) -> tuple[str | None, str]:
        if reply.content is None or req.max_tokens is None or reply.tool_calls or req.response_format:
            return reply.content, reply.finish_reason
        pieces = _pieces(reply.content)
        if len(pieces) <= req.max_tokens:
            return reply.content, reply.finish_reason
        return "".join(pieces[: req.max_tokens]), "length"

    def _usage(self, prompt: int, completion: str, cached: int) -> dict:
        done = model.count_tokens(completion)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": done,
            "total_tokens": prompt + done,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def _whole(self, req: ChatRequest, reply: model.Reply, prompt: int, cached: int) -> int:
        content, finish = self._truncate(req, reply)
        message: dict = {"role": "assistant", "content": content}
        if reply.reasoning is not None:
            message["reasoning_content"] = reply.reasoning
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        text = (
            (content or "")
            + (reply.reasoning or "")
            + "".join(c["function"]["arguments"] for c in reply.tool_calls)
        )
        doc = {
            "id": "chatcmpl-" + secrets.token_hex(12),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.engine.cfg.served_model_name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": self._usage(prompt, text, cached),
        }
        self._json(200, doc)
        return 200

    def _stream(self, req: ChatRequest, reply: model.Reply, prompt: int, cached: int) -> int:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        base = {
            "id": "chatcmpl-" + secrets.token_hex(12),
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.engine.cfg.served_model_name,
        }

        def event(delta: dict, finish: str | None = None, **extra) -> None:
            doc = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
            self.wfile.write(b"data: " + json.dumps(doc).encode() + b"\n\n")
            self.wfile.flush()

        content, finish = self._truncate(req, reply)
        event({"role": "assistant", "content": ""})
        steps = 0
        try:
            for field_name, text in (("reasoning_content", reply.reasoning), ("content", content)):
                for piece in _pieces(text or ""):
                    steps += 1
                    if steps % STREAM_REDUCE_EVERY == 0:
                        self.engine.reduce(f"{base['id']}|{steps}")  # every rank takes part in decoding
                    event({field_name: piece})
                    time.sleep(0.002)
        except RankUnavailable as exc:
            err = {
                "error": {
                    "message": f"the engine cannot serve: {exc}",
                    "type": "engine_unavailable",
                    "code": 503,
                }
            }
            self.wfile.write(b"data: " + json.dumps(err).encode() + b"\n\ndata: [DONE]\n\n")
            return 503
        if reply.tool_calls:
            event({"tool_calls": [{"index": i, **call} for i, call in enumerate(reply.tool_calls)]})
        event({}, finish)
        if req.include_usage:
            text = (content or "") + (reply.reasoning or "")
            doc = {**base, "choices": [], "usage": self._usage(prompt, text, cached)}
            self.wfile.write(b"data: " + json.dumps(doc).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        return 200


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64


def build(engine: Engine, host: str, port: int) -> Server:
    handler = type("BoundHandler", (Handler,), {"engine": engine})
    return Server((host, port), handler)

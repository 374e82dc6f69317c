"""Rank 0's HTTP side, as the real CUDA server answers (sfxnz/TensorFold src/tensorfold/cuda/http.py,
cuda/health.py, server/auth_http.py at the versions.py commits; the deepseek_v41 family page).

- The port opens only once the model is loaded (serve.py binds it last): no "loading" answer exists.
- GET /health, /v1/health: the counters body (ok, backend, busy, requests_running, the totals,
  context_length; `streams` with --parallel 2 or more); with API keys on (0.6.6+) {"status": "ok"}.
  Never gated. Polled GETs that answer 200 are not logged.
- GET /v1/models, /models: {"object": "list", "data": [{"id", "object": "model", "owned_by": "tensorfold"}]}
  for --name then each --alias.
- POST /v1/chat/completions, /v1/completions: the family's request rules (family page "Requests"),
  a `[tensorfold] done req-...` line per request, then the access line
  `[tensorfold] <client> "<request line>" <status> -` (` key=<label>` appended with keys on).
- API keys (0.6.6+): gated paths answer 401 with the real body and `WWW-Authenticate: Bearer`.
- A request that fails on a rank: 500 {"error": {"message": ...}}, a `[tensorfold] request error:` line
  and its traceback; the server goes on serving.
- GET /metrics: a few counters under the double's own names (the real metric names were not checked),
  gated unless --metrics-open.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import threading
import time
import traceback
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import auth, model
from .cluster import RankLost
from .prompt_cache import Kept
from .versions import Version

MAX_BODY = 64 << 20
POLLED = ("/metrics", "/v1/metrics", "/health", "/v1/health")
STATS = {
    "prefill_s": "prefill_seconds_total",
    "decode_s": "decode_seconds_total",
    "cached": "cached_tokens_total",
    "rounds": "rounds_total",
    "drafted": "drafted_total",
    "accepted": "accepted_total",
}
CONTEXT_LIMIT = "This server's maximum context length is"
GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend")
IMAGE_PARTS = ("image_url", "input_image", "image")
STREAM_PIECE_S = 0.002


class RequestError(ValueError):
    """A refused request: HTTP 400."""

    code: str | None = None


class ContextLengthError(RequestError):
    code = "context_length_exceeded"


def error_body(exc: Exception) -> dict:
    body = {"message": str(exc), "type": "invalid_request_error"}
    if getattr(exc, "code", None):
        body["code"] = exc.code
    return body


class Health:
    """Totals of finished requests and the requests running now (cuda/health.py's body)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.live: dict[int, int] = {}  # request -> reply tokens so far
        self.totals: dict[str, float] = dict.fromkeys(
            ("requests_total", "prompt_tokens_total", "completion_tokens_total", *STATS.values()), 0
        )

    @contextlib.contextmanager
    def running(self, key: int):
        with self.lock:
            self.live[key] = 0
        try:
            yield
        finally:
            with self.lock:
                self.live.pop(key, None)

    def fold(self, prompt: int, completion: int, stats: dict) -> None:
        with self.lock:
            t = self.totals
            t["requests_total"] += 1
            t["prompt_tokens_total"] += prompt
            t["completion_tokens_total"] += completion
            for key, name in STATS.items():
                value = stats.get(key)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    t[name] += value

    def snapshot(self, lanes: int, window: int | None) -> dict:
        with self.lock:
            totals = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in self.totals.items()}
            totals["completion_tokens_total"] += sum(self.live.values())
            running = len(self.live)
        body: dict[str, Any] = {
            "ok": True,
            "backend": "tensorfold",
            "busy": running > 0,
            "requests_running": running,
            **totals,
        }
        if lanes > 1:  # the concurrent decoder's streams
            body["streams"] = {"decoding": running, "prefilling": 0, "max": lanes}
        if window:
            body["context_length"] = int(window)
        return body


@dataclass
class Settings:
    """What rank 0 serves with: `tensorfold serve`'s request defaults and the family's."""

    version: Version
    ids: list[str]
    window: int
    max_tokens: int
    thinking: bool
    effort: str | None
    thinking_budget: int
    sampling: dict[str, float]
    lanes: int
    drafts: int
    serial_only: bool
    world: int
    background_ids: frozenset[str] = field(default_factory=frozenset)


@dataclass
class Prepared:
    chat: bool
    messages: list[dict]
    prompt: list[str]
    max_tokens: int
    thinking: bool
    effort: int
    tools: list[dict]
    tool_choice: object
    response_format: dict | None
    draft: bool
    sampling: dict[str, float]


class App:
    def __init__(self, settings: Settings, kept: Kept, coordinator, store: auth.KeyStore | None, log) -> None:
        self.s, self.kept, self.coordinator, self.auth, self.log = settings, kept, coordinator, store, log
        self.health = Health()
        self.turns = threading.BoundedSemaphore(settings.lanes)
        self.ranks = threading.Lock()  # every rank runs requests in one order
        self._seq = 0

    @property
    def model_ids(self) -> list[str]:
        return list(dict.fromkeys(i for i in self.s.ids if i))

    def reply_model(self, body: object) -> str:
        asked = body.get("model") if isinstance(body, dict) else None
        return asked if isinstance(asked, str) and asked in self.model_ids else self.model_ids[0]

    # ---- request rules ---------------------------------------------------------------------
    def _effort(self, value: object) -> int | None:
        """A request's reasoning_effort -> budget; None is "none" (thinking off)."""
        if value == "none":
            return None
        if isinstance(value, str) and value in self.s.version.efforts:
            return self.s.version.efforts[value]
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 100:
            return value
        if isinstance(value, str) and value.isdigit() and 1 <= int(value) <= 100:
            return int(value)
        names = ", ".join(["none", *self.s.version.efforts])
        raise RequestError(f"reasoning_effort {value!r}: one of {names}, or an integer from 1 to 100")

    def _thinking(self, body: dict) -> tuple[bool, int]:
        kwargs = body.get("chat_template_kwargs")
        if kwargs is None:
            kwargs = {}
        elif not isinstance(kwargs, dict):
            raise RequestError("chat_template_kwargs must be a JSON object or null")
        explicit = next(
            (kwargs[k] for k in ("thinking", "enable_thinking") if isinstance(kwargs.get(k), bool)), None
        )
        if explicit is None and self.s.version.thinking_field and isinstance(body.get("thinking"), bool):
            explicit = body["thinking"]
        level = None
        if body.get("reasoning_effort") is not None:
            level = self._effort(body["reasoning_effort"])
            if explicit is None:
                explicit = level is not None  # an effort name turns thinking on; "none" keeps it off
        thinking = self.s.thinking if explicit is None else explicit
        if level is None:
            default = self.s.effort or self.s.version.default_effort
            level = self.s.version.efforts.get(default, 75) if default else 75
        return thinking, level

    def _tools(self, body: dict) -> tuple[list[dict], object]:
        tools = body.get("tools") or []
        if not isinstance(tools, list):
            raise RequestError("tools must be a list")
        names = []
        for i, tool in enumerate(tools):
            fn = tool.get("function") if isinstance(tool, dict) else None
            if not (
                isinstance(fn, dict) and tool.get("type") == "function" and isinstance(fn.get("name"), str)
            ):
                raise RequestError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}")
            if not isinstance(fn.get("parameters", {}), dict):
                raise RequestError(f"tools[{i}].function.parameters must be a JSON schema object")
            names.append(fn["name"])
        choice = body.get("tool_choice")
        forced = choice == "required" or isinstance(choice, dict)
        if forced and not self.s.version.forced_tools:
            raise RequestError(
                "tool_choice 'required' or a named function is not supported by this model: tool calls run "
                "with tool_choice 'auto' or 'none'"
            )
        if choice == "required" and not tools:
            raise RequestError("tool_choice 'required' needs tools")
        if isinstance(choice, dict):
            wanted = (choice.get("function") or {}).get("name")
            if choice.get("type") != "function" or wanted not in names:
                raise RequestError(f"tool_choice names the function {wanted!r}, which is not in tools")
        elif choice not in (None, "none", "auto", "required"):
            raise RequestError(f"tool_choice {choice!r}: none, auto, required or a function")
        return tools, choice

    def _response_format(self, body: dict) -> dict | None:
        for name in (*GUIDED, "structured_outputs"):
            if body.get(name) is not None:
                raise RequestError(f"{name}: this model's engine does not enforce structured output")
        fmt = body.get("response_format")
        if fmt is None:
            return None
        if not self.s.version.structured_output:
            raise RequestError("response_format: this model's engine does not enforce structured output")
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind not in ("text", "json_object", "json_schema"):
            raise RequestError("response_format.type must be text, json_object or json_schema")
        if kind == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
                raise RequestError("response_format.json_schema must be {name, schema}")
        return None if kind == "text" else fmt

    def _sampling(self, body: dict) -> dict[str, float]:
        out = dict(self.s.sampling)
        bounds = {"temperature": (0, 2), "top_p": (0, 1), "top_k": (0, 1 << 31), "min_p": (0, 1)}
        for name, (lo, hi) in bounds.items():
            value = body.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
                raise RequestError(f"{name} must be a number from {lo} to {hi}, not {value!r}")
            out[name] = value
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise RequestError("seed must be an integer")
        return out

    def prepare(self, body: object, chat: bool) -> Prepared:  # noqa: PLR0912 - one rule a branch
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        if body.get("logprobs") or body.get("top_logprobs") is not None:
            raise RequestError("logprobs are not supported by this model's engine")
        n = body.get("n")
        if n is not None and n != 1:
            raise RequestError("n: this engine returns one choice a request (n=1)")
        if body.get("thinking_budget") is not None:
            raise RequestError(
                "thinking_budget is not supported by this model: both ranks decode a request to its end"
            )
        draft = body.get("draft", True) is not False
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
            raise RequestError("max_tokens must be an integer token count")
        max_tokens = max(1, max_tokens or self.s.max_tokens)
        sampling = self._sampling(body)
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                raise RequestError("messages must be a list of message objects")
            for m in messages:
                parts = m.get("content") if isinstance(m.get("content"), list) else []
                if any(isinstance(p, dict) and p.get("type") in IMAGE_PARTS for p in parts):
                    raise RequestError("images are not supported by this model's engine")
            thinking, effort = self._thinking(body)
            if thinking and self.s.thinking_budget > 0:
                raise RequestError("thinking requests are refused on a server started with --thinking-budget")
            tools, choice = self._tools(body)
            fmt = self._response_format(body)
            prompt = model.render(messages, tools, thinking)
        else:
            text = body.get("prompt")
            if not isinstance(text, str):
                raise RequestError("prompt must be a string")
            messages, thinking, effort, tools, choice, fmt = (
                [{"role": "user", "content": text}],
                False,
                75,
                [],
                None,
                None,
            )
            prompt = model.tokens(text)
        if not prompt:
            raise RequestError("rendered prompt is empty")
        if len(prompt) >= self.s.window:
            raise ContextLengthError(
                f"{CONTEXT_LIMIT} {self.s.window} tokens. However, your messages resulted in "
                f"{len(prompt)} tokens."
            )
        max_tokens = min(max_tokens, self.s.window - len(prompt))
        return Prepared(
            chat, messages, prompt, max_tokens, thinking, effort, tools, choice, fmt, draft, sampling
        )

    # ---- running ---------------------------------------------------------------------------
    def run(self, p: Prepared, on_piece=None) -> dict:
        """One request on every rank -> the reply, usage numbers and stats."""
        with self.turns:
            self._seq += 1
            key = self._seq
            with self.health.running(key):
                return self._run(p, key, on_piece)

    def _run(self, p: Prepared, key: int, on_piece) -> dict:
        received = time.perf_counter()
        rid = "req-" + secrets.token_hex(6)
        drafting = p.draft and not self.s.serial_only
        with self.ranks:
            lost = self.coordinator.lost() if self.coordinator is not None else []
            if lost:
                raise RankLost("; ".join(lost))
            cached = self.kept.lookup(p.prompt) if drafting else 0
            request = {"id": rid, "prompt": p.prompt, "cached": cached, "draft": drafting}
            if self.coordinator is not None:
                self.coordinator.run(request)
            apply(self.kept, request)
        prefilled = time.perf_counter()
        mix = int(hashlib.sha256(" ".join(p.prompt).encode()).hexdigest()[:8], 16)
        reply = model.generate(
            p.messages,
            thinking=p.thinking,
            effort=p.effort,
            tools=p.tools,
            tool_choice=p.tool_choice,
            response_format=p.response_format,
            mix=mix,
            rank_info=f" (TP{self.s.world})",
        )
        content, reasoning, finish = reply.content, reply.reasoning, reply.finish_reason
        pieces = _pieces(reasoning or "") + _pieces(content or "")
        if not reply.tool_calls and not p.response_format and len(pieces) > p.max_tokens:
            kept_pieces, budget = [], p.max_tokens
            for text in (reasoning, content):
                mine = _pieces(text or "")[:budget]
                budget -= len(mine)
                kept_pieces.append("".join(mine) if mine else None)
            reasoning, content = kept_pieces[0] if reasoning else None, kept_pieces[1]
            finish = "length"
        first = None
        out_tokens = 0
        for field_name, text in (("reasoning_content", reasoning), ("content", content)):
            for piece in _pieces(text or ""):
                out_tokens += 1
                with self.health.lock:
                    self.health.live[key] = out_tokens
                first = first or time.perf_counter()
                if on_piece is not None:
                    on_piece({field_name: piece})
                    time.sleep(STREAM_PIECE_S)
        calls_text = "".join(c["function"]["arguments"] for c in reply.tool_calls)
        completion = out_tokens + len(model.tokens(calls_text))
        done = time.perf_counter()
        tokens = [*model.tokens(reasoning or ""), *model.tokens(content or ""), calls_text]
        sha = hashlib.sha256(json.dumps(tokens).encode()).hexdigest()
        rounds, drafted, accepted = _rounds(completion, self.s.drafts if drafting else 0, sha)
        stats = {
            "prefill_s": round(prefilled - received, 6),
            "decode_s": round(done - prefilled, 6),
            "cached": cached,
            "rounds": rounds,
            "drafted": drafted,
            "accepted": accepted,
            "drafts": drafting,
            "policy": str(self.s.drafts if drafting else 0),
            "sha256": sha[:16],
        }
        self.health.fold(len(p.prompt), completion, stats)
        ttft = (first or done) - received
        tok_s = completion / max(done - prefilled, 1e-6)
        self.log(
            f"[tensorfold] done {rid} prompt={len(p.prompt)} cached={cached} thinking={p.thinking} "
            f"tokens={completion} sha={sha[:12]} finish={finish} tok/s={tok_s:.1f} ttft={ttft:.2f}s "
            f"prefill={prefilled - received:.2f}s rounds={rounds} accepted={accepted}/{drafted}"
        )
        return {
            "content": content,
            "reasoning": reasoning,
            "calls": reply.tool_calls,
            "finish": finish,
            "prompt_tokens": len(p.prompt),
            "completion_tokens": completion,
            "cached_tokens": cached,
            "reasoning_tokens": len(model.tokens(reasoning or "")),
            "stats": stats,
        }


def apply(kept: Kept, request: dict) -> None:
    """What every rank does with a request's prompt states: resume from `cached`, keep the new one."""
    prompt = request["prompt"]
    if request["cached"]:
        kept.resume(prompt, request["cached"])
    if request["draft"]:
        kept.keep(prompt)


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


def _rounds(tokens: int, drafts: int, sha: str) -> tuple[int, int, int]:
    """Decode rounds for `tokens`: serial one a round, else 1 + the drafts the target kept."""
    if drafts <= 0:
        return tokens, 0, 0
    rounds = drafted = accepted = 0
    left = max(0, tokens - 1)  # the prompt's forward gives the first token
    while left > 0:
        kept = int(sha[(rounds * 2) % 60 : (rounds * 2) % 60 + 2], 16) % (drafts + 1)
        kept = min(kept, max(0, left - 1))
        rounds += 1
        drafted += drafts
        accepted += kept
        left -= 1 + kept
    if rounds == 0:  # the prompt's forward alone: its round still drafted
        return 1, drafts, 0
    return rounds, drafted, accepted


def usage_of(result: dict) -> dict:
    return {
        "prompt_tokens": result["prompt_tokens"],
        "completion_tokens": result["completion_tokens"],
        "total_tokens": result["prompt_tokens"] + result["completion_tokens"],
        "prompt_tokens_details": {"cached_tokens": result["cached_tokens"]},
        "completion_tokens_details": {"reasoning_tokens": result["reasoning_tokens"]},
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    app: App  # set on the subclass by build()

    # ---- logging and auth ------------------------------------------------------------------
    def log_message(self, format: str, *args) -> None:
        store = self.app.auth
        if store is not None and store.enabled:
            format += " key=" + (getattr(self, "key_label", None) or "unauthenticated")
        self.app.log(f"[tensorfold] {self.address_string()} {format % args}")

    def log_request(self, code="-", size="-") -> None:
        route = self.path.split("?", 1)[0].rstrip("/")
        if not (self.command == "GET" and route in POLLED and code == 200):
            super().log_request(code, size)

    def parse_request(self) -> bool:
        self.key_label = None
        return super().parse_request() and self._authenticate()

    def _authenticate(self) -> bool:
        store = self.app.auth
        if self.command == "OPTIONS" or store is None or not store.enabled:
            return True
        self.key_label = store.match(self.headers)
        if not auth.gated(self.path, store.metrics_open) or self.key_label is not None:
            return True
        blob = json.dumps(auth.unauthorized_body(self.path)).encode()
        self.close_connection = True
        self.send_response(401)
        self.send_header("WWW-Authenticate", "Bearer")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(blob)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(blob)
        return False

    # ---- plumbing ----------------------------------------------------------------------------
    def _send(self, code: int, data: bytes, kind: str) -> None:
        try:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _json(self, code: int, payload: object) -> None:
        self._send(code, json.dumps(payload).encode(), "application/json")

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None:
            return b""
        if not length.isdigit() or int(length) > MAX_BODY:
            self.close_connection = True
            raise RequestError("the request body's Content-Length is not acceptable")
        return self.rfile.read(int(length))

    # ---- routes ------------------------------------------------------------------------------
    def do_GET(self) -> None:
        route = self.path.split("?", 1)[0].rstrip("/")
        app = self.app
        if route in ("/metrics", "/v1/metrics"):
            snap = app.health.snapshot(app.s.lanes, app.s.window)
            lines = [
                f"tensorfold_{k} {v}"
                for k, v in snap.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            ]
            self._send(200, ("\n".join(lines) + "\n").encode(), "text/plain; version=0.0.4")
        elif route in ("/v1/models", "/models"):
            data = [{"id": i, "object": "model", "owned_by": "tensorfold"} for i in app.model_ids]
            self._json(200, {"object": "list", "data": data})
        elif route in ("/health", "/v1/health"):
            enabled = app.auth is not None and app.auth.enabled
            self._json(200, {"status": "ok"} if enabled else app.health.snapshot(app.s.lanes, app.s.window))
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        chat = path.endswith("/chat/completions")
        if not chat and not path.endswith("/completions"):
            with contextlib.suppress(RequestError, OSError):
                self._body()
            return self._json(404, {"error": "not found"})
        try:
            raw = self._body()
            body = json.loads(raw or b"{}")
        except RequestError as exc:
            return self._json(400, {"error": error_body(exc)})
        except (json.JSONDecodeError, UnicodeDecodeError):
            return self._json(
                400, {"error": {"message": "the request body is not JSON", "type": "invalid_request_error"}}
            )
        try:
            prepared = self.app.prepare(body, chat)
        except RequestError as exc:
            return self._json(400, {"error": error_body(exc)})
        rid = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        created, model_id = int(time.time()), self.app.reply_model(body)
        if body.get("stream"):
            return self._stream(prepared, rid, created, model_id, body)
        try:
            result = self.app.run(prepared)
        except Exception as exc:
            _log_error(self.app, exc)
            return self._json(500, {"error": {"message": str(exc) or type(exc).__name__}})
        usage = usage_of(result)
        if chat:
            message: dict[str, Any] = {"role": "assistant", "content": result["content"] or None}
            if result["reasoning"]:
                message["reasoning_content"] = result["reasoning"]
            if result["calls"]:
                message["tool_calls"] = result["calls"]
            choice = {"index": 0, "message": message, "finish_reason": result["finish"]}
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": result["content"] or "", "finish_reason": result["finish"]}
            kind = "text_completion"
        payload = {"id": rid, "object": kind, "created": created, "model": model_id, "choices": [choice]}
        self._json(200, {**payload, "usage": usage, "tensorfold": result["stats"]})

    def _stream(self, prepared: Prepared, rid: str, created: int, model_id: str, body: dict) -> None:
        chat = prepared.chat
        kind = "chat.completion.chunk" if chat else "text_completion"
        opts = body.get("stream_options")
        separate_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))

        def chunk(delta: dict, finish: str | None = None) -> dict:
            if chat:
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta.get("content", ""), "finish_reason": finish}
            return {"id": rid, "object": kind, "created": created, "model": model_id, "choices": [choice]}

        def write(*frames: dict, done: bool = False) -> None:
            data = "".join(f"data: {json.dumps(f)}\n\n" for f in frames).encode()
            self.wfile.write(data + (b"data: [DONE]\n\n" if done else b""))
            self.wfile.flush()

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            if chat:
                write(chunk({"role": "assistant"}))
            try:
                result = self.app.run(prepared, on_piece=lambda delta: write(chunk(delta)))
            except OSError:
                raise
            except Exception as exc:
                _log_error(self.app, exc)
                error = {"message": str(exc) or type(exc).__name__, "type": "server_error"}
                self.wfile.write(f"data: {json.dumps({'error': error})}\n\ndata: [DONE]\n\n".encode())
                return
            frames = []
            for i, call in enumerate(result["calls"]):  # tool calls come whole, at the end
                frames.append(chunk({"tool_calls": [{"index": i, **call}]}))
            end = chunk({}, result["finish"])
            end["tensorfold"] = result["stats"]
            frames.append(end)
            if separate_usage:
                frames.append(
                    {
                        "id": rid,
                        "object": kind,
                        "created": created,
                        "model": model_id,
                        "choices": [],
                        "usage": usage_of(result),
                    }
                )
            else:
                end["usage"] = usage_of(result)
            write(*frames, done=True)
        except (BrokenPipeError, ConnectionResetError):
            pass


def _log_error(app: App, exc: BaseException) -> None:
    app.log(f"[tensorfold] request error: {type(exc).__name__}: {exc}")
    traceback.print_exception(exc)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64


def build(app: App, host: str, port: int) -> Server:
    handler = type("Handler", (Handler,), {"app": app})
    return Server((host, port), handler)

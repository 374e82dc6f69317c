# The engine's OpenAI-compatible HTTP API as a client sees it: one request (status, headers, body), a JSON
# request, a streamed (SSE) reply with the time to its first piece, the bearer key read from the engine's key
# file. Used by the module engine_api (readiness and verify). Standard library only.
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from ansible_collections.sparkfleet.cluster.plugins.module_utils.api_keys import KeyFileError, parse_key_file


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
                    if first is None and delta_text(event):
                        first = time.monotonic() - start
        except urllib.error.HTTPError as exc:
            raise ApiError(f"HTTP {exc.code}: {error_text(exc.read())}", exc.code) from exc
        except (OSError, ValueError) as exc:
            raise ApiError(f"{self.url}{path}: {getattr(exc, 'reason', exc)}") from exc
        return events, first


def error_text(body: object) -> str:
    if isinstance(body, bytes):
        try:
            body = json.loads(body)
        except ValueError:
            return body.decode(errors="replace")[:200]
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", body["error"]))[:300]
    return str(body)[:300]


def delta_text(event: object) -> str:
    if not isinstance(event, dict):
        return ""
    choices = event.get("choices") or []
    if not choices:
        return ""
    return (choices[0].get("delta") or {}).get("content") or ""

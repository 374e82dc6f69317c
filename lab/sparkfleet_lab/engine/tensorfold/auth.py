"""API keys as engine 0.6.6 has them (sfxnz/TensorFold @ dc971a2: src/tensorfold/server/authentication.py,
auth_http.py); 0.6.4 has none.

Key sources: `--api-key K` (repeatable, labels cli-N), TENSORFOLD_API_KEY (comma-separated, taken out of
the process environment, labels env-N), `--api-key-file F`: a regular file that group and other cannot
read (mode & 0o044 refused), at most 1 MiB, one `label: key` or a bare key (file-N) a line, `#` comments
and blank lines skipped, at least one key. The file is looked at again at most once a second (and at once
after SIGHUP); a file that no longer passes closes every gated route until it does. Only SHA-256 digests
of keys are kept; a request matches by `Authorization: Bearer K` or `x-api-key: K`, compared in constant
time; a key never reaches a log.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import os
import re
import signal
import stat
import threading
import time
from pathlib import Path

LABEL = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_FILE = 1 << 20
MESSAGE = "A valid API key is required"
ANTHROPIC_PATHS = {"/v1/messages", "/v1/messages/count_tokens", "/messages", "/messages/count_tokens"}
NO_KEY_WARNING = "[tensorfold] warning: non-loopback server has no API key; requests are open"
RELOAD_REFUSED = "[tensorfold] API key file reload refused; authenticated routes remain closed"


def digest(key: str) -> bytes:
    if not isinstance(key, str) or not key or any(c.isspace() or ord(c) < 32 for c in key):
        raise ValueError("API keys must be nonempty text without whitespace")
    return hashlib.sha256(key.encode()).digest()


def gated(path: str, metrics_open: bool = False) -> bool:
    """Whether a path needs a key (/health never does)."""
    path = path.split("?", 1)[0].rstrip("/")
    if metrics_open and path in ("/metrics", "/v1/metrics"):
        return False
    exact = {"/metrics", "/tokenize", "/detokenize", "/models", "/messages", "/messages/count_tokens"}
    exact |= {"/chat/completions", "/completions", "/decisions", "/responses"}
    return (
        path == "/v1"
        or path.startswith(("/v1/", "/responses/"))
        or path in exact
        or path.endswith(("/chat/completions", "/completions", "/decisions", "/models"))
    )


def unauthorized_body(path: str) -> dict:
    path = path.split("?", 1)[0].rstrip("/")
    if path in ANTHROPIC_PATHS:
        return {"type": "error", "error": {"type": "authentication_error", "message": MESSAGE}}
    return {
        "error": {
            "message": MESSAGE,
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }


class KeyStore:
    def __init__(
        self, keys=(), *, key_file: str | None = None, environment: str = "", metrics_open: bool = False
    ) -> None:
        self._static = [(digest(k), f"cli-{i}") for i, k in enumerate(keys, 1)]
        env_keys = [k.strip() for k in environment.split(",") if k.strip()]
        self._static += [(digest(k), f"env-{i}") for i, k in enumerate(env_keys, 1)]
        self.key_file = Path(key_file).expanduser() if key_file else None
        self.metrics_open = bool(metrics_open)
        self._lock = threading.Lock()
        self._forced = threading.Event()
        self._checked = float("-inf")
        self._file: list[tuple[bytes, str]] = []
        self._stamp: tuple | None = None
        self._valid = True
        if self.key_file is not None:
            try:
                self._file, self._stamp = self._read()
            except OSError:
                raise ValueError("API key file cannot be opened safely") from None

    @property
    def enabled(self) -> bool:
        return bool(self._static) or self.key_file is not None

    def _read(self) -> tuple[list[tuple[bytes, str]], tuple]:
        assert self.key_file is not None
        fd = os.open(self.key_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o044:
                raise ValueError(
                    "API key file must be a regular file that other users cannot read; chmod 600 it"
                )
            if info.st_size > MAX_FILE:
                raise ValueError("API key file is larger than 1 MiB")
            raw = b""
            while len(raw) <= MAX_FILE and (chunk := os.read(fd, MAX_FILE + 1 - len(raw))):
                raw += chunk
        finally:
            os.close(fd)
        if len(raw) > MAX_FILE:
            raise ValueError("API key file is larger than 1 MiB")
        keys: list[tuple[bytes, str]] = []
        for raw_line in raw.decode("utf-8").splitlines():
            line = raw_line.strip()
            if not line or line.startswith("#"):
                continue
            label, colon, key = line.partition(":")
            if colon:
                label, key = label.strip(), key.strip()
                if not LABEL.fullmatch(label):
                    raise ValueError("an API key label is 1-64 letters, digits, dots, underscores or hyphens")
            else:
                label, key = f"file-{len(keys) + 1}", line
            keys.append((digest(key), label))
        if not keys:
            raise ValueError("API key file has no keys")
        stamp = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size, info.st_mode)
        return keys, stamp

    def request_reload(self, *_args) -> None:
        self._forced.set()

    def refresh(self) -> None:
        if self.key_file is None:
            return
        with self._lock:
            now = time.monotonic()
            forced = self._forced.is_set()
            if not forced and now - self._checked < 1:
                return
            self._forced.clear()
            self._checked = now
            try:
                info = self.key_file.stat()
                stamp = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size, info.st_mode)
                if forced or not self._valid or stamp != self._stamp:
                    self._file, self._stamp = self._read()
                    self._valid = True
            except (OSError, UnicodeError, ValueError):
                was_valid, self._file, self._valid = self._valid, [], False
                if was_valid:
                    print(RELOAD_REFUSED, flush=True)

    def match(self, headers) -> str | None:
        """The label of the key a request carries, or None."""
        self.refresh()
        with self._lock:
            keys, valid = self._static + self._file, self._valid
        offered = []
        for name in ("Authorization", "x-api-key"):
            values = headers.get_all(name) or []
            value = values[0] if len(values) == 1 else ""
            if name == "Authorization":
                scheme, space, value = value.partition(" ")
                value = value.strip() if space and scheme.lower() == "bearer" else ""
            try:
                offered.append(digest(value))
            except ValueError:
                offered.append(hashlib.sha256(b"").digest())
        label = None
        for known, name in keys:
            hit = False
            for candidate in offered:  # every comparison runs: no early exit
                hit |= hmac.compare_digest(known, candidate)
            if hit and label is None:
                label = name
        return label if valid else None

    @contextlib.contextmanager
    def signals(self):
        ok = self.key_file is not None and threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGHUP, self.request_reload) if ok else None
        try:
            yield
        finally:
            if ok:
                signal.signal(signal.SIGHUP, previous)


def configure(args) -> KeyStore:
    """The key store of a `serve` command line (0.6.6+); warns about an open non-loopback server."""
    store = KeyStore(
        getattr(args, "api_key", None) or (),
        key_file=getattr(args, "api_key_file", None),
        environment=os.environ.pop("TENSORFOLD_API_KEY", ""),
        metrics_open=getattr(args, "metrics_open", False),
    )
    args.api_key = []
    if not store.enabled:
        try:
            loopback = ipaddress.ip_address(args.host).is_loopback
        except ValueError:
            loopback = str(args.host).lower() == "localhost"
        if not loopback:
            print(NO_KEY_WARNING, flush=True)
    return store

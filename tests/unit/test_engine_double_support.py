"""Shared helpers of the engine double's tests (imported by test_engine_double_*; no tests here)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from sparkfleet_lab import engine as engine_repo
from sparkfleet_lab.engine.local import LocalCluster, free_port, make_snapshot

__all__ = ["LocalCluster", "call", "chat", "make_snapshot", "rank_alone", "until", "wait_line"]

# the real lines' shapes (sfxnz/DeepSeek-V4.1-Flash-EXL3-TensorFold-2x-DGX-Spark
# evidence/s2-run-sh-ec28f35/bootB/rank0-full.log, rank1-full.log)
LINES = {
    "loading": re.compile(
        r"^\[tensorfold\] loading (\S+): DeepSeek-V4\.1-Flash \(deepseek_v41\) on CUDA, rank (\d) of (\d)$"
    ),
    "estimate": re.compile(
        r"^\[tensorfold\] CUDA rank (\d) startup estimate [\d.]+ GiB within [\d.]+ GiB; native (\d+), "
        r"allocated prompt/reply window (\d+), cache slots (\d+)$"
    ),
    "weights": re.compile(
        r"^\[tensorfold\] rank (\d) of (\d): \d+ layers( and DSpark)?, [\d.]+ GiB of weights in [\d.]+ s$"
    ),
    "serving": re.compile(
        r"^\[tensorfold\] serving (\S+) at http://(\S+):(\d+)/v1 on CUDA, rank 0 of (\d) \(sampling: [^;]*; "
        r"drafts: (on|off); prompts: bf16 activations; context: (\d+); loaded in [\d.]+s\)$"
    ),
    "following": re.compile(r"^\[tensorfold\] rank (\d) ready in [\d.]+s, following rank 0$"),
    "done": re.compile(
        r"^\[tensorfold\] done req-[0-9a-f]{12} prompt=\d+ cached=\d+ thinking=(True|False) tokens=\d+ "
        r"sha=[0-9a-f]{12} finish=\w+ tok/s=[\d.]+ ttft=[\d.]+s prefill=[\d.]+s rounds=\d+ accepted=\d+/\d+$"
    ),
    "access": re.compile(r'^\[tensorfold\] \S+ "(GET|POST) (\S+) HTTP/1\.1" (\d{3}) -( key=\S+)?$'),
}
HEALTH_KEYS = [
    "ok",
    "backend",
    "busy",
    "requests_running",
    "requests_total",
    "prompt_tokens_total",
    "completion_tokens_total",
    "prefill_seconds_total",
    "decode_seconds_total",
    "cached_tokens_total",
    "rounds_total",
    "drafted_total",
    "accepted_total",
    "context_length",
]


def until(check, what: str, timeout: float = 30, every: float = 0.1):
    """Poll `check` until it returns something true, else fail naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


def wait_line(rank, pattern: str, timeout: float = 30) -> str:
    return until(
        lambda: next((ln for ln in rank.output().splitlines() if re.search(pattern, ln)), None),
        f"a line matching {pattern!r} in rank {rank.rank}'s log:\n{rank.output()}",
        timeout,
    )


def call(url: str, path: str, body=None, *, key: str | None = None, headers: dict | None = None, timeout=30):
    """(status, parsed JSON or text, response headers) of one request."""
    data = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    if key:
        hdrs["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(  # noqa: S310 - loopback only
        url + path, data=data, headers=hdrs, method="POST" if data is not None else "GET"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback
            raw, status, got = resp.read().decode(), resp.status, resp.headers
    except urllib.error.HTTPError as exc:
        raw, status, got = exc.read().decode(), exc.code, exc.headers
    try:
        return status, json.loads(raw), got
    except json.JSONDecodeError:
        return status, raw, got


def chat(content: str, **extra) -> dict:
    return {"model": "standin-model", "messages": [{"role": "user", "content": content}], **extra}


def sse(url: str, body: dict, key: str | None = None) -> list:
    hdrs = {"Content-Type": "application/json"}
    if key:
        hdrs["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), headers=hdrs)  # noqa: S310
    events = []
    with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - loopback
        assert resp.headers["Content-Type"] == "text/event-stream"
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data: "):
                payload = line[6:]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def rank_alone(tree: Path, snapshot: Path, *args: str, env: dict | None = None, timeout: float = 60):
    """One `tensorfold serve` process run to its end (refusals come before or at the rendezvous)."""
    full_env = {
        "PYTHONPATH": str(tree),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "SPARKFLEET_LAB_ENGINE_RENDEZVOUS_S": "0.5",
        "SPARKFLEET_LAB_ENGINE_LOAD_S": "0",
        "SPARKFLEET_LAB_ENGINE_JIT_S": "0",
        "TORCH_EXTENSIONS_DIR": str(tree / "torch_extensions"),
        **(env or {}),
    }
    argv = [sys.executable, "-m", "tensorfold", "serve", str(snapshot), *args]
    return subprocess.run(argv, capture_output=True, text=True, env=full_env, timeout=timeout, check=False)


def tree(version: str, root: Path) -> Path:
    return engine_repo.materialize(version, root / version)


def port() -> int:
    return free_port()

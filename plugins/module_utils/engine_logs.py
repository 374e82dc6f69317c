# One rank's engine log read the way an admin reads it: has it started loading, is it serving (rank 0) or
# following rank 0 (a worker), did it fail and with which message. The patterns are the engine profile's
# (role engine_service, `ready` of a profile), so another engine build brings its own lines. Read by
# engine_node (status, the start of the workers) and engine_api (the wait for rank 0). Standard library only.
from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterable, Mapping
from datetime import datetime

# `docker logs` of a rank: the first lines hold the startup (the ready line comes early), the last ones what
# happened since; a long-running engine prints a line per request, so the middle is never read.
HEAD_LINES = 400
TAIL_LINES = 80
# Python's last traceback line: "ValueError: ...", "RuntimeError: ...", "KeyboardInterrupt"
EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)\b:?")


class Patterns:
    """The profile's log rules: loading, serving (rank 0), following (a worker), fatal (any rank)."""

    def __init__(self, rules: Mapping | None) -> None:
        rules = rules or {}
        self.loading = _compile(rules.get("loading"))
        self.serving = _compile(rules.get("serving"))
        self.following = _compile(rules.get("following"))
        self.fatal = [p for p in (_compile(r) for r in _as_list(rules.get("fatal"))) if p is not None]
        self.progress = _compile(rules.get("progress"))


def _as_list(value: object) -> list:
    if value is None or value == "":
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def _compile(pattern: object) -> re.Pattern | None:
    return re.compile(str(pattern)) if pattern not in (None, "") else None


def _first(pattern: re.Pattern | None, lines: Iterable[str]) -> str:
    if pattern is None:
        return ""
    return next((ln for ln in lines if pattern.search(ln)), "")


def _last(pattern: re.Pattern | None, lines: list[str]) -> str:
    if pattern is None:
        return ""
    return next((ln for ln in reversed(lines) if pattern.search(ln)), "")


def fatal_message(lines: list[str], patterns: Patterns) -> str:
    """The engine's own words for why it stopped: the exception line of its last traceback, else the last
    line a fatal rule matches (an argparse error, `tensorfold: <refusal>`), else ''."""
    hit = ""
    for i, line in enumerate(lines):
        if any(p.search(line) for p in patterns.fatal):
            hit = line
            if line.startswith("Traceback"):
                after = [ln for ln in lines[i + 1 :] if ln and not ln[0].isspace()]
                exc = next((ln for ln in reversed(after) if EXCEPTION.match(ln)), "")
                hit = exc or (after[-1] if after else line)
    return hit.strip()


def summarize(lines: list[str], patterns: Patterns, *, rank: int, running: bool | None) -> dict:
    """phase: failed | serving | following | loading | starting | stopped | unknown, with the lines that
    say so: `ready` (the serving / following line), `fatal` (the engine's message), `last` (the latest
    line of the engine's own progress, e.g. `[tensorfold] rank 0 of 2: ... weights in 29.4 s`)."""
    lines = [ln.rstrip("\r\n") for ln in lines]
    fatal = fatal_message(lines, patterns)
    ready = _first(patterns.serving if rank == 0 else patterns.following, lines)
    loading = _first(patterns.loading, lines)
    last = _last(patterns.progress, lines) or next((ln for ln in reversed(lines) if ln.strip()), "")
    if running is False:
        phase = "failed" if fatal else "stopped"
    elif fatal and not ready:
        phase = "failed"
    elif ready:
        phase = "serving" if rank == 0 else "following"
    elif loading:
        phase = "loading"
    elif running:
        phase = "starting"
    else:
        phase = "unknown"
    return {"phase": phase, "ready": ready, "fatal": fatal, "loading": loading, "last": last.strip()}


def read_logs(docker: str, name: str, head: int = HEAD_LINES, tail: int = TAIL_LINES) -> list[str]:
    """The first `head` and the last `tail` lines of a container's log (stdout and stderr, in order);
    [] when there is no such container."""
    lines: list[str] = []
    try:
        with subprocess.Popen(
            [docker, "logs", name],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        ) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if len(lines) >= head:
                    break
            proc.kill()
    except OSError:
        return []
    if len(lines) < head:
        return lines  # the whole log
    end = subprocess.run(
        [docker, "logs", "--tail", str(tail), name],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        check=False,
    )
    return [*lines, "...", *end.stdout.splitlines(keepends=True)]


RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


def seconds_since(stamp: str, now: float | None = None) -> float | None:
    """Seconds from docker's StartedAt (RFC 3339 with nanoseconds) to now; None for an unset or odd stamp."""
    m = RFC3339.match(stamp or "")
    if not m or stamp.startswith("0001-"):
        return None
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    start = datetime.fromisoformat(m.group(1) + zone).timestamp() + float("0." + (m.group(2) or "0"))
    return round((time.time() if now is None else now) - start, 1)

# Progress files: the JSON status a long weights task rewrites (bytes, rate, ETA, per part),
# which the role's wait action prints between polls.
# Standard library only: it runs on the nodes (Python 3.11-3.13), inside the hub's venv too.
from __future__ import annotations

import contextlib
import json
import threading
import time

from ansible_collections.sparkfleet.cluster.plugins.module_utils.fileio import write_atomic
from ansible_collections.sparkfleet.cluster.plugins.module_utils.text_format import duration
from ansible_collections.sparkfleet.cluster.plugins.module_utils.text_format import size as human


class Progress:
    """A JSON status file a long task rewrites; the role's wait action prints it between polls."""

    def __init__(self, path: str | None, phase: str, total_bytes: int = 0, total_files: int = 0):
        self.path = path
        self.phase = phase
        self.total = total_bytes
        self.total_files = total_files
        self.done = 0
        self.files_done = 0
        self.skipped = 0
        self.start = time.monotonic()
        self.detail = ""
        self.parts: dict[str, dict] = {}  # per part (e.g. per worker of a copy): done/total bytes, rate, ETA
        self._lock = threading.Lock()
        self._last = 0.0
        self._samples: list[tuple[float, int]] = []

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n
        self.maybe_write()

    def set_done(self, n: int) -> None:
        with self._lock:
            self.done = n
        self.maybe_write()

    def file_done(self) -> None:
        with self._lock:
            self.files_done += 1
        self.maybe_write()

    def rate(self) -> float:
        now = time.monotonic()
        with self._lock:
            self._samples.append((now, self.done))
            self._samples = [s for s in self._samples if now - s[0] <= 30] or [(now, self.done)]
            t0, d0 = self._samples[0]
        if now - t0 < 0.5:
            elapsed = now - self.start
            return (self.done - self.skipped) / elapsed if elapsed > 0 else 0.0
        return (self.done - d0) / (now - t0)

    def snapshot(self, state: str = "running") -> dict:
        rate = self.rate()
        left = max(0, self.total - self.done)
        return {
            "phase": self.phase,
            "state": state,
            "done_bytes": self.done,
            "total_bytes": self.total,
            "files_done": self.files_done,
            "files_total": self.total_files,
            "rate_bps": round(rate),
            "eta_s": round(left / rate) if rate > 0 and left else (0 if not left else None),
            "elapsed_s": round(time.monotonic() - self.start, 1),
            "detail": self.detail,
            "line": self.line(rate),
            **({"parts": self.parts} if self.parts else {}),
        }

    def line(self, rate: float | None = None) -> str:
        rate = self.rate() if rate is None else rate
        pct = 100.0 * self.done / self.total if self.total else 100.0
        left = max(0, self.total - self.done)
        eta = duration(left / rate) if rate > 0 and left else (duration(0) if not left else "?")
        text = (
            f"{self.phase}: {human(self.done)} / {human(self.total)} ({pct:.1f}%), "
            f"{human(rate)}/s, ETA {eta}, files {self.files_done}/{self.total_files}"
        )
        return f"{text}; {self.detail}" if self.detail else text

    def maybe_write(self, force: bool = False, state: str = "running") -> None:
        if not self.path:
            return
        now = time.monotonic()
        if not force and now - self._last < 1.0:
            return
        self._last = now
        with contextlib.suppress(OSError):  # progress is best effort; the work itself is not
            write_atomic(self.path, json.dumps(self.snapshot(state)), fsync=False)

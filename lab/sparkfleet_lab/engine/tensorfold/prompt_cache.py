"""Kept prompt states, as the deepseek_v41 family keeps them, and the disk tier under them.

Memory (sfxnz/TensorFold families/deepseek_v41/cuda/cache.py, docs/recipes/deepseek-v4.1-flash.md):
a request that drafts keeps its prompt's state one token before the prompt's end; a later prompt that
starts with a kept state resumes there (its `cached` tokens). TF_DSV41_CACHE_ENTRIES (default 8, plus
one a lane under --parallel 2 or more) bounds the count and TF_DSV41_CACHE_GIB (default 3) the arena,
least recently used first; the ranks use the smaller of their values. A kept state's size here is the
family's 890 bytes a token (the real one also holds fixed ring state).

Disk (ashhart/TensorFold deploy/dsv41-tp2/README.md @ 0e788251): with TF_DSV41_DISK=<dir> a state the
arena evicts is written to disk when it has at least TF_DSV41_DISK_MIN tokens (2048), bounded by
TF_DSV41_DISK_GIB (128), least recently used first, and restored when a later prompt resumes from it;
entries live in a directory named by a hash of the build, and a start keeps the entries every rank holds.
Stopping writes every kept state first. This tier is not in sfxnz's 0.6.4/0.6.6 sources read for the
double; the double has it on every version.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

GIB = 1 << 30
BYTES_PER_TOKEN = 890
CACHE_GIB_ENV, CACHE_GIB = "TF_DSV41_CACHE_GIB", 3.0
ENTRIES_ENV, ENTRIES = "TF_DSV41_CACHE_ENTRIES", 8
DISK_ENV = "TF_DSV41_DISK"
DISK_GIB_ENV, DISK_GIB = "TF_DSV41_DISK_GIB", 128.0
DISK_MIN_ENV, DISK_MIN = "TF_DSV41_DISK_MIN", 2048


def _number(environ: Mapping[str, str], name: str, default: float, integer: bool) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        value = -1
    if value < 0:
        kind = "a whole number, 0 or more" if integer else "a number of GiB, 0 or more"
        raise ValueError(f"{name}={raw}: {kind}")
    return value


@dataclass(frozen=True)
class Knobs:
    cache_bytes: int
    entries: int
    disk: Path | None
    disk_bytes: int
    disk_min: int

    @classmethod
    def read(cls, environ: Mapping[str, str], lanes: int) -> Knobs:
        """The TF_DSV41_* knobs; ValueError names a bad one."""
        gib = _number(environ, CACHE_GIB_ENV, CACHE_GIB, integer=False)
        entries = int(_number(environ, ENTRIES_ENV, ENTRIES, integer=True))
        if lanes > 1 and not environ.get(ENTRIES_ENV, "").strip():
            entries += lanes
        disk = environ.get(DISK_ENV, "").strip()
        disk_gib = _number(environ, DISK_GIB_ENV, DISK_GIB, integer=False)
        disk_min = int(_number(environ, DISK_MIN_ENV, DISK_MIN, integer=True))
        path = Path(disk) if disk else None
        if path is not None and not path.is_dir():
            raise ValueError(f"{DISK_ENV}={disk}: not a directory (is it mounted?)")
        return cls(int(gib * GIB), entries, path, int(disk_gib * GIB), disk_min)


def key_of(ids: Sequence[str]) -> str:
    return hashlib.sha256("\x1f".join(ids).encode()).hexdigest()


class DiskTier:
    """Evicted states on disk, one file each, in a directory named by a hash of the build."""

    def __init__(self, root: Path, build: str, limit: int, minimum: int) -> None:
        self.dir = root / f"dsv41-{build}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.limit, self.minimum = limit, minimum
        self.lock = threading.Lock()

    def keys(self) -> list[str]:
        return sorted(p.stem for p in self.dir.glob("*.kept"))

    def keep_only(self, keys: set[str]) -> None:
        """At start: the entries every rank holds stay usable; the others are removed."""
        for p in self.dir.glob("*.kept"):
            if p.stem not in keys:
                p.unlink(missing_ok=True)

    def _entries(self) -> list[Path]:
        return sorted(self.dir.glob("*.kept"), key=lambda p: p.stat().st_mtime_ns)

    def write(self, ids: Sequence[str]) -> bool:
        size = len(ids) * BYTES_PER_TOKEN
        if len(ids) < self.minimum or size > self.limit:
            return False
        with self.lock:
            head = json.dumps({"ids": list(ids)}).encode() + b"\n"
            path = self.dir / f"{key_of(ids)}.kept"
            tmp = path.with_suffix(f".{os.getpid()}.partial")
            with tmp.open("wb") as fh:
                fh.write(head)
                fh.truncate(max(size, len(head)))  # the state's bytes (a sparse file: the double has none)
            tmp.replace(path)
            used = sum(p.stat().st_size for p in self._entries())
            for old in self._entries():
                if used <= self.limit:
                    break
                if old != path:
                    used -= old.stat().st_size
                    old.unlink(missing_ok=True)
        return True

    def longest(self, prompt: Sequence[str]) -> list[str] | None:
        best: list[str] | None = None
        with self.lock:
            for p in self._entries():
                with contextlib.suppress(OSError, ValueError):
                    with p.open("rb") as fh:
                        ids = json.loads(fh.readline())["ids"]
                    n = len(ids)
                    if n < len(prompt) and list(prompt[:n]) == ids and (best is None or n > len(best)):
                        best = ids
        return best

    def take(self, ids: Sequence[str]) -> None:
        """A restored entry leaves the disk (it is kept in memory again)."""
        (self.dir / f"{key_of(ids)}.kept").unlink(missing_ok=True)


class Kept:
    """One rank's kept prompt states, least recently used first; every rank runs the same operations."""

    def __init__(self, cache_bytes: int, entries: int, disk: DiskTier | None) -> None:
        self.limit, self.entries, self.disk = cache_bytes, entries, disk
        self.cache: list[list[str]] = []
        self.lock = threading.Lock()

    def _used(self) -> int:
        return sum(len(ids) for ids in self.cache) * BYTES_PER_TOKEN

    def _evict(self, ids: list[str]) -> None:
        self.cache.remove(ids)
        if self.disk is not None:
            self.disk.write(ids)

    def lookup(self, prompt: Sequence[str]) -> int:
        """Rank 0: the length of the longest kept state that is a strict prefix of `prompt` (0: none)."""
        with self.lock:
            best = max(
                (ids for ids in self.cache if len(ids) < len(prompt) and list(prompt[: len(ids)]) == ids),
                key=len,
                default=None,
            )
            if best is None and self.disk is not None:
                best = self.disk.longest(prompt)
            return len(best) if best else 0

    def resume(self, prompt: Sequence[str], cached: int) -> None:
        """Every rank: take the state of prompt[:cached] (restored from disk when it is there)."""
        if not cached:
            return
        want = list(prompt[:cached])
        with self.lock:
            if want in self.cache:
                self.cache.remove(want)
                self.cache.append(want)
                return
            if self.disk is not None and self.disk.longest(list(prompt)) == want:
                self.disk.take(want)
                self._store(want)
                return
        raise RuntimeError(f"this rank has no kept state of the {cached} tokens rank 0 resumes from")

    def keep(self, prompt: Sequence[str]) -> None:
        """Every rank: keep the state one token before the prompt's end."""
        ids = list(prompt[: max(1, len(prompt) - 1)])
        with self.lock:
            if ids in self.cache:
                self.cache.remove(ids)
                self.cache.append(ids)
                return
            self._store(ids)

    def _store(self, ids: list[str]) -> None:
        if self.entries <= 0 or len(ids) * BYTES_PER_TOKEN > self.limit:
            if self.disk is not None:
                self.disk.write(ids)
            return
        while self.cache and (
            len(self.cache) >= self.entries or self._used() + len(ids) * BYTES_PER_TOKEN > self.limit
        ):
            self._evict(self.cache[0])
        self.cache.append(ids)

    def flush(self) -> int:
        """Stopping: write every kept state to the disk tier -> how many were written."""
        if self.disk is None:
            return 0
        with self.lock:
            return sum(self.disk.write(ids) for ids in self.cache)

# Hashing the weights: sha256 and git blob ids of files, and the stat cache of digests already
# computed (a file whose size, mtime, ctime, inode and device match is not hashed again).
# Standard library only: it runs on the nodes (Python 3.11-3.13), inside the hub's venv too.
from __future__ import annotations

import hashlib
import json
import os
import threading

from ansible_collections.sparkfleet.cluster.plugins.module_utils.fileio import write_atomic

CHUNK = 8 << 20  # hashlib drops the GIL for big updates, so threads hash on every core
CACHE_FORMAT = 1


def git_blob_oid(path: str, size: int | None = None) -> str:
    """The git object id of a file's content (what the hub lists for non-LFS files)."""
    size = os.path.getsize(path) if size is None else size
    h = hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def sha256_file(path: str, want_git_oid: bool = False) -> tuple[str, str | None]:
    size = os.path.getsize(path)
    h = hashlib.sha256()
    g = hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False) if want_git_oid else None
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            h.update(block)
            if g is not None:
                g.update(block)
    return h.hexdigest(), (g.hexdigest() if g is not None else None)


def stat_key(st: os.stat_result) -> list[int]:
    # ctime cannot be set from user space: a flipped byte with a restored mtime still misses.
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


class StatCache:
    """(size, mtime, ctime, inode, device) of a file -> its digests, as of the last full hash."""

    def __init__(self, path: str | None):
        self.path = path
        self.entries: dict[str, dict] = {}
        self._loaded: dict[str, dict] = {}
        self._lock = threading.Lock()
        if path and os.path.isfile(path):
            try:
                with open(path) as fh:
                    data = json.load(fh)
                if data.get("format") == CACHE_FORMAT and isinstance(data.get("entries"), dict):
                    self.entries = data["entries"]
            except (OSError, ValueError):
                self.entries = {}  # a broken cache only costs a full hash
        self._loaded = json.loads(json.dumps(self.entries))

    def get(self, rel: str, st: os.stat_result) -> dict | None:
        entry = self.entries.get(rel)
        if entry and entry.get("stat") == stat_key(st):
            return entry
        return None

    def put(self, rel: str, st: os.stat_result, sha256: str, git_oid: str | None = None) -> None:
        with self._lock:
            entry = {"stat": stat_key(st), "sha256": sha256}
            if git_oid:
                entry["git_oid"] = git_oid
            self.entries[rel] = entry

    def drop(self, rel: str) -> None:
        with self._lock:
            self.entries.pop(rel, None)

    def keep_only(self, rels: set[str]) -> None:
        with self._lock:
            for rel in list(self.entries):
                if rel not in rels:
                    del self.entries[rel]

    @property
    def dirty(self) -> bool:
        return self.entries != self._loaded

    def save(self) -> bool:
        if not self.path or not self.dirty:
            return False
        text = json.dumps({"format": CACHE_FORMAT, "entries": self.entries}, sort_keys=True)
        write_atomic(self.path, text, fsync=False)  # a lost cache only costs a full hash
        self._loaded = json.loads(json.dumps(self.entries))
        return True

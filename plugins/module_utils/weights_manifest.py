# The weights manifest: its digest, SHA256SUMS files, and every listed file checked against it
# (present, size, sha256 or git blob id, safetensors header), hashed in parallel.
# Standard library only: it runs on the nodes (Python 3.11-3.13), inside the hub's venv too.
from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_hash import (
    StatCache,
    sha256_file,
    stat_key,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_main import WeightsError
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_progress import Progress
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_safetensors import (
    read_safetensors_header,
)

MANIFEST_FORMAT = 1
SHA256_LEN = 64


def manifest_digest(files: list[dict]) -> str:
    """sha256 of the canonical file list; the engine computes the same over its snapshot."""
    listing = sorted(
        ({"path": f["path"], "size": int(f["size"]), "sha256": f["sha256"]} for f in files),
        key=lambda f: f["path"],
    )
    canonical = json.dumps(listing, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def parse_sha256sums(text: str) -> dict[str, str]:
    """`<sha256>  <path>` lines (sha256sum's output; `*path` binary marks accepted)."""
    out = {}
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        if (
            len(parts) != 2
            or len(parts[0]) != SHA256_LEN
            or any(c not in "0123456789abcdef" for c in parts[0])
        ):
            raise WeightsError(f"line {n} is not '<sha256>  <path>': {line[:80]!r}")
        out[parts[1].lstrip("*").strip()] = parts[0]
    return out


def verify_files(  # noqa: PLR0912, PLR0915, PLR0917 - stat, cache, hash in parallel, classify
    root: str,
    files: list[dict],
    cache: StatCache,
    workers: int = 0,
    full: bool = False,
    progress: Progress | None = None,
) -> dict:
    """Check every listed file: present, size, sha256 (or git blob id), safetensors header.

    Returns {"ok": {rel: sha256}, "missing": [rel], "bad": [{"path", "reason"}], "hashed_bytes",
    "cache_hits"}. Files are hashed in parallel on `workers` threads (0: every core).
    """
    workers = workers or os.cpu_count() or 1
    ok: dict[str, str] = {}
    missing: list[str] = []
    bad: list[dict] = []
    todo: list[tuple[dict, os.stat_result]] = []
    hits = 0
    for entry in files:
        rel = entry["path"]
        path = os.path.join(root, rel)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            missing.append(rel)
            cache.drop(rel)
            continue
        if not os.path.isfile(path):
            bad.append({"path": rel, "reason": "not a regular file"})
            continue
        if st.st_size != int(entry["size"]):
            bad.append({"path": rel, "reason": f"size {st.st_size}, expected {entry['size']}"})
            cache.drop(rel)
            continue
        if rel.endswith(".safetensors"):
            try:
                read_safetensors_header(path)
            except (OSError, WeightsError) as exc:
                bad.append({"path": rel, "reason": f"safetensors: {exc}"})
                cache.drop(rel)
                continue
        hit = None if full else cache.get(rel, st)
        if hit and _matches(entry, hit.get("sha256"), hit.get("git_oid")) is None:
            ok[rel] = hit["sha256"]
            hits += 1
            if progress:
                progress.skipped += st.st_size
                progress.add(st.st_size)
                progress.file_done()
            continue
        todo.append((entry, st))

    def work(item: tuple[dict, os.stat_result]) -> tuple[dict, os.stat_result, str, str | None]:
        entry, st = item
        sha, oid = sha256_file(os.path.join(root, entry["path"]), want_git_oid=bool(entry.get("git_oid")))
        if progress:
            progress.add(st.st_size)
            progress.file_done()
        return entry, st, sha, oid

    hashed = 0
    # Largest first: the longest single hash starts at once instead of last.
    todo.sort(key=lambda item: -item[1].st_size)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for entry, st, sha, oid in pool.map(work, todo):
            rel = entry["path"]
            hashed += st.st_size
            problem = _matches(entry, sha, oid)
            try:
                now = os.stat(os.path.join(root, rel))
            except OSError:
                now = None
            if problem:
                bad.append({"path": rel, "reason": problem})
                cache.drop(rel)
            elif now is None or stat_key(now) != stat_key(st):
                bad.append({"path": rel, "reason": "changed while it was hashed"})
                cache.drop(rel)
            else:
                ok[rel] = sha
                cache.put(rel, st, sha, oid)
    return {"ok": ok, "missing": sorted(missing), "bad": bad, "hashed_bytes": hashed, "cache_hits": hits}


def _matches(entry: dict, sha: str | None, oid: str | None) -> str | None:
    want = entry.get("sha256")
    if want:
        return None if sha == want else f"sha256 {sha}, expected {want}"
    want_oid = entry.get("git_oid")
    if want_oid:
        return None if oid == want_oid else f"git blob id {oid}, expected {want_oid}"
    return "the manifest has no sha256 or git blob id for it"

# Shared code of the model_weights modules: hashing with a stat cache, safetensors and index
# checks, the manifest digest, free-disk arithmetic, the rank-file format and progress files.
# Standard library only: it runs on the nodes (Python 3.11-3.13), inside the hub's venv too.
from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import shutil
import struct
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.sparkfleet.cluster.plugins.module_utils.fileio import write_atomic
from ansible_collections.sparkfleet.cluster.plugins.module_utils.text_format import duration
from ansible_collections.sparkfleet.cluster.plugins.module_utils.text_format import size as human

CHUNK = 8 << 20  # hashlib drops the GIL for big updates, so threads hash on every core
MAX_HEADER = 100 << 20
CACHE_FORMAT = 1
MANIFEST_FORMAT = 1
SHA256_LEN = 64


class WeightsError(Exception):
    pass


# ---- a module's main -----------------------------------------------------------------------
def run_module(module, run, known: tuple[type[Exception], ...] = (WeightsError,)) -> None:
    """exit_json with what run(params, check_mode) returns, or fail_json with its message.

    An exception of `known` is an expected refusal: its first argument is the message, a dict second
    argument more result fields. Anything else is a bug: its traceback goes with the failure.
    """
    try:
        result = run(module.params, module.check_mode)
    except known as exc:
        extra = dict(exc.args[1]) if len(exc.args) > 1 and isinstance(exc.args[1], dict) else {}
        extra.pop("msg", None)
        module.fail_json(msg=str(exc.args[0]) if exc.args else type(exc).__name__, **extra)
    except Exception as exc:
        module.fail_json(msg=f"{type(exc).__name__}: {exc}", exception=traceback.format_exc())
    module.exit_json(**result)


# ---- hashing ------------------------------------------------------------------------------
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


# ---- safetensors --------------------------------------------------------------------------
def read_safetensors_header(path: str) -> tuple[dict, int]:
    """(header, data start) of a .safetensors file; WeightsError if it does not fit the file."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise WeightsError(f"{size} bytes, too short for a safetensors header")
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER or 8 + length > size:
            raise WeightsError(f"header length {length} does not fit the file ({size} bytes)")
        blob = fh.read(length)
    try:
        header = json.loads(blob)
    except (UnicodeDecodeError, ValueError) as exc:
        raise WeightsError(f"header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise WeightsError("header is not a JSON object")
    start = 8 + length
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(x, int) for x in offsets)
            and 0 <= offsets[0] <= offsets[1]
        ):
            raise WeightsError(f"tensor {name!r} has no valid data_offsets")
        if start + offsets[1] > size:
            raise WeightsError(
                f"tensor {name!r} ends at byte {start + offsets[1]}, past the end of the file ({size} bytes)"
            )
    return header, start


def check_indexes(root: str, indexes: list[dict], present: set[str]) -> list[str]:  # noqa: PLR0912 - one check per rule
    """Check each safetensors index against the shards that are present.

    complete=True: the index's shard set is exactly the present shards of its directory and the
    shard count matches the `-of-NNNNN` names; complete=False (an allow-patterned subset such as
    the Engram files): every present shard is named by the index. Either way each present shard
    holds every tensor the index maps to it.
    """
    errors = []
    for spec in indexes:
        rel = spec["path"]
        base = os.path.dirname(rel)
        path = os.path.join(root, rel)
        try:
            with open(path) as fh:
                weight_map = json.load(fh)["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            errors.append(f"{rel}: not a usable safetensors index ({exc})")
            continue
        named = {os.path.join(base, f) if base else f for f in weight_map.values()}
        here = {p for p in present if p.endswith(".safetensors") and os.path.dirname(p) == base}
        if spec.get("complete", True):
            missing = sorted(named - here)
            extra = sorted(here - named)
            if missing:
                errors.append(
                    f"{rel} names {len(named)} shards, {len(missing)} missing: {', '.join(missing[:3])}"
                )
            if extra:
                errors.append(f"{rel}: shards not in the index: {', '.join(extra[:3])}")
            counts = {n.rsplit("-of-", 1)[1].split(".")[0] for n in named if "-of-" in n}
            for count in counts:
                if count.isdigit() and int(count) != len(named):
                    errors.append(f"{rel} names {len(named)} shards, the file names say {int(count)}")
        else:
            extra = sorted(p for p in here if p not in named)
            if extra:
                errors.append(f"{rel}: shards not in the index: {', '.join(extra[:3])}")
        by_shard: dict[str, list[str]] = {}
        for tensor, shard in weight_map.items():
            by_shard.setdefault(os.path.join(base, shard) if base else shard, []).append(tensor)
        for shard in sorted(here & named):
            try:
                header, _ = read_safetensors_header(os.path.join(root, shard))
            except (OSError, WeightsError):
                continue  # reported by the per-file check
            absent = [t for t in by_shard.get(shard, []) if t not in header]
            if absent:
                errors.append(
                    f"{shard}: {len(absent)} tensors of {rel} are not in its header, e.g. {absent[0]}"
                )
    return errors


# ---- manifests ----------------------------------------------------------------------------
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


def repo_folder(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


def blob_path(hub_cache: str, entry: dict) -> str:
    return os.path.join(hub_cache, repo_folder(entry["repo_id"]), "blobs", entry["etag"])


# ---- free disk ----------------------------------------------------------------------------
def present_bytes(path: str, size: int, partials: list[str]) -> int:
    """Bytes of a file already on disk: whole when the size matches, else its resumable partial."""
    try:
        if os.path.getsize(path) == size:
            return size
    except OSError:
        pass
    best = 0
    for partial in partials:
        try:
            best = max(best, min(os.path.getsize(partial), size))
        except OSError:
            continue
    return best


# ---- progress files -----------------------------------------------------------------------
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


# ---- parallel verification ----------------------------------------------------------------
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


def list_tree(root: str, skip_dirs: tuple[str, ...] = ()) -> list[str]:
    """Every regular file under root, relative, dot-paths excluded (as the engine lists them)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not d.startswith(".") and os.path.normpath(os.path.join(rel_dir, d)) not in skip_dirs
        )
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            out.append(os.path.normpath(os.path.join(rel_dir, name)))
    return out


def matches_any(rel: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(rel, p) for p in patterns)


# ---- rank files ---------------------------------------------------------------------------
RANK_FORMAT = "sparkfleet-rank-v1"


def parse_keys(text: str) -> list[str]:
    keys = []
    seen = set()
    for n, line in enumerate(text.splitlines(), start=1):
        key = line.strip()
        if not key or key.startswith("#"):
            continue
        if key in seen:
            raise WeightsError(f"line {n}: tensor {key!r} is listed twice")
        seen.add(key)
        keys.append(key)
    if not keys:
        raise WeightsError("the keys file lists no tensors")
    return keys


def rank_header(rank: int, keys_sha256: str, tensors: list[tuple[str, str, list[int], int]]) -> bytes:
    """The header bytes (length prefix + JSON + space padding) of a rank file.

    tensors: (name, dtype, shape, nbytes) in the keys file's order.
    """
    header: dict = {"__metadata__": {"format": "pt", "rank": str(rank), "keys_sha256": keys_sha256}}
    offset = 0
    for name, dtype, shape, nbytes in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    blob += b" " * ((8 - (8 + len(blob)) % 8) % 8)
    return struct.pack("<Q", len(blob)) + blob


def plan_rank_file(snapshot: str, keys_text: str, rank: int, index_rel: str) -> dict:
    """Where each listed tensor is: {"header": bytes, "pieces": [(shard path, start, nbytes)], "size"}."""
    keys = parse_keys(keys_text)
    with open(os.path.join(snapshot, index_rel)) as fh:
        weight_map = json.load(fh)["weight_map"]
    base = os.path.dirname(index_rel)
    headers: dict[str, tuple[dict, int]] = {}
    tensors = []
    pieces = []
    for key in keys:
        shard = weight_map.get(key)
        if shard is None:
            raise WeightsError(f"tensor {key!r} of the keys file is not in {index_rel}")
        shard_path = os.path.join(snapshot, base, shard)
        if shard_path not in headers:
            headers[shard_path] = read_safetensors_header(shard_path)
        header, start = headers[shard_path]
        info = header.get(key)
        if info is None:
            raise WeightsError(f"tensor {key!r} is not in the header of {shard}")
        b, e = info["data_offsets"]
        tensors.append((key, info["dtype"], info["shape"], e - b))
        pieces.append((shard_path, start + b, e - b))
    keys_sha = hashlib.sha256(keys_text.encode()).hexdigest()
    head = rank_header(rank, keys_sha, tensors)
    return {
        "header": head,
        "pieces": pieces,
        "size": len(head) + sum(p[2] for p in pieces),
        "tensors": len(keys),
    }


def write_rank_file(plan: dict, out_path: str, progress: Progress | None = None) -> str:
    """Write the planned rank file to out_path; return its sha256 (hashed as it is written)."""
    h = hashlib.sha256()
    with open(out_path, "wb") as out:
        out.write(plan["header"])
        h.update(plan["header"])
        if progress:
            progress.add(len(plan["header"]))
        for shard_path, start, nbytes in plan["pieces"]:
            with open(shard_path, "rb") as src:
                src.seek(start)
                left = nbytes
                while left:
                    block = src.read(min(CHUNK, left))
                    if not block:
                        raise WeightsError(f"{shard_path} ended early while copying a tensor")
                    out.write(block)
                    h.update(block)
                    left -= len(block)
                    if progress:
                        progress.add(len(block))
        out.flush()
        os.fsync(out.fileno())
    return h.hexdigest()


def copy_or_link(src: str, dst: str) -> str:
    """Hard-link src to dst (same inode, no extra space); copy where links are not possible."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tmp = dst + ".link-partial"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    try:
        os.link(src, tmp)
        how = "link"
    except OSError:
        shutil.copyfile(src, tmp)
        how = "copy"
    os.replace(tmp, dst)
    return how

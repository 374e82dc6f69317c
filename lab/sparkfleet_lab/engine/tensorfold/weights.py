"""Read a weights snapshot as an engine loads it: every file read, every safetensors header parsed and
checked against its file's size, the index's shards present.

Two digests: `digest` (SHA-256 of every byte of every file, logged) and `layout` (each .safetensors
file's path, size and header), which the ranks compare at startup as the real deepseek_v41 family
compares its Engram files' sizes and headers. Dot-paths (the Hugging Face client's local `.cache/`)
are not part of either.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 20
MAX_HEADER = 100 << 20


class WeightsError(RuntimeError):
    pass


@dataclass(frozen=True)
class Snapshot:
    path: Path
    files: list[dict]  # sorted: {"path", "size", "sha256"}
    digest: str  # sha256 of the canonical listing of every file's sha256
    tensors: int
    layout: str = ""  # sha256 of every .safetensors file's path, size and header

    @property
    def total_bytes(self) -> int:
        return sum(f["size"] for f in self.files)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def safetensors_header(path: Path) -> dict:
    """The parsed header of a .safetensors file, checked against the file's size."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise WeightsError(f"{path.name}: {size} bytes, too short for a safetensors header")
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER or 8 + length > size:
            raise WeightsError(f"{path.name}: header length {length} does not fit the file ({size} bytes)")
        try:
            header = json.loads(fh.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise WeightsError(f"{path.name}: header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise WeightsError(f"{path.name}: header is not a JSON object")
    end = 8 + length
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and 0 <= offsets[0] <= offsets[1]):
            raise WeightsError(f"{path.name}: tensor {name!r} has no valid data_offsets")
        if end + offsets[1] > size:
            raise WeightsError(
                f"{path.name}: tensor {name!r} ends at {end + offsets[1]}, past the file's {size} bytes"
            )
    return header


def _listed(root: Path, exclude: list[str]) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith(".") or name.endswith((".partial", ".incomplete", ".lock")):
                continue
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if any(fnmatch.fnmatch(rel, pat) for pat in exclude):
                continue
            out.append(path)
    return out


def load(root: Path, exclude: list[str] | None = None, workers: int = 2, read: bool = True) -> Snapshot:
    """The snapshot's files and digests; read=False only parses the headers (no `digest`)."""
    if not root.is_dir():
        raise WeightsError(f"weights snapshot {root} is not a directory (is it mounted?)")
    paths = _listed(root, exclude or [])
    shards = [p for p in paths if p.name.endswith(".safetensors")]
    if not shards:
        raise WeightsError(f"no .safetensors files under {root}")
    index = root / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise WeightsError(f"{index.name}: not a safetensors index: {exc}") from exc
        missing = sorted({f for f in weight_map.values() if not (root / f).is_file()})
        if missing:
            raise WeightsError(f"{index.name} names shards that are missing: {', '.join(missing[:5])}")
    tensors = 0
    layout = hashlib.sha256()
    for shard in sorted(shards):
        header = safetensors_header(shard)
        tensors += len([k for k in header if k != "__metadata__"])
        rel = shard.relative_to(root).as_posix()
        layout.update(f"{rel}\0{shard.stat().st_size}\0".encode())
        layout.update(json.dumps(header, sort_keys=True, separators=(",", ":")).encode() + b"\0")
    if read:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            digests = list(pool.map(_sha256, paths))
    else:
        digests = [""] * len(paths)
    files = sorted(
        (
            {"path": p.relative_to(root).as_posix(), "size": p.stat().st_size, "sha256": d}
            for p, d in zip(paths, digests, strict=True)
        ),
        key=lambda f: f["path"],
    )
    canonical = json.dumps(files, sort_keys=True, separators=(",", ":")).encode()
    return Snapshot(
        path=root,
        files=files,
        digest="sha256:" + hashlib.sha256(canonical).hexdigest() if read else "",
        tensors=tensors,
        layout="sha256:" + layout.hexdigest(),
    )

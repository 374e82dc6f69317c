# Rank files: the tensors a rank loads (its keys file), cut from the safetensors shards into one
# safetensors file (format: roles/model_weights/README.md, "Rank files").
# Standard library only: it runs on the nodes (Python 3.11-3.13), inside the hub's venv too.
from __future__ import annotations

import hashlib
import json
import os
import struct

from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_hash import CHUNK
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_main import WeightsError
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_progress import Progress
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_safetensors import (
    read_safetensors_header,
)


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

# safetensors files: a file's header (checked against the file's size) and the index files'
# weight maps checked against the shards present.
# Standard library only: it runs on the nodes (Python 3.11-3.13), inside the hub's venv too.
from __future__ import annotations

import json
import os
import struct

from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_main import WeightsError

MAX_HEADER = 100 << 20


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

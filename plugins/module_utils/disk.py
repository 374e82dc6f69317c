# Disk arithmetic the modules share: free space where a path will be, and what a tree already holds.
# Standard library only (runs on the nodes).
from __future__ import annotations

import os


def existing_parent(path: str) -> str:
    """`path`, or its nearest existing parent (what a directory not made yet will live on)."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    return probe


def free_bytes(path: str) -> tuple[int, str]:
    """(bytes free for an unprivileged writer, the path measured) on the filesystem that holds `path`."""
    probe = existing_parent(path)
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize, probe


def tree_bytes(path: str) -> int:
    """Bytes allocated under `path` (like du), hard-linked files counted once: the hub cache and the
    snapshot share blobs. 0 when `path` is not a directory."""
    if not os.path.isdir(path):
        return 0
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


GIB = 1 << 30


def shortfall(size_gib: float, used: int, free: int) -> int:
    """Bytes missing for a cache to reach its size (0 when it fits)."""
    return max(0, int(size_gib * GIB) - used - free)


def cache_space(caches: list[dict]) -> tuple[list[dict], list[str]]:
    """(report, problems) of the engine's caches (engine_cache's check, read-only): for each cache its
    name, path, size_gib, used_bytes, free_bytes and whether it is missing (`created`: not a directory yet);
    a problem for each that the filesystem cannot grow to its size (free space plus what it already holds).
    Raises ValueError for an entry without an absolute path and a positive size."""
    report, problems = [], []
    for cache in caches:
        name, path = cache.get("name"), cache.get("path")
        try:
            size = float(cache.get("size_gib"))
        except (TypeError, ValueError):
            raise ValueError(
                f"cache {name}: size_gib must be a number, not {cache.get('size_gib')!r}"
            ) from None
        if not path or not os.path.isabs(path) or size <= 0:
            raise ValueError(f"cache {name}: needs an absolute path and size_gib > 0 (got {path!r}, {size})")
        used = tree_bytes(path)
        free, _measured_at = free_bytes(path)
        report.append({"name": name, "path": path, "size_gib": size, "used_bytes": used, "free_bytes": free,
                       "created": not os.path.isdir(path)})  # fmt: skip
        missing = shortfall(size, used, free)
        if missing:
            problems.append(
                f"cache {name} at {path} is configured for {size:g} GiB but the filesystem has "
                f"{free / GIB:.1f} GiB free (+{used / GIB:.1f} GiB already in it): "
                f"{missing / GIB:.1f} GiB short. "
                "Free disk space or lower its size_gib in engine_service_caches."
            )
    return report, problems

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

# Where the weights are on disk: the Hugging Face cache's layout (repo folders, blobs), the
# snapshot's file listing, the bytes of a file already present, hard links in place of copies.
# Standard library only: it runs on the nodes (Python 3.11-3.13), inside the hub's venv too.
from __future__ import annotations

import os
import shutil


def repo_folder(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


def blob_path(hub_cache: str, entry: dict) -> str:
    return os.path.join(hub_cache, repo_folder(entry["repo_id"]), "blobs", entry["etag"])


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

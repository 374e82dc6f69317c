# Files the modules write and read on a node: one atomic writer, one reader that tolerates absence.
# Standard library only: Ansible ships module_utils with the module, and nodes run Python 3.11-3.13.
from __future__ import annotations

import contextlib
import os
import tempfile

# Temporary files start with a dot: directory listings that skip dot-files (the weights snapshot's) never
# see a half-written file.
TMP_PREFIX = ".sparkfleet-"


def read_text(path: str | None) -> str | None:
    """The file's text, or None when there is none to read (missing, a directory, not permitted)."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def write_atomic(
    path: str,
    content: str | bytes,
    mode: int = 0o644,
    *,
    uid: int = -1,
    gid: int = -1,
    fsync: bool = True,
    dir_mode: int = 0o755,
) -> None:
    """Replace `path` with `content` in one rename: a reader sees the old file or the new one, never a part.

    The temporary file (beside `path`, so the rename stays on one filesystem) has its mode and owner
    before a byte is written: a secret is never readable by others on the way. uid/gid -1 keep the
    writer's. Missing parent directories are made with `dir_mode`. `fsync=False` skips the flush to disk
    for files that are cheap to lose (progress, caches). On any failure the temporary file is removed.
    """
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=dir_mode, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            if uid != -1 or gid != -1:
                os.fchown(fh.fileno(), uid, gid)
            fh.write(content.encode("utf-8") if isinstance(content, str) else content)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise

"""Thin wrappers over the docker CLI (the lab drives Docker the way an admin would)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path


class DockerError(RuntimeError):
    """A docker command failed; the message carries the command and its stderr."""


def docker(*args: str, check: bool = True, input: bytes | None = None, timeout: float | None = None) -> str:
    proc = subprocess.run(["docker", *args], input=input, capture_output=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()
        raise DockerError(f"docker {' '.join(args[:3])}... failed ({proc.returncode}): {err}")
    return proc.stdout.decode(errors="replace")


def ok(*args: str) -> bool:
    return subprocess.run(["docker", *args], capture_output=True, check=False).returncode == 0


def image_exists(ref: str) -> bool:
    return ok("image", "inspect", ref)


def inspect(kind: str, name: str) -> dict | None:
    proc = subprocess.run(["docker", kind, "inspect", name], capture_output=True, check=False)
    if proc.returncode != 0:
        return None
    data = json.loads(proc.stdout)
    return data[0] if data else None


def ls(kind: str, label: str) -> list[str]:
    """Names of containers/networks/volumes carrying `label` (key=value)."""
    if kind == "container":
        out = docker("ps", "-a", "--filter", f"label={label}", "--format", "{{.Names}}")
    else:
        out = docker(kind, "ls", "--filter", f"label={label}", "--format", "{{.Name}}")
    return sorted(line for line in out.splitlines() if line)


def put_file(container: str, path: str, content: bytes, mode: int = 0o644, uid: int = 0) -> None:
    """Write one file into a container (created or running) through `docker cp` of a tar stream."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(Path(path).name)
        info.size = len(content)
        info.mode = mode
        info.uid = info.gid = uid
        tar.addfile(info, io.BytesIO(content))
    # -a keeps the tar's owner (uid) instead of making every file root's.
    docker("cp", "-a", "-", f"{container}:{Path(path).parent}", input=buf.getvalue())


def exec_(container: str, cmd: Sequence[str], *, user: str | None = None, check: bool = True) -> str:
    args = ["exec"]
    if user:
        args += ["--user", user]
    return docker(*args, container, *cmd, check=check)

#!/usr/bin/python
"""Ansible module: the NCCL library a running engine rank loaded, and its version (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_nccl
short_description: The NCCL library file a running engine rank has loaded, and its version
description:
  - >-
    Operators found that two NCCL builds of the same version behave differently (the pip wheel
    nvidia-nccl-cu13 2.28.9 and DGX OS's libnccl2 2.28.9 are different binaries; the system one ended a
    20-minute all-gather hang), so which file each rank loaded matters, not only the version it says.
  - >-
    Reads it from the kernel, not from the engine's log: the memory maps (/proc/PID/maps) of the rank's
    container processes (docker inspect's State.Pid and its descendants) list every shared library mapped,
    by its path inside the container; each C(libnccl.so*) there is reported. The version comes from the
    file's name (C(libnccl.so.2.28.9), as the distribution's package installs it), else from the pip wheel's
    C(nvidia_nccl_cu*-<version>.dist-info) beside it, else from the version string the library carries
    (C(2.28.9+cuda13.0), what NCCL prints after C(NCCL version) at init); else it is C(unknown).
  - >-
    A rank whose process has not loaded NCCL (not started its communicator yet, or an engine without NCCL,
    such as the lab's double) reports no library; a container not running reports that. Changes nothing.
options:
  name:
    description: The engine container's name.
    type: str
    required: true
  docker:
    description: The docker executable.
    type: str
    default: docker
  proc:
    description: Where /proc is (tests).
    type: path
    default: /proc
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: Which NCCL this rank loaded
  sparkfleet.cluster.engine_nccl:
    name: sparkfleet-engine
"""

RETURN = r"""
running:
  description: Whether the container runs.
  type: bool
  returned: always
libraries:
  description: "Each NCCL library mapped: path (inside the container), version, version_from (file name,
    dist-info, embedded string, unknown), pids."
  type: list
  returned: always
summary:
  description: "One line: 'NCCL 2.28.9 (/usr/lib/.../libnccl.so.2.28.9)', 'no NCCL loaded', or why not read."
  type: str
  returned: always
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule

LIB = re.compile(r"^libnccl\.so(\.\d+)*$")
NAMED = re.compile(r"^libnccl\.so\.(\d+\.\d+\.\d+)$")
WHEEL = re.compile(r"^nvidia_nccl_cu\d+-(\d+\.\d+\.\d+)[^/]*\.dist-info$")
EMBEDDED = re.compile(rb"(\d+\.\d+\.\d+)\+cuda\d+\.\d+")


def mapped_libraries(maps_text: str) -> list[str]:
    """The NCCL library paths in one /proc/PID/maps (its sixth column, the mapped file)."""
    found = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5].removesuffix(" (deleted)")
        if LIB.match(os.path.basename(path)) and path not in found:
            found.append(path)
    return found


def descendants(proc: str, pid: int) -> list[int]:
    """pid and every process under it (by the parent field of /proc/N/stat)."""
    parent: dict[int, int] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "stat"), encoding="utf-8", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1].isdigit():
            parent[int(entry)] = int(fields[1])
    out, todo = [pid], [pid]
    while todo:
        current = todo.pop()
        for child, ppid in parent.items():
            if ppid == current and child not in out:
                out.append(child)
                todo.append(child)
    return out


def version_of(path: str, root: str) -> tuple[str, str]:
    """(version, where it came from) of a library at `path` inside the filesystem at `root`."""
    named = NAMED.match(os.path.basename(path))
    if named:
        return named.group(1), "file name"
    # pip: <site-packages>/nvidia/nccl/lib/libnccl.so.2 beside <site-packages>/nvidia_nccl_cu13-<v>.dist-info
    parts = path.split("/")
    if len(parts) > 4 and parts[-4:-1] == ["nvidia", "nccl", "lib"]:
        site = os.path.join(root, "/".join(parts[:-4]).lstrip("/"))
        try:
            for entry in sorted(os.listdir(site)):
                wheel = WHEEL.match(entry)
                if wheel:
                    return wheel.group(1), f"{entry}"
        except OSError:
            pass
    try:
        with open(os.path.join(root, path.lstrip("/")), "rb") as fh:
            found = EMBEDDED.search(fh.read())
    except OSError:
        found = None
    if found:
        return found.group(1).decode(), "embedded string"
    return "unknown", "unknown"


def read(proc: str, pid: int) -> list[dict]:
    libs: dict[str, dict] = {}
    for p in descendants(proc, pid):
        try:
            with open(os.path.join(proc, str(p), "maps"), encoding="utf-8", errors="replace") as fh:
                paths = mapped_libraries(fh.read())
        except OSError:
            continue
        for path in paths:
            if path not in libs:
                version, source = version_of(path, os.path.join(proc, str(p), "root"))
                libs[path] = {"path": path, "version": version, "version_from": source, "pids": []}
            libs[path]["pids"].append(p)
    return list(libs.values())


def summary(running: bool, libraries: list[dict], error: str = "") -> str:
    if error:
        return f"not read: {error}"
    if not running:
        return "container not running"
    if not libraries:
        return "no NCCL loaded (no libnccl.so* in the rank's memory maps)"
    return "; ".join(f"NCCL {lib['version']} ({lib['path']})" for lib in libraries)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "docker": {"type": "str", "default": "docker"},
            "proc": {"type": "path", "default": "/proc"},
        },
        supports_check_mode=True,
    )
    p = module.params
    docker = module.get_bin_path(p["docker"])
    if not docker:
        module.exit_json(changed=False, running=False, libraries=[], summary=summary(False, [], "no docker"))
    rc, out, err = module.run_command(
        [docker, "inspect", "--format", "{{.State.Running}} {{.State.Pid}}", p["name"]]
    )
    words = out.split()
    running = rc == 0 and len(words) == 2 and words[0] == "true" and words[1].isdigit() and words[1] != "0"
    if not running:
        error = "" if rc == 0 or "No such" in err else f"docker inspect: {(err or out).strip()[-200:]}"
        module.exit_json(changed=False, running=False, libraries=[], summary=summary(False, [], error))
    libraries = read(p["proc"], int(words[1]))
    module.exit_json(changed=False, running=True, libraries=libraries, summary=summary(True, libraries))


if __name__ == "__main__":
    main()

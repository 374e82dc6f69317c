#!/usr/bin/python
"""Ansible module: read what preflight layer 2 needs from a node, changing nothing."""

from __future__ import annotations

DOCUMENTATION = r"""
module: preflight_facts
short_description: Read free disk and memory, kernel settings, docker, nvidia-smi and listening ports
description:
  - Read-only probe for preflight layer 2. Supports check mode; never changes the node.
  - Free disk is measured on the filesystem that holds O(weights_path) (its nearest existing parent
    when it does not exist yet); what the weights directory already holds is reported separately, so
    a re-run after the download is not refused for the space the weights themselves use.
options:
  weights_path:
    description: Where the model weights go.
    type: path
    required: true
  gpu_clock_state_file:
    description: The GPU clock cap sparkfleet recorded (role gpu_clocks); missing = none configured.
    type: path
    default: /var/lib/sparkfleet/clocks/gpu.conf
  engine_container:
    description: Name of sparkfleet's engine container (its memory and ports are not "in use by others").
    type: str
    default: sparkfleet-engine
  ports:
    description: TCP ports to report as listening or not.
    type: list
    elements: int
    default: []
  docker:
    description: The docker executable.
    type: str
    default: docker
  nvidia_smi:
    description: The nvidia-smi executable.
    type: str
    default: nvidia-smi
author: sparkfleet
"""

RETURN = r"""
disk:
  description: C({path, measured_at, free_bytes, weights_bytes}).
  type: dict
  returned: always
memory:
  description: C({total_bytes, available_bytes}) from /proc/meminfo.
  type: dict
  returned: always
settings:
  description: Kernel settings to compare across nodes (kernel, page_size, transparent_hugepage,
    vm.min_free_kbytes, vm.swappiness, vm.watermark_boost_factor, gpu_clock_cap).
  type: dict
  returned: always
docker:
  description: C({ok, version, error, engine_running}).
  type: dict
  returned: always
gpu:
  description: C({ok, gpus, error, compute_processes}).
  type: dict
  returned: always
listening:
  description: The ports of O(ports) that something listens on.
  type: list
  returned: always
"""

import os
import re


def nearest_existing(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def tree_bytes(path: str) -> int:
    """Allocated bytes under path, counting hard-linked files once (the hub cache and the snapshot
    share blobs)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    if not os.path.isdir(path):
        return 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue
            seen.add(key)
            total += st.st_blocks * 512
    return total


def meminfo(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+):\s+(\d+)\s*kB", line)
        if m:
            out[m.group(1)] = int(m.group(2)) * 1024
    return {
        "total_bytes": out.get("MemTotal", 0),
        "available_bytes": out.get("MemAvailable", out.get("MemFree", 0)),
    }


def thp_mode(text: str) -> str:
    """'always madvise [never]' -> 'never'."""
    m = re.search(r"\[(\w+)\]", text or "")
    return m.group(1) if m else (text or "").strip()


def listening_ports(tables: list[str], ports: list[int]) -> list[int]:
    """Ports of `ports` in LISTEN state (0A) in /proc/net/tcp{,6} texts."""
    found = set()
    for text in tables:
        for line in text.splitlines()[1:]:
            parts = line.split()
            if len(parts) < 4 or parts[3] != "0A":
                continue
            try:
                port = int(parts[1].rsplit(":", 1)[1], 16)
            except (IndexError, ValueError):
                continue
            if port in ports:
                found.add(port)
    return sorted(found)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={
            "weights_path": {"type": "path", "required": True},
            "gpu_clock_state_file": {"type": "path", "default": "/var/lib/sparkfleet/clocks/gpu.conf"},
            "engine_container": {"type": "str", "default": "sparkfleet-engine"},
            "ports": {"type": "list", "elements": "int", "default": []},
            "docker": {"type": "str", "default": "docker"},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
        },
        supports_check_mode=True,
    )
    p = module.params
    at = nearest_existing(p["weights_path"])
    st = os.statvfs(at)
    disk = {
        "path": p["weights_path"],
        "measured_at": at,
        "free_bytes": st.f_bavail * st.f_frsize,
        "weights_bytes": tree_bytes(p["weights_path"]),
    }
    memory = meminfo(_read("/proc/meminfo") or "")
    settings = {
        "kernel": os.uname().release,
        "page_size": str(os.sysconf("SC_PAGE_SIZE")),
        "transparent_hugepage": thp_mode(_read("/sys/kernel/mm/transparent_hugepage/enabled") or "unknown"),
    }
    for key in ("min_free_kbytes", "swappiness", "watermark_boost_factor"):
        settings[f"vm.{key}"] = (_read(f"/proc/sys/vm/{key}") or "unknown").strip()
    cap = _read(p["gpu_clock_state_file"])
    settings["gpu_clock_cap"] = cap.strip() if cap is not None else "none recorded"

    docker = {"ok": False, "version": "", "error": "", "engine_running": False}
    path = module.get_bin_path(p["docker"])
    if path is None:
        docker["error"] = f"{p['docker']} not found in PATH"
    else:
        rc, out, err = module.run_command([path, "version", "--format", "{{.Server.Version}}"])
        docker.update(
            ok=rc == 0 and bool(out.strip()), version=out.strip(), error=(err or out).strip()[-500:]
        )
        if docker["ok"]:
            rc, out, _err = module.run_command(
                [path, "inspect", "--format", "{{.State.Running}}", p["engine_container"]]
            )
            docker["engine_running"] = rc == 0 and out.strip() == "true"
            docker["error"] = ""

    gpu = {"ok": False, "gpus": [], "error": "", "compute_processes": []}
    smi = module.get_bin_path(p["nvidia_smi"])
    if smi is None:
        gpu["error"] = f"{p['nvidia_smi']} not found in PATH"
    else:
        rc, out, err = module.run_command([smi, "-L"])
        gpu["gpus"] = [ln.strip() for ln in out.splitlines() if ln.startswith("GPU ")]
        gpu["ok"] = rc == 0 and bool(gpu["gpus"])
        gpu["error"] = "" if gpu["ok"] else (err or out or f"exit {rc}").strip()[-500:]
        if gpu["ok"]:
            rc, out, _err = module.run_command(
                [smi, "--query-compute-apps=pid,process_name", "--format=csv,noheader"]
            )
            if rc == 0:
                gpu["compute_processes"] = [ln.strip() for ln in out.splitlines() if ln.strip()]

    tables = [t for t in (_read("/proc/net/tcp"), _read("/proc/net/tcp6")) if t]
    module.exit_json(
        changed=False,
        disk=disk,
        memory=memory,
        settings=settings,
        docker=docker,
        gpu=gpu,
        listening=listening_ports(tables, p["ports"]),
    )


if __name__ == "__main__":
    main()

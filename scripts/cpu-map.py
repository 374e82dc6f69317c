#!/usr/bin/env python3
"""Where a long run's CPU goes (README "What `make test` runs"): the lab nodes' containers, the VM lab's qemu
guests, and everything else on the host (Ansible's controllers and workers, pytest, lint, Docker itself).

    scripts/cpu-map.py LOG &   ... the run ...   kill -TERM <its pid>

Every 10 s it appends a line to LOG: the machine's busy CPU seconds since the start (/proc/stat), the
lab containers' (Docker's cgroup, cpuacct, which counts the nested containers of a node in the node) and
the qemu processes'. On SIGTERM it appends a SUMMARY line: those totals, the host side (busy minus
containers minus qemu), and each lab's containers' CPU by lab name (a container
`sparkfleet-lab-<lab>-<node>` counts for <lab>). A container's or qemu process's last 10 s before it went
away or restarted are not counted. cgroup v1 (this machine's layout); read-only, no traffic.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DOCKER = Path("/sys/fs/cgroup/cpuacct/docker")
HZ = os.sysconf("SC_CLK_TCK")
PREFIX = "sparkfleet-lab-"


def busy() -> float:
    """The machine's busy CPU seconds since boot: user, nice, system, irq, softirq, steal."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7]) / HZ


def usage(path: Path) -> float | None:
    try:
        return int((path / "cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        return None


class Map:
    def __init__(self, log: Path) -> None:
        self.log = log.open("a")
        self.names: dict[str, str] = {}
        # container id -> [usage of its cgroup's earlier lives, its cgroup's inode, its usage now]: a
        # restarted container (docker restart, a lab node's reboot) gets a new cgroup, whose usage starts at 0
        self.containers: dict[str, list[float]] = {}
        self.qemu: dict[str, float] = {}  # pid -> its highest CPU seconds seen
        self.start = time.time()
        self.busy0 = busy()
        self.docker0 = usage(DOCKER) or 0.0
        self.before = self._containers()  # what each container had used before the start

    def _containers(self) -> dict[str, float]:
        try:
            ids = [d.name for d in DOCKER.iterdir() if d.is_dir() and len(d.name) == 64]
        except OSError:
            return {}
        new = [i for i in ids if i not in self.names]
        if new:
            argv = ["docker", "inspect", "-f", "{{.Id}} {{.Name}}", *new]
            out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
            for line in out.splitlines():
                if " " in line:
                    cid, name = line.split(" ", 1)
                    self.names[cid] = name.lstrip("/")
            for cid in new:
                self.names.setdefault(cid, "gone-" + cid[:12])
        return {i: u for i in ids if (u := usage(DOCKER / i)) is not None}

    def _lives(self) -> None:
        for cid, used in self._containers().items():
            try:
                inode = float((DOCKER / cid).stat().st_ino)
            except OSError:
                continue
            seen = self.containers.setdefault(cid, [0.0, inode, 0.0])
            if inode != seen[1]:  # a new cgroup: the old one's last usage read is banked
                seen[0] += seen[2]
                seen[1] = inode
            seen[2] = used

    def sample(self) -> dict[str, Any]:
        self._lives()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            if stat[stat.index("(") + 1 : stat.rindex(")")].startswith("qemu-system"):
                fields = stat[stat.rindex(")") + 2 :].split()
                used = (int(fields[11]) + int(fields[12])) / HZ  # utime + stime
                self.qemu[proc.name] = max(self.qemu.get(proc.name, 0.0), used)
        return {
            "t": time.strftime("%T"),
            "busy": round(busy() - self.busy0),
            "containers": round((usage(DOCKER) or self.docker0) - self.docker0),
            "qemu": round(sum(self.qemu.values())),
            "load": Path("/proc/loadavg").read_text().split()[0],
        }

    def summary(self) -> dict[str, Any]:
        last = self.sample()
        labs: dict[str, float] = {}
        for cid, (earlier, _inode, now) in self.containers.items():
            used = earlier + now
            name = self.names.get(cid, cid[:12])
            lab = name[len(PREFIX) :].rsplit("-", 1)[0] if name.startswith(PREFIX) else "other"
            labs[lab] = labs.get(lab, 0.0) + used - self.before.get(cid, 0.0)
        return {
            "wall_s": round(time.time() - self.start),
            "busy_cpu_s": last["busy"],
            "containers_cpu_s": last["containers"],
            "qemu_cpu_s": last["qemu"],
            "host_side_cpu_s": last["busy"] - last["containers"] - last["qemu"],
            "by_lab": {k: round(v) for k, v in sorted(labs.items(), key=lambda kv: -kv[1]) if round(v)},
        }

    def write(self, prefix: str, doc: dict[str, Any]) -> None:
        self.log.write(prefix + json.dumps(doc) + "\n")
        self.log.flush()


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: scripts/cpu-map.py LOG")
    cpu_map = Map(Path(sys.argv[1]))

    def stop(*_: Any) -> None:
        cpu_map.write("SUMMARY ", cpu_map.summary())
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        time.sleep(10)
        cpu_map.write("", cpu_map.sample())


if __name__ == "__main__":
    main()

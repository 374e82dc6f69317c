"""Where a test run's CPU goes, test by test (README "What `make test` runs"): a pytest plugin, off unless
asked.

    PYTHONPATH=scripts PYTEST_ADDOPTS="-p pytest_cpu" SPARKFLEET_PYTEST_CPU=DIR  make test   (or pytest ...)
    python3 scripts/pytest_cpu.py DIR [N]     the N heaviest test files (per lab), with their three figures

For each test it appends one JSON line to DIR/<pid>.jsonl: the test's id, the lab it ran against
($SPARKFLEET_LAB), its start and wall time, and three CPU figures in seconds: `self` (the pytest process),
`children` (processes it started and waited for: ansible-playbook runs, the CLI, module runs, simulators) and
`containers` (the lab's containers, `sparkfleet-lab-<lab>-*`, from Docker's cgroup v1 cpuacct, read before and
after the test; 0 without a lab). What it does not see: processes the test did not wait for (an engine double
left running), other labs' containers, and a lab node's CPU before a restart during the test (a restarted
container gets a new cgroup whose count starts at 0: such a test's `containers` is too low;
scripts/cpu-map.py, which samples every 10 s, keeps those); under xdist each worker writes its own file.
Read-only: it sends nothing anywhere and changes no test.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import time
from pathlib import Path

import pytest

CGROUP = Path("/sys/fs/cgroup/cpuacct/docker")
OUT = os.environ.get("SPARKFLEET_PYTEST_CPU", "")


def _containers_cpu() -> float:
    lab = os.environ.get("SPARKFLEET_LAB")
    if not lab:
        return 0.0
    try:
        ids = subprocess.run(
            ["docker", "ps", "-q", "--no-trunc", "--filter", f"name=sparkfleet-lab-{lab}-"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return 0.0
    total = 0.0
    for cid in ids:
        with contextlib.suppress(OSError, ValueError):  # gone in the meantime, or not cgroup v1
            total += int((CGROUP / cid / "cpuacct.usage").read_text()) / 1e9
    return total


def _process_cpu() -> tuple[float, float]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if not OUT:
        return (yield)
    start, before, lab_before = time.time(), _process_cpu(), _containers_cpu()
    try:
        return (yield)
    finally:
        after, lab_after = _process_cpu(), _containers_cpu()
        record = {
            "id": item.nodeid,
            "lab": os.environ.get("SPARKFLEET_LAB"),
            "t0": start,
            "wall": time.time() - start,
            "self": after[0] - before[0],
            "children": after[1] - before[1],
            "containers": max(lab_after - lab_before, 0.0),
        }
        Path(OUT).mkdir(parents=True, exist_ok=True)
        with open(Path(OUT) / f"{os.getpid()}.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def summary(out: Path, top: int = 15) -> str:
    """Per lab and test file: tests, wall, and the three CPU figures, the heaviest first."""
    files: dict[tuple[str, str], list[float]] = {}
    for path in sorted(out.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            key = (r["lab"] or "-", r["id"].split("::", 1)[0])
            row = files.setdefault(key, [0, 0.0, 0.0, 0.0, 0.0])
            row[0] += 1
            for i, name in enumerate(("wall", "self", "children", "containers"), start=1):
                row[i] += r[name]
    rows = sorted(files.items(), key=lambda kv: -(kv[1][2] + kv[1][3] + kv[1][4]))
    lines = [f"{'cpu s':>7} {'wall s':>7} {'self':>6} {'child':>6} {'cont':>6} {'n':>4}  lab  file"]
    for (lab, file), (n, wall, me, kids, cont) in rows[:top]:
        cpu = me + kids + cont
        lines.append(f"{cpu:7.1f} {wall:7.1f} {me:6.1f} {kids:6.1f} {cont:6.1f} {n:4d}  {lab}  {file}")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(summary(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 15))

"""A first converge against the no-op re-run it is followed by (the phase gates' target: docs/design.md "Phase
gates"), side by side in one run, each as a ratio.

For each topology in SPARKFLEET_BENCH_CONVERGE (e.g. "tp3" or "tp3,tp2"; unset: not run, it makes a lab and
converges it, 10-20 minutes per topology): a lab of its own, bench-<topology>, is made without converging
(`sparkfleet lab up --no-converge`, untimed), then timed with plain ansible-playbook and the same settings:
site.yml on the fresh nodes (the first converge), then site.yml again (the no-op: every phase's record found
clean), then `--check` site.yml (the dry run, which never skips: the full truth). The lab is removed
afterwards. The ratio is first converge / no-op (the target: at least 1 / 0.15 = 6.7x, and a no-op of at most
20 s on TP3).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}"
        )
    return took


def bench_topology(topology: str, tmp: Path) -> list[dict]:
    name = f"bench-{topology}"
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp / f"facts-{topology}"),  # empty: a first run gathers
    }
    lab_cli = [str(BIN / "sparkfleet"), "lab"]
    subprocess.run([*lab_cli, "down", "--name", name], env=env, cwd=ROOT, capture_output=True, check=False)
    subprocess.run(
        [*lab_cli, "up", "--topology", topology, "--name", name, "--no-converge"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    try:
        if str(ROOT / "lab") not in sys.path:
            sys.path.insert(0, str(ROOT / "lab"))
        from sparkfleet_lab.core import Lab

        lab = Lab(name=name)
        play = [str(BIN / "ansible-playbook"), *[a for i in lab.inventories for a in ("-i", str(i))]]
        first = _timed([*play, "site.yml"], env)
        noop = _timed([*play, "site.yml"], env)
        check = _timed([*play, "--check", "site.yml"], env)
    finally:
        subprocess.run(
            [*lab_cli, "down", "--name", name], env=env, cwd=ROOT, capture_output=True, check=False
        )
    how = "plain ansible-playbook site.yml on a fresh lab, then again (same settings and fact cache)"
    return [
        {
            "name": f"{topology} site.yml: first converge over no-op",
            "baseline": first,
            "candidate": noop,
            "unit": "s",
            "ratio": first / noop,
            "how": f"{how}; target no-op <= 0.15x the first (ratio >= 6.7x)",
        },
        {
            "name": f"{topology} site.yml: --check over no-op",
            "baseline": check,
            "candidate": noop,
            "unit": "s",
            "ratio": check / noop,
            "how": "a dry run never skips a phase: what the gates save on a clean cluster",
        },
    ]


def run() -> list[dict]:
    wanted = [t.strip() for t in os.environ.get("SPARKFLEET_BENCH_CONVERGE", "").split(",") if t.strip()]
    if not wanted:
        print(
            "   converge benchmarks not run: SPARKFLEET_BENCH_CONVERGE=tp3[,tp2] makes a lab for each",
            flush=True,
        )
        return []
    rows = []
    with tempfile.TemporaryDirectory(prefix="sparkfleet-bench-converge-") as tmp:
        for topology in wanted:
            rows += bench_topology(topology, Path(tmp))
    return rows

"""Engine benchmarks on a TP3 lab of their own (created, then removed).

- site.yml: the no-op re-run against the first converge (target: a no-op in seconds);
- site.yml no-op: SPARKFLEET_STRATEGY=mitogen (the default) against ansible's linear strategy;
- start.yml: a no-op start (nothing changed: no restart) against a cold ordered start after a stop
  (workers first, rank 0 last, readiness wait).
Both sides run back to back in this run, on this machine, against the same lab.
"""

from __future__ import annotations

import os
import time

from sparkfleet import runner
from sparkfleet_lab.core import Lab

LAB_NAME = os.environ.get("SPARKFLEET_BENCH_ENGINE_LAB", "bench-eng3")


def _timed(lab: Lab, playbook: str, strategy: str = "") -> float:
    """Wall time of one run; strategy "" is the default (ansible.cfg: mitogen when installed)."""
    os.environ["SPARKFLEET_STRATEGY"] = strategy
    start = time.monotonic()
    result = runner.run_playbook(
        lab.project_dir / playbook, [str(p) for p in lab.inventories], project_dir=lab.project_dir, quiet=True
    )
    elapsed = time.monotonic() - start
    if result.exit_code != 0:
        why = "; ".join(f"{f.host}: {f.task}: {f.msg}" for f in result.failures[:3])
        raise RuntimeError(f"{playbook} failed on lab {lab.name} (exit {result.exit_code}): {why}")
    return elapsed


def _row(name: str, baseline: float, candidate: float, how: str) -> dict:
    return {
        "name": name,
        "baseline": baseline,
        "candidate": candidate,
        "unit": "s",
        "ratio": baseline / candidate if candidate else float("inf"),
        "how": how,
    }


def run() -> list[dict]:
    lab = Lab(name=LAB_NAME, topology_name="tp3")
    keep = os.environ.get("SPARKFLEET_BENCH_KEEP_LAB") == "1"
    try:
        lab.up(converge=False)
        first = _timed(lab, "site.yml")
        noop = _timed(lab, "site.yml")
        noop_linear = _timed(lab, "site.yml", strategy="linear")
        noop_mitogen = _timed(lab, "site.yml", strategy="mitogen")
        _timed(lab, "playbooks/stop.yml")
        cold = _timed(lab, "playbooks/start.yml")
        warm = _timed(lab, "playbooks/start.yml")
    finally:
        os.environ.pop("SPARKFLEET_STRATEGY", None)
        if not keep:
            lab.down()
    return [
        _row(
            "site.yml TP3: no-op re-run vs first converge",
            first,
            noop,
            f"lab {LAB_NAME} (3 nodes, stand-in engine), wall time of site.yml through sparkfleet's runner: "
            "the first converge, then the same run again with nothing to change",
        ),
        _row(
            "site.yml TP3 no-op: mitogen vs linear strategy",
            noop_linear,
            noop_mitogen,
            "the same no-op re-run, back to back: SPARKFLEET_STRATEGY=linear (ansible's own, one Python per "
            "task and node), then SPARKFLEET_STRATEGY=mitogen (the default: one persistent Python per node)",
        ),
        _row(
            "start.yml TP3: no-op vs cold ordered start",
            cold,
            warm,
            "after stop.yml: start.yml starting workers then rank 0 and waiting for /health + the model; "
            "then start.yml again (same settings digest: no restart)",
        ),
    ]

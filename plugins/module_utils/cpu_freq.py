"""cpufreq caps (sparkfleet.cluster.cpu_clocks, and gpu_clocks' `cpu` option: one round trip for both
caps): read every policy, compare with the wanted ceiling, write scaling_max_freq where it differs, record
the cap."""

from __future__ import annotations

import glob
import os
import re

from ansible_collections.sparkfleet.cluster.plugins.module_utils.clock_state import (
    CPU_KEY,
    STATE_DIR,
    read_cap,
    state_diff,
    state_text,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.fileio import write_atomic

# Where the CPU cap is read and recorded: the options cpu_clocks and gpu_clocks' `cpu` share.
ARGUMENT_SPEC = {
    "cpufreq_root": {"type": "path", "default": "/sys/devices/system/cpu/cpufreq"},
    "state_file": {"type": "path", "default": f"{STATE_DIR}/clocks/cpu.conf"},
}


class CpuClockError(Exception):
    """A cap that cannot be set (its message is the module's failure)."""


# A driver may round a written ceiling down to a frequency it supports; within this, it counts as set.
TOLERANCE_KHZ = 25000


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as fh:
            text = fh.read().strip()
    except OSError:
        return None
    return int(text) if re.fullmatch(r"\d+", text) else None


def read_policies(root: str) -> list[dict]:
    policies = []
    for path in sorted(
        glob.glob(os.path.join(root, "policy*")), key=lambda p: int(re.sub(r"\D", "", p) or 0)
    ):
        max_khz = _read_int(os.path.join(path, "cpuinfo_max_freq"))
        current = _read_int(os.path.join(path, "scaling_max_freq"))
        if max_khz is None or current is None:
            continue
        try:
            with open(os.path.join(path, "related_cpus"), encoding="ascii") as fh:
                cpus = fh.read().strip()
        except OSError:
            cpus = ""
        policies.append(
            {
                "name": os.path.basename(path),
                "path": path,
                "cpus": cpus,
                "min_khz": _read_int(os.path.join(path, "cpuinfo_min_freq")),
                "max_khz": max_khz,
                "current_max_khz": current,
            }
        )
    return policies


def wanted_khz(cap_mhz: int, policy: dict) -> int:
    return policy["max_khz"] if cap_mhz == 0 else min(cap_mhz * 1000, policy["max_khz"])


def in_effect(policy: dict, wanted: int) -> bool:
    current = policy["current_max_khz"]
    if wanted == policy["max_khz"]:
        return current == wanted
    return wanted - TOLERANCE_KHZ <= current <= wanted


def apply(writes: list[dict], state_file: str, state: str | None) -> None:
    for x in writes:
        with open(os.path.join(x["path"], "scaling_max_freq"), "w", encoding="ascii") as fh:
            fh.write(f"{x['wanted_khz']}\n")
        x["current_max_khz"] = _read_int(os.path.join(x["path"], "scaling_max_freq"))
    if state is not None:
        write_atomic(state_file, state)


def report(configured: int | None, policies: list[dict], skipped: str | None) -> list[str]:
    what = (
        "never configured"
        if configured is None
        else ("0 = stock" if configured == 0 else f"{configured} MHz")
    )
    if skipped:
        return [f"CPU cap: {what}; skipped: {skipped}"]
    lines = [f"CPU cap: {what}"]
    for x in policies:
        lines.append(
            f"CPU {x['name']} (cpus {x['cpus'] or '?'}): max {x['current_max_khz'] // 1000} MHz "
            f"of {x['max_khz'] // 1000} MHz"
        )
    return lines


def run(cap_mhz: int | None, state: str, cpufreq_root: str, state_file: str, check_mode: bool) -> dict:
    """The module's result (without failing): state `query` reports, `present` applies `cap_mhz`."""
    policies = read_policies(cpufreq_root)
    configured = read_cap(state_file, CPU_KEY)
    skipped = None
    if not policies:
        skipped = f"no cpufreq policies under {cpufreq_root}: this node has no CPU frequency control"
    elif not all(os.access(os.path.join(x["path"], "scaling_max_freq"), os.W_OK) for x in policies):
        skipped = f"{cpufreq_root} is read-only here (a container?): CPU clocks not changed"
    if state == "query":
        for x in policies:
            x["capped"] = x["current_max_khz"] < x["max_khz"]
        return {
            "changed": False,
            "cap_mhz": configured,
            "policies": policies,
            "skipped_reason": skipped,
            "report": report(configured, policies, skipped),
        }
    cap = cap_mhz
    if cap < 0:
        raise CpuClockError(f"cap_mhz must be 0 (stock clocks) or a clock in MHz, got {cap}")
    floor = max((x["min_khz"] or 0 for x in policies), default=0)
    if cap and cap * 1000 < floor:
        raise CpuClockError(f"CPU cap {cap} MHz is under the CPUs' minimum clock {floor // 1000} MHz")
    writes = []
    for x in policies:
        x["wanted_khz"] = wanted_khz(cap, x)
        if not in_effect(x, x["wanted_khz"]):
            writes.append(x)
    live = skipped is None
    changed = configured != cap or (live and bool(writes))
    after = state_text(cap, CPU_KEY)
    if changed and not check_mode:
        try:
            apply(writes if live else [], state_file, after if configured != cap else None)
        except OSError as err:
            raise CpuClockError(f"setting CPU clocks failed: {err}") from None
    return {
        "changed": changed,
        "cap_mhz": cap,
        "configured_before": configured,
        "policies": policies,
        "written": [x["name"] for x in writes] if live else [],
        "skipped_reason": skipped,
        # after a write, the clocks as they are now (what state=query would report)
        "report": report(
            cap,
            read_policies(cpufreq_root) if changed and live and not check_mode else policies,
            skipped,
        ),
        "diff": state_diff(state_file, configured, cap, CPU_KEY),
    }

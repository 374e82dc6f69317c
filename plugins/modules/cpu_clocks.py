#!/usr/bin/python
"""Ansible module: cap (or restore) the CPU clocks of a node through cpufreq, idempotently."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cpu_clocks
short_description: Cap every cpufreq policy's scaling_max_freq (query, compare, set) and record it
description:
  - For each cpufreq policy, the wanted ceiling is C(min(cap, cpuinfo_max_freq)); C(cap_mhz = 0) restores
    C(cpuinfo_max_freq) (stock). On a DGX Spark a cap of 3600 MHz limits the performance cores and leaves
    the efficiency cores (which top out lower) alone.
  - Writes C(scaling_max_freq) only where it differs. The interface is cpufreq's C(scaling_max_freq),
    which every cpufreq driver has, in kHz.
  - Records the cap in I(state_file) (read at boot by sparkfleet-clocks.service).
  - Where the node has no cpufreq policies, or sysfs is read-only (a container), the live change is
    skipped and the result says so (C(skipped_reason)).
options:
  cap_mhz:
    description: CPU clock cap in MHz; 0 = stock. Required when I(state=present).
    type: int
  state:
    description: C(present) applies I(cap_mhz); C(query) only reports.
    type: str
    choices: [present, query]
    default: present
  cpufreq_root:
    description: The cpufreq sysfs directory.
    type: path
    default: /sys/devices/system/cpu/cpufreq
  state_file:
    description: What sparkfleet configured.
    type: path
    default: /var/lib/sparkfleet/clocks/cpu.conf
author: sparkfleet developers
"""

RETURN = r"""
policies:
  description: Per policy name, cpus, max_khz (cpuinfo_max_freq), current_max_khz, wanted_khz.
  type: list
  returned: always
skipped_reason:
  description: Why the live change was not made (no cpufreq, read-only sysfs), or null.
  type: str
  returned: always
cap_mhz:
  description: The cap configured after the run.
  type: int
  returned: always
report:
  description: Human lines for C(sparkfleet clocks show).
  type: list
  returned: always
"""

EXAMPLES = r"""
- name: Cap the CPU at 3600 MHz
  sparkfleet.cluster.cpu_clocks:
    cap_mhz: 3600

- name: Report the CPU cap
  sparkfleet.cluster.cpu_clocks:
    state: query
  register: cpu
"""

import glob
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils.clock_state import (
    CPU_KEY,
    STATE_DIR,
    read_cap,
    state_diff,
    state_text,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.fileio import write_atomic

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


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "cap_mhz": {"type": "int"},
            "state": {"type": "str", "choices": ["present", "query"], "default": "present"},
            "cpufreq_root": {"type": "path", "default": "/sys/devices/system/cpu/cpufreq"},
            "state_file": {"type": "path", "default": f"{STATE_DIR}/clocks/cpu.conf"},
        },
        required_if=[("state", "present", ["cap_mhz"])],
        supports_check_mode=True,
    )
    p = module.params
    policies = read_policies(p["cpufreq_root"])
    configured = read_cap(p["state_file"], CPU_KEY)
    skipped = None
    if not policies:
        skipped = f"no cpufreq policies under {p['cpufreq_root']}: this node has no CPU frequency control"
    elif not all(os.access(os.path.join(x["path"], "scaling_max_freq"), os.W_OK) for x in policies):
        skipped = f"{p['cpufreq_root']} is read-only here (a container?): CPU clocks not changed"
    if p["state"] == "query":
        for x in policies:
            x["capped"] = x["current_max_khz"] < x["max_khz"]
        module.exit_json(
            changed=False,
            cap_mhz=configured,
            policies=policies,
            skipped_reason=skipped,
            report=report(configured, policies, skipped),
        )

    cap = p["cap_mhz"]
    if cap < 0:
        module.fail_json(msg=f"cap_mhz must be 0 (stock clocks) or a clock in MHz, got {cap}")
    floor = max((x["min_khz"] or 0 for x in policies), default=0)
    if cap and cap * 1000 < floor:
        module.fail_json(msg=f"CPU cap {cap} MHz is under the CPUs' minimum clock {floor // 1000} MHz")
    writes = []
    for x in policies:
        x["wanted_khz"] = wanted_khz(cap, x)
        if not in_effect(x, x["wanted_khz"]):
            writes.append(x)
    live = skipped is None
    changed = configured != cap or (live and bool(writes))
    after = state_text(cap, CPU_KEY)
    if changed and not module.check_mode:
        try:
            apply(writes if live else [], p["state_file"], after if configured != cap else None)
        except OSError as err:
            module.fail_json(msg=f"setting CPU clocks failed: {err}")
    module.exit_json(
        changed=changed,
        cap_mhz=cap,
        configured_before=configured,
        policies=policies,
        written=[x["name"] for x in writes] if live else [],
        skipped_reason=skipped,
        # after a write, the clocks as they are now (what state=query would report)
        report=report(
            cap,
            read_policies(p["cpufreq_root"]) if changed and live and not module.check_mode else policies,
            skipped,
        ),
        diff=state_diff(p["state_file"], configured, cap, CPU_KEY),
    )


if __name__ == "__main__":
    main()

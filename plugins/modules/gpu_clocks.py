#!/usr/bin/python
"""Ansible module: cap (or reset) the GPU clocks of a node with nvidia-smi, idempotently."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_clocks
short_description: Cap the GPU SM clock with nvidia-smi (query, compare, set) and record it
description:
  - Reads the GPUs with C(nvidia-smi --query-gpu), the cap this node is configured with (the state file
    sparkfleet writes, because nvidia-smi does not report a lock range) and the cap applied since this boot
    (a marker under /run, which a reboot empties, as it empties the GPU's lock).
  - Sets only what differs. C(cap_mhz > 0) runs C(nvidia-smi -lgc 0,<cap>); C(cap_mhz = 0) runs
    C(nvidia-smi -rgc) (stock clocks). Persistence mode is enabled first (C(nvidia-smi -pm 1)).
  - A cap is re-applied when an SM clock runs above it (the lock was lost, e.g. after a GPU reset).
  - Flags a GPU whose SM clock is under I(latched_below_mhz): a latched GB10 needs an AC power cycle.
  - Supports check mode and diff.
options:
  cap_mhz:
    description: GPU SM clock cap in MHz; 0 = stock clocks. Required when I(state=present).
    type: int
  state:
    description: C(present) applies I(cap_mhz); C(query) only reports.
    type: str
    choices: [present, query]
    default: present
  persistence_mode:
    description: Enable persistence mode before setting clocks (the driver forgets clocks otherwise).
    type: bool
    default: true
  state_file:
    description: What sparkfleet configured (read at boot by sparkfleet-clocks.service).
    type: path
    default: /var/lib/sparkfleet/clocks/gpu.conf
  applied_file:
    description: The cap applied since this boot (on a tmpfs).
    type: path
    default: /run/sparkfleet/clocks/gpu.applied
  nvidia_smi:
    description: The nvidia-smi executable.
    type: str
    default: nvidia-smi
  latched_below_mhz:
    description: An SM clock under this value means a latched GPU.
    type: int
    default: 1000
author: sparkfleet developers
"""

RETURN = r"""
cap_mhz:
  description: The cap this node is configured with after the run (0 = stock).
  type: int
  returned: always
configured_before:
  description: The cap recorded before the run (null when never configured).
  type: int
  returned: always
applied:
  description: The cap applied since this boot (null when none).
  type: int
  returned: always
gpus:
  description: >-
    Per GPU index, name, persistence_mode, sm_mhz, max_sm_mhz, event_reasons, event_reason_names, latched.
  type: list
  returned: always
latched:
  description: Whether any GPU runs under latched_below_mhz.
  type: bool
  returned: always
commands:
  description: The nvidia-smi changes run (or that would run in check mode).
  type: list
  returned: always
report:
  description: Human lines for C(sparkfleet clocks show).
  type: list
  returned: always
"""

EXAMPLES = r"""
- name: Cap the GPU at 2300 MHz
  sparkfleet.cluster.gpu_clocks:
    cap_mhz: 2300

- name: Back to stock clocks
  sparkfleet.cluster.gpu_clocks:
    cap_mhz: 0

- name: Report the clocks
  sparkfleet.cluster.gpu_clocks:
    state: query
  register: clocks
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils.clock_state import (
    GPU_KEY,
    read_cap,
    state_diff,
    state_text,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.fileio import write_atomic

QUERY = "index,name,persistence_mode,clocks.sm,clocks.max.sm,clocks_event_reasons.active"
REASON_NAMES = {
    0x1: "GPU idle",
    0x2: "applications clocks setting (the lock)",
    0x4: "SW power cap",
    0x8: "HW slowdown",
    0x10: "sync boost",
    0x20: "SW thermal slowdown",
    0x40: "HW thermal slowdown",
    0x80: "HW power brake slowdown",
    0x100: "display clock setting",
}


class ClockError(Exception):
    pass


def _int_or_none(text: str) -> int | None:
    text = text.strip()
    return int(text) if re.fullmatch(r"\d+", text) else None


def parse_gpus(csv: str, latched_below: int) -> list[dict]:
    """Rows of `--query-gpu=QUERY --format=csv,noheader,nounits`."""
    gpus = []
    for line in csv.splitlines():
        if not line.strip():
            continue
        cols = [c.strip() for c in line.split(",")]
        if len(cols) != 6:
            raise ClockError(f"unexpected nvidia-smi output line: {line!r}")
        index, name, persistence, sm, max_sm, reasons = cols
        bits = int(reasons, 16) if re.fullmatch(r"0x[0-9A-Fa-f]+", reasons) else None
        sm_mhz = _int_or_none(sm)
        gpus.append(
            {
                "index": int(index),
                "name": name,
                "persistence_mode": persistence,
                "sm_mhz": sm_mhz,
                "max_sm_mhz": _int_or_none(max_sm),
                "event_reasons": reasons,
                "event_reason_names": [n for b, n in sorted(REASON_NAMES.items()) if bits and bits & b],
                "latched": sm_mhz is not None and sm_mhz < latched_below,
            }
        )
    if not gpus:
        raise ClockError("nvidia-smi reports no GPU")
    return gpus


def plan(cap: int, gpus: list[dict], configured: int | None, applied: int | None, persistence: bool) -> dict:
    """What must change: persistence mode, the clock lock, the state file. Pure: unit-tested."""
    reasons = []
    need_pm = persistence and any(g["persistence_mode"] != "Enabled" for g in gpus)
    if need_pm:
        reasons.append("persistence mode is disabled")
    need_clock = False
    if applied != cap:
        need_clock = True
        reasons.append(
            "no cap applied since this boot" if applied is None else f"{applied} MHz applied, {cap} wanted"
        )
    elif cap > 0:
        over = [g for g in gpus if g["sm_mhz"] is not None and g["sm_mhz"] > cap]
        if over:
            need_clock = True
            reasons.append(
                f"GPU {over[0]['index']} runs at {over[0]['sm_mhz']} MHz, above the cap: lock lost"
            )
    commands = []
    if need_pm:
        commands.append(["-pm", "1"])
    if need_clock:
        commands.append(["-lgc", f"0,{cap}"] if cap > 0 else ["-rgc"])
    return {
        "commands": commands,
        "write_state": configured != cap,
        "reasons": reasons,
    }


class Smi:
    def __init__(self, module: AnsibleModule, executable: str) -> None:
        self.module = module
        path = module.get_bin_path(executable) if "/" not in executable else executable
        if not path or not os.access(path, os.X_OK):
            raise ClockError(f"{executable} not found: is the NVIDIA driver installed on this node?")
        self.path = path

    def run(self, args: list[str]) -> str:
        rc, out, err = self.module.run_command([self.path, *args])
        if rc != 0:
            raise ClockError(f"nvidia-smi {' '.join(args)} failed (exit {rc}): {(out + err).strip()}")
        return out

    def gpus(self, latched_below: int) -> list[dict]:
        return parse_gpus(self.run([f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"]), latched_below)


def latched_warnings(gpus: list[dict], latched_below: int) -> list[str]:
    return [
        f"GPU {g['index']} ({g['name']}) runs its SM clock at {g['sm_mhz']} MHz, under {latched_below} MHz: "
        "the GPU is latched in a low-clock state. A clock reset or reboot does not clear it; power-cycle "
        "the Spark at the wall (shut down, unplug AC for 30 s, plug in, boot)."
        for g in gpus
        if g["latched"]
    ]


def report(configured: int | None, applied: int | None, gpus: list[dict], latched_below: int) -> list[str]:
    """Human lines for `sparkfleet clocks show`."""
    if configured is None:
        lines = ["GPU cap: never configured by sparkfleet (stock unless someone ran nvidia-smi -lgc)"]
    else:
        what = "0 = stock clocks" if configured == 0 else f"{configured} MHz"
        if applied == configured:
            lines = [f"GPU cap: {what}, applied since this boot"]
        else:
            lines = [
                f"GPU cap: {what} configured but NOT applied since this boot "
                f"({'nothing' if applied is None else f'{applied} MHz'} applied): "
                "check `systemctl status sparkfleet-clocks` or run `sparkfleet clocks set`"
            ]
    for g in gpus:
        names = ", ".join(g["event_reason_names"]) or "none"
        lines.append(
            f"GPU {g['index']} {g['name']}: SM {g['sm_mhz']} MHz (max {g['max_sm_mhz']} MHz), "
            f"persistence {g['persistence_mode']}, clock event reasons {g['event_reasons']} ({names})"
        )
        if g["latched"]:
            lines.append(
                f"GPU {g['index']}: LATCHED: SM clock {g['sm_mhz']} MHz is under {latched_below} MHz; "
                "only an AC power cycle clears it (shut down, unplug for 30 s)"
            )
    return lines


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "cap_mhz": {"type": "int"},
            "state": {"type": "str", "choices": ["present", "query"], "default": "present"},
            "persistence_mode": {"type": "bool", "default": True},
            "state_file": {"type": "path", "default": "/var/lib/sparkfleet/clocks/gpu.conf"},
            "applied_file": {"type": "path", "default": "/run/sparkfleet/clocks/gpu.applied"},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "latched_below_mhz": {"type": "int", "default": 1000},
        },
        required_if=[("state", "present", ["cap_mhz"])],
        supports_check_mode=True,
    )
    p = module.params
    latched_below = p["latched_below_mhz"]
    try:
        smi = Smi(module, p["nvidia_smi"])
        gpus = smi.gpus(latched_below)
    except ClockError as err:
        module.fail_json(msg=str(err))
    configured = read_cap(p["state_file"], GPU_KEY)
    applied = read_cap(p["applied_file"], GPU_KEY)
    result = {
        "changed": False,
        "configured_before": configured,
        "applied": applied,
        "commands": [],
        "reasons": [],
    }
    if p["state"] == "query":
        for warning in latched_warnings(gpus, latched_below):
            module.warn(warning)
        module.exit_json(
            cap_mhz=configured,
            gpus=gpus,
            latched=any(g["latched"] for g in gpus),
            in_effect=configured is not None and configured == applied,
            report=report(configured, applied, gpus, latched_below),
            **result,
        )

    cap = p["cap_mhz"]
    if cap < 0:
        module.fail_json(msg=f"cap_mhz must be 0 (stock clocks) or a clock in MHz, got {cap}")
    todo = plan(cap, gpus, configured, applied, p["persistence_mode"])
    changed = bool(todo["commands"]) or todo["write_state"]
    result.update(
        changed=changed,
        commands=[f"nvidia-smi {' '.join(c)}" for c in todo["commands"]],
        reasons=todo["reasons"],
        diff=state_diff(p["state_file"], configured, cap, GPU_KEY),
    )
    if changed and not module.check_mode:
        try:
            for args in todo["commands"]:
                smi.run(args)
            if todo["write_state"]:
                write_atomic(p["state_file"], state_text(cap, GPU_KEY))
            write_atomic(p["applied_file"], f"{cap}\n")
            gpus = smi.gpus(latched_below)
        except (ClockError, OSError) as err:
            module.fail_json(msg=str(err), **result)
        result["applied"] = cap
    for warning in latched_warnings(gpus, latched_below):
        module.warn(warning)
    module.exit_json(
        cap_mhz=cap,
        gpus=gpus,
        latched=any(g["latched"] for g in gpus),
        in_effect=not module.check_mode or not changed,
        report=report(cap, result["applied"], gpus, latched_below),
        **result,
    )


if __name__ == "__main__":
    main()

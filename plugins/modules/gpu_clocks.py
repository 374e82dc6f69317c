#!/usr/bin/python
"""Ansible module: cap (or reset) the GPU clocks of a node with nvidia-smi, idempotently."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_clocks
short_description: Cap the GPU SM clock with nvidia-smi (query, compare, set, verify) and record it
description:
  - >-
    Reads the GPUs with C(nvidia-smi --query-gpu), the cap this node is configured with (the state file
    sparkfleet writes, because nvidia-smi does not report a lock range) and the cap applied since this boot
    (a marker under /run, which a reboot empties, as it empties the GPU's lock).
  - >-
    Sets only what differs. C(cap_mhz > 0) runs C(nvidia-smi -lgc <min_mhz>,<cap>); C(cap_mhz = 0) runs
    C(nvidia-smi -rgc) (stock clocks). With I(persistence_mode), C(nvidia-smi -pm 1) runs first; its
    failure is a warning, never the end of the run (the GB10 receipts run without it).
  - >-
    After setting, samples the SM clock (I(verify_samples) times, I(verify_interval_ms) apart) and records
    the verdict under /run (C(gpu.verify)), since C(nvidia-smi -lgc) can answer success without pinning
    the clock, so a sample above the cap is reported as a cap that did not take (a warning and
    C(pinned=false)).
  - >-
    A cap is re-applied when an SM clock runs above it although it took before (the lock was lost, e.g.
    after a GPU reset); one that did not take in this boot is reported again, not re-applied every run.
  - >-
    Flags a GPU whose SM clock is under I(latched_below_mhz): a latched GB10 needs an AC power cycle.
  - >-
    Supports check mode and diff.
options:
  cap_mhz:
    description: GPU SM clock cap in MHz; 0 = stock clocks. Required when I(state=present).
    type: int
  min_mhz:
    description: The lower end of the lock range (C(nvidia-smi -lgc <min>,<cap>)).
    type: int
    default: 0
  state:
    description: C(present) applies I(cap_mhz); C(query) only reports.
    type: str
    choices: [present, query]
    default: present
  persistence_mode:
    description: Enable persistence mode before setting clocks; a failure is a warning.
    type: bool
    default: false
  state_file:
    description: What sparkfleet configured (read at boot by sparkfleet-clocks.service).
    type: path
    default: /var/lib/sparkfleet/clocks/gpu.conf
  applied_file:
    description: The cap applied since this boot (on a tmpfs).
    type: path
    default: /run/sparkfleet/clocks/gpu.applied
  verify_file:
    description: What the SM clock did right after the cap was applied (on a tmpfs).
    type: path
    default: /run/sparkfleet/clocks/gpu.verify
  verify_samples:
    description: SM clock samples taken after applying a cap.
    type: int
    default: 5
  verify_interval_ms:
    description: Milliseconds between those samples.
    type: int
    default: 200
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
verify:
  description: "The check after applying: {min, cap, result (held, not-taken, stock), sm_mhz} (null: none)."
  type: dict
  returned: always
pinned:
  description: False when the cap did not take (an SM clock sample above it); null without a cap or check.
  type: bool
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
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils.clock_state import (
    GPU_KEY,
    read_cap,
    read_verify,
    state_diff,
    state_text,
    verdict,
    verify_text,
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


def plan(
    cap: int,
    gpus: list[dict],
    configured: int | None,
    applied: int | None,
    persistence: bool,
    *,
    min_mhz: int = 0,
    verify: dict | None = None,
) -> dict:
    """What must change: persistence mode, the clock lock, the state file. Pure: unit-tested."""
    reasons = []
    need_pm = persistence and any(g["persistence_mode"] != "Enabled" for g in gpus)
    if need_pm:
        reasons.append("persistence mode is disabled")
    checked = verify is not None and verify["cap"] == cap and verify["min"] == min_mhz
    need_clock = False
    if applied != cap:
        need_clock = True
        reasons.append(
            "no cap applied since this boot" if applied is None else f"{applied} MHz applied, {cap} wanted"
        )
    elif cap > 0 and verify is not None and not checked:
        need_clock = True
        reasons.append(f"the lock range was {verify['min']},{verify['cap']}, {min_mhz},{cap} wanted")
    elif cap > 0 and not (checked and verify["result"] == "not-taken"):
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
        commands.append(["-lgc", f"{min_mhz},{cap}"] if cap > 0 else ["-rgc"])
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

    def sample(self, count: int, interval_s: float, latched_below: int) -> list[int]:
        """The highest SM clock of all GPUs, `count` times, `interval_s` apart."""
        out = []
        for i in range(max(1, count)):
            if i:
                time.sleep(interval_s)
            clocks = [g["sm_mhz"] for g in self.gpus(latched_below) if g["sm_mhz"] is not None]
            if clocks:
                out.append(max(clocks))
        return out


def not_taken_warning(verify: dict | None) -> list[str]:
    if not verify or verify["result"] != "not-taken":
        return []
    return [
        f"nvidia-smi -lgc {verify['min']},{verify['cap']} answered success, but the SM clock ran at "
        f"{verify['sm_mhz']} MHz right after, above the {verify['cap']} MHz cap: the cap did not take. "
        "GB10 can accept -lgc without pinning the clock, and a latched GPU ignores it; check the clock under "
        "load (`sparkfleet clocks show`), and power-cycle the Spark at the wall if it stays so."
    ]


def latched_warnings(gpus: list[dict], latched_below: int) -> list[str]:
    return [
        f"GPU {g['index']} ({g['name']}) runs its SM clock at {g['sm_mhz']} MHz, under {latched_below} MHz: "
        "the GPU is latched in a low-clock state. A clock reset or reboot does not clear it; power-cycle "
        "the Spark at the wall (shut down, unplug AC for 30 s, plug in, boot)."
        for g in gpus
        if g["latched"]
    ]


def report(
    configured: int | None,
    applied: int | None,
    gpus: list[dict],
    latched_below: int,
    verify: dict | None = None,
) -> list[str]:
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
    if verify and applied is not None and verify["cap"] == applied and applied > 0:
        if verify["result"] == "not-taken":
            lines.append(
                f"GPU cap check: NOT TAKEN: right after -lgc {verify['min']},{verify['cap']} the SM clock "
                f"ran at {verify['sm_mhz']} MHz, above the cap (-lgc answered success without pinning)"
            )
        else:
            lines.append(
                f"GPU cap check: held: no SM clock sample above {verify['cap']} MHz right after -lgc "
                f"{verify['min']},{verify['cap']} (highest {verify['sm_mhz']} MHz)"
            )
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


def apply(module: AnsibleModule, smi: Smi, todo: dict, p: dict) -> dict | None:
    """Run the planned commands, sample the SM clock after a lock, write the state; the new verdict."""
    cap, low, verify = p["cap_mhz"], p["min_mhz"], None
    for args in todo["commands"]:
        if args[0] == "-pm":
            try:
                smi.run(args)
            except ClockError as err:  # optional: the GB10 receipts run without it
                module.warn(f"persistence mode not enabled, the clocks are set anyway: {err}")
            continue
        smi.run(args)
        samples = smi.sample(p["verify_samples"], p["verify_interval_ms"] / 1000.0, p["latched_below_mhz"])
        peak = max(samples) if samples else None
        verify = {"min": low, "cap": cap, "result": verdict(cap, samples), "sm_mhz": peak}
        write_atomic(p["verify_file"], verify_text(low, cap, verify["result"], peak))
    if todo["write_state"]:
        write_atomic(p["state_file"], state_text(cap, GPU_KEY))
    write_atomic(p["applied_file"], f"{cap}\n")
    return verify


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "cap_mhz": {"type": "int"},
            "min_mhz": {"type": "int", "default": 0},
            "state": {"type": "str", "choices": ["present", "query"], "default": "present"},
            "persistence_mode": {"type": "bool", "default": False},
            "state_file": {"type": "path", "default": "/var/lib/sparkfleet/clocks/gpu.conf"},
            "applied_file": {"type": "path", "default": "/run/sparkfleet/clocks/gpu.applied"},
            "verify_file": {"type": "path", "default": "/run/sparkfleet/clocks/gpu.verify"},
            "verify_samples": {"type": "int", "default": 5},
            "verify_interval_ms": {"type": "int", "default": 200},
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
    verify = read_verify(p["verify_file"])
    result = {
        "changed": False,
        "configured_before": configured,
        "applied": applied,
        "commands": [],
        "reasons": [],
    }

    def pinned(v: dict | None, cap: int | None) -> bool | None:
        if not v or cap is None or cap <= 0 or v["cap"] != cap:
            return None
        return v["result"] == "held"

    if p["state"] == "query":
        for warning in latched_warnings(gpus, latched_below):
            module.warn(warning)
        shown = verify if verify and verify["cap"] == applied else None
        for warning in not_taken_warning(shown):
            module.warn(warning)
        module.exit_json(
            cap_mhz=configured,
            gpus=gpus,
            latched=any(g["latched"] for g in gpus),
            in_effect=configured is not None and configured == applied,
            verify=verify,
            pinned=pinned(shown, applied),
            report=report(configured, applied, gpus, latched_below, verify),
            **result,
        )

    cap, low = p["cap_mhz"], p["min_mhz"]
    if cap < 0:
        module.fail_json(msg=f"cap_mhz must be 0 (stock clocks) or a clock in MHz, got {cap}")
    if cap > 0 and not 0 <= low < cap:
        module.fail_json(msg=f"min_mhz must be at least 0 and under the cap ({cap} MHz), got {low}")
    todo = plan(cap, gpus, configured, applied, p["persistence_mode"], min_mhz=low, verify=verify)
    changed = bool(todo["commands"]) or todo["write_state"]
    result.update(
        changed=changed,
        commands=[f"nvidia-smi {' '.join(c)}" for c in todo["commands"]],
        reasons=todo["reasons"],
        diff=state_diff(p["state_file"], configured, cap, GPU_KEY),
    )
    if changed and not module.check_mode:
        try:
            verify = apply(module, smi, todo, p) or verify
            gpus = smi.gpus(latched_below)
        except (ClockError, OSError) as err:
            module.fail_json(msg=str(err), **result)
        result["applied"] = cap
    for warning in latched_warnings(gpus, latched_below):
        module.warn(warning)
    shown = verify if verify and verify["cap"] == cap and verify["min"] == low else None
    for warning in not_taken_warning(shown):
        module.warn(warning)
    module.exit_json(
        cap_mhz=cap,
        gpus=gpus,
        latched=any(g["latched"] for g in gpus),
        in_effect=not module.check_mode or not changed,
        verify=verify,
        pinned=pinned(shown, cap),
        report=report(cap, result["applied"], gpus, latched_below, shown),
        **result,
    )


if __name__ == "__main__":
    main()

#!/usr/bin/python
"""Ansible module: cap (or reset) the GPU clocks of a node with nvidia-smi, idempotently."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_clocks
short_description: Cap the GPU SM clock with nvidia-smi (query, compare, set, verify) and record it
description:
  - >-
    Reads the GPUs with C(nvidia-smi --query-gpu) and their compute processes with
    C(nvidia-smi --query-compute-apps), the cap this node is configured with (the state file sparkfleet
    writes, because nvidia-smi does not report a lock range) and the cap applied since this boot (a marker
    under /run, which a reboot empties, as it empties the GPU's lock).
  - >-
    Sets only what differs. C(cap_mhz > 0) runs C(nvidia-smi -lgc <min_mhz>,<cap>); C(cap_mhz = 0) runs
    C(nvidia-smi -rgc) (stock clocks). With I(persistence_mode), C(nvidia-smi -pm 1) runs first; its
    failure is a warning, never the end of the run (the GB10 receipts run without it).
  - >-
    Judges each GPU's activity. C(idle) when the driver reports the clock event reason C(GPU idle) (0x1), or
    0 % utilization with no compute process; C(busy) when a compute process runs on it, its utilization is
    at least 50 % or it reports C(SW power cap) (0x4, which only bites under load); else C(unknown). An idle
    GPU drops its SM clock far below its maximum (a real H200 on driver 580: 345 MHz idle, 1500 MHz under
    load), so a low clock means something only under load.
  - >-
    After setting, samples the SM clock (I(verify_samples) times, I(verify_interval_ms) apart) and records
    the verdict under /run (C(gpu.verify)), since C(nvidia-smi -lgc) can answer success without pinning the
    clock. A sample above the cap is a cap that did not take (C(not-taken): a warning and C(pinned=false));
    no sample above it proves the cap only when the GPU was busy (C(held)); with the GPU idle throughout
    the verdict is C(unverified) (C(pinned=null)): an idle clock is low whatever the cap.
  - >-
    A cap is re-applied when an SM clock runs above it although it took before (the lock was lost, e.g.
    after a GPU reset); one that did not take in this boot is reported again, not re-applied every run.
  - >-
    Flags a GPU whose SM clock is under I(latched_below_mhz) while it is busy: a latched GB10 needs an AC
    power cycle. An idle GPU, or one whose activity is unknown, is never flagged and never told to power
    cycle; the report says the latch check needs the GPU under load.
  - >-
    With I(state=query) the report is read-only and degrades: GPUs that cannot be read (no nvidia-smi, an
    error) are a line saying so and C(gpu_error), not a failure.
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
    description: An SM clock under this value while the GPU is busy means a latched GPU.
    type: int
    default: 1000
  cpu:
    description: >-
      The CPU cap in the same round trip (what C(sparkfleet.cluster.cpu_clocks) does with these options),
      returned as C(cpu); the task is changed when either cap changed.
    type: dict
    suboptions:
      cap_mhz:
        description: CPU clock cap in MHz; 0 = stock.
        type: int
        required: true
      cpufreq_root:
        description: The cpufreq sysfs directory.
        type: path
        default: /sys/devices/system/cpu/cpufreq
      state_file:
        description: What sparkfleet configured.
        type: path
        default: /var/lib/sparkfleet/clocks/cpu.conf
  observe:
    description: >-
      (state=present) Paths and units to read in the same round trip (nothing is changed): each path's sha256,
      mode and owner, each unit's UnitFileState and NeedDaemonReload, returned as C(observed) for the filter
      C(sparkfleet.cluster.files_pending), so the role's files task (the boot-time clock unit) runs only when
      something differs.
    type: dict
    suboptions:
      paths:
        description: Files (and directories) to read.
        type: list
        elements: path
        default: []
      units:
        description: systemd units to read.
        type: list
        elements: str
        default: []
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
in_effect:
  description: >-
    The configured cap is the one applied since this boot; stock wanted (0 or never configured) with
    nothing else applied counts as in effect (a boot starts at stock).
  type: bool
  returned: always
verify:
  description: >-
    The check after applying: {min, cap, result (held, not-taken, unverified, stock), sm_mhz} (null: none).
  type: dict
  returned: always
pinned:
  description: >-
    False when the cap did not take (an SM clock sample above it); true when it held with the GPU busy;
    null without a cap or check, or when the GPU idled throughout the check.
  type: bool
  returned: always
gpus:
  description: >-
    Per GPU index, name, uuid, persistence_mode, sm_mhz, max_sm_mhz, event_reasons, event_reason_names,
    utilization_pct, processes, activity (idle, busy, unknown), activity_why, latched.
  type: list
  returned: always
latched:
  description: Whether any GPU runs under latched_below_mhz while busy.
  type: bool
  returned: always
gpu_error:
  description: Why the GPUs could not be read (state=query; null when they were read).
  type: str
  returned: always
commands:
  description: The nvidia-smi changes run (or that would run in check mode).
  type: list
  returned: always
report:
  description: Human lines for C(sparkfleet clocks show).
  type: list
  returned: always
cpu:
  description: >-
    With O(cpu), the result C(sparkfleet.cluster.cpu_clocks) returns (cap_mhz, policies, skipped_reason,
    report, ...).
  type: dict
  returned: when O(cpu) is set and O(state=present)
observed:
  description: >-
    With O(observe): C(paths) (path to its sha256, mode, uid and gid, or null when missing) and C(other_units)
    (unit name to its C(enabled) state and C(need_reload), or null when systemctl cannot show it).
  type: dict
  returned: when O(observe) is set and O(state=present)
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
    STATE_DIR,
    read_cap,
    read_verify,
    state_diff,
    state_text,
    verdict,
    verify_text,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.cpu_freq import (
    ARGUMENT_SPEC as CPU_ARGUMENT_SPEC,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.cpu_freq import CpuClockError
from ansible_collections.sparkfleet.cluster.plugins.module_utils.cpu_freq import run as cpu_run
from ansible_collections.sparkfleet.cluster.plugins.module_utils.fileio import write_atomic
from ansible_collections.sparkfleet.cluster.plugins.module_utils.files_state import observe, unit_files

QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "persistence_mode",
    "clocks.sm",
    "clocks.max.sm",
    "clocks_event_reasons.active",
    "utilization.gpu",
)
QUERY = ",".join(QUERY_FIELDS)
APPS_QUERY = "gpu_uuid,pid,process_name"
# Other spellings nvidia-smi accepts for the same fields (nvidia-smi --help-query-gpu).
ALIASES = {
    "clocks.current.sm": "clocks.sm",
    "clocks_throttle_reasons.active": "clocks_event_reasons.active",
    "gpu_uuid": "uuid",
    "gpu_name": "name",
}
IDLE_BIT = 0x1
SW_POWER_CAP_BIT = 0x4
BUSY_UTILIZATION_PCT = 50
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
UNDER_LOAD_HINT = "`sparkfleet clocks show` while the engine serves"


class ClockError(Exception):
    pass


def _number(text: str | None) -> int | None:
    """'345', '345 MHz', '96 %' -> the integer; '[N/A]', '' and the like -> None."""
    match = re.fullmatch(r"(\d+)(?:\.\d+)?\s*(?:MHz|%)?", (text or "").strip())
    return int(match.group(1)) if match else None


def _reason_bits(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text, 16) if re.fullmatch(r"0x[0-9A-Fa-f]+", text) else None


def parse_processes(csv: str) -> dict[str, list[str]]:
    """`--query-compute-apps=gpu_uuid,pid,process_name --format=csv,noheader` -> GPU uuid -> ['pid name']."""
    out: dict[str, list[str]] = {}
    for line in csv.splitlines():
        cols = [c.strip() for c in line.split(",", 2)]
        if len(cols) == 3 and cols[1].isdigit():
            out.setdefault(cols[0], []).append(f"{cols[1]} ({cols[2]})")
    return out


def judge(gpu: dict, latched_below: int) -> dict:
    """The GPU's activity (idle, busy, unknown), why, and whether it is latched: a low clock while busy."""
    bits = _reason_bits(gpu.get("event_reasons"))
    util, procs = gpu.get("utilization_pct"), gpu.get("processes") or []
    if bits is not None and bits & IDLE_BIT:
        activity, why = "idle", "clock event reason GPU idle"
    elif procs:
        activity, why = "busy", f"compute process {procs[0]}"
    elif util is not None and util >= BUSY_UTILIZATION_PCT:
        activity, why = "busy", f"utilization {util} %"
    elif bits is not None and bits & SW_POWER_CAP_BIT:
        activity, why = "busy", "clock event reason SW power cap, which only bites under load"
    elif util == 0:
        activity, why = "idle", "utilization 0 %, no compute process"
    else:
        shown = "not reported" if util is None else f"{util} %"
        activity, why = "unknown", f"no idle reason, no compute process, utilization {shown}"
    sm = gpu.get("sm_mhz")
    return {
        **gpu,
        "activity": activity,
        "activity_why": why,
        "latched": activity == "busy" and sm is not None and sm < latched_below,
    }


def parse_gpus(
    csv: str,
    latched_below: int,
    fields: tuple[str, ...] | list[str] = QUERY_FIELDS,
    processes: dict[str, list[str]] | None = None,
    header: bool = False,
) -> list[dict]:
    """Rows of `--query-gpu=<fields>` (`--format=csv,noheader,nounits`, or with units; `header` skips the
    first line) -> one dict per GPU, judged (see judge). Lines starting with # are comments (recordings)."""
    names = [ALIASES.get(f.strip(), f.strip()) for f in fields]
    lines = [ln for ln in csv.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    gpus = []
    for position, line in enumerate(lines[1:] if header else lines):
        cols = [c.strip() for c in line.split(",")]
        if len(cols) != len(names):
            raise ClockError(f"unexpected nvidia-smi output line (want {len(names)} fields): {line!r}")
        row = dict(zip(names, cols, strict=True))
        bits = _reason_bits(row.get("clocks_event_reasons.active"))
        uuid = row.get("uuid")
        gpu = {
            "index": _number(row.get("index")) if "index" in row else position,
            "name": row.get("name", "GPU"),
            "uuid": uuid,
            "persistence_mode": row.get("persistence_mode"),
            "sm_mhz": _number(row.get("clocks.sm")),
            "max_sm_mhz": _number(row.get("clocks.max.sm")),
            "event_reasons": row.get("clocks_event_reasons.active"),
            "event_reason_names": [n for b, n in sorted(REASON_NAMES.items()) if bits and bits & b],
            "utilization_pct": _number(row.get("utilization.gpu")),
            "processes": (processes or {}).get(uuid or "", []),
        }
        gpus.append(judge(gpu, latched_below))
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


def stock_or_applied(configured: int | None, applied: int | None) -> bool:
    """The configured cap is in effect: the one applied since this boot, or stock wanted (0 or never
    configured) with no cap applied (a boot starts at stock clocks)."""
    return configured == applied or (configured in (None, 0) and applied in (None, 0))


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

    def processes(self) -> dict[str, list[str]]:
        """Compute processes per GPU uuid; none when the query is refused (they only add evidence of load)."""
        rc, out, _err = self.module.run_command(
            [self.path, f"--query-compute-apps={APPS_QUERY}", "--format=csv,noheader"]
        )
        return parse_processes(out) if rc == 0 else {}

    def gpus(self, latched_below: int) -> list[dict]:
        out = self.run([f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"])
        return parse_gpus(out, latched_below, processes=self.processes())

    def sample(self, count: int, interval_s: float, latched_below: int) -> list[tuple[int, bool]]:
        """(the highest SM clock of all GPUs, whether any GPU was busy), `count` times, `interval_s` apart."""
        out = []
        for i in range(max(1, count)):
            if i:
                time.sleep(interval_s)
            gpus = [g for g in self.gpus(latched_below) if g["sm_mhz"] is not None]
            if gpus:
                out.append((max(g["sm_mhz"] for g in gpus), any(g["activity"] == "busy" for g in gpus)))
        return out


def not_taken_warning(verify: dict | None) -> list[str]:
    if not verify or verify["result"] != "not-taken":
        return []
    return [
        f"nvidia-smi -lgc {verify['min']},{verify['cap']} answered success, but the SM clock ran at "
        f"{verify['sm_mhz']} MHz right after, above the {verify['cap']} MHz cap: the cap did not take. "
        "GB10 can accept -lgc without pinning the clock (it has no supported-clock table to pin to); check "
        f"the clock under load with {UNDER_LOAD_HINT}."
    ]


def latched_warnings(gpus: list[dict], latched_below: int) -> list[str]:
    return [
        f"GPU {g['index']} ({g['name']}) runs its SM clock at {g['sm_mhz']} MHz under load "
        f"({g['activity_why']}), under {latched_below} MHz: the GPU is latched in a low-clock state. A clock "
        "reset or reboot does not clear it; power-cycle the Spark at the wall (shut down, unplug AC for "
        "30 s, plug in, boot)."
        for g in gpus
        if g["latched"]
    ]


def warn_all(module: AnsibleModule, gpus: list[dict], latched_below: int, shown: dict | None) -> None:
    """The run's warnings: each latched GPU, and a cap that did not take."""
    for warning in latched_warnings(gpus, latched_below) + not_taken_warning(shown):
        module.warn(warning)


def _cap_line(configured: int | None, applied: int | None) -> str:
    if configured is None:
        if applied in (None, 0):
            return (
                "GPU cap: never configured by sparkfleet: stock clocks (nvidia-smi does not report a lock, "
                "so one set by hand with nvidia-smi -lgc would not show here)"
            )
        return (
            f"GPU cap: never configured by sparkfleet, but {applied} MHz applied since this boot: "
            "run `sparkfleet clocks set <MHz>` or `sparkfleet clocks reset`"
        )
    what = "0 = stock clocks" if configured == 0 else f"{configured} MHz"
    if applied == configured:
        return f"GPU cap: {what}, applied since this boot"
    if configured == 0 and applied is None:
        return "GPU cap: 0 = stock clocks (nothing applied since this boot, and a boot starts at stock)"
    return (
        f"GPU cap: {what} configured but NOT applied since this boot "
        f"({'nothing' if applied is None else f'{applied} MHz'} applied): "
        "check `systemctl status sparkfleet-clocks` or run `sparkfleet clocks set`"
    )


def _verify_line(verify: dict | None, applied: int | None) -> list[str]:
    if not verify or applied is None or verify["cap"] != applied or applied <= 0:
        return []
    if verify["result"] == "not-taken":
        return [
            f"GPU cap check: NOT TAKEN: right after -lgc {verify['min']},{verify['cap']} the SM clock "
            f"ran at {verify['sm_mhz']} MHz, above the cap (-lgc answered success without pinning)"
        ]
    if verify["result"] == "unverified":
        return [
            f"GPU cap check: not verified: the GPU idled right after -lgc {verify['min']},{verify['cap']} "
            f"(highest SM {verify['sm_mhz']} MHz), and an idle clock is low whatever the cap; "
            f"{UNDER_LOAD_HINT} checks it under load"
        ]
    return [
        f"GPU cap check: held: no SM clock sample above {verify['cap']} MHz under load right after -lgc "
        f"{verify['min']},{verify['cap']} (highest {verify['sm_mhz']} MHz)"
    ]


def _gpu_lines(g: dict, latched_below: int, applied: int | None) -> list[str]:
    names = ", ".join(g["event_reason_names"]) or "none"
    util = "not reported" if g["utilization_pct"] is None else f"{g['utilization_pct']} %"
    lines = [
        f"GPU {g['index']} {g['name']}: SM {g['sm_mhz']} MHz (max {g['max_sm_mhz']} MHz), "
        f"persistence {g['persistence_mode']}, clock event reasons {g['event_reasons']} ({names}), "
        f"utilization {util}: {g['activity']} ({g['activity_why']})"
    ]
    low = g["sm_mhz"] is not None and g["sm_mhz"] < latched_below
    if g["latched"]:
        lines.append(
            f"GPU {g['index']}: LATCHED: SM clock {g['sm_mhz']} MHz under load is under {latched_below} MHz; "
            "only an AC power cycle clears it (shut down, unplug for 30 s)"
        )
    elif low and g["activity"] == "idle":
        lines.append(
            f"GPU {g['index']}: idle: SM {g['sm_mhz']} MHz is its idle clock, not a fault; whether it is "
            f"latched shows only under load ({UNDER_LOAD_HINT})"
        )
    elif low:
        lines.append(
            f"GPU {g['index']}: SM {g['sm_mhz']} MHz with no sign of load or idle: not judged; "
            f"{UNDER_LOAD_HINT} tells a latched GPU from an idle one"
        )
    if (
        g["activity"] == "busy"
        and applied
        and applied > 0
        and g["sm_mhz"] is not None
        and g["sm_mhz"] > applied
    ):
        lines.append(
            f"GPU {g['index']}: SM {g['sm_mhz']} MHz under load, above the {applied} MHz cap: the cap is not "
            "holding (GB10 can accept -lgc without pinning); `sparkfleet clocks set` re-applies it"
        )
    return lines


def report(
    configured: int | None,
    applied: int | None,
    gpus: list[dict],
    latched_below: int,
    verify: dict | None = None,
    *,
    gpu_error: str | None = None,
) -> list[str]:
    """Human lines for `sparkfleet clocks show`."""
    lines = [_cap_line(configured, applied), *_verify_line(verify, applied)]
    if gpu_error:
        lines.append(f"GPU clocks not read: {gpu_error}")
    for g in gpus:
        lines += _gpu_lines(g, latched_below, applied)
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
        peak = max((mhz for mhz, _busy in samples), default=None)
        verify = {"min": low, "cap": cap, "result": verdict(cap, samples), "sm_mhz": peak}
        write_atomic(p["verify_file"], verify_text(low, cap, verify["result"], peak))
    if todo["write_state"]:
        write_atomic(p["state_file"], state_text(cap, GPU_KEY))
    write_atomic(p["applied_file"], f"{cap}\n")
    return verify


def pinned(v: dict | None, cap: int | None) -> bool | None:
    if not v or cap is None or cap <= 0 or v["cap"] != cap or v["result"] not in ("held", "not-taken"):
        return None
    return v["result"] == "held"


def query(module: AnsibleModule, p: dict, result: dict) -> None:
    """state=query: report, never fail on what cannot be read."""
    latched_below = p["latched_below_mhz"]
    configured, applied, verify = result["configured_before"], result["applied"], result["verify"]
    gpus, gpu_error = [], None
    try:
        gpus = Smi(module, p["nvidia_smi"]).gpus(latched_below)
    except ClockError as err:
        gpu_error = str(err)
    shown = verify if verify and verify["cap"] == applied else None
    warn_all(module, gpus, latched_below, shown)
    module.exit_json(
        cap_mhz=configured,
        gpus=gpus,
        gpu_error=gpu_error,
        latched=any(g["latched"] for g in gpus),
        in_effect=stock_or_applied(configured, applied),
        pinned=pinned(shown, applied),
        report=report(configured, applied, gpus, latched_below, verify, gpu_error=gpu_error),
        **result,
    )


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "cap_mhz": {"type": "int"},
            "min_mhz": {"type": "int", "default": 0},
            "state": {"type": "str", "choices": ["present", "query"], "default": "present"},
            "persistence_mode": {"type": "bool", "default": False},
            "state_file": {"type": "path", "default": f"{STATE_DIR}/clocks/gpu.conf"},
            "applied_file": {"type": "path", "default": "/run/sparkfleet/clocks/gpu.applied"},
            "verify_file": {"type": "path", "default": "/run/sparkfleet/clocks/gpu.verify"},
            "verify_samples": {"type": "int", "default": 5},
            "verify_interval_ms": {"type": "int", "default": 200},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "latched_below_mhz": {"type": "int", "default": 1000},
            "cpu": {
                "type": "dict",
                "options": {"cap_mhz": {"type": "int", "required": True}, **CPU_ARGUMENT_SPEC},
            },
            "observe": {
                "type": "dict",
                "options": {
                    "paths": {"type": "list", "elements": "path", "default": []},
                    "units": {"type": "list", "elements": "str", "default": []},
                },
            },
        },
        required_if=[("state", "present", ["cap_mhz"])],
        supports_check_mode=True,
    )
    p = module.params
    latched_below = p["latched_below_mhz"]
    configured = read_cap(p["state_file"], GPU_KEY)
    applied = read_cap(p["applied_file"], GPU_KEY)
    verify = read_verify(p["verify_file"])
    result = {
        "changed": False,
        "configured_before": configured,
        "applied": applied,
        "verify": verify,
        "commands": [],
        "reasons": [],
    }
    if p["state"] == "query":
        query(module, p, result)
        return

    try:
        smi = Smi(module, p["nvidia_smi"])
        gpus = smi.gpus(latched_below)
    except ClockError as err:
        module.fail_json(msg=str(err))
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
    result["verify"] = verify
    shown = verify if verify and verify["cap"] == cap and verify["min"] == low else None
    warn_all(module, gpus, latched_below, shown)
    if p["cpu"]:
        c = p["cpu"]
        try:
            cpu = cpu_run(c["cap_mhz"], "present", c["cpufreq_root"], c["state_file"], module.check_mode)
        except CpuClockError as err:
            module.fail_json(msg=str(err), **result)
        result["diff"] = [result["diff"], cpu.pop("diff")]
        result["changed"] = result["changed"] or cpu["changed"]
        result["cpu"] = cpu
    if p["observe"]:
        result["observed"] = {
            "paths": observe(p["observe"]["paths"]),
            "other_units": unit_files(
                module.run_command, module.get_bin_path("systemctl"), p["observe"]["units"]
            ),
        }
    module.exit_json(
        cap_mhz=cap,
        gpus=gpus,
        gpu_error=None,
        latched=any(g["latched"] for g in gpus),
        in_effect=not module.check_mode or not changed,
        pinned=pinned(shown, cap),
        report=report(cap, result["applied"], gpus, latched_below, shown),
        **result,
    )


if __name__ == "__main__":
    main()

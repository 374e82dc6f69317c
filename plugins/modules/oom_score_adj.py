#!/usr/bin/python
"""Ansible module: set oom_score_adj of running systemd services' main processes, idempotently."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: oom_score_adj
short_description: Give the running main process of systemd units an oom_score_adj
description:
  - For each unit that exists and runs, reads C(/proc/<MainPID>/oom_score_adj) and writes I(value) where
    the score is higher. This is the live half of an C(OOMScoreAdjust=) drop-in; systemd applies the drop-in
    at the next start, and restarting docker would stop the engine.
  - A score already at or below I(value) is kept, never raised - the process is already as safe from the
    OOM killer as asked, or safer. OpenSSH's sshd sets its own to -1000 when it starts on Linux, after
    systemd applied the drop-in (seen on the VM lab's real kernel - -900 written over sshd's -1000 would
    have made it killable sooner, and every check-mode run reported that as a change).
  - Lowering a score needs CAP_SYS_RESOURCE. Where the node does not grant it (a container), the unit is
    reported in C(not_applied) with the reason and a warning; nothing is claimed as done.
  - Supports check mode.
options:
  units:
    description: systemd units (absent or stopped ones are listed in C(absent) / C(stopped)).
    type: list
    elements: str
    required: true
  value:
    description: The oom_score_adj, -1000..1000.
    type: int
    required: true
  proc_root:
    description: Where /proc is (tests).
    type: path
    default: /proc
  systemctl:
    description: The systemctl executable.
    type: str
    default: systemctl
author: sparkfleet developers
"""

RETURN = r"""
units:
  description: Per unit id, pid, before, after, state (set; ok when at or below the value; absent, stopped,
    not_applied) and reason.
  type: list
  returned: always
not_applied:
  description: Units whose running process could not be given the score, with the reason.
  type: list
  returned: always
"""

EXAMPLES = r"""
- name: Keep the OOM killer away from ssh and docker now (their drop-ins act at the next start)
  sparkfleet.cluster.oom_score_adj:
    units: [ssh.service, docker.service, containerd.service]
    value: -900
"""

import errno
import os

from ansible.module_utils.basic import AnsibleModule


def unit_info(module: AnsibleModule, systemctl: str, unit: str) -> dict:
    rc, out, err = module.run_command([systemctl, "show", "-p", "Id,LoadState,MainPID", "--", unit])
    if rc != 0:
        module.fail_json(msg=f"systemctl show {unit} failed: {err.strip() or out.strip()}")
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return {
        "unit": unit,
        "id": props.get("Id", unit),
        "loaded": props.get("LoadState") == "loaded",
        "pid": int(props.get("MainPID") or 0),
    }


CAP_SYS_RESOURCE = 24


def has_cap_sys_resource(proc_root: str) -> bool:
    """Lowering an oom_score_adj needs CAP_SYS_RESOURCE (the lab's containers lack it)."""
    try:
        with open(os.path.join(proc_root, "self", "status"), encoding="ascii") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    except (OSError, ValueError):
        pass
    return True  # unknown: try, and report what the kernel says


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "units": {"type": "list", "elements": "str", "required": True},
            "value": {"type": "int", "required": True},
            "proc_root": {"type": "path", "default": "/proc"},
            "systemctl": {"type": "str", "default": "systemctl"},
        },
        supports_check_mode=True,
    )
    p = module.params
    if not -1000 <= p["value"] <= 1000:
        module.fail_json(msg=f"value must be within -1000..1000, got {p['value']}")
    systemctl = module.get_bin_path(p["systemctl"], required=True)
    results, not_applied, changed = [], [], False
    may_lower = has_cap_sys_resource(p["proc_root"])
    for unit in p["units"]:
        info = unit_info(module, systemctl, unit)
        if not info["loaded"]:
            results.append({**info, "state": "absent"})
            continue
        if not info["pid"]:
            results.append({**info, "state": "stopped"})
            continue
        path = os.path.join(p["proc_root"], str(info["pid"]), "oom_score_adj")
        try:
            with open(path, encoding="ascii") as fh:
                before = int(fh.read().strip())
        except (OSError, ValueError) as err:
            module.fail_json(msg=f"cannot read {path} ({info['id']}): {err}")
        entry = {**info, "before": before, "after": before, "state": "ok"}
        if before <= p["value"]:
            results.append(entry)  # as protected as asked, or more (sshd's own -1000): never raised
            continue
        error = None
        if p["value"] < before and not may_lower:
            error = "lowering it needs CAP_SYS_RESOURCE, which this node does not grant (a container)"
        elif not module.check_mode:
            try:
                with open(path, "w", encoding="ascii") as fh:
                    fh.write(f"{p['value']}\n")
            except OSError as err:
                if err.errno not in (errno.EACCES, errno.EPERM):
                    module.fail_json(msg=f"cannot write {path} ({info['id']}): {err}")
                error = f"the kernel refused it ({err.strerror})"
        if error:
            reason = (
                f"{info['id']} (pid {info['pid']}) keeps oom_score_adj {before}: {error}; "
                "its OOMScoreAdjust drop-in applies where systemd may set it"
            )
            entry.update(state="not_applied", reason=reason)
            not_applied.append(reason)
            module.warn(reason)
        else:
            entry.update(after=p["value"], state="set")
            changed = True
        results.append(entry)
    module.exit_json(changed=changed, units=results, not_applied=not_applied)


if __name__ == "__main__":
    main()

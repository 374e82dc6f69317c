#!/usr/bin/python
"""Ansible module: bring live kernel parameters (/proc/sys) to the values of sparkfleet's drop-in."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sysctl
short_description: Validate sysctl keys and set their live values where they differ
description:
  - Every key must exist under I(proc_sys) (an unknown or misspelled key fails, naming it).
  - With I(apply=true), writes the live value of each key that differs (what C(sysctl -w) does).
    With I(apply=false) (a container, where /proc/sys is read-only) nothing is written and the keys whose
    live value differs are listed in C(not_applied).
  - The persistent half is the drop-in file in /etc/sysctl.d, written by the role's template.
  - Why not C(ansible.posix.sysctl) - it takes one key a task (a round trip per key and node), writes its own
    file, and fails where /proc/sys is read-only; this module checks every key in one call, refuses one the
    kernel does not have, and lists what it could not apply in a container.
  - Supports check mode.
options:
  settings:
    description: Key (dotted, e.g. vm.swappiness) to value.
    type: dict
    required: true
  apply:
    description: Write live values.
    type: bool
    default: true
  proc_sys:
    description: Where /proc/sys is (tests).
    type: path
    default: /proc/sys
author: sparkfleet developers
"""

RETURN = r"""
keys:
  description: Per key its wanted and live value and state (ok, set, not_applied).
  type: list
  returned: always
not_applied:
  description: Keys whose live value differs and was not written.
  type: list
  returned: always
"""

EXAMPLES = r"""
- name: Apply the memory sysctls
  sparkfleet.cluster.sysctl:
    settings: {vm.swappiness: 10, vm.watermark_boost_factor: 0}
"""

import os

from ansible.module_utils.basic import AnsibleModule


def normalize(value: object) -> str:
    return " ".join(str(value).split())


def key_path(proc_sys: str, key: str) -> str:
    return os.path.join(proc_sys, *key.split("."))


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "settings": {"type": "dict", "required": True},
            "apply": {"type": "bool", "default": True},
            "proc_sys": {"type": "path", "default": "/proc/sys"},
        },
        supports_check_mode=True,
    )
    p = module.params
    unknown = [k for k in p["settings"] if not os.path.isfile(key_path(p["proc_sys"], k))]
    if unknown:
        module.fail_json(
            msg=f"unknown sysctl key(s) {', '.join(sorted(unknown))}: no such file under {p['proc_sys']}"
        )
    keys, not_applied, changed = [], [], False
    for key, wanted in sorted(p["settings"].items()):
        path = key_path(p["proc_sys"], key)
        with open(path, encoding="ascii") as fh:
            live = normalize(fh.read())
        entry = {"key": key, "wanted": normalize(wanted), "live": live, "state": "ok"}
        if live != entry["wanted"]:
            if not p["apply"]:
                entry["state"] = "not_applied"
                not_applied.append(key)
            else:
                changed = True
                entry["state"] = "set"
                if not module.check_mode:
                    try:
                        with open(path, "w", encoding="ascii") as fh:
                            fh.write(entry["wanted"] + "\n")
                    except OSError as err:
                        module.fail_json(msg=f"setting {key} = {entry['wanted']} failed: {err}", keys=keys)
                    with open(path, encoding="ascii") as fh:
                        entry["live"] = normalize(fh.read())
                    if entry["live"] != entry["wanted"]:
                        module.fail_json(
                            msg=f"{key}: wrote {entry['wanted']}, the kernel reports {entry['live']}",
                            keys=keys,
                        )
        keys.append(entry)
    module.exit_json(changed=changed, keys=keys, not_applied=not_applied)


if __name__ == "__main__":
    main()

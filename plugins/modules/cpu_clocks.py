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

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils.cpu_freq import (
    ARGUMENT_SPEC,
    CpuClockError,
    run,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "cap_mhz": {"type": "int"},
            "state": {"type": "str", "choices": ["present", "query"], "default": "present"},
            **ARGUMENT_SPEC,
        },
        required_if=[("state", "present", ["cap_mhz"])],
        supports_check_mode=True,
    )
    p = module.params
    try:
        result = run(p["cap_mhz"], p["state"], p["cpufreq_root"], p["state_file"], module.check_mode)
    except CpuClockError as err:
        module.fail_json(msg=str(err))
    module.exit_json(**result)


if __name__ == "__main__":
    main()

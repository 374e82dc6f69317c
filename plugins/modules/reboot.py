# sparkfleet.cluster.reboot is an action plugin (plugins/action/reboot.py); this file holds its
# documentation only, as ansible.builtin.reboot's own module file does.
from __future__ import annotations

DOCUMENTATION = r"""
module: reboot
short_description: Reboot a machine and wait for it, reporting the wait as it goes
description:
  - ansible.builtin.reboot (the same options, the same result), with its two waits (for the new boot,
    then for the test command) reported as they go, as async-poll events of the task
    (C(sparkfleet_progress)), so that a reboot of a cluster shows each node's state and how long it has
    waited at normal verbosity.
options:
  pre_reboot_delay: {type: int, default: 0, description: Seconds before the reboot.}
  post_reboot_delay: {type: int, default: 0, description: Seconds after the reboot command before the waits.}
  reboot_timeout: {type: int, default: 600, description: Seconds each wait may take.}
  connect_timeout: {type: int, description: Seconds for one connection attempt.}
  test_command: {type: str, default: whoami, description: The command that must succeed after the reboot.}
  msg: {type: str, default: Reboot initiated by Ansible, description: Shown to users before the reboot.}
  search_paths:
    type: list
    elements: str
    default: [/sbin, /bin, /usr/sbin, /usr/bin, /usr/local/sbin]
    description: Where to look for the shutdown command.
  boot_time_command:
    type: str
    default: cat /proc/sys/kernel/random/boot_id
    description: Prints something that changes with every boot.
  reboot_command: {type: str, description: The command that reboots (default by OS).}
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: Reboot every node at once and wait for each
  sparkfleet.cluster.reboot:
    reboot_timeout: 900
"""

RETURN = r"""
rebooted: {description: Whether the machine rebooted, type: bool, returned: always}
elapsed: {description: Seconds the reboot took, type: int, returned: always}
"""

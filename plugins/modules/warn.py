#!/usr/bin/python
# Documentation of the action plugin sparkfleet.cluster.warn (plugins/action/warn.py), as ansible-core
# documents its own action-only plugins: the action runs on the controller; no module is shipped.
from __future__ import annotations

DOCUMENTATION = r"""
module: warn
short_description: Show messages as Ansible warnings, changing nothing
description:
  - Each message becomes a warning in Ansible's output (and in the run's recap of C(sparkfleet)), for
    inputs that are accepted but should be improved (preflight, e.g. a short revision pin).
  - Runs on the controller only. It needs no connection to the host and ships no module.
  - With no messages it does nothing.
options:
  msgs:
    description: The messages; a single string is one message.
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    description: It changes nothing in either mode.
  action:
    support: full
    description: Runs as an action plugin on the controller.
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: Warn about inputs that are accepted but should be improved
  sparkfleet.cluster.warn:
    msgs:
      - "sparkfleet_pins.engine.commit is a short revision (a1b2c3d4): pin the full 40-hex commit"
"""

RETURN = r"""
msg:
  description: How many warnings were shown.
  type: str
  returned: always
"""

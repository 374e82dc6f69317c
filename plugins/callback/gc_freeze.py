"""Callback plugin `sparkfleet.cluster.gc_freeze`: the controller's loaded objects moved out of reach of
Python's cyclic garbage collector (`gc.freeze()`) once the playbook is loaded and again at each play's start.

Why: every task on every node runs in a worker process the controller forks for it. The worker shares the
controller's memory until it writes to a page; a collection of the oldest generation, in the controller or
in a worker, visits every tracked object (the loaded playbook, roles, plugins, inventory: 130,199 after a
TP2 `site.yml` loaded, 140,512 at its last play; `-vvv` prints the count) and writes to each one's header,
so it costs a full walk in the controller and, in a worker, a copy of every page it walks. Frozen objects
are never visited: the controller's collections walk only what the run made since the last freeze, and a
worker's only what it made itself. Measured side by side on a no-op TP2 `site.yml` (`make bench`, rows
"heap frozen before forks" and "peak memory, heap frozen"; README "Speed").

What is frozen is what the controller holds at `v2_playbook_on_start` (the playbook just loaded) and at
every `v2_playbook_on_play_start` (the play's roles and variables), never at a task's start: garbage a task
leaves is still collected, so the controller's memory does not grow with the number of tasks. Nothing is
printed, no result changes; a frozen object is still freed when its last reference goes (reference
counting), only cycles among frozen objects wait for the end of the run.
"""

from __future__ import annotations

import gc
from typing import Any

from ansible.plugins.callback import CallbackBase
from ansible.utils.display import Display

DOCUMENTATION = r"""
name: gc_freeze
short_description: Freezes the controller's loaded objects before the workers are forked
description:
  - Calls Python's C(gc.freeze()) when the playbook is loaded and at the start of each play, so the
    garbage collector of the controller and of each forked worker process no longer walks the loaded
    playbook, roles, plugins and inventory.
  - Prints nothing and changes no result. Garbage a task leaves is still collected (nothing is frozen at a
    task's start).
type: aggregate
requirements:
  - enabled in C(callbacks_enabled) (sparkfleet's ansible.cfg enables it)
author: sparkfleet developers
version_added: 2.0.0
"""

display = Display()


def freeze() -> int:
    """Move every object the collector tracks into its permanent generation; how many are frozen now."""
    gc.freeze()
    return gc.get_freeze_count()


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "sparkfleet.cluster.gc_freeze"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook: Any) -> None:
        display.vvv(f"{self.CALLBACK_NAME}: {freeze()} objects frozen after the playbook's load")

    def v2_playbook_on_play_start(self, play: Any) -> None:
        display.vvv(f"{self.CALLBACK_NAME}: {freeze()} objects frozen at the play's start")

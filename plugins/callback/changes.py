"""Callback plugin `sparkfleet.cluster.changes`: counts, in the controller, the task results of this run that
changed something (or failed, or found a node unreachable), so a phase gate knows whether a read taken earlier
in the run still holds.

Why: preflight layer 2 re-reads every phase record of a node in its one round trip (module preflight_facts,
option phase_dir). A gate later in the same run (plugins/action/phase_state.py) takes that read instead of a
round trip of its own only while this count is 0: nothing in the run has changed anything yet, on any node, so
the state read then is the state now. After the first change, failure or unreachable node, every gate reads
again, as without this plugin. The count lives in the controller process; each task's worker is forked from it
after the results of the tasks before it were counted (the linear strategy waits for every host's result of a
task before it starts the next), so the worker sees the count as of its task's start.

Nothing is printed and no result is changed. Not enabled (another ansible.cfg): the gates always read.
"""

from __future__ import annotations

from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: changes
short_description: Counts this run's changed, failed and unreachable results for the phase gates
description:
  - Keeps, in the controller, how many task results of this run changed something, failed or found a host
    unreachable. The action C(sparkfleet.cluster.phase_state) takes preflight layer 2's read of a phase record
    instead of a round trip of its own only while that count is 0 (docs/design.md "Phase gates").
  - Prints nothing and changes no result. Without it every gate makes its own round trip.
type: aggregate
requirements:
  - enabled in C(callbacks_enabled) (sparkfleet's ansible.cfg enables it)
author: sparkfleet developers
version_added: 2.0.0
"""

# Read by plugins/action/phase_state.py in the task's worker (a fork of this process): active once a playbook
# started with this plugin enabled; changed counts over the whole ansible-playbook command and is never reset
# (with several playbooks in one command, a count per playbook could trust a read an earlier one outdated).
STATE: dict[str, Any] = {"active": False, "changed": 0}


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "sparkfleet.cluster.changes"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook: Any) -> None:
        STATE["active"] = True

    def v2_runner_on_ok(self, result: Any) -> None:
        if result.is_changed():
            STATE["changed"] += 1

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        STATE["changed"] += 1  # a failed task may have changed part of what it was to change

    def v2_runner_on_unreachable(self, result: Any) -> None:
        STATE["changed"] += 1

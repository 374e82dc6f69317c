# ansible.builtin.reboot, with the wait reported as it goes: each check for the new boot and each try of
# the test command is sent as an async-poll event of the task (plugin_utils/progress.py), so `sparkfleet
# reboot` shows every node's state (going down, waiting for the new boot, answering again) and how long
# it has waited, at normal verbosity. The reboot itself is ansible's own, unchanged.
from __future__ import annotations

import time

from ansible_collections.sparkfleet.cluster.plugins.module_utils.text_format import duration
from ansible_collections.sparkfleet.cluster.plugins.plugin_utils.ansible_private import reboot_action
from ansible_collections.sparkfleet.cluster.plugins.plugin_utils.progress import (
    PROGRESS_DATA_KEY,
    PROGRESS_KEY,
    report,
)

# ansible.builtin.reboot's names for its two waits -> what a person reads
STEPS = {
    "last boot time check": "waiting for the new boot",
    "post-reboot test command": "waiting for it to answer",
}


# ansible.builtin.reboot's class: its two steps overridden below are internals
# (plugin_utils/ansible_private.py, seam 2: REBOOT_STEPS)
RebootAction = reboot_action()


class ActionModule(RebootAction):
    # ansible.builtin.reboot's own arguments, unchanged (plugins/modules/reboot.py documents them)
    _VALID_ARGS = frozenset(
        (
            "boot_time_command",
            "connect_timeout",
            "msg",
            "post_reboot_delay",
            "pre_reboot_delay",
            "reboot_command",
            "reboot_timeout",
            "search_paths",
            "test_command",
        )
    )
    _started = 0.0

    def run(self, tmp=None, task_vars=None):
        self._started = time.monotonic()
        return super().run(tmp, task_vars)

    def _progress(self, note: str, *, last: bool = False) -> None:
        """One report of the wait; `last`: the step's final word (`finished`: always shown, never
        throttled away by a display that prints at most a line every few seconds per host)."""
        waited = time.monotonic() - self._started
        report(
            self._task,
            {
                "started": 1,
                "finished": 1 if last else 0,
                PROGRESS_KEY: f"reboot: {note} ({duration(waited)})",
                PROGRESS_DATA_KEY: {"label": "reboot", "elapsed_s": round(waited, 1)},
            },
        )

    def perform_reboot(self, task_vars, distribution):
        result = super().perform_reboot(task_vars, distribution)
        if not result.get("failed"):
            self._progress("reboot command sent", last=True)
        return result

    def do_until_success_or_timeout(
        self, action, reboot_timeout, action_desc, distribution, action_kwargs=None
    ):
        step = STEPS.get(action_desc, action_desc or "waiting")
        attempts = 0

        def watched(**kwargs):
            nonlocal attempts
            attempts += 1
            try:
                return action(**kwargs)
            except Exception as exc:
                lines = str(exc).strip().splitlines()
                why = lines[-1][:120] if lines else type(exc).__name__
                self._progress(f"{step}, try {attempts} (timeout {reboot_timeout} s): {why}")
                raise

        super().do_until_success_or_timeout(watched, reboot_timeout, action_desc, distribution, action_kwargs)
        self._progress(f"{step}: done after {attempts} tr{'y' if attempts == 1 else 'ies'}", last=True)

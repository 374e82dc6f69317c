# Wait for an async model_weights task and report its progress between polls (runs on the controller).
# Each poll is sent as an async-poll event of this task (plugin_utils/progress.py): bytes done/total,
# rate and ETA, per worker for a copy, reach sparkfleet's display and every callback at normal verbosity.
from __future__ import annotations

import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.sparkfleet.cluster.plugins.plugin_utils.progress import (
    PROGRESS_DATA_KEY,
    PROGRESS_KEY,
    from_status_file,
    report,
)

display = Display()

INTERNAL = (
    "started",
    "finished",
    "ansible_job_id",
    "results_file",
    "_ansible_suppress_tmpdir_delete",
    "invocation",
)


def poll_event(job: dict, poll: dict, finished: bool) -> dict:
    """One poll as an async-poll result; every poll is reported, the last one too (where the step
    ended: 100 %, per worker)."""
    status = poll.get("progress") or {}
    if not finished and status.get("state") != "running":
        status = {}  # the last run's file, until this job writes its first progress
    event = {"ansible_job_id": job.get("ansible_job_id"), "started": 1, "finished": int(finished)}
    if status.get("line"):
        event.update({PROGRESS_KEY: status["line"], PROGRESS_DATA_KEY: from_status_file(status)})
    return event


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("job", "status_file", "interval", "timeout"))
    _requires_connection = True

    def _results_file(self, job: dict) -> str | None:
        if job.get("results_file"):
            return job["results_file"]
        if job.get("ansible_job_id"):
            # mitogen's async (SPARKFLEET_STRATEGY=mitogen) registers no results_file; its job file is
            # where ansible's own would be: async_dir/JOB_ID on the node.
            async_dir = self.get_shell_option("async_dir", default="~/.ansible_async")
            return f"{async_dir.rstrip('/')}/{job['ansible_job_id']}"
        return None

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        job = args.get("job") or {}
        if job.get("skipped"):
            result.update(skipped=True, msg="the task was skipped")
            return result
        results_file = self._results_file(job)
        if not results_file:
            result.update(
                failed=True, msg="job: pass the registered result of a task run with async and poll: 0"
            )
            return result
        interval = max(1, int(args.get("interval") or 10))
        timeout = int(args.get("timeout") or 86400)
        host = task_vars.get("inventory_hostname", "?") if task_vars else "?"
        start = time.monotonic()
        last_line = None
        last_print = 0.0
        while True:
            poll = self._execute_module(
                module_name="sparkfleet.cluster.weights_wait",
                module_args={"results_file": results_file, "status_file": args.get("status_file")},
                task_vars=task_vars,
            )
            if poll.get("failed") or poll.get("unreachable"):
                result.update(failed=True, msg=f"polling the job failed: {poll.get('msg')}")
                return result
            finished = bool(poll.get("finished"))
            event = poll_event(job, poll, finished)
            line = event.get(PROGRESS_KEY)
            now = time.monotonic()
            if not report(self._task, event) and line and (line != last_line or now - last_print >= 60):
                display.display(f"  {host}: {line}")  # no worker queue: plain output, as before
                last_line, last_print = line, now
            if finished:
                break
            if now - start > timeout:
                result.update(
                    failed=True,
                    msg=f"still running after {timeout} s (job {job.get('ansible_job_id')}); "
                    "it goes on in the background",
                )
                return result
            time.sleep(interval)
        self._execute_module(
            module_name="sparkfleet.cluster.weights_wait",
            module_args={"results_file": results_file, "cleanup": True},
            task_vars=task_vars,
        )
        outcome = dict(poll.get("job") or {})
        for key in INTERNAL:
            outcome.pop(key, None)
        final = (poll.get("progress") or {}).get("line")
        if final:
            outcome.setdefault(PROGRESS_KEY, final)  # the last word of the step: 100 %, or where it stopped
        result.update(outcome)
        result["changed"] = bool(outcome.get("changed"))
        if outcome.get("failed"):
            result["failed"] = True
        return result

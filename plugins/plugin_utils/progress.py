# Controller-side helper for action plugins that wait on a long step (a download, a copy, a reboot):
# report its progress as a task event that every callback sees at normal verbosity.
#
# Why not Display.display(): a worker's display() reaches ansible-runner as a `verbose` event with no
# host or task, which sparkfleet (and ansible-navigator, AWX) cannot tell from ansible's own chatter.
# A `v2_runner_on_async_poll` callback is what ansible itself sends while it polls an async job: it
# carries the host, the task and a result, and ansible-runner turns it into a `runner_on_async_poll`
# event. The worker process hands callbacks to the strategy through its final queue, as the task
# executor does for `until` retries and async polls (ansible-core 2.19: executor/task_executor.py).
from __future__ import annotations

from typing import Any

from ansible_collections.sparkfleet.cluster.plugins.plugin_utils.ansible_private import send_async_poll

PROGRESS_KEY = "sparkfleet_progress"  # one line of text
PROGRESS_DATA_KEY = "sparkfleet_progress_data"  # numbers: label, unit, done, total, rate, eta_s, parts


def report(task: Any, result: dict[str, Any]) -> bool:
    """Send `result` as an async-poll event of `task` on the current worker's host.

    Returns False when that is not possible (not in a worker process, or an ansible-core whose
    internals differ): the caller then falls back to Display. The worker's queue and the raw task result
    are ansible-core internals: plugin_utils/ansible_private.py, seam 1.
    """
    return send_async_poll(task, result)


def from_status_file(status: dict[str, Any]) -> dict[str, Any]:
    """A weights progress file (module_utils/weights_progress.py) -> the `sparkfleet_progress_data` shape."""
    data: dict[str, Any] = {
        "label": status.get("phase") or "",
        "unit": "B",
        "done": status.get("done_bytes"),
        "total": status.get("total_bytes"),
        "rate": status.get("rate_bps"),
        "eta_s": status.get("eta_s"),
        "files_done": status.get("files_done"),
        "files_total": status.get("files_total"),
    }
    parts = status.get("parts")
    if isinstance(parts, dict) and parts:
        data["parts"] = {
            str(name): {
                "done": p.get("done_bytes"),
                "total": p.get("total_bytes"),
                "rate": p.get("rate_bps"),
                "eta_s": p.get("eta_s"),
            }
            for name, p in parts.items()
            if isinstance(p, dict)
        }
    return data

#!/usr/bin/python
# One poll of a long async task: its job file and its progress file. The action plugin of the same
# name (action_plugins/model_weights_wait.py) calls this in a loop and prints the progress lines.
from __future__ import annotations

DOCUMENTATION = r"""
module: weights_wait
short_description: Wait for an async model_weights task, printing its progress (bytes, rate, ETA)
description:
  - >-
    The action plugin polls the job started with C(async)/C(poll=0) and prints the progress file the
    task writes (e.g. C(download: 12.3 GB / 385.0 GB (3.2%), 410.0 MB/s, ETA 15m12s, files 3/45))
    between polls, so a long download or copy is never hours of silence. It returns the job's own
    result (changed, failed, msg, ...).
  - The module is one poll. It reads the job file and the progress file (and removes the job file
    with C(cleanup)).
options:
  job: {type: dict, description: the registered result of the async task (action plugin)}
  results_file: {type: path, description: the async job file (module)}
  status_file: {type: path, description: the progress file}
  interval: {type: int, default: 10, description: seconds between polls}
  timeout: {type: int, default: 86400, description: give up after this many seconds}
  cleanup: {type: bool, default: false, description: remove the job file (module)}
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: Wait for the download, printing bytes, rate and ETA
  sparkfleet.cluster.weights_wait:
    job: "{{ download_job }}"
    status_file: /srv/sparkfleet/models/.sparkfleet/progress-download.json
    interval: 10
"""

RETURN = r"""
finished:
  description: "Module: the job has finished."
  type: bool
  returned: always
job:
  description: "Module: the job's result once it has finished (null before)."
  type: dict
  returned: always
progress:
  description: "Module: the progress file's content (null when there is none yet)."
  type: dict
  returned: always
"""

import contextlib
import json
import os

from ansible.module_utils.basic import AnsibleModule


def _read(path: str | None) -> dict | None:
    if not path:
        return None
    try:
        with open(os.path.expanduser(path)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def poll(params: dict) -> dict:
    job = _read(params.get("results_file"))
    finished = bool(job) and (job.get("finished") == 1 or "started" not in job)
    out = {
        "changed": False,
        "finished": finished,
        "job": job if finished else None,
        "progress": _read(params.get("status_file")),
    }
    if params.get("cleanup") and params.get("results_file"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.expanduser(params["results_file"]))
    return out


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "job": {"type": "dict"},
            "results_file": {"type": "path"},
            "status_file": {"type": "path"},
            "interval": {"type": "int", "default": 10},
            "timeout": {"type": "int", "default": 86400},
            "cleanup": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    module.exit_json(**poll(module.params))


if __name__ == "__main__":
    main()

# Test helper: which of the given Python modules the worker process running this task has already imported,
# before any template of this task names a filter (its one argument is a plain list). A worker is forked from
# the controller for each task and node, so this shows what the controller had loaded before the task.
from __future__ import annotations

import sys

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result["changed"] = False
        # ansible-core loads a builtin plugin file as a module named after its path plus a suffix
        # (ansible.plugins.filter.core_<n>); a collection's under its own name
        loaded = list(sys.modules)
        wanted = self._task.args["modules"]
        result["imported"] = [n for n in wanted if any(m == n or m.startswith(n + "_") for m in loaded)]
        return result

# Test helper: how many objects Python's garbage collector holds frozen in the worker process running this
# task (gc.get_freeze_count). A worker is forked from the controller for each task and node, so this is
# what the controller had frozen before it forked the worker.
from __future__ import annotations

import gc

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result["changed"] = False
        result["frozen"] = gc.get_freeze_count()
        return result

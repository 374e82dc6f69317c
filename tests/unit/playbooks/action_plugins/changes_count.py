# Test helper: the count of sparkfleet.cluster.changes as this task's worker process sees it (the way
# plugins/action/phase_state.py reads it: the callback's module as Ansible loaded it in the controller).
from __future__ import annotations

import sys

from ansible.plugins.action import ActionBase
from ansible_collections.sparkfleet.cluster.plugins.action.phase_state import TRACKER  # the name it reads


class ActionModule(ActionBase):
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        module = sys.modules.get(TRACKER)
        result["changed"] = False
        result["state"] = dict(module.STATE) if module is not None else None
        return result

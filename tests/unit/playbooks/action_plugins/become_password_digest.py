# Test helper: the SHA-256 of the become password ansible-playbook holds for this play (from -K's
# prompt or --become-password-file), so a test can check it arrived without anything printing it.
from __future__ import annotations

import hashlib

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        password = self._play_context.become_pass
        result["changed"] = False
        result["digest"] = hashlib.sha256(password.encode()).hexdigest() if password else None
        return result

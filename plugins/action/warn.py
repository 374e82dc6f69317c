"""Action plugin: show each message as an Ansible warning (preflight's accepted-but-not-ideal inputs).

Runs on the controller only: no connection, no module shipped, nothing changed."""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(("msgs",))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        msgs = self._task.args.get("msgs") or []
        if isinstance(msgs, str):
            msgs = [msgs]
        result.update(changed=False, msg=f"{len(msgs)} warning(s)", warnings=[str(m) for m in msgs])
        return result

# Every part of ansible-core's and mitogen's private internals the collection uses, in one place.
#
# Ansible's documented plugin API (ActionBase, Templar, the loaders) is not listed here; what is listed has a
# leading underscore, or is a method of a built-in plugin that is not an API, or is mitogen's internals. Each
# seam names what sparkfleet gets from it and what it falls back to when the internals differ, and
# tests/unit/test_ansible_private.py checks every name and signature below against the pinned ansible-core
# and mitogen (requirements/lock.txt), so a version bump that moves one fails there first, naming the seam.
#
# 1. A task event from a worker (progress of a long wait): the worker process's queue to the strategy
#    (ansible.executor.process.worker.current_worker: _final_q, _host) and a raw task result
#    (ansible.executor.task_result._RawTaskResult), sent as `v2_runner_on_async_poll`, as the task executor
#    does for async polls (executor/task_executor.py). Fallback: False, and the caller uses Display.
# 2. The built-in reboot action's two steps (ansible.plugins.action.reboot.ActionModule.perform_reboot and
#    do_until_success_or_timeout), overridden to report progress (plugins/action/reboot.py). The reboot
#    itself stays ansible's. No fallback: a changed signature fails the reboot task, naming itself.
# 3. A task's role (Task._role: its path and name), which the validate action reads for the role's
#    argument specs and defaults (plugins/action/validate.py). Fallback: None, and validate says it must run
#    inside a role.
# 4. mitogen's module_utils scan (ansible_mitogen.module_finder.scan and walk_imports; ModuleDepService's
#    _get_builtin_names and _get_custom_tups), patched so collection module_utils reach an async task before
#    it detaches (plugins/strategy/sparkfleet.py; only with SPARKFLEET_STRATEGY=mitogen).
#
# The CLI's in-process Ansible (python/sparkfleet/plan.py and runner/head.py: InventoryManager, DataLoader,
# VariableManager, Templar, CLI) is Ansible's Python API: public names, unsupported as an API; its unit tests
# (tests/unit/test_cli_plan.py, test_runner_lock.py) run it against the pinned ansible-core.
from __future__ import annotations

from typing import Any

TESTED = {"ansible-core": "2.19", "mitogen": "0.3"}  # the pinned versions' series, requirements/lock.txt


# ---- 1. a task event from a worker ----------------------------------------------------------------------
def send_async_poll(task: Any, result: dict[str, Any]) -> bool:
    """Send `result` as a `v2_runner_on_async_poll` of `task` on the current worker's host; False when this
    is not a worker process or ansible-core's internals differ (the caller falls back to Display)."""
    try:
        from ansible.executor.process import worker as _worker
        from ansible.executor.task_result import _RawTaskResult
    except ImportError:
        return False
    current = getattr(_worker, "current_worker", None)
    queue = getattr(current, "_final_q", None)
    host = getattr(current, "_host", None)
    if current is None or queue is None or host is None:
        return False
    try:
        queue.send_callback(
            "v2_runner_on_async_poll",
            _RawTaskResult(host=host, task=task, return_data=dict(result), task_fields=task.dump_attrs()),
        )
    except Exception:  # progress is best effort; the wait itself goes on
        return False
    return True


# ---- 2. the built-in reboot action's steps --------------------------------------------------------------
def reboot_action() -> type:
    """ansible.builtin.reboot's action class (plugins/action/reboot.py overrides its REBOOT_STEPS)."""
    from ansible.plugins.action.reboot import ActionModule

    return ActionModule


# the overridden methods and their parameters (after self), as the pinned ansible-core has them
REBOOT_STEPS = {
    "perform_reboot": ("task_vars", "distribution"),
    "do_until_success_or_timeout": (
        "action",
        "reboot_timeout",
        "action_desc",
        "distribution",
        "action_kwargs",
    ),
}


# ---- 3. a task's role -------------------------------------------------------------------------------------
def task_role(task: Any) -> tuple[str, str] | None:
    """(role path, role name) of the role `task` belongs to, None outside a role."""
    role = getattr(task, "_role", None)
    if role is None:
        return None
    return str(role._role_path), str(role.get_name())


# ---- 4. mitogen's module_utils scan --------------------------------------------------------------------
MITOGEN_SEAMS = {
    "ansible_mitogen.module_finder": ("scan", "walk_imports"),
    "ansible_mitogen.services.ModuleDepService": ("_get_builtin_names", "_get_custom_tups"),
}


def patch_mitogen_scan(module_finder: Any, service: Any, extra_utils, is_ours) -> None:
    """Make mitogen's scan also return `extra_utils(module_path, walk_imports)` (the collection module_utils
    a module imports) and put those in its "builtin" (import before the task) list, not its custom one.
    `is_ours(entry)` tells such an entry (name, path, is_package). Idempotent."""
    if getattr(module_finder.scan, "sparkfleet", False):
        return
    scan = module_finder.scan
    builtin_names, custom_tups = service._get_builtin_names, service._get_custom_tups

    def _scan(module_name, module_path, search_path):
        found = set(scan(module_name, module_path, search_path))
        found.update(extra_utils(module_path, module_finder.walk_imports))
        return sorted(found)

    def _builtin_names(self, builtin_path, resolved):
        ours = [entry[0] for entry in resolved if is_ours(entry)]
        return builtin_names(self, builtin_path, [e for e in resolved if not is_ours(e)]) + ours

    def _custom_tups(self, builtin_path, resolved):
        return custom_tups(self, builtin_path, [e for e in resolved if not is_ours(e)])

    _scan.sparkfleet = True
    module_finder.scan = _scan
    service._get_builtin_names = _builtin_names
    service._get_custom_tups = _custom_tups

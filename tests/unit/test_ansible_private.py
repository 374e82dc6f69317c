"""The private seams of ansible-core and mitogen (plugins/plugin_utils/ansible_private.py) against the pinned
versions (requirements/lock.txt): every name and signature the collection relies on is there. A version bump
that moves one fails here, naming the seam, before a run does. (What each seam does is tested through it:
test_progress_channel.py, test_module_utils.py's strategy tests, the validate and reboot tests.)"""

from __future__ import annotations

import inspect
from importlib import import_module
from importlib.metadata import version

import pytest
from ansible_collections.sparkfleet.cluster.plugins.plugin_utils import ansible_private as seams


@pytest.mark.parametrize("package", sorted(seams.TESTED))
def test_the_pinned_versions_are_the_series_the_seams_were_checked_against(package):
    assert version(package).startswith(seams.TESTED[package] + "."), version(package)


def test_seam_1_the_workers_queue_and_the_raw_task_result():
    from ansible.executor.process import worker
    from ansible.executor.task_result import _RawTaskResult

    assert hasattr(worker, "current_worker")
    init = inspect.signature(worker.WorkerProcess.__init__).parameters
    assert {"final_q", "host"} <= set(init), list(init)
    source = inspect.getsource(worker.WorkerProcess.__init__)
    assert "self._final_q = final_q" in source and "self._host = host" in source
    params = inspect.signature(_RawTaskResult.__init__).parameters
    assert {"host", "task", "return_data", "task_fields"} <= set(params), list(params)
    from ansible.executor.task_queue_manager import FinalQueue  # the worker's _final_q

    params = inspect.signature(FinalQueue.send_callback).parameters
    assert list(params) == ["self", "method_name", "task_result"], list(params)


def test_seam_1_outside_a_worker_is_false_never_an_error():
    class Task:
        def dump_attrs(self):
            return {}

    assert seams.send_async_poll(Task(), {"x": 1}) is False


def test_seam_2_the_reboot_actions_steps():
    cls = seams.reboot_action()
    for name, params in seams.REBOOT_STEPS.items():
        got = tuple(p for p in inspect.signature(getattr(cls, name)).parameters if p != "self")
        assert got == params, (name, got)


def test_seam_3_a_tasks_role():
    from ansible.playbook.role import Role
    from ansible.playbook.task import Task

    assert "_role_path" in inspect.getsource(Role) and callable(Role.get_name)
    assert "_role" in inspect.signature(Task.__init__).parameters or "self._role" in inspect.getsource(Task)
    assert seams.task_role(Task()) is None  # a task outside a role


@pytest.mark.parametrize(("where", "names"), sorted(seams.MITOGEN_SEAMS.items()))
def test_seam_4_mitogens_scan(where, names):
    module, _, cls = where.partition(".services.")
    target = getattr(import_module(module + ".services"), cls) if cls else import_module(where)
    for name in names:
        assert callable(getattr(target, name)), (where, name)
    if not cls:
        assert list(inspect.signature(target.scan).parameters) == [
            "module_name",
            "module_path",
            "search_path",
        ]
    else:
        for name in names:
            assert list(inspect.signature(getattr(target, name)).parameters) == [
                "self",
                "builtin_path",
                "resolved",
            ]

"""The engine as data: the filters of role engine_service, each a thin entry point to a module_utils.

  engine_profile     (plugins/module_utils/engine_profile.py)   engine profiles checked: profile_problems,
                     profile_serves, setting_problems, extra_arg_problems, cache_problems, rank_args
  engine_container   (plugins/module_utils/engine_container.py) one rank's container: engine_spec (docker
                     run arguments, command, environment, mounts, labels, settings digest), engine_caches,
                     systemd_exec, env_file
  engine_status      (plugins/module_utils/engine_status.py)    the status table: status_rows, status_lines,
                     rank_problem, status_table, short_commit
  engine_flags       (plugins/module_utils/engine_flags.py)     each engine version's serve flags, and each
                     rank's command line parsed with them: command_line_problems

A filter plugin file cannot import another one, so the code lives in module_utils, which filters, modules
and tests import alike. Pure functions: unit-tested in tests/unit/test_engine_spec.py.
"""

from __future__ import annotations

from ansible_collections.sparkfleet.cluster.plugins.module_utils import engine_container
from ansible_collections.sparkfleet.cluster.plugins.module_utils.engine_container import (
    SETTINGS_LABEL,
    engine_caches,
    env_file,
    systemd_exec,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.engine_flags import command_line_problems
from ansible_collections.sparkfleet.cluster.plugins.module_utils.engine_profile import (
    cache_problems,
    extra_arg_problems,
    profile_problems,
    profile_serves,
    rank_args,
    setting_problems,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.engine_status import (
    rank_problem,
    short_commit,
    status_lines,
    status_rows,
    status_table,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.files_state import pending

# the settings label is part of what tests import from this file
__all__ = ["SETTINGS_LABEL", "FilterModule", "SpecError", "engine_spec"]

try:  # inside Ansible, a clear "this setting is wrong" error instead of a traceback
    from ansible.errors import AnsibleFilterError as _Base
except ImportError:  # pragma: no cover - the filter is also importable without Ansible
    _Base = ValueError


class SpecError(_Base):
    """engine_container.SpecError as a filter error (module_utils import only the standard library)."""


def files_pending(
    node: dict, files: list | None = None, dirs: list | None = None, enable: list | None = None
) -> list:
    """What a files task would change on a node, from its engine_node read (module_utils/files_state.py)."""
    units = [node.get("unit"), *(node.get("other_units") or {}).values()]
    by_name = {u["name"]: u for u in units if u and u.get("name")}
    return pending(node.get("paths") or {}, files or [], dirs or [], by_name, enable or [])


def engine_spec(settings: dict) -> dict:
    try:
        return engine_container.engine_spec(settings)
    except engine_container.SpecError as exc:
        raise SpecError(str(exc)) from None


class FilterModule:
    def filters(self) -> dict:
        return {
            "engine_spec": engine_spec,
            "engine_profile_problems": profile_problems,
            "engine_profile_serves": profile_serves,
            "engine_setting_problems": setting_problems,
            "engine_extra_arg_problems": extra_arg_problems,
            "engine_command_line_problems": command_line_problems,
            "engine_cache_problems": cache_problems,
            "engine_rank_args": rank_args,
            "systemd_exec": systemd_exec,
            "env_file": env_file,
            "short_commit": short_commit,
            "engine_caches": engine_caches,
            "engine_status": status_rows,
            "engine_status_lines": status_lines,
            "engine_rank_problem": rank_problem,
            "status_table": status_table,
            "files_pending": files_pending,
        }

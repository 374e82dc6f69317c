"""The cluster-wide constants (plugins/module_utils/cluster_constants.py) for Jinja: role defaults, argument
specs and validation rules read a topology's node count or engine ports from where the Python code does."""

from __future__ import annotations

from ansible_collections.sparkfleet.cluster.plugins.module_utils.cluster_constants import constant

try:  # inside Ansible, the error names the variable instead of a traceback
    from ansible.errors import AnsibleFilterError as _Error
except ImportError:  # pragma: no cover - the filter is also importable without Ansible
    _Error = ValueError


def cluster_constant(name: str, topology: str | None = None) -> object:
    try:
        return constant(name, topology)
    except ValueError as exc:
        raise _Error(str(exc)) from None


class FilterModule:
    def filters(self) -> dict:
        return {"cluster_constant": cluster_constant}

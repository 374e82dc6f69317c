"""Action plugin `sparkfleet.cluster.phase_state`: a role's phase gate, the controller's half.

Computes the digest of the role's inputs on the controller and runs the module of the same name on the node
with it (one round trip): `state: read` says whether the phase is clean (the record of the last successful
apply has this digest and the state it lists is unchanged), `state: record` writes the record at the end of
the apply.

The digest covers, as sha256 over a canonical JSON: the collection's version; the value of every option of the
role's meta/argument_specs.yml (entry point main) as this host sees it (templated); the values named in
`inputs` (templated: e.g. sparkfleet_plan, or a fact the role's tasks read); and the content of every file
under the role's directory (tasks, templates, files, defaults, vars, meta) and of the collection's plugins the
role names (`sparkfleet.cluster.<name>`: its module, action plugin or the filter file defining it, and the
module_utils they import). Any change of a variable, a template or that code makes the phase apply in full.
The values are hashed, never returned or logged: a secret among them stays out of the run's output.

A read without a round trip: preflight layer 2 (module preflight_facts, option phase_dir) re-reads every
record of the node against its own digest, read-only, in the round trip it makes anyway. `state: read` takes
that survey instead of running the module when all of these hold: the callback sparkfleet.cluster.changes
is enabled and has counted no changed, failed or unreachable result in this run (so the node is as the
survey found it), the survey has this record, its recorded digest is the one computed here, its manifest had
not drifted, the task is not in check mode, and a passwd entry it asks for (ssh_trust's) is in the survey
too. The result is then what the module would have returned for a clean record (with the user's
`getent_passwd` fact when asked), and `surveyed: true`. In every other case the module runs (and
removes a stale record) as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.plugins.action import ActionBase
from ansible_collections.sparkfleet.cluster.plugins.plugin_utils import yaml_files

ROOT = Path(__file__).resolve().parents[2]
# the callback sparkfleet.cluster.changes, by the module name Ansible loads it under
TRACKER = "ansible_collections.sparkfleet.cluster.plugins.callback.changes"
# preflight layer 2's registered read (roles/preflight/tasks/facts.yml): its `phases` and `passwd`
SURVEY = "__preflight_node"
_TREES: dict[str, str] = {}  # path -> digest of the files under it, once per controller process


def tree_digest(path: Path) -> str:
    """sha256 of the relative names and contents of the files under path (sorted; bytecode aside)."""
    key = str(path)
    if key not in _TREES:
        h = hashlib.sha256()
        for f in sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            h.update(str(f.relative_to(path)).encode() + b"\0" + f.read_bytes() + b"\0")
        _TREES[key] = h.hexdigest()
    return _TREES[key]


NAMED = re.compile(r"sparkfleet\.cluster\.(\w+)")
UTILS = re.compile(r"module_utils\.(\w+)")


def code_files(role_path: Path) -> list[Path]:
    """The collection's plugin files a role's files name, and the module_utils those import (transitively)."""
    names = set()
    for f in role_path.rglob("*"):
        if f.is_file() and f.suffix in (".yml", ".yaml", ".j2"):
            names.update(NAMED.findall(f.read_text(errors="replace")))
    plugins = ROOT / "plugins"
    found: set[Path] = set()
    for name in names:
        direct = [
            d / f"{name}.py" for d in (plugins / "modules", plugins / "action") if (d / f"{name}.py").exists()
        ]
        if direct:
            found.update(direct)
            continue
        quoted = (f'"{name}"', f"'{name}'")
        found.update(f for f in (plugins / "filter").glob("*.py") if any(q in f.read_text() for q in quoted))
    todo = list(found)
    while todo:
        for util in UTILS.findall(todo.pop().read_text()):
            path = plugins / "module_utils" / f"{util}.py"
            if path.exists() and path not in found:
                found.add(path)
                todo.append(path)
    return sorted(found)


def code_digest(role_path: Path) -> str:
    key = f"code:{role_path}"
    if key not in _TREES:
        h = hashlib.sha256()
        for f in code_files(role_path):
            h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
        _TREES[key] = h.hexdigest()
    return _TREES[key]


def canonical(value: Any) -> str:
    """JSON of a templated value, keys sorted; anything JSON cannot say is written as its str()."""
    return json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("path", "state", "inputs", "files", "stat_paths", "units", "data", "passwd_of"))

    def _role(self) -> tuple[str, Path]:
        role = getattr(self._task, "_role", None)
        if role is None:
            raise AnsibleActionFail("sparkfleet.cluster.phase_state runs inside a role (its phase gate)")
        return role.get_name(), Path(role._role_path)

    def digest(self, task_vars: dict[str, Any]) -> str:
        name, path = self._role()
        specs_file = path / "meta/argument_specs.yml"
        specs = yaml_files.load(specs_file.read_text()) if specs_file.exists() else {}
        options = (((specs or {}).get("argument_specs") or {}).get("main") or {}).get("options") or {}
        values = {}
        for option in sorted(options):
            if option in task_vars:
                try:
                    values[option] = self._templar.template(task_vars[option])
                except AnsibleError:  # a default computed from what the role reads on the node: as written
                    values[option] = ["unresolved", str(task_vars[option])]
        inputs = self._task.args.get("inputs") or {}
        galaxy = yaml_files.load((ROOT / "galaxy.yml").read_text())
        blob = canonical(
            {
                "collection": galaxy.get("version"),
                "role": name,
                "options": values,
                "inputs": inputs,
                "role_files": tree_digest(path),
                "code": code_digest(path),
            }
        )
        return hashlib.sha256(blob.encode()).hexdigest()

    def surveyed(self, path: str, digest: str, task_vars: dict[str, Any]) -> dict[str, Any] | None:
        """The clean read preflight layer 2's survey already made of this record, when it still holds (the
        module docstring says when); None: the module must read."""
        tracker = sys.modules.get(TRACKER)
        state = getattr(tracker, "STATE", None) or {}
        if not state.get("active") or state.get("changed") != 0:
            return None
        if self._task.check_mode or self._play_context.check_mode:
            return None
        read = task_vars.get(SURVEY) or {}
        entry = (read.get("phases") or {}).get(os.path.normpath(path))
        if not isinstance(entry, dict) or entry.get("digest") != digest or entry.get("drift") != []:
            return None
        taken = {
            "changed": False,
            "clean": True,
            "drift": [],
            "data": dict(entry.get("data") or {}),
            "surveyed": True,
        }
        user = self._task.args.get("passwd_of")
        if user:  # the read returns the user's passwd entry too: the survey must have this user's
            passwd = read.get("passwd") or {}
            if user not in passwd:
                return None
            taken["ansible_facts"] = {"getent_passwd": {user: passwd[user]}}
        return taken

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = self._task.args
        state = args.get("state", "read")
        module_args = {"path": args["path"], "state": state}
        if state != "absent":
            module_args["digest"] = self.digest(task_vars)
        if state == "read":
            taken = self.surveyed(args["path"], module_args["digest"], task_vars)
            if taken is not None:
                result.update(taken)
                return result
        if state == "read" and args.get("passwd_of"):
            module_args["passwd_of"] = args["passwd_of"]
        if state == "record":
            module_args["files"] = list(args.get("files") or [])
            module_args["stat_paths"] = list(args.get("stat_paths") or [])
            module_args["units"] = list(args.get("units") or [])
            module_args["data"] = dict(args.get("data") or {})
        result.update(
            self._execute_module(
                module_name="sparkfleet.cluster.phase_state", module_args=module_args, task_vars=task_vars
            )
        )
        return result

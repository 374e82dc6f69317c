"""Preflight layer 1 in-process: the first play of playbooks/preflight.yml for every host of an inventory,
without an ansible-playbook process, then the verdict filter over the facts it recorded.

What is real here: the inventory and every host's variables come from Ansible's own InventoryManager,
VariableManager and HostVars (its variable precedence: group_vars/all, child groups, host vars); the
play and its tasks are loaded from playbooks/preflight.yml by Ansible's Play loader; each task runs the
collection's own action plugin (sparkfleet.cluster.validate) found by Ansible's plugin loader, in the
task order of the play, with the facts a task returns set on the host as the executor does; the verdict
is the filter playbooks/preflight.yml's second play calls (roles/preflight/tasks/inventory.yml).
What is not: the strategy, forks and callbacks (three real runs in test_preflight_bad_inventories.py
cover them). The connection is a double that fails the test when anything uses it: layer 1 must never
touch a node. Facts live in a memory cache of this VariableManager (never the user's fact cache).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ansible.constants as C
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.playbook import Playbook
from ansible.playbook.block import Block
from ansible.playbook.play_context import PlayContext
from ansible.plugins.connection.local import Connection as LocalConnection
from ansible.plugins.loader import action_loader, init_plugin_loader
from ansible.template import Templar
from ansible.utils.collection_loader import AnsibleCollectionConfig
from ansible.vars.hostvars import HostVars
from ansible.vars.manager import VariableManager

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "playbooks/preflight.yml"
_STATE: dict[str, Any] = {"loaded": False}
VALIDATE = ("sparkfleet.cluster.validate", "validate")


class NoConnection(LocalConnection):
    """A connection that fails the test on any use (layer 1 runs on the controller only)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("preflight layer 1 touched a node: " + repr(args)[:200])

    _connect = exec_command = put_file = fetch_file = _refuse


def _load_plugins() -> None:
    """Ansible's collection loader, as ansible-playbook installs it (tests/conftest.py installs it first;
    then this changes nothing)."""
    if not _STATE["loaded"]:
        if AnsibleCollectionConfig.collection_finder is None:
            init_plugin_loader([str(ROOT / ".collections"), *C.COLLECTIONS_PATHS])
        _STATE["loaded"] = True


def _tasks(blocks: list) -> list:
    """The play's tasks in order, an imported role's tasks (blocks inside blocks) included."""
    out = []
    for item in blocks:
        out += _tasks(item.block) if isinstance(item, Block) else [item]
    return out


def _play() -> tuple[DataLoader, Any, list]:
    """The first play of playbooks/preflight.yml and its validate tasks, loaded once per process while the
    playbook and the roles' files are unchanged (nothing in them depends on the inventory: the roles are
    imported by name), with the DataLoader that read them (its file cache is what a run has too)."""
    files = [PLAYBOOK, *sorted(ROOT.glob("roles/*/[dmtv]*/*.yml"))]
    key = tuple(f.stat().st_mtime_ns for f in files)
    if _STATE.get("key") != key:
        loader = DataLoader()
        loader.set_basedir(str(ROOT))
        empty = InventoryManager(loader=loader, sources=[])
        play = Playbook.load(str(PLAYBOOK), variable_manager=VariableManager(loader, empty), loader=loader)
        first = play.get_plays()[0]
        tasks = [t for t in _tasks(first.compile()) if t.action in VALIDATE]
        assert tasks, f"{PLAYBOOK}: its first play has no validate task"
        _STATE.update(key=key, loaded_play=(loader, first, tasks))
    return _STATE["loaded_play"]


def facts(inventory: Path) -> tuple[dict[str, dict], dict[str, list[str]]]:
    """Every cluster host's facts after layer 1's first play, and the inventory's groups."""
    _load_plugins()
    loader, play, tasks = _play()
    inv = InventoryManager(loader=loader, sources=[str(inventory)])
    saved = C.CACHE_PLUGIN
    C.CACHE_PLUGIN = "ansible.builtin.memory"  # read when the VariableManager makes its fact cache
    try:
        vm = VariableManager(loader=loader, inventory=inv)
    finally:
        C.CACHE_PLUGIN = saved
    HostVars(inventory=inv, variable_manager=vm, loader=loader)  # hostvars, as the task queue manager sets it
    hosts = inv.get_hosts(play.hosts)
    out: dict[str, dict] = {h.name: {} for h in hosts}
    for task in tasks:
        for host in hosts:
            task_vars = vm.get_vars(play=play, host=host, task=task)
            context = PlayContext(play=play)
            action = action_loader.get(
                task.action,
                task=task,
                connection=NoConnection(context),
                play_context=context,
                loader=loader,
                templar=Templar(loader=loader, variables=task_vars),
                shared_loader_obj=None,
            )
            result = action.run(task_vars=task_vars)
            assert not result.get("failed"), f"{host.name}: {task.get_name()}: {result.get('msg')}"
            new = result.get("ansible_facts") or {}
            vm.set_host_facts(host.name, new)
            out[host.name].update(new)
    groups = {name: [h.name for h in group.get_hosts()] for name, group in inv.groups.items()}
    return out, groups


def verdict(inventory: Path) -> dict[str, list[str]]:
    """preflight's verdict: every role's problems and warnings (roles/preflight/tasks/inventory.yml)."""
    found, groups = facts(inventory)
    from ansible_collections.sparkfleet.cluster.plugins.filter.preflight import validation_verdict

    head = groups.get("head", [])
    nodes = head + [h for h in groups.get("cluster", []) if h not in head]
    return validation_verdict(found, nodes)

"""Preflight layer 1 in-process: the first play of playbooks/preflight.yml for every host of an inventory,
without an ansible-playbook process, then the verdict filter over the facts it recorded.

What is real here: the inventory and every host's variables come from Ansible's own InventoryManager,
VariableManager and HostVars (its variable precedence: group_vars/all, child groups, host vars); the
play and its tasks are loaded from playbooks/preflight.yml by Ansible's Play loader; each task runs the
collection's own action plugin (sparkfleet.cluster.validate) found by Ansible's plugin loader, in the
task order of the play, with the facts a task returns set on the host as the executor does; the verdict
is the filter playbooks/preflight.yml's second play calls (roles/preflight/tasks/inventory.yml).
What is not: the strategy, forks and callbacks (two real runs in test_preflight_bad_inventories.py
cover them). The connection is a double that fails the test when anything uses it: layer 1 must never
touch a node. Facts live in a memory cache of this VariableManager (never the user's fact cache).

One cost is not paid again: Ansible compiles every Jinja template and expression each time it renders one
(about 1100 per inventory, most of them the roles' same rules), and compiling was most of a case's time.
While layer 1 runs here, a template's compiled code is reused for the same source, the same compile options
and the same base directory (what the compiled code depends on); it still renders with each host's own
variables, every time. A source that fails to compile is compiled again every time, so its error is Ansible's.
The real runs compile everything afresh, as ansible-playbook does.

Nor is the cyclic garbage collector run as often: a case makes a few million short-lived objects (Ansible
wraps every variable lazily at each render), and at the default threshold (a collection every 700 new
container objects) the collector, which also walks what the worker process keeps alive, took about a sixth
of a case's CPU time. While layer 1 runs here it collects every 50,000: the same garbage, found later.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ansible.constants as C
from ansible._internal._templating._engine import TemplateEngine
from ansible._internal._templating._jinja_bits import AnsibleTemplate, AnsibleTemplateExpression
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


_COMPILED: dict[tuple, Any] = {}
_COMPILERS = {"_compile_template": AnsibleTemplate, "_compile_expression": AnsibleTemplateExpression}


def _reusing(name: str, compile_: Callable, kind: type) -> Callable:
    def compiled(engine: TemplateEngine, source: str, options: Any) -> Any:
        # what the compiled code depends on: the source (with any #jinja2: header), the compile-time options
        # (escape_backslashes, the overrides) and the base directory of the environment's template loader
        key = (name, engine.basedir, str(source), options.escape_backslashes, options.overrides)
        found = _COMPILED.get(key)
        if found is None:
            found = compile_(engine, source, options)
            if not isinstance(found, kind):  # a compile error, deferred by Ansible: never kept
                return found
            _COMPILED[key] = found
        return found

    return compiled


@contextlib.contextmanager
def _compiled_once() -> Iterator[None]:
    """TemplateEngine's two compile steps reuse what they compiled before, while layer 1 runs here."""
    saved = {name: getattr(TemplateEngine, name) for name in _COMPILERS}  # AttributeError: Ansible moved them
    for name, kind in _COMPILERS.items():
        setattr(TemplateEngine, name, _reusing(name, saved[name], kind))
    try:
        yield
    finally:
        for name, compile_ in saved.items():
            setattr(TemplateEngine, name, compile_)


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


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """The cyclic collector runs every 50,000 new container objects instead of 700, while layer 1 runs."""
    saved = gc.get_threshold()
    gc.set_threshold(50_000, 20, 20)
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def facts(inventory: Path, reuse_compiled: bool = True) -> tuple[dict[str, dict], dict[str, list[str]]]:
    """Every cluster host's facts after layer 1's first play, and the inventory's groups."""
    with _fewer_collections(), _compiled_once() if reuse_compiled else contextlib.nullcontext():
        return _facts(inventory)


def _facts(inventory: Path) -> tuple[dict[str, dict], dict[str, list[str]]]:
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


def verdict(inventory: Path, reuse_compiled: bool = True) -> dict[str, list[str]]:
    """preflight's verdict: every role's problems and warnings (roles/preflight/tasks/inventory.yml)."""
    found, groups = facts(inventory, reuse_compiled)
    from ansible_collections.sparkfleet.cluster.plugins.filter.preflight import validation_verdict

    head = groups.get("head", [])
    nodes = head + [h for h in groups.get("cluster", []) if h not in head]
    # the recorded verdict is host facts: hostvars has them under ansible_facts
    return validation_verdict({h: {"ansible_facts": f} for h, f in found.items()}, nodes)

"""sparkfleet's default strategy: mitogen's linear strategy when mitogen is installed, else Ansible's linear.

See DOCUMENTATION (ansible-doc -t strategy sparkfleet.cluster.sparkfleet).
"""

from __future__ import annotations

import importlib.util
import os

from ansible.utils.display import Display
from ansible_collections.sparkfleet.cluster.plugins.plugin_utils.ansible_private import patch_mitogen_scan

DOCUMENTATION = r"""
name: sparkfleet
short_description: mitogen's linear strategy when mitogen is installed, else Ansible's linear strategy
description:
  - The same tasks in the same order as C(ansible.builtin.linear). With the pinned C(mitogen) package
    installed (requirements/lock.txt), mitogen keeps one Python interpreter per node for the whole run
    instead of starting one per task. An opt-in, not ansible.cfg's strategy; with the collection's fact
    cache, in the TP3 lab, a no-op re-run of site.yml took 57.6 s with it against 58.0 s with linear, and
    status.yml 6.0 s against 3.6 s (make bench).
  - Without mitogen it runs Ansible's linear strategy and says so in a warning. To run without mitogen on
    purpose, C(SPARKFLEET_STRATEGY=linear) (sparkfleet) or C(ANSIBLE_STRATEGY=linear) (ansible-playbook).
  - >-
    mitogen loads the module_utils a module needs before a task starts, but finds only
    C(ansible.module_utils) imports. This strategy also hands it the collection module_utils a module
    imports (C(ansible_collections.<ns>.<name>.plugins.module_utils)), so an async task (the weights
    download, copy and rank files) has them before it detaches from the controller, where an import
    would wait forever.
  - Choose it with C(SPARKFLEET_STRATEGY=mitogen) (sparkfleet), C(ANSIBLE_STRATEGY=sparkfleet) with
    C(strategy_plugins) pointing at the checkout's plugins/strategy, or by its FQCN
    C(sparkfleet.cluster.sparkfleet).
author: sparkfleet developers
version_added: 2.0.0
"""

COLLECTIONS = "ansible_collections"
MODULE_UTILS = ".plugins.module_utils."


def collection_module_utils(module_path: str, walk) -> list[tuple[str, str, bool]]:
    """(name, path, is_package) of every collection module_util the module at `module_path` imports,
    directly or through another module_util. `walk(code, prefix)` yields the imported names."""
    found: dict[str, tuple[str, str, bool]] = {}
    queue = [module_path]
    while queue:
        path = queue.pop()
        with open(path, "rb") as fh:
            code = compile(fh.read(), path, "exec")
        for name in walk(code, COLLECTIONS):
            if name in found or MODULE_UTILS not in name:
                continue
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError):  # a name imported from a module, not a module
                spec = None
            # a package Ansible's collection loader makes without a file (`.../__synthetic__`, e.g.
            # community.crypto's module_utils/_crypto): nothing to scan or send, its modules are found by name
            if spec is None or not spec.origin or not spec.has_location or not os.path.isfile(spec.origin):
                continue
            found[name] = (name, spec.origin, spec.submodule_search_locations is not None)
            queue.append(spec.origin)
    return sorted(found.values())


def _is_collection_util(entry: tuple[str, str, bool]) -> bool:
    return entry[0].startswith(COLLECTIONS + ".") and MODULE_UTILS in entry[0]


try:
    from ansible_mitogen import module_finder
    from ansible_mitogen.plugins.strategy.mitogen_linear import StrategyModule
    from ansible_mitogen.services import ModuleDepService
except ImportError:  # plain Ansible without mitogen (an execution environment built without it, say)
    from ansible.plugins.strategy.linear import StrategyModule

    Display().warning(
        "sparkfleet: the mitogen package is not installed; running with ansible's linear strategy "
        "(the same result, slower: install requirements/lock.txt)"
    )
else:  # mitogen internals: plugin_utils/ansible_private.py, seam 4
    patch_mitogen_scan(module_finder, ModuleDepService, collection_module_utils, _is_collection_util)

__all__ = ["StrategyModule"]

"""Callback plugin `sparkfleet.cluster.preload`: Jinja's filter and test plugins loaded once, in the
controller, before the first task.

Why: every task on every node runs in a worker process the controller forks for it, and a worker starts with
what the controller had loaded. ansible-core loads a filter or test plugin when a template first names it, so
without this a worker whose templates name a filter loaded the plugins itself (Jinja looks them up while it
generates a template's code), again and again: on a no-op TP3 `site.yml`, 151 of its 471 workers did. With
them loaded here first, none does, and the workers' CPU over that run went from 16.08 s to 14.00 s (`make
bench`, row "the workers' CPU, plugin preload"; README "Speed").

What is loaded: every filter and test plugin of ansible.builtin (the loaders' own `all()`) and every filter of
this collection (its plugins/filter files, by their fully qualified names). Nothing runs on a node, nothing
is printed; a plugin that fails to load here is only not preloaded (the template that names it loads it, and
fails, as before).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import filter_loader, test_loader
from ansible.utils.display import Display

DOCUMENTATION = r"""
name: preload
short_description: Loads the Jinja filter and test plugins once, before the first task forks a worker
description:
  - At the start of a playbook, loads every filter and test plugin of C(ansible.builtin) and every filter of
    C(sparkfleet.cluster) in the controller, so the worker process of each task and node inherits them
    instead of loading the ones its templates name again.
  - Prints nothing and changes no result. A plugin that cannot be loaded is left to load (and fail) where a
    template names it, as without this plugin.
type: aggregate
requirements:
  - enabled in C(callbacks_enabled) (sparkfleet's ansible.cfg enables it)
author: sparkfleet developers
version_added: 2.0.0
"""

display = Display()
COLLECTION = "sparkfleet.cluster"
FILTERS = Path(__file__).resolve().parents[1] / "filter"  # this collection's plugins/filter
PACKAGE = "ansible_collections.sparkfleet.cluster.plugins.filter"


def preload() -> tuple[int, list[str]]:
    """Load the plugins; (how many were loaded, what could not be, with why)."""
    loaded, failed = 0, []
    for loader in (filter_loader, test_loader):
        try:
            loaded += sum(1 for _ in loader.all())
        except Exception as exc:  # only a lost speed-up: each template loads what it names
            failed.append(f"ansible.builtin {loader.type}: {exc}")
    for path in sorted(FILTERS.glob("*.py")):
        if path.stem == "__init__":
            continue
        try:
            module = importlib.import_module(f"{PACKAGE}.{path.stem}")
            for name in module.FilterModule().filters():
                if filter_loader.get(f"{COLLECTION}.{name}") is not None:
                    loaded += 1
        except Exception as exc:  # as above
            failed.append(f"{COLLECTION} filter file {path.name}: {exc}")
    return loaded, failed


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "sparkfleet.cluster.preload"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook: Any) -> None:
        loaded, failed = preload()
        display.vvv(f"{self.CALLBACK_NAME}: {loaded} filter and test plugins loaded before the first task")
        for why in failed:
            display.vvv(f"{self.CALLBACK_NAME}: not preloaded: {why}")

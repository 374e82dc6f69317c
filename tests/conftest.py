"""Every test sees the checkout as the collection sparkfleet.cluster, as Ansible does (ansible.cfg's
collections_path): `ansible_collections.sparkfleet.cluster.plugins...` imports in-process, and module
files run as subprocesses find their module_utils through PYTHONPATH."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COLLECTIONS = ROOT / ".collections"

if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))
_paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
if str(COLLECTIONS) not in _paths:
    os.environ["PYTHONPATH"] = os.pathsep.join([str(COLLECTIONS), *_paths])

# Bytecode is cached for the suite even where the shell sets PYTHONDONTWRITEBYTECODE: without the cache every
# xdist worker rewrites and compiles every test module again (pytest keeps no rewritten module then), and
# every Python process the tests start (ansible-playbook with the collection's plugins, the CLI, the engine
# double, the simulators) compiles the checkout's sources it imports again. Popped here, before xdist starts
# its workers, so they and every subprocess inherit the environment without it. The caches land in
# __pycache__ directories, which .gitignore and galaxy.yml's build_ignore leave out.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False

# Ansible's collection loader, installed before any test imports the collection, as ansible-playbook
# installs it at start: every `ansible_collections.sparkfleet.cluster...` import then goes through it
# (with the collection's metadata). Tests that set Ansible up in-process (tests/unit/layer1.py, sparkfleet's
# plan and lock, which call init_plugin_loader) find it installed already; installed later, it would meet
# collection packages imported without it and refuse new submodules ("collection metadata was not loaded").
os.environ.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
from ansible.plugins.loader import init_plugin_loader  # noqa: E402 - after the paths above are set

init_plugin_loader([str(COLLECTIONS)])


# Under xdist every worker sets up the module-scoped fixtures of the tests it runs: a test module whose tests
# went to both workers would build its fixture twice (a real ansible-playbook run, an engine double's tree).
# `make unit` runs with --dist loadgroup: the tests that use a module- or class-scoped fixture are one group
# per module, sent to one worker together; the module's other tests (the bad-inventory table beside its three
# real runs) are still shared out one by one.
@pytest.hookimpl(wrapper=True, tryfirst=True)  # the marks before xdist's own hook reads them
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    for item in items:
        info = getattr(item, "_fixtureinfo", None)  # every fixture the test uses, its dependencies included
        defs = info.name2fixturedefs if info is not None else {}
        if any(d.scope in ("module", "class") for name in item.fixturenames for d in defs.get(name, ())):
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
    yield
    if getattr(config.option, "loadgroup", False):  # an xdist worker of --dist loadgroup
        _group_suffix(items)


def _group_suffix(items: list[pytest.Item]) -> None:
    """xdist passes a test's group to its scheduler as a suffix of the test's id (`...::test@group`), which
    pytest-xdist 3.8 writes to `item._nodeid`; pytest 9.2 keeps the id in `item._id` and never reads
    `_nodeid`, so without this every group is silently split (pytest-dev/pytest-xdist#1386; its fix,
    pytest-dev/pytest-xdist#1388, is an open pull request). Where xdist's suffix is missing, it is set
    where pytest reads it; an xdist that sets it itself makes this do nothing."""
    from _pytest.nodeid import NodeId  # pytest 9.2's structured ids (requirements/lock.txt)

    for item in items:
        names = sorted(
            {
                str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                for m in item.iter_markers("xdist_group")
            }
        )
        if names and "@" not in item.nodeid[item.nodeid.rfind("]") + 1 :]:
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")
            assert item.nodeid.endswith("@" + "_".join(names)), item.nodeid


def pytest_collection_finish(session: pytest.Session) -> None:
    """What the process holds once the tests are collected (Ansible, the test modules, their tables) lives
    until the end: moved out of the cyclic collector's reach, so its collections walk only what the tests
    make (a full collection walked all of it each time)."""
    gc.collect()
    gc.freeze()

"""Fixtures of the VM lab's scenario (molecule/vm; SPARKFLEET_LAB names a lab of `sparkfleet lab up --vm`).

lab is the VmLab; node(host) and play(playbook) are the cluster scenarios' fixtures (tests/lab/conftest.py),
loaded from there rather than written twice: they need only the lab's ssh config, inventories and checkout.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from sparkfleet_lab.vm.lab import VmLab, is_vm_lab


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_fixtures = _load("sparkfleet_lab_fixtures", Path(__file__).parents[1] / "lab/conftest.py")
# the lab tests' Events (task results by task name), importable as there: `from lab_events import Events`
sys.modules["lab_events"] = _load("lab_events", Path(__file__).parents[1] / "lab/lab_events.py")

node = _fixtures.node
play = _fixtures.play


@pytest.fixture(scope="session")
def lab() -> VmLab:
    name = os.environ.get("SPARKFLEET_LAB")
    if not name:
        pytest.skip("SPARKFLEET_LAB is not set: these tests need a running VM lab (sparkfleet lab up --vm)")
    if not is_vm_lab(name):
        pytest.skip(f"{name!r} is not a VM lab (sparkfleet lab up --vm --name {name})")
    lab = VmLab(name=name)
    for host in lab.hosts:
        lab.wait_ssh(host)
    return lab

"""Every test sees the checkout as the collection sparkfleet.cluster, as Ansible does (ansible.cfg's
collections_path): `ansible_collections.sparkfleet.cluster.plugins...` imports in-process, and module
files run as subprocesses find their module_utils through PYTHONPATH."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLLECTIONS = ROOT / ".collections"

if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))
_paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
if str(COLLECTIONS) not in _paths:
    os.environ["PYTHONPATH"] = os.pathsep.join([str(COLLECTIONS), *_paths])

# Ansible's collection loader, installed before any test imports the collection, as ansible-playbook
# installs it at start: every `ansible_collections.sparkfleet.cluster...` import then goes through it
# (with the collection's metadata). Tests that set Ansible up in-process (tests/unit/layer1.py, sparkfleet's
# plan and lock, which call init_plugin_loader) find it installed already; installed later, it would meet
# collection packages imported without it and refuse new submodules ("collection metadata was not loaded").
os.environ.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
from ansible.plugins.loader import init_plugin_loader  # noqa: E402 - after the paths above are set

init_plugin_loader([str(COLLECTIONS)])

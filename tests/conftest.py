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

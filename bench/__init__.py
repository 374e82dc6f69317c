"""sparkfleet benchmarks: each measures a candidate against a baseline side by side in one run.

The checkout is the collection sparkfleet.cluster (ansible.cfg's collections_path): as in the tests
(tests/conftest.py), `ansible_collections.sparkfleet.cluster...` imports in-process, and module files
run as subprocesses find their module_utils through PYTHONPATH; a fresh clone needs nothing else."""

from __future__ import annotations

import os
import sys
from pathlib import Path

COLLECTIONS = Path(__file__).resolve().parents[1] / ".collections"
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))
_paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
if str(COLLECTIONS) not in _paths:
    os.environ["PYTHONPATH"] = os.pathsep.join([str(COLLECTIONS), *_paths])

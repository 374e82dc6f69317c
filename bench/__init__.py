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


def lab_from_env(topology: str | None = None):
    """The running lab named by SPARKFLEET_LAB (of `topology` when given), or None: the benchmarks that
    need one are then reported as not run."""
    name = os.environ.get("SPARKFLEET_LAB")
    if not name:
        return None
    root = Path(__file__).resolve().parents[1]
    if str(root / "lab") not in sys.path:
        sys.path.insert(0, str(root / "lab"))
    from sparkfleet_lab.core import Lab

    lab = Lab(name=name)
    if not lab.state or (topology and lab.topology != topology):
        return None
    return lab

"""Preflight layer 1's validate action: rendering with every variable of the host against rendering with the
variables each role's checks can reach (plugins/action/validate.py), side by side in one run.

In-process, as tests/unit/layer1.py runs it: Ansible's own inventory and variable managers, the first play of
playbooks/preflight.yml, the collection's validate action for every host and role. The inventories: the unit
tests' good TP2 and TP3 ones and every 8th case of their bad-inventory table. Each side runs them all, the two
sides alternate, three rounds; the fastest round of each side counts (CPU time of this process). Both sides
must give the same verdicts, or the bench fails.
"""

from __future__ import annotations

import importlib
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 3


def run() -> list[dict]:
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    import layer1
    import test_preflight_bad_inventories as table

    layer1._load_plugins()
    action = importlib.import_module("ansible_collections.sparkfleet.cluster.plugins.action.validate")
    cases = [("good-tp2", "tp2", lambda inv: None, None), ("good-tp3", "tp3", lambda inv: None, None)]
    cases += table.CASES[::8]
    with tempfile.TemporaryDirectory() as tmp:
        paths = [table.inventory_of(Path(tmp) / case[0], case) for case in cases]
        layer1.verdict(paths[0])  # plugins loaded, the play parsed: neither side pays for that
        best = {False: float("inf"), True: float("inf")}
        verdicts: dict[bool, list] = {}
        try:
            for _ in range(ROUNDS):
                for scoped in (False, True):
                    action.ActionModule.SCOPE_VARIABLES = scoped
                    start = time.process_time()
                    verdicts[scoped] = [layer1.verdict(p) for p in paths]
                    best[scoped] = min(best[scoped], time.process_time() - start)
        finally:
            action.ActionModule.SCOPE_VARIABLES = True
    if verdicts[False] != verdicts[True]:
        raise AssertionError("the scoped validate action gave other verdicts than the unscoped one")
    return [
        {
            "name": f"preflight layer 1, {len(paths)} inventories (validate: all variables / those in reach)",
            "baseline": best[False],
            "candidate": best[True],
            "unit": "s CPU",
            "ratio": best[False] / best[True],
            "how": f"in-process (tests/unit/layer1.py), fastest of {ROUNDS} alternating rounds per side; "
            "the same verdicts on both sides",
        }
    ]

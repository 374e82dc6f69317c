"""What the worker process forked for each task inherits from the controller, through two callbacks that
ansible.cfg enables. sparkfleet.cluster.preload: the filter and test plugins the controller loaded before the
first task, where without it each worker loads them itself; templates render as before; a filter file that
cannot be loaded is named and left alone. sparkfleet.cluster.gc_freeze: the objects the controller froze for
the garbage collector at the playbook's and each play's start (none without it), nothing more at a task's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PB = ROOT / "tests/unit/playbooks"
MODULES = [
    "ansible_collections.sparkfleet.cluster.plugins.filter.cluster",
    "ansible.plugins.filter.core",
    "ansible.plugins.test.core",
]


def run(**env: str) -> dict:
    settings = {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(PB / "inventory/local.yml"),
         str(PB / "preload.yml")],
        env={**os.environ, **settings, **env},
        capture_output=True, text=True, cwd=ROOT, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc, _ = json.JSONDecoder().raw_decode(proc.stdout[proc.stdout.index("{") :])
    first, second, third, fourth = (task["hosts"]["local1"] for task in doc["plays"][0]["tasks"])
    (fifth,) = (task["hosts"]["local1"] for task in doc["plays"][1]["tasks"])
    frozen = [third["frozen"], fourth["frozen"], fifth["frozen"]]
    return {"imported": first["imported"], "rendered": second["msg"], "frozen": frozen}


def test_a_tasks_worker_inherits_the_plugins_loaded_before_the_first_task():
    preloaded = run()  # ansible.cfg: callbacks_enabled has sparkfleet.cluster.preload
    assert preloaded["imported"] == MODULES
    # the same run without it: the worker had none of them (it would load what its templates name)
    alone = run(ANSIBLE_CALLBACKS_ENABLED="ansible.posix.timer")
    assert alone["imported"] == []
    assert preloaded["rendered"] == alone["rendered"] == "ac True"
    # gc_freeze: the loaded playbook and ansible-core are frozen in every worker (-vvv counts 70,807 for
    # playbooks/status.yml); a task's start freezes nothing more (the next task's worker has no more frozen,
    # only fewer when a frozen object was freed); none without the callback
    play1, later, play2 = preloaded["frozen"]
    assert play1 > 50_000 and play2 > 50_000, preloaded["frozen"]
    assert later <= play1, preloaded["frozen"]
    assert alone["frozen"] == [0, 0, 0]


def test_a_filter_file_that_cannot_be_loaded_is_named_and_the_rest_still_load(tmp_path, monkeypatch):
    from ansible_collections.sparkfleet.cluster.plugins.callback import preload

    (tmp_path / "cluster.py").write_text("")  # the real module of that name: loads
    (tmp_path / "gone.py").write_text("")  # no such module in the collection: cannot load
    monkeypatch.setattr(preload, "FILTERS", tmp_path)
    loaded, failed = preload.preload()
    assert loaded > 0
    assert len(failed) == 1 and failed[0].startswith("sparkfleet.cluster filter file gone.py: "), failed

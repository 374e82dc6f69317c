"""A phase read without a round trip (docs/design.md "Phase gates"): preflight layer 2's survey of every
phase record (module_utils/phase_record.survey, run by preflight_facts), the callback
sparkfleet.cluster.changes that counts a run's changes in the controller, and the phase_state action taking
the survey only while it still holds - else the module reads as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import module_runner
import pytest
from ansible_collections.sparkfleet.cluster.plugins.action import phase_state as action
from ansible_collections.sparkfleet.cluster.plugins.callback import changes
from ansible_collections.sparkfleet.cluster.plugins.module_utils.phase_record import survey
from test_phase_state import node, read, record  # noqa: F401 - node is the fixture the tests below use

ROOT = Path(__file__).resolve().parents[2]
PB = ROOT / "tests/unit/playbooks"


def surveyed(n: dict) -> dict:
    """The survey of the records next to the test's record, with the node's fake systemctl on PATH."""
    with mock.patch.dict(os.environ, n["env"]):
        return survey(str(Path(n["record"]).parent), "systemctl")


def test_the_survey_of_an_unchanged_record_is_what_a_read_finds_clean(node: dict) -> None:  # noqa: F811
    record(node, digest="d1")
    found = surveyed(node)
    assert found == {node["record"]: {"digest": "d1", "drift": [], "data": {}}}
    assert read(node, digest="d1")["clean"] is True  # the module agrees


def test_the_survey_names_drift_and_removes_nothing(node: dict) -> None:  # noqa: F811
    record(node)
    node["conf"].write_text("EARLYOOM_ARGS=-m 1\n")
    entry = surveyed(node)[node["record"]]
    assert any("sha256 changed" in line for line in entry["drift"]), entry
    assert entry["data"] == {}
    assert Path(node["record"]).exists()  # read-only: the gate's own read removes it, later


def test_no_directory_no_record_or_a_broken_one_is_an_empty_survey(node: dict, tmp_path: Path) -> None:  # noqa: F811
    assert surveyed(node) == {}  # the directory does not exist yet
    Path(node["record"]).parent.mkdir(parents=True)
    Path(node["record"]).write_text("{not json")
    (Path(node["record"]).parent / "other.json").write_text(json.dumps({"version": 1}))  # no digest
    assert surveyed(node) == {}


def test_preflight_facts_returns_the_survey_only_when_asked(node: dict) -> None:  # noqa: F811
    record(node)
    env = {**node["env"]}
    base = {
        "weights_path": str(node["root"] / "models"),
        "docker": "/nonexistent",
        "nvidia_smi": "/nonexistent",
    }
    out = module_runner.run("preflight_facts", base, env)
    assert out["phases"] == {}
    out = module_runner.run("preflight_facts", {**base, "phase_dir": str(Path(node["record"]).parent)}, env)
    assert out["phases"] == {node["record"]: {"digest": "d1", "drift": [], "data": {}}}
    assert out["passwd"] == {}
    # with ssh_trust's user: its entry, the same as phase_state's own read returns as getent_passwd
    out = module_runner.run(
        "preflight_facts", {**base, "phase_dir": str(Path(node["record"]).parent), "passwd_of": "root"}, env
    )
    own = module_runner.run("phase_state", {"path": node["record"], "digest": "d1", "passwd_of": "root"}, env)
    assert out["passwd"] == own["ansible_facts"]["getent_passwd"] and out["passwd"]["root"][4] == "/root"
    assert not out.get("warnings"), out.get("warnings")


# ---- the action: when a gate takes the survey --------------------------------------------------------------
PATH = "/var/lib/sparkfleet/phases/earlyoom.json"
GOOD = {PATH: {"digest": "d1", "drift": [], "data": {"repos": ["x"]}}}


def gate(args: dict | None = None, check_mode: bool = False) -> SimpleNamespace:
    """What ActionModule.surveyed reads of itself: the task's args and check mode, the play's check mode."""
    return SimpleNamespace(
        _task=SimpleNamespace(args=args or {"path": PATH}, check_mode=check_mode),
        _play_context=SimpleNamespace(check_mode=check_mode),
    )


@pytest.fixture
def tracker(monkeypatch: pytest.MonkeyPatch) -> dict:
    state = {"active": True, "changed": 0}
    monkeypatch.setitem(sys.modules, action.TRACKER, SimpleNamespace(STATE=state))
    return state


def take(
    self: SimpleNamespace, path: str = PATH, digest: str = "d1", phases: dict | None = None, passwd=None
):
    task_vars = {action.SURVEY: {"phases": GOOD if phases is None else phases, "passwd": passwd or {}}}
    return action.ActionModule.surveyed(self, path, digest, task_vars)  # type: ignore[arg-type]


def test_a_clean_survey_with_the_same_digest_and_nothing_changed_is_taken(tracker: dict) -> None:
    assert take(gate()) == {
        "changed": False,
        "clean": True,
        "drift": [],
        "data": {"repos": ["x"]},
        "surveyed": True,
    }
    assert (
        take(gate(), path="/var/lib/sparkfleet//phases/./earlyoom.json")["surveyed"] is True
    )  # the same path


@pytest.mark.parametrize(
    "why",
    [
        "changed",
        "failed-over",
        "inactive",
        "digest",
        "drift",
        "absent",
        "check",
        "play-check",
        "passwd",
        "none",
    ],
)
def test_the_module_reads_whenever_the_survey_may_not_hold(tracker: dict, monkeypatch, why: str) -> None:
    self, kwargs = gate(), {}
    if why == "changed":
        tracker["changed"] = 1  # a task of this run changed something (anywhere)
    elif why == "failed-over":
        tracker["changed"] = 3
    elif why == "inactive":
        tracker["active"] = False  # the callback module is there, but no playbook started with it enabled
    elif why == "digest":
        kwargs["digest"] = "d2"  # the inputs changed since the record
    elif why == "drift":
        kwargs["phases"] = {PATH: {**GOOD[PATH], "drift": ["x: removed"]}}
    elif why == "absent":
        kwargs["phases"] = {}  # no survey of this record (layer 2 did not run, or found none)
    elif why == "check":
        self = gate(check_mode=True)
    elif why == "play-check":
        self._play_context.check_mode = True
    elif why == "passwd":
        self = gate({"path": PATH, "passwd_of": "spark"})  # ssh_trust's read also returns the user's entry...
        kwargs["passwd"] = {"admin": ["x", "1000", "1000", "", "/home/admin", "/bin/bash"]}  # ...not this one
    elif why == "none":
        monkeypatch.delitem(sys.modules, action.TRACKER)  # the callback is not enabled
    assert take(self, **kwargs) is None


def test_the_callback_counts_changed_failed_and_unreachable_results(monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"active": False, "changed": 0}
    monkeypatch.setattr(changes, "STATE", state)
    cb = changes.CallbackModule()
    cb.v2_playbook_on_start(None)
    result = lambda c: SimpleNamespace(is_changed=lambda: c)  # noqa: E731
    cb.v2_runner_on_ok(result(False))
    assert state == {"active": True, "changed": 0}
    cb.v2_runner_on_ok(result(True))
    cb.v2_runner_on_failed(result(False), ignore_errors=True)
    cb.v2_runner_on_unreachable(result(False))
    assert state == {"active": True, "changed": 3}
    cb.v2_playbook_on_start(None)  # a second playbook of the same command: the count stays
    assert state["changed"] == 3


def test_a_tasks_worker_sees_the_count_of_the_tasks_before_it() -> None:
    """The real thing: ansible-playbook with ansible.cfg (the callback enabled); the worker of each task reads
    the count the controller kept, as the phase_state action does."""
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(PB / "inventory/local.yml"),
         str(PB / "changes.yml")],
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
             "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"},
        capture_output=True, text=True, cwd=ROOT, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc, _ = json.JSONDecoder().raw_decode(proc.stdout[proc.stdout.index("{") :])
    counts = [
        task["hosts"]["local1"]["state"]
        for task in doc["plays"][0]["tasks"]
        if "state" in task["hosts"]["local1"]
    ]
    assert counts == [
        {"active": True, "changed": 0},
        {"active": True, "changed": 0},
        {"active": True, "changed": 2},
    ]

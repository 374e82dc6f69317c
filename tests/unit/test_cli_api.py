"""The Python API and the verbs, run for real against a small project of this test's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sparkfleet import cli
from sparkfleet.api import PLAYBOOKS, Cluster
from sparkfleet.runner import RunResult

PLAY = """---
- name: {name}
  hosts: all
  gather_facts: false
  tasks:
    - name: Which playbook
      ansible.builtin.debug:
        msg: "playbook={name} cap={{{{ cap }}}} check={{{{ ansible_check_mode }}}}"
      vars:
        cap: "{{{{ gpu_clocks_cap_mhz | default('unset') }}}}"
    - name: Show clocks
      ansible.builtin.debug:
        msg: "showing"
      tags: [show]
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project laid out like sparkfleet's, every verb's playbook a tiny localhost play."""
    root = tmp_path / "project"
    (root / "playbooks").mkdir(parents=True)
    (root / "inventory").mkdir()
    (root / "ansible.cfg").write_text("[defaults]\nretry_files_enabled = false\n")
    for verb, playbook in PLAYBOOKS.items():
        (root / playbook).write_text(PLAY.format(name=verb))
    (root / "inventory" / "local.yml").write_text(
        "all:\n  hosts:\n    local1:\n      ansible_connection: local\n"
        '      ansible_python_interpreter: "{{ ansible_playbook_python }}"\n'
    )
    monkeypatch.setenv("SPARKFLEET_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("SPARKFLEET_PROJECT", raising=False)
    monkeypatch.chdir(tmp_path)  # relative inventories then resolve against the project
    return root


SHOW = "showing"


def messages(events: list[dict]) -> list[str]:
    return [
        e["event_data"]["res"]["msg"]
        for e in events
        if e["event"] == "runner_on_ok" and "msg" in e["event_data"].get("res", {})
    ]


def test_every_verb_is_a_method_running_its_playbook(project: Path) -> None:
    cluster = Cluster("inventory/local.yml", project_dir=project)
    for verb in PLAYBOOKS:
        if verb == "clocks":
            continue
        events: list[dict] = []
        result = getattr(cluster, verb.replace("-", "_"))(on_event=events.append)
        assert isinstance(result, RunResult)
        assert result.exit_code == 0, (verb, result.failures)
        assert result.playbook == str(project / PLAYBOOKS[verb])
        assert messages(events)[0] == f"playbook={verb} cap=unset check=False"


def test_options_reach_ansible(project: Path) -> None:
    events: list[dict] = []
    result = Cluster(["inventory/local.yml"], project_dir=project).up(
        check=True, extravars={"gpu_clocks_cap_mhz": 1}, tags="show", on_event=events.append
    )
    assert result.check and result.exit_code == 0
    assert messages(events) == ["showing"]
    assert result.hosts["local1"].ok == 1


def test_clock_verbs(project: Path) -> None:
    cluster = Cluster("inventory/local.yml", project_dir=project)
    for call, expected in [
        (
            lambda ev: cluster.clocks_set(2400, on_event=ev),
            ["playbook=clocks cap=2400 check=False", "showing"],
        ),
        (lambda ev: cluster.clocks_reset(on_event=ev), ["playbook=clocks cap=0 check=False", "showing"]),
        (lambda ev: cluster.clocks_show(on_event=ev), ["showing"]),
    ]:
        events: list[dict] = []
        assert call(events.append).exit_code == 0
        assert messages(events) == expected
    for bad in (0, -1, True, "2400"):
        with pytest.raises(ValueError, match="positive number of MHz"):
            cluster.clocks_set(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown verb"):
        cluster.verb("frobnicate")


def test_api_is_quiet_unless_asked(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = Cluster("inventory/local.yml", project_dir=project)
    cluster.status()
    assert capsys.readouterr().out == ""
    cluster.status(quiet=False)
    out = capsys.readouterr().out
    assert "PLAY status" in out and "RECAP" in out and "result: successful (exit 0)" in out


def test_cli_verbs_with_project_dir(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(
        ["--project-dir", str(project), "clocks", "set", "2400", "-i", "inventory/local.yml", "--json", "-q"]
    )
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["playbook"] == str(project / "playbooks" / "clocks.yml")
    assert doc["inventories"] == [str(project / "inventory" / "local.yml")]


def test_cli_finds_the_project_from_the_environment(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPARKFLEET_PROJECT", str(project))
    assert cli.main(["up", "-i", "inventory/local.yml", "--check", "-q"]) == 0
    out = capsys.readouterr().out
    assert "RECAP  " in out and "site.yml  (check mode: nothing was changed)" in out

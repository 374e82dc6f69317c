"""plugins/modules/phase_state.py run the way Ansible runs it (JSON in, JSON out: its main() in this process,
tests/unit/module_runner.py; one test runs the module file as a process of its own), and the digest of the
action plugin of the same name: a record is clean only while its digest and every file, unit and kernel value
it lists are unchanged; a stale record is removed before the apply (so an interrupted apply leaves none);
check mode writes and removes nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import module_runner
import pytest
import yaml
from ansible_collections.sparkfleet.cluster.plugins.action import phase_state as action

ROOT = Path(__file__).resolve().parents[2]

# `systemctl show -p Id -p ActiveState -p UnitFileState -- a b`: one block per unit, blank line between, as
# systemd prints it; the state of each unit is a file under $UNITS (active/enabled).
FAKE_SYSTEMCTL = """#!/bin/sh
[ "$1" = show ] || exit 1
first=1
for u in "$@"; do
  case "$u" in *.service)
    [ $first = 1 ] || echo
    first=0
    echo "Id=$u"
    echo "ActiveState=$(cat "$UNITS/$u.active" 2>/dev/null || echo inactive)"
    echo "UnitFileState=$(cat "$UNITS/$u.enabled" 2>/dev/null || echo)"
  ;; esac
done
"""


@pytest.fixture
def node(tmp_path: Path) -> dict:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "systemctl").write_text(FAKE_SYSTEMCTL)
    (bindir / "systemctl").chmod(0o755)
    units = tmp_path / "units"
    units.mkdir()
    (units / "earlyoom.service.active").write_text("active\n")
    (units / "earlyoom.service.enabled").write_text("enabled\n")
    conf = tmp_path / "etc/default/earlyoom"
    conf.parent.mkdir(parents=True)
    conf.write_text("EARLYOOM_ARGS=-m 5\n")
    return {
        "root": tmp_path,
        "record": str(tmp_path / "phases/earlyoom.json"),
        "conf": conf,
        "units": units,
        "env": {**os.environ, "UNITS": str(units), "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"},
    }


def run(node: dict, args: dict, check_mode: bool = False, real: bool = False) -> dict:
    module_args = {"path": node["record"], **args, "_ansible_check_mode": check_mode}
    out = module_runner.run("phase_state", module_args, node["env"], real=real)
    assert not out.get("failed"), out
    return out


def record(node: dict, digest: str = "d1", check_mode: bool = False, real: bool = False) -> dict:
    args = {"state": "record", "digest": digest, "files": [str(node["conf"])], "units": ["earlyoom.service"]}
    return run(node, args, check_mode, real)


def read(node: dict, digest: str = "d1", check_mode: bool = False, real: bool = False) -> dict:
    return run(node, {"state": "read", "digest": digest}, check_mode, real)


def test_no_record_is_not_clean(node: dict) -> None:
    out = read(node)
    assert out["clean"] is False
    assert out["drift"] == ["no record of a successful apply"]


def test_recorded_and_unchanged_is_clean_and_idempotent(node: dict) -> None:
    """The module file run as a process of its own, as Ansible runs it."""
    assert record(node, real=True)["changed"] is True
    assert record(node, real=True)["changed"] is False  # the same record: nothing written
    out = read(node, real=True)
    assert (out["clean"], out["drift"], out["changed"]) == (True, [], False)
    assert json.loads(Path(node["record"]).read_text())["units"] == {
        "earlyoom.service": {"active": "active", "enabled": "enabled"}
    }


@pytest.mark.parametrize(
    ("disturb", "reason"),
    [
        (lambda n: n["conf"].write_text("EARLYOOM_ARGS=-m 1\n"), "sha256 changed"),
        (lambda n: n["conf"].chmod(0o600), "mode changed"),
        (lambda n: n["conf"].unlink(), "removed"),
        (
            lambda n: (n["units"] / "earlyoom.service.active").write_text("inactive\n"),
            "active 'active' -> 'inactive'",
        ),
        (lambda n: (n["units"] / "earlyoom.service.enabled").write_text("disabled\n"), "enabled"),
    ],
    ids=["edited", "mode", "removed", "stopped", "disabled"],
)
def test_drift_is_found_and_the_stale_record_removed(node: dict, disturb, reason: str) -> None:
    record(node)
    disturb(node)
    out = read(node)
    assert out["clean"] is False
    assert any(reason in line for line in out["drift"]), out["drift"]
    assert not Path(node["record"]).exists()  # an apply that stops now leaves no record behind
    assert read(node)["drift"] == ["no record of a successful apply"]


def test_a_kernel_value_reset_is_drift(node: dict) -> None:
    """A sysctl is a file under /proc/sys: recorded by content, a reset value shows (a stand-in path here:
    the module reads it the same way)."""
    value = node["root"] / "swappiness"
    value.write_text("10\n")
    run(node, {"state": "record", "digest": "d1", "files": [str(value)]})
    assert read(node)["clean"] is True
    value.write_text("60\n")
    assert any(str(value) in line for line in read(node)["drift"])


def test_another_digest_is_not_clean(node: dict) -> None:
    record(node)
    out = read(node, digest="d2")
    assert out["clean"] is False
    assert out["drift"] == ["the inputs changed (digest of the role's variables and files)"]


def test_check_mode_writes_and_removes_nothing(node: dict) -> None:
    assert record(node, check_mode=True)["changed"] is True
    assert not Path(node["record"]).exists()
    record(node)
    assert read(node, digest="d2", check_mode=True)["clean"] is False
    assert Path(node["record"]).exists()


def test_absent_removes_the_record(node: dict) -> None:
    record(node)
    assert run(node, {"state": "absent"})["changed"] is True
    assert not Path(node["record"]).exists()
    assert run(node, {"state": "absent"})["changed"] is False


def test_tree_digest_changes_with_any_file(tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks/main.yml").write_text("- name: a\n")
    first = action.tree_digest(tmp_path)
    action._TREES.clear()
    (tmp_path / "tasks/main.yml").write_text("- name: b\n")
    assert action.tree_digest(tmp_path) != first
    action._TREES.clear()


def test_a_secret_is_recorded_by_its_hash_only(node: dict) -> None:
    """ssh_trust records the head's private key: its sha256, owner and mode, never a byte of it."""
    key = node["root"] / "id_ed25519"
    body = "-----BEGIN OPENSSH PRIVATE KEY-----\nc2VjcmV0LWtleS1tYXRlcmlhbA==\n-----END OPENSSH KEY-----\n"
    key.write_text(body)
    key.chmod(0o600)
    out = run(node, {"state": "record", "digest": "d1", "files": [str(key)]})
    text = Path(node["record"]).read_text()
    assert "c2VjcmV0" not in text and "PRIVATE" not in text and "c2VjcmV0" not in json.dumps(out)
    assert set(json.loads(text)["files"][str(key)]) == {"sha256", "mode", "uid", "gid"}
    key.write_text(body.replace("c2Vj", "c2Vk"))
    assert read(node)["drift"] == [f"{key}: sha256 changed"]  # the reason names the path, never the content


def test_a_directory_is_recorded_by_owner_and_mode(node: dict) -> None:
    """~/.ssh: sshd refuses a key whose directory others can write (StrictModes), so its mode is state too."""
    ssh = node["root"] / "home/.ssh"
    ssh.mkdir(parents=True)
    ssh.chmod(0o700)
    run(node, {"state": "record", "digest": "d1", "files": [str(ssh)]})
    assert json.loads(Path(node["record"]).read_text())["files"][str(ssh)]["mode"] == "0700"
    assert read(node)["clean"] is True
    ssh.chmod(0o777)
    assert read(node)["drift"] == [f"{ssh}: mode changed"]


SSH_TRUST = ROOT / "roles/ssh_trust"


def test_ssh_trust_gates_its_writes_and_always_runs_its_checks() -> None:
    """The gate skips the writes (tasks/apply.yml, included unless every node is clean), never the checks that
    see the network: a swapped cable or a worker's sshd changes none of the files the record lists."""
    main = yaml.safe_load((SSH_TRUST / "tasks/main.yml").read_text())
    apply = (SSH_TRUST / "tasks/apply.yml").read_text()

    def tasks(items: list) -> list:
        for t in items:
            yield t
            yield from tasks(t.get("block") or [])
            yield from tasks(t.get("rescue") or [])

    include = next(t for t in tasks(main) if "ansible.builtin.include_tasks" in t)
    assert include["ansible.builtin.include_tasks"] == "apply.yml"
    assert include["when"] == "not __ssh_trust_clean"
    for check in ("Reach every worker address from the head by key", "Reach every worker by name through the "
                  "managed ssh config", "Check that the head reached every worker"):  # fmt: skip
        task = next(t for t in tasks(main) if t.get("name", "").startswith(check))
        assert "__ssh_trust_clean" not in json.dumps(task), check
    for write in ("openssh_keypair", "authorized_key:", "ansible.builtin.template:", "blockinfile:"):
        assert write in apply, write
        assert write not in (SSH_TRUST / "tasks/main.yml").read_text(), write
    # the read and the record hash the same inputs, so an unchanged cluster reads clean
    gate = [t["sparkfleet.cluster.phase_state"] for t in tasks(main) if "sparkfleet.cluster.phase_state" in t]
    reads = [g for g in gate if g.get("state", "read") == "read"]
    records = [g for g in gate if g.get("state") == "record"]
    assert len(reads) == len(records) == 1 and reads[0]["inputs"] == records[0]["inputs"]
    assert "__ssh_trust_key" in records[0]["files"] and "authorized_keys" in records[0]["files"]

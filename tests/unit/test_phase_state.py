"""plugins/modules/phase_state.py run the way Ansible runs it (JSON in, JSON out: its main() in this process,
tests/unit/module_runner.py; one test runs the module file as a process of its own), and the digest of the
action plugin of the same name: a record is clean only while its digest and every file, unit and kernel value
it lists are unchanged; a stale record is removed before the apply (so an interrupted apply leaves none);
check mode writes and removes nothing."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
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


@pytest.mark.parametrize("user", ["root", "nobody", "no-such-user-here"])
def test_passwd_of_is_the_getent_fact_in_the_same_round_trip(node: dict, user: str) -> None:
    """ssh_trust reads its user's home with the record (no getent round trip): the same fact, value for value,
    as ansible.builtin.getent (database passwd, fail_key false) run here, a missing user included."""
    ours = run(node, {"state": "read", "digest": "d1", "passwd_of": user})
    getent = module_runner.in_process(
        "getent", {"database": "passwd", "key": user, "fail_key": False}, package="ansible.modules"
    )
    assert ours["ansible_facts"] == getent["ansible_facts"]
    assert (ours["ansible_facts"]["getent_passwd"][user] is None) == (user == "no-such-user-here")
    # a user name is not a secret: the option says so (no_log False), so Ansible does not warn of its name
    assert not ours.get("warnings"), ours.get("warnings")
    assert "ansible_facts" not in read(node)  # only when asked


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


# ---- stat_paths: big files (model weights) by their stat alone, and the listing of their directory --------


@pytest.fixture
def weights(node: dict) -> dict:
    """A snapshot directory as model_weights leaves it (shards in a subdirectory too) and a venv whose pinned
    package is a dist-info directory named with its version."""
    snap = node["root"] / "models/snapshot"
    (snap / "engram").mkdir(parents=True)
    for rel, body in (
        ("model-00001-of-00002.safetensors", b"a" * 4096),
        ("model-00002-of-00002.safetensors", b"b" * 4096),
        ("config.json", b"{}\n"),
        ("engram/model-00047-of-00048.safetensors", b"c" * 512),
    ):
        (snap / rel).write_bytes(body)
    dist = node["root"] / "venv/lib/python3.12/site-packages/huggingface_hub-2.4.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Name: huggingface_hub\nVersion: 2.4.0\n")
    pattern = str(node["root"] / "venv/lib/python3*/site-packages/huggingface_hub-*.dist-info")
    return {"snap": snap, "dist": dist, "pattern": pattern, "paths": [str(snap), pattern]}


def record_stats(node: dict, weights: dict, **extra) -> dict:
    return run(node, {"state": "record", "digest": "d1", "stat_paths": weights["paths"], **extra})


def shard(weights: dict) -> Path:
    return weights["snap"] / "model-00001-of-00002.safetensors"


def rewrite_keeping_mtime(path: Path) -> None:
    """A byte flipped in place and the mtime put back (what an admin's tool, or a bit of bad luck, may do):
    the ctime still moves, as user space cannot set it."""
    st = path.stat()
    with path.open("r+b") as fh:
        fh.seek(100)
        fh.write(b"X")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size


def replace_by_a_copy(path: Path) -> None:
    """The same bytes, size and mtime in a new file renamed over it (another inode)."""
    copy = path.with_name("copy")
    shutil.copy2(path, copy)
    copy.replace(path)


@pytest.mark.parametrize(
    ("disturb", "reason"),
    [
        (lambda w: shard(w).unlink(), "1 removed (model-00001-of-00002.safetensors)"),
        (lambda w: os.truncate(shard(w), 1000), "1 changed (model-00001-of-00002.safetensors)"),
        (lambda w: rewrite_keeping_mtime(shard(w)), "1 changed (model-00001-of-00002.safetensors)"),
        (lambda w: replace_by_a_copy(shard(w)), "1 changed (model-00001-of-00002.safetensors)"),
        (lambda w: (w["snap"] / "engram/model-00047-of-00048.safetensors").unlink(), "removed (engram/"),
        (lambda w: (w["snap"] / "stray.safetensors").write_bytes(b"x"), "1 appeared (stray.safetensors)"),
        (lambda w: (w["snap"] / "extra").mkdir(), "1 appeared (extra)"),
    ],
    ids=["shard-deleted", "shard-truncated", "shard-rewritten-mtime-kept", "shard-replaced",
         "subdir-file-deleted", "file-appeared", "directory-appeared"],
)  # fmt: skip
def test_a_weights_file_changed_behind_our_back_is_drift(
    node: dict, weights: dict, disturb, reason: str
) -> None:
    assert record_stats(node, weights)["changed"] is True
    assert read(node)["clean"] is True
    disturb(weights)
    out = read(node)
    assert out["clean"] is False
    lines = [line for line in out["drift"] if line.startswith(f"{weights['snap']}: ")]
    assert any(reason in line for line in lines), out["drift"]
    assert not Path(node["record"]).exists()


def test_a_weights_file_is_recorded_by_stat_and_never_read(node: dict, weights: dict) -> None:
    """The record holds the stat (size, mtime_ns, ctime_ns, inode, device) of each file, no digest of it; a
    file that cannot be opened without blocking (a FIFO) is recorded all the same."""
    secret = shard(weights)
    record_stats(node, weights)
    entry = json.loads(Path(node["record"]).read_text())["stats"][str(weights["snap"])]["tree"][secret.name]
    st = secret.stat()
    assert entry == {"stat": [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]}
    assert len(Path(node["record"]).read_text()) < 4096  # no content: 4 files take a few lines
    assert read(node)["clean"] is True
    # a FIFO in the snapshot: opening it would block the module forever; by stat it is just recorded
    os.mkfifo(weights["snap"] / "pipe")
    assert "1 appeared (pipe)" in read(node)["drift"][0]
    record_stats(node, weights)
    assert read(node)["clean"] is True


def test_reading_an_unchanged_snapshot_twice_is_clean_and_writes_nothing(node: dict, weights: dict) -> None:
    record_stats(node, weights)
    before = os.stat(node["record"]).st_mtime_ns
    assert record_stats(node, weights)["changed"] is False  # the same state: the record is not rewritten
    for _ in range(2):
        assert (read(node)["clean"], read(node)["drift"]) == (True, [])
    assert os.stat(node["record"]).st_mtime_ns == before


@pytest.mark.parametrize(
    ("disturb", "reason"),
    [
        # another version installed: pip removes the dist-info of the old one and writes the new one's
        (lambda w: w["dist"].rename(w["dist"].with_name("huggingface_hub-2.5.0.dist-info")),
         r"1 removed \(.+hub-2\.4\.0\.dist-info\); 1 appeared \(.+hub-2\.5\.0\.dist-info\)"),
        (lambda w: shutil.rmtree(w["dist"].parents[3]), "removed$"),  # the venv deleted
        (lambda w: (w["dist"] / "METADATA").write_text("Name: huggingface_hub\nVersion: 2.4.0\n\n"),
         r"1 changed \(.+huggingface_hub-2\.4\.0\.dist-info\)"),  # reinstalled in place
    ],
    ids=["other-version", "venv-removed", "reinstalled"],
)  # fmt: skip
def test_the_venvs_pinned_package_changed_or_gone_is_drift(
    node: dict, weights: dict, disturb, reason: str
) -> None:
    record_stats(node, weights)
    recorded = json.loads(Path(node["record"]).read_text())["stats"][weights["pattern"]]
    assert list(recorded["glob"]) == [str(weights["dist"])]  # the wildcard expanded on the node
    disturb(weights)
    out = read(node)
    assert out["clean"] is False
    pattern = f"^{re.escape(weights['pattern'])}: {reason}"
    assert any(re.search(pattern, line) for line in out["drift"]), out["drift"]


def test_a_stat_path_missing_when_recorded_that_appears_is_drift(node: dict, weights: dict) -> None:
    rank = node["root"] / "models/rank"
    run(node, {"state": "record", "digest": "d1", "stat_paths": [str(rank)]})
    assert json.loads(Path(node["record"]).read_text())["stats"] == {str(rank): None}
    assert read(node)["clean"] is True
    rank.mkdir()
    assert read(node)["drift"] == [f"{rank}: appeared"]


def test_data_is_returned_while_clean_only(node: dict, weights: dict) -> None:
    """What the apply resolved (the weights' commits) for a run that skips it; nothing once the phase is not
    clean (the apply that follows says it again)."""
    data = {"repos": [{"name": "model", "revision": "afc7aa0a", "commit": "afc7aa0a" + "0" * 32}]}
    record_stats(node, weights, data=data)
    assert read(node)["data"] == data
    assert read(node, digest="d2")["data"] == {}
    assert record_stats(node, weights, data=data)["changed"] is True  # the stale record went with the read
    shard(weights).unlink()
    out = read(node)
    assert (out["clean"], out["data"]) == (False, {})


def test_a_record_without_stat_paths_has_no_stats(node: dict) -> None:
    """The roles that list no stat paths (earlyoom, host_tuning, ssh_trust) keep the record they had."""
    record(node)
    assert set(json.loads(Path(node["record"]).read_text())) == {"version", "digest", "files", "units"}


def test_many_changed_entries_are_named_briefly(node: dict, weights: dict) -> None:
    for i in range(8):
        (weights["snap"] / f"s{i}").write_bytes(b"x")
    record_stats(node, weights)
    for i in range(8):
        (weights["snap"] / f"s{i}").unlink()
    (line,) = read(node)["drift"]
    assert line == f"{weights['snap']}: 8 removed (s0, s1, s2, s3, s4 and 3 more)"


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
    for check in ("Reach every worker from the head by key", "Check that the head reached every worker"):
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


def test_every_option_a_role_gives_the_gate_passes_its_action_plugin() -> None:
    """The action plugin refuses options it does not know before the module runs: each phase_state task of
    every role uses only the options it passes on (a new module option must be added there too)."""

    def tasks(items: list) -> list:
        for t in items or []:
            yield t
            for key in ("block", "rescue", "always"):
                yield from tasks(t.get(key))

    used = set()
    for path in ROOT.glob("roles/*/tasks/*.yml"):
        for task in tasks(yaml.safe_load(path.read_text())):
            used |= set(task.get("sparkfleet.cluster.phase_state") or {})
    assert {"path", "state", "inputs", "files", "passwd_of"} <= used
    assert used <= action.ActionModule._VALID_ARGS


WEIGHTS = ROOT / "roles/model_weights"
HEX40 = "afc7aa0a" + "0123456789abcdef" * 2


@pytest.mark.parametrize(
    ("model", "engram", "extra", "gated"),
    [
        ("afc7aa0a", "1bae0e10", {}, True),  # the recipes' short commits: resolved once, recorded
        (HEX40, HEX40, {}, True),
        (12345678, "1bae0e10", {}, True),  # YAML reads an all-digit revision as a number
        ("main", "1bae0e10", {}, False),  # a branch moves upstream without any change here
        ("afc7aa0a", "v1.0", {}, False),  # a tag too
        ("afc7aa0a", "main", {"model_weights_engram_enabled": False}, True),  # the Engram repo is not used
        ("AFC7AA0A", "1bae0e10", {}, False),  # not as a commit is written
        ("afc7aa", "1bae0e10", {}, False),  # 6 hex: not a commit the resolve step checks
        ("afc7aa0a", "1bae0e10", {"model_weights_verify_full": True}, False),  # a full hash asked for
    ],
)
def test_model_weights_is_gated_only_while_every_revision_is_a_commit(
    tmp_path: Path, model, engram, extra: dict, gated: bool
) -> None:
    """__model_weights_gated, as Ansible templates it from the role's defaults and vars: the read becomes
    `state: absent` (and nothing is recorded) unless every revision the role resolves is a commit or a commit
    prefix, and model_weights_verify_full is off."""
    pins = {"model": {"repo": "o/m", "revision": model}, "engram": {"repo": "o/e", "revision": engram}}
    play = [
        {
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars_files": [str(WEIGHTS / "defaults/main.yml"), str(WEIGHTS / "vars/main.yml")],
            "vars": {"sparkfleet_pins": pins},
            "tasks": [
                {
                    "name": "Gated",
                    "ansible.builtin.debug": {"msg": "GATED={{ __model_weights_gated | bool }}"},
                }
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_FACT_CACHING": "memory"}
    playbook = Path(sys.executable).with_name("ansible-playbook")
    proc = subprocess.run(  # extra vars: above the role's defaults, as an inventory's values are
        [str(playbook), "-i", "localhost,", "-e", json.dumps(extra), str(tmp_path / "play.yml")],
        capture_output=True, text=True, check=False, env=env, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"GATED={gated}" in proc.stdout, proc.stdout


def test_model_weights_gate_reads_first_records_last_and_never_in_check_mode() -> None:
    """The read comes right after the input checks and the role ends there only when every node is clean;
    the record is the role's last task, hashes the same inputs as the read, lists the snapshot by stat, and
    neither runs in check mode; status keeps its own task file (never gated)."""
    main = yaml.safe_load((WEIGHTS / "tasks/main.yml").read_text())
    assert main[0]["ansible.builtin.import_tasks"] == "validate.yml"
    read, clean, _pins, stop = main[1:5]
    gate = read["sparkfleet.cluster.phase_state"]
    assert gate["state"] == "{{ 'read' if __model_weights_gated | bool else 'absent' }}"
    assert read["when"] == "not ansible_check_mode" and read["become"] is True
    assert "hosts_by_rank" in clean["ansible.builtin.set_fact"]["__model_weights_clean"] and clean["run_once"]
    assert stop["ansible.builtin.meta"] == "end_role" and stop["when"] == "__model_weights_clean | bool"
    record = main[-1]["sparkfleet.cluster.phase_state"]
    assert (
        record["state"] == "record" and record["inputs"] == gate["inputs"] and record["path"] == gate["path"]
    )
    assert {"not ansible_check_mode", "__model_weights_gated | bool"} <= set(main[-1]["when"])
    stat_paths = yaml.safe_load((WEIGHTS / "vars/main.yml").read_text())["__model_weights_phase_stat_paths"]
    assert "__model_weights_snapshot" in stat_paths and "huggingface_hub-*.dist-info" in stat_paths
    assert "phase_state" not in (WEIGHTS / "tasks/status.yml").read_text()

"""plugins/modules/files.py run the way Ansible runs it (JSON in, JSON out: its main() in this process,
tests/unit/module_runner.py; one test runs the module file as a process of its own), with a recording
`systemctl` first on PATH: what is written, when systemd is reloaded, what is enabled, check mode."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import module_runner
import pytest
from ansible_collections.sparkfleet.cluster.plugins.modules import files as mod

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="the module writes files owned by root")

FAKE_SYSTEMCTL = """#!/bin/sh
echo "$*" >> "$SYSTEMCTL_LOG"
case "$1" in
  show) for u in "$@"; do
          case "$u" in *.service) echo "NeedDaemonReload=$(cat "$RELOAD_STATE")";; esac
        done ;;
  is-enabled) if grep -qx "$3" "$ENABLED"; then echo enabled; else echo disabled; exit 1; fi ;;
  daemon-reload) echo no > "$RELOAD_STATE" ;;
  enable) echo "$3" >> "$ENABLED" ;;
esac
"""


@pytest.fixture
def node(tmp_path: Path) -> dict:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "systemctl").write_text(FAKE_SYSTEMCTL)
    (bindir / "systemctl").chmod(0o755)
    (tmp_path / "reload").write_text("no\n")
    (tmp_path / "enabled").write_text("")
    return {
        "root": tmp_path,
        "env": {
            **os.environ,
            "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
            "SYSTEMCTL_LOG": str(tmp_path / "calls"),
            "RELOAD_STATE": str(tmp_path / "reload"),
            "ENABLED": str(tmp_path / "enabled"),
        },
    }


def run(node: dict, args: dict, check_mode: bool = False, real: bool = False) -> dict:
    module_args = {**args, "_ansible_check_mode": check_mode, "_ansible_diff": True}
    return module_runner.run("files", module_args, node["env"], real=real)


def calls(node: dict) -> list[str]:
    log = node["root"] / "calls"
    return log.read_text().splitlines() if log.exists() else []


def test_writes_then_changes_nothing_and_enables_once(node: dict) -> None:
    """The module file run as a process of its own, as Ansible runs it."""
    unit = node["root"] / "etc-systemd" / "x.service"  # not under /etc/systemd: reload comes from systemd
    helper = node["root"] / "libexec" / "x-helper"
    args = {
        "files": [
            {"path": str(unit), "content": "[Service]\n", "mode": "0644"},
            {"path": str(helper), "content": "#!/bin/sh\n", "mode": "0755"},
        ],
        "units": ["x.service"],
        "enable": ["x.service"],
    }
    dry = run(node, args, check_mode=True, real=True)
    assert dry["changed"] and dry["changed_files"] == [str(unit), str(helper)]
    assert dry["enabled"] == ["x.service"]
    assert not unit.exists() and not any(c.startswith(("enable", "daemon-reload")) for c in calls(node))
    first = run(node, args, real=True)
    assert first["changed"] and unit.read_text() == "[Service]\n"
    assert helper.stat().st_mode & 0o7777 == 0o755 and first["enabled"] == ["x.service"]
    assert first["diff"][1]["after"] == "#!/bin/sh\n"
    second = run(node, args, real=True)
    assert not second["changed"] and second["changed_files"] == [] and second["enabled"] == []
    assert calls(node).count("enable -- x.service") == 1


def test_a_pending_reload_of_an_interrupted_run_is_done(node: dict) -> None:
    path = node["root"] / "d" / "50-oom.conf"
    args = {"files": [{"path": str(path), "content": "[Service]\nOOMScoreAdjust=-900\n", "mode": "0644"}],
            "units": ["ssh.service"]}  # fmt: skip
    assert run(node, args)["changed"]
    (node["root"] / "reload").write_text("yes\n")  # the file was written, then the run was cut off
    again = run(node, args)
    assert again["changed"] and again["reloaded"] and again["changed_files"] == []
    assert "daemon-reload" in calls(node)
    assert not run(node, args)["changed"]


def test_a_changed_mode_is_a_change(node: dict) -> None:
    path = node["root"] / "f"
    args = {"files": [{"path": str(path), "content": "a\n", "mode": "0644"}]}
    run(node, args)
    path.chmod(0o600)
    assert run(node, args)["changed"] and path.stat().st_mode & 0o7777 == 0o644


def test_bad_entries_fail_naming_them(node: dict) -> None:
    out = run(node, {"files": [{"path": "relative/x", "content": "", "mode": "0644"}, {"path": "/abs"}]})
    assert out["failed"] and "'relative/x'" in out["msg"] and "'/abs'" in out["msg"]


def test_pending_reload_parser() -> None:
    assert mod.pending_reload("NeedDaemonReload=no\nNeedDaemonReload=yes\n")
    assert not mod.pending_reload("NeedDaemonReload=no\n\nNeedDaemonReload=no\n")


def test_directories_are_made_with_parents_then_corrected_then_left_alone(node: dict) -> None:
    top = node["root"] / "w" / "models"
    deep = top / "snap" / "abc"
    dirs = [{"path": str(top), "mode": "0755", "owner": "nobody"}, {"path": str(deep), "mode": "0750"}]
    args = {"dirs": dirs}
    dry = run(node, args, check_mode=True)
    assert dry["changed"] and dry["changed_dirs"] == [str(top), str(deep)] and not top.exists()
    assert run(node, args)["changed"]
    assert top.stat().st_uid == pwd.getpwnam("nobody").pw_uid and top.stat().st_mode & 0o7777 == 0o755
    assert (top / "snap").stat().st_mode & 0o7777 == 0o750 and deep.stat().st_uid == 0  # parents as asked
    assert not run(node, args)["changed"]
    os.chown(top, 0, 0)
    fixed = run(node, args)
    assert fixed["changed_dirs"] == [str(top)] and top.stat().st_uid == pwd.getpwnam("nobody").pw_uid


def test_a_file_where_a_directory_should_be_fails(node: dict) -> None:
    path = node["root"] / "plain"
    path.write_text("x")
    out = run(node, {"dirs": [{"path": str(path), "mode": "0755"}]})
    assert out["failed"] and "is not a directory" in out["msg"]
    out = run(node, {"dirs": [{"path": str(node["root"] / "d"), "mode": "0755", "owner": "no-such-user-x"}]})
    assert out["failed"] and "no-such-user-x" in out["msg"]


def test_an_existing_directory_an_admin_points_to_keeps_its_owner_and_mode(node: dict) -> None:
    """issue 21: model_weights_path: /etc once made the admin the owner of /etc. A directory with if_missing
    is made with its owner and mode only when missing; an existing one (root's, 0755) is left exactly as it
    is, while the role's own directories inside it get the intended owner and mode."""
    theirs = node["root"] / "etc-like"
    theirs.mkdir()
    os.chown(theirs, 0, 0)
    theirs.chmod(0o755)
    (theirs / "passwd").write_text("root:x:0:0\n")
    nobody = pwd.getpwnam("nobody").pw_uid
    args = {
        "dirs": [
            {"path": str(theirs), "mode": "0700", "owner": "nobody", "if_missing": True},
            {"path": str(theirs / "snapshot"), "mode": "0750", "owner": "nobody", "if_missing": True},
            {"path": str(theirs / ".sparkfleet"), "mode": "0750", "owner": "nobody"},
        ]
    }
    dry = run(node, args, check_mode=True)
    assert dry["changed_dirs"] == [str(theirs / "snapshot"), str(theirs / ".sparkfleet")]
    assert all(str(theirs) != d["before_header"] for d in dry["diff"])
    out = run(node, args)
    assert out["changed_dirs"] == [str(theirs / "snapshot"), str(theirs / ".sparkfleet")]
    st = theirs.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (0, 0, 0o755)  # as it was
    for made in ("snapshot", ".sparkfleet"):
        st = (theirs / made).stat()
        assert (st.st_uid, st.st_mode & 0o7777) == (nobody, 0o750)
    assert not run(node, args)["changed"]
    assert not run(node, args, check_mode=True)["changed"]
    # a directory the role made earlier is not taken back either: if_missing means made once, never changed
    os.chown(theirs / "snapshot", 0, 0)
    assert not run(node, args)["changed"] and (theirs / "snapshot").stat().st_uid == 0


def test_a_missing_directory_with_if_missing_is_made_with_its_parents(node: dict) -> None:
    top = node["root"] / "srv" / "sparkfleet" / "models"
    args = {"dirs": [{"path": str(top), "mode": "0755", "owner": "nobody", "if_missing": "true"}]}
    out = run(node, args, check_mode=True)
    assert out["changed_dirs"] == [str(top)] and out["diff"][0]["before"] == "absent\n" and not top.exists()
    assert run(node, args)["changed"]
    nobody = pwd.getpwnam("nobody").pw_uid
    for d in (top, top.parent):  # the parents it made are its own too
        assert d.stat().st_uid == nobody and d.stat().st_mode & 0o7777 == 0o755
    assert not run(node, args)["changed"]


# ---- files_pending (plugins/module_utils/files_state.py): the same verdict from a read made beforehand ----
def test_files_pending_agrees_with_the_module_in_every_state(node: dict) -> None:
    """engine_service skips its files task when files_pending finds nothing: for each state of the node the
    verdict from files_state's read must match what the module itself would change (its check mode)."""
    from ansible_collections.sparkfleet.cluster.plugins.module_utils import files_state

    root = node["root"]
    unit, helper, cache = root / "u" / "x.service", root / "libexec" / "x-helper", root / "cache" / "k"
    args = {
        "files": [
            {"path": str(unit), "content": "[Service]\nExecStart=/bin/true\n", "mode": "0644"},
            {"path": str(helper), "content": "#!/bin/sh\necho é\n", "mode": "0755"},
        ],
        "dirs": [{"path": str(cache), "mode": "0755"}],
        "units": ["x.service"],
        "enable": ["x.service"],
    }

    def verdicts() -> tuple[bool, list[str]]:
        module_changes = run(node, args, check_mode=True)["changed"]
        show = "yes" in (root / "reload").read_text()
        enabled = "x.service" in (root / "enabled").read_text().split()
        units = {"x.service": {"enabled": "enabled" if enabled else "disabled", "need_reload": show}}
        observed = files_state.observe([str(unit), str(helper), str(cache)])
        found = files_state.pending(observed, args["files"], args["dirs"], units, args["enable"])
        return module_changes, found

    states = {}
    states["nothing there"] = verdicts()
    run(node, args)
    states["as written"] = verdicts()
    helper.chmod(0o700)
    states["a file's mode"] = verdicts()
    run(node, args)
    unit.write_text("[Service]\nExecStart=/bin/false\n")
    states["a file's content"] = verdicts()
    run(node, args)
    cache.chmod(0o700)
    states["a directory's mode"] = verdicts()
    run(node, args)
    cache.rmdir()
    states["a directory removed"] = verdicts()
    run(node, args)
    (root / "enabled").write_text("")
    states["a unit disabled"] = verdicts()
    run(node, args)
    (root / "reload").write_text("yes\n")
    states["a reload pending"] = verdicts()
    run(node, args)
    os.chown(helper, 1, 1)
    states["a file's owner"] = verdicts()
    run(node, args)
    states["as written again"] = verdicts()

    assert {name: (module, bool(found)) for name, (module, found) in states.items()} == {
        name: (name not in ("as written", "as written again"),) * 2 for name in states
    }
    assert states["a file's mode"][1] == [f"{helper}: mode or owner"]
    assert states["a file's content"][1] == [f"{unit}: content"]

"""run_playbook against localhost for real: stats, failures, exit codes, artifacts, secrets."""

from __future__ import annotations

import configparser
import importlib.util
import json
from pathlib import Path

import pytest
from sparkfleet.runner import (
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    REDACTED,
    RunnerError,
    fact_cache_env,
    prune_runs,
    run_playbook,
    strategy_env,
)

REPO = Path(__file__).resolve().parents[2]
PB = REPO / "tests" / "unit" / "playbooks"
LOCAL = PB / "inventory" / "local.yml"


@pytest.fixture(autouse=True)
def runs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    runs = tmp_path / "runs"
    monkeypatch.setenv("SPARKFLEET_RUNS_DIR", str(runs))
    monkeypatch.delenv("SPARKFLEET_KEEP_RUNS", raising=False)
    return runs


def run(playbook: str | Path, inventories: list[Path] | None = None, **kw):
    return run_playbook(
        PB / playbook if isinstance(playbook, str) else playbook,
        inventories or [LOCAL],
        project_dir=REPO,
        quiet=True,
        **kw,
    )


def test_ok_changed_skipped_and_layered_inventories(tmp_path: Path, runs_dir: Path) -> None:
    events: list[dict] = []
    work = tmp_path / "work"
    work.mkdir()
    result = run(
        "basic.yml",
        [LOCAL, PB / "inventory" / "extra.yml"],
        extravars={"workdir": str(work)},
        on_event=events.append,
    )
    assert result.exit_code == EXIT_OK and result.status == "successful" and result.ok
    assert sorted(result.hosts) == ["local1", "local2"]
    for stats in result.hosts.values():
        assert (stats.ok, stats.changed, stats.skipped, stats.failed) == (3, 1, 1, 0)
    assert result.failures == []
    assert (work / "local1.txt").read_text() == "local1\n"
    # The second inventory was layered over the first: local2 sees its variable.
    msgs = {
        e["event_data"]["host"]: e["event_data"]["res"].get("msg")
        for e in events
        if e["event"] == "runner_on_ok" and e["event_data"].get("task") == "Show the layered variable"
    }
    assert msgs == {"local1": "layered=none", "local2": "layered=from-extra"}

    # One private data dir per run under the runs root, named after the playbook.
    assert result.artifacts_dir.parent.parent == runs_dir
    assert result.artifacts_dir.parent.name.endswith("-basic")
    assert list((result.artifacts_dir / "job_events").glob("*.json"))
    assert (result.artifacts_dir / "rc").read_text() == "0"
    saved = json.loads((result.artifacts_dir / "sparkfleet-result.json").read_text())
    assert saved["exit_code"] == 0
    # suppress_env_files: nothing but our own runner settings under env/.
    assert [p.name for p in (result.artifacts_dir.parent / "env").iterdir()] == ["settings"]
    command = json.loads((result.artifacts_dir / "command").read_text())
    assert command["env"]["ANSIBLE_CONFIG"] == str(REPO / "ansible.cfg")
    # ansible-runner does not move the fact cache into the run's artifacts: one cache per inventory
    # set (host names repeat across clusters), and host key checking stays ansible.cfg's.
    cache = command["env"]["ANSIBLE_CACHE_PLUGIN_CONNECTION"]
    assert "/sparkfleet/facts-by-inventory/" in cache and str(result.artifacts_dir) not in cache
    assert command["env"]["ANSIBLE_HOST_KEY_CHECKING"] == "True"


def test_each_inventory_set_has_its_own_fact_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ANSIBLE_CACHE_PLUGIN_CONNECTION", raising=False)
    a = fact_cache_env([tmp_path / "tp2", tmp_path / "lab-a"])
    b = fact_cache_env([tmp_path / "tp2", tmp_path / "lab-b"])
    assert a != b and a == fact_cache_env([tmp_path / "tp2", tmp_path / "lab-a"])
    monkeypatch.setenv("ANSIBLE_CACHE_PLUGIN_CONNECTION", str(tmp_path / "mine"))
    assert fact_cache_env([tmp_path / "tp2"]) == {}  # the caller's own choice is kept


def test_check_mode_changes_nothing(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    result = run("basic.yml", extravars={"workdir": str(work)}, check=True, diff=True)
    assert result.exit_code == EXIT_OK and result.check
    assert result.hosts["local1"].changed == 1  # would change ...
    assert list(work.iterdir()) == []  # ... but did not
    command = json.loads((result.artifacts_dir / "command").read_text())["command"]
    assert "--check" in command and "--diff" in command


def test_tags_select_tasks(tmp_path: Path) -> None:
    result = run("basic.yml", extravars={"workdir": str(tmp_path)}, tags="hello")
    assert {h: s.ok for h, s in result.hosts.items()} == {"local1": 1, "local2": 1}
    skipped = run("basic.yml", extravars={"workdir": str(tmp_path)}, skip_tags="hello", check=True)
    assert skipped.hosts["local1"].ok == 2  # copy (check) + layered debug; hello skipped


def test_failed_host_exit_2_with_plain_message() -> None:
    result = run("fail.yml")
    assert result.exit_code == EXIT_FAILED and result.status == "failed" and result.rc == 2
    assert result.hosts["local2"].failed == 1 and result.hosts["local1"].ok == 2
    [failure] = result.failures
    assert failure.kind == "failed" and failure.host == "local2"
    assert failure.task == "Check the disk" and failure.play == "Failing play"
    assert failure.msg == "command exited with status 3"
    assert failure.detail == "disk /dev/nvme9 is missing"
    assert failure.rc == 3 and failure.action == "ansible.builtin.command"
    assert failure.task_path.endswith("fail.yml:7")


def test_assert_message_is_the_fail_msg() -> None:
    [failure] = run("assert.yml").failures
    assert failure.msg == "gpu_clocks_cap_mhz is -5; expected a positive number of MHz"


def test_loop_failure_names_the_items() -> None:
    result = run("loop_fail.yml")
    assert result.exit_code == EXIT_FAILED
    assert "item a.safetensors: command exited with status 1" in result.failures[0].msg
    assert "item b.safetensors" in result.failures[0].msg


def test_rescued_failure_is_not_a_failure() -> None:
    result = run("rescue.yml")
    assert result.exit_code == EXIT_OK and result.failures == []
    assert result.hosts["local1"].rescued == 1


def test_unreachable_host_exit_4() -> None:
    result = run("reach.yml", [PB / "inventory" / "unreachable.yml"])
    assert result.exit_code == EXIT_UNREACHABLE and result.status == "unreachable"
    assert result.hosts["dead"].unreachable == 1 and result.hosts["local1"].ok == 1
    [failure] = result.failures
    assert failure.kind == "unreachable" and failure.host == "dead"
    assert "port 1: Connection refused" in failure.msg
    assert not failure.msg.startswith("Task failed")


def test_playbook_error_exit_1(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "- name: Broken\n  hosts: all\n  tasks:\n    - name: Two actions\n"
        "      ansible.builtin.debug: {msg: hi}\n      bogus_keyword: 1\n"
    )
    result = run(broken)
    assert result.exit_code == EXIT_ERROR and result.status == "error"
    assert result.rc == 4  # ansible's parser error: not "unreachable"
    [failure] = result.failures
    assert failure.kind == "error" and failure.host is None
    assert "conflicting action statements" in failure.msg
    assert "broken.yml" in failure.detail


def test_no_hosts_matched_is_an_error() -> None:
    result = run("reach.yml", limit="nosuchhost")
    assert result.exit_code == EXIT_ERROR
    assert "no hosts to target" in result.failures[0].msg


def test_missing_inputs_raise_before_running() -> None:
    with pytest.raises(RunnerError, match="playbook not found"):
        run("nope.yml")
    with pytest.raises(RunnerError, match="inventory not found"):
        run("reach.yml", [PB / "inventory" / "nope.yml"])


def _files_containing(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def test_secret_extravars_never_reach_the_artifacts(monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    hf_value = "hf_SEKRIT_value_5f2a"
    env_value = "env-SEKRIT-9c1d"
    monkeypatch.setenv("SPARKFLEET_TEST_API_KEY", env_value)
    result = run(
        "secrets.yml",
        extravars={
            "hf_token": hf_value,
            "expected_sha": hashlib.sha256(hf_value.encode()).hexdigest(),
            "plain_value": "visible",
        },
    )
    # The playbook asserted the token arrived intact (sha256 compare) ...
    assert result.exit_code == EXIT_OK, result.failures
    run_dir = result.artifacts_dir.parent
    # ... and neither it nor the secret-named environment variable is anywhere in the run dir.
    assert _files_containing(run_dir, hf_value) == []
    assert _files_containing(run_dir, env_value) == []
    assert not (run_dir / "env" / "extravars").exists()
    command = json.loads((result.artifacts_dir / "command").read_text())
    assert command["env"]["SPARKFLEET_TEST_API_KEY"] == REDACTED
    secret_files = [a[1:] for a in command["command"] if a.startswith("@") and "sparkfleet-secrets-" in a]
    assert secret_files
    assert '"plain_value":"visible"' in " ".join(command["command"])
    # The in-memory file that carried the secret is gone, with its directory. (This run's own: other tests
    # running beside this one under xdist make and remove theirs, so the set of all of them may differ.)
    for path in map(Path, secret_files):
        assert path.parent.name.startswith("sparkfleet-secrets-")
        assert not path.exists() and not path.parent.exists(), path


def test_secret_printed_by_a_task_is_redacted(tmp_path: Path) -> None:
    leaky = tmp_path / "leaky.yml"
    leaky.write_text(
        "- name: Leaky\n  hosts: local1\n  gather_facts: false\n  tasks:\n"
        "    - name: Print it (a role bug)\n      ansible.builtin.debug:\n"
        '        msg: "the key is {{ engine_api_key }}"\n'
    )
    events: list[dict] = []
    result = run(leaky, extravars={"engine_api_key": "sk-SEKRIT-77aa"}, on_event=events.append)
    assert result.exit_code == EXIT_OK
    # The live event still carries it (memory only) but the files on disk do not.
    assert any("sk-SEKRIT-77aa" in json.dumps(e) for e in events)
    assert _files_containing(result.artifacts_dir.parent, "sk-SEKRIT-77aa") == []
    assert _files_containing(result.artifacts_dir, f"the key is {REDACTED}")


def test_only_the_last_runs_are_kept(tmp_path: Path, runs_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs_dir.mkdir(parents=True)
    for stamp in ("20200101T000000Z-up", "20200102T000000Z-up", "20200103T000000Z-status"):
        (runs_dir / stamp).mkdir()
    (runs_dir / "notes.txt").write_text("not a run")
    (runs_dir / "keep-me").mkdir()
    monkeypatch.setenv("SPARKFLEET_KEEP_RUNS", "2")
    result = run("reach.yml", limit="local1")
    left = sorted(p.name for p in runs_dir.iterdir())
    assert left == ["20200103T000000Z-status", result.artifacts_dir.parent.name, "keep-me", "notes.txt"]


def test_prune_never_removes_newer_runs(tmp_path: Path) -> None:
    names = ["20200101T000000Z-a", "20200102T000000Z-b", "20200103T000000Z-c", "20200104T000000Z-d"]
    for name in names:
        (tmp_path / name).mkdir()
    prune_runs(tmp_path, tmp_path / names[2], keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == names[2:]


def test_the_default_strategy_is_linear_and_mitogen_an_opt_in() -> None:
    spec = importlib.util.spec_from_file_location("strategy_plugin", REPO / "plugins/strategy/sparkfleet.py")
    strategy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(strategy)

    assert strategy.StrategyModule.__module__ == "ansible_mitogen.plugins.strategy.mitogen_linear"
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(REPO / "ansible.cfg")
    assert cfg.get("defaults", "strategy") == "linear"
    assert strategy_env("linear") == {"ANSIBLE_STRATEGY": "linear"} and strategy_env("") == {}
    assert strategy_env("mitogen") == {"ANSIBLE_STRATEGY": "sparkfleet"}


@pytest.mark.parametrize("strategy", ["mitogen", "linear"])
def test_both_strategies_converge_and_the_other_then_finds_nothing_to_change(
    strategy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each strategy really runs the modules: a second run, with the other one, finds the work done (the
    idempotence of a run: no test runs the same strategy twice for it). --limit reaches ansible, and each run
    has its own artifacts."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("SPARKFLEET_STRATEGY", strategy)
    first = run("basic.yml", extravars={"workdir": str(work)}, limit="local1")
    monkeypatch.setenv("SPARKFLEET_STRATEGY", "linear" if strategy == "mitogen" else "mitogen")
    second = run("basic.yml", extravars={"workdir": str(work)}, limit="local1")
    assert first.exit_code == EXIT_OK and first.hosts["local1"].changed == 1
    assert second.exit_code == EXIT_OK and second.hosts["local1"].changed == 0
    assert list(first.hosts) == list(second.hosts) == ["local1"]  # --limit reached ansible
    assert first.artifacts_dir != second.artifacts_dir


def test_unknown_strategy_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKFLEET_STRATEGY", "turbo")
    with pytest.raises(RunnerError, match=r"SPARKFLEET_STRATEGY='turbo': use one of linear, mitogen"):
        run("basic.yml")

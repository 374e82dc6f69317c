"""The cluster lock, for real: its holder runs as a local process (`ansible_connection: local`
for the head), the same code that runs on a real head over SSH; the state directory is a
temporary one. Two runs at once, a holder killed with SIGKILL, --break-lock, read-only verbs,
sudo's password."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import jsonschema
import pytest
from sparkfleet import api
from sparkfleet.api import Cluster
from sparkfleet.cli import main
from sparkfleet.runner import SCHEMA_FILE, RunnerError, lock_holder, run_playbook
from sparkfleet.runner import lock as lockmod
from sparkfleet.runner.head import HeadConnection
from sparkfleet.runner.lock import LockRequest

REPO = Path(__file__).resolve().parents[2]
PB = REPO / "tests" / "unit" / "playbooks"
INV = PB / "inventory" / "cluster.yml"
GATE = PB / "gate.yml"
EXIT_LOCKED = 75


@pytest.fixture(autouse=True)
def runs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    runs = tmp_path / "runs"
    monkeypatch.setenv("SPARKFLEET_RUNS_DIR", str(runs))
    return runs


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    """The head's state directory; at the end no process may still hold the lock."""
    path = tmp_path / "state"
    yield path
    lock = path / "lock"
    deadline = time.monotonic() + 15
    while lock.exists() and lock_holder.holders_of(str(lock)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not lock.exists() or lock_holder.holders_of(str(lock)) == [], "a lock holder outlived its run"


def wait_for(what: str, check: Callable[[], object], timeout: float = 30) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def cluster() -> Cluster:
    return Cluster(str(INV), project_dir=REPO)


def record(state: Path) -> dict | None:
    try:
        return json.loads((state / "lock.json").read_text())
    except (OSError, ValueError):
        return None


def lock_is_free(state: Path) -> bool:
    fd = os.open(state / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


class Background:
    """A changing run in a thread (the Python API), held open by the playbook's gate. With `notes`, the
    run is run_playbook's with the lock's messages as they come (the API, quiet, prints none)."""

    def __init__(self, state: Path, gate: Path, notes: list[str] | None = None, **options: object) -> None:
        self.gate = gate
        self.result = None
        self.error: BaseException | None = None
        extravars = {"sparkfleet_state_dir": str(state), "gate": str(gate)}

        def go() -> None:
            try:
                if notes is None:
                    self.result = cluster().run(GATE, extravars=extravars, **options)
                else:
                    self.result = run_playbook(
                        GATE,
                        [str(INV)],
                        project_dir=REPO,
                        quiet=True,
                        extravars=extravars,
                        lock=LockRequest(**{"verb": f"run {GATE}", **options}),
                        notify=notes.append,
                    )
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=go, daemon=True)
        self.thread.start()
        wait_for("the first run to take the lock", lambda: record(state) or self.error)
        assert self.error is None

    def finish(self):
        self.gate.touch()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive() and self.error is None
        return self.result


def test_a_changing_run_takes_the_lock_and_lets_it_go(state: Path) -> None:
    seen: list[dict | None] = []
    result = cluster().run(
        GATE,
        extravars={"sparkfleet_state_dir": str(state)},
        on_event=lambda e: seen.append(record(state)) if e.get("event") == "playbook_on_task_start" else None,
    )
    assert result.ok, result.failures
    assert result.lock is not None and result.lock.outcome == "taken"
    assert result.lock.head == "local1" and result.lock.path == f"{state}/lock"
    # While the playbook ran, the record named this run ...
    during = next(r for r in seen if r)
    assert during["pid"] == os.getpid() and during["user"] and during["controller"] == socket.gethostname()
    assert during["verb"] == f"run {GATE}" and during["playbook"] == str(GATE)
    assert during["head_hostname"] and during["holder_pid"] != os.getpid() and during["sparkfleet_version"]
    # ... and at the end the record is gone and no process holds the flock.
    assert record(state) is None and lock_is_free(state)
    doc = result.to_dict()
    jsonschema.validate(doc, json.loads(SCHEMA_FILE.read_text()))
    assert doc["schema_version"] == "1.2" and doc["lock"]["outcome"] == "taken"


def test_a_second_changing_run_is_refused_naming_the_holder(
    state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = Background(state, tmp_path / "gate")
    holder = record(state)
    argv = [
        "run",
        str(GATE),
        "-i",
        str(INV),
        "-e",
        f"sparkfleet_state_dir={state}",
        "--project-dir",
        str(REPO),
    ]
    started = time.monotonic()
    assert main(argv) == EXIT_LOCKED
    assert time.monotonic() - started < 20  # refused at once, not after waiting
    out = capsys.readouterr().out
    who = f"{holder['user']}@{holder['controller']} (pid {os.getpid()}, `sparkfleet run {GATE}`"
    assert f"LOCKED  the cluster lock on local1 ({state}/lock) is held by {who}" in out
    assert "--break-lock" in out and "result: locked (exit 75)" in out

    assert main([*argv, "--json", "-q"]) == EXIT_LOCKED
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert captured.err == ""
    jsonschema.validate(doc, json.loads(SCHEMA_FILE.read_text()))
    assert doc["status"] == "locked" and doc["exit_code"] == EXIT_LOCKED and doc["hosts"] == {}
    assert doc["lock"]["outcome"] == "refused" and doc["lock"]["holder"]["run_id"] == holder["run_id"]
    assert doc["failures"][0]["kind"] == "locked" and doc["failures"][0]["host"] == "local1"
    assert record(state) == holder  # the refused runs left the holder alone

    result = first.finish()
    assert result.ok and result.lock.outcome == "taken" and result.lock.notes == []
    assert record(state) is None
    again = cluster().run(GATE, extravars={"sparkfleet_state_dir": str(state)})
    assert again.ok and again.lock.outcome == "taken"


def test_a_run_killed_with_sigkill_frees_the_lock_and_the_next_run_takes_over(
    state: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    cli = [
        sys.executable,
        "-m",
        "sparkfleet",
        "run",
        str(GATE),
        "-i",
        str(INV),
        "-q",
        "--project-dir",
        str(REPO),
    ]
    cli += ["-e", f"sparkfleet_state_dir={state}", "-e", f"gate={gate}"]
    log = tmp_path / "cli.log"  # the CLI's output, shown when the record is not as expected
    with log.open("wb") as out:
        proc = subprocess.Popen(cli, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        held = wait_for("the CLI to take the lock", lambda: record(state))
        assert held["pid"] == proc.pid
        ran = proc.poll()  # None: the run was still going (held by the gate) when it was killed
        proc.kill()  # SIGKILL: no cleanup runs in sparkfleet
        proc.wait()
        # The holder on the "head" sees its connection close and exits: the kernel frees the flock.
        wait_for("the holder to let go", lambda: lock_is_free(state), timeout=20)
        left = record(state)  # the record of the run that is gone stays
        assert ran is None and left is not None and left["run_id"] == held["run_id"], (
            f"CLI exit before the kill: {ran}; record: {left}\n{log.read_text(errors='replace')[-3000:]}"
        )
    finally:
        gate.touch()  # the orphaned ansible-playbook ends too
        if proc.poll() is None:
            proc.kill()
    result = cluster().run(GATE, extravars={"sparkfleet_state_dir": str(state)})
    assert result.ok and result.lock.outcome == "taken_over"
    assert result.lock.holder["pid"] == proc.pid and result.lock.holder["run_id"] == held["run_id"]
    message = result.lock.message
    assert message.startswith(f"taking over the cluster lock on local1 ({state}/lock) from ")
    assert f"(pid {proc.pid}, `sparkfleet run {GATE}`" in message and message.endswith("whose run is gone")
    assert record(state) is None


def test_the_takeover_message_is_printed(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state.mkdir()
    gone = {"run_id": "0" * 32, "user": "alice", "controller": "laptop", "pid": 4242, "verb": "up"}
    (state / "lock.json").write_text(json.dumps(gone))
    argv = [
        "run",
        str(GATE),
        "-i",
        str(INV),
        "-e",
        f"sparkfleet_state_dir={state}",
        "--project-dir",
        str(REPO),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"lock: taking over the cluster lock on local1 ({state}/lock) from alice@laptop (pid 4242" in out
    assert "whose run is gone" in out


def test_break_lock_stops_the_holder_and_takes_the_lock(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lockmod, "HEARTBEAT_S", 0.2)
    monkeypatch.setattr(lockmod, "RETAKE_S", 0.2)
    first_notes: list[str] = []
    first = Background(state, tmp_path / "gate", notes=first_notes)
    held = record(state)
    # The breaking run holds the lock (its own gate closed) until the first run has found it held: the
    # order this test is about, waited for, not left to which run is faster on a busy machine.
    notes: list[str] = []
    breaking = Background(state, tmp_path / "gate-2", notes=notes, verb="stop", break_lock=True)
    wait_for(
        "the first run to find the lock held by the breaking run",
        lambda: any(n.startswith("lock: now held by ") for n in first_notes) or breaking.error,
    )
    result = breaking.finish()
    assert result.ok, result.failures
    assert result.lock.outcome == "broken", result.lock
    assert result.lock.holder["run_id"] == held["run_id"]
    who = lockmod.describe_holder(held).split(", since")[0]
    assert len(notes) == 1 and notes[0].startswith(
        f"lock: broke the cluster lock on local1 ({state}/lock), held by {who}"
    )
    # The first run noticed at its next heartbeat, found the lock held by the breaking run and
    # went on without it (it does not fight over a lock that was broken).
    first_result = first.finish()
    assert first_result.ok
    assert len(first_result.lock.notes) == 2, first_result.lock.notes
    lost, now = first_result.lock.notes
    assert lost.startswith("lost the cluster lock on local1 (stopped by signal 15)")
    assert now.startswith("now held by ") and "`sparkfleet stop`" in now
    assert now.endswith("this run goes on without the lock")
    assert record(state) is None


def test_break_lock_through_the_cli_and_the_api(
    state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = Background(state, tmp_path / "gate")
    held = record(state)
    argv = [
        "run",
        str(GATE),
        "-i",
        str(INV),
        "-e",
        f"sparkfleet_state_dir={state}",
        "--project-dir",
        str(REPO),
    ]
    assert main([*argv, "--break-lock", "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["lock"]["outcome"] == "broken" and doc["lock"]["holder"]["run_id"] == held["run_id"]
    assert f"lock: broke the cluster lock on local1 ({state}/lock), held by " in captured.err
    first.finish()
    assert cluster().run(
        GATE, extravars={"sparkfleet_state_dir": str(state)}, break_lock=True
    ).lock.outcome == ("taken")  # nothing to break: taken as usual


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["status"], "`status` changes nothing"),
        (["clocks", "show"], "`clocks show` changes nothing"),
        (["up", "--check"], "--check changes nothing"),
        (["up", "--list-tasks"], "a listing runs nothing"),
    ],
)
def test_break_lock_where_no_lock_is_taken_is_a_usage_error(
    argv: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "-i", str(INV), "--break-lock"]) == 64
    assert why in capsys.readouterr().err


def test_which_runs_take_the_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[LockRequest | None] = []
    monkeypatch.setattr(api, "run_playbook", lambda *a, **kw: calls.append(kw["lock"]))
    c = Cluster(str(INV), project_dir=REPO)
    for read_only in (c.status, c.host_status, c.preflight, c.verify, c.clocks_show):
        read_only()
    c.up(check=True)
    c.start(list_tasks=True)
    c.run(GATE, ansible_args=["--check"])
    assert calls == [None] * 8
    calls.clear()
    c.up()
    c.stop()
    c.clocks_set(2400)
    c.clocks_reset()
    c.reboot(force=True)
    c.weights(break_lock=True)
    c.run(GATE)
    assert [(r.verb, r.break_lock) for r in calls if r] == [
        ("up", False),
        ("stop", False),
        ("clocks set 2400", False),
        ("clocks reset", False),
        ("reboot --force", False),
        ("weights", True),
        (f"run {GATE}", False),
    ]
    with pytest.raises(ValueError, match="changes nothing and takes no cluster lock"):
        c.status(break_lock=True)


def test_a_check_run_takes_no_lock(state: Path) -> None:
    result = cluster().run(GATE, extravars={"sparkfleet_state_dir": str(state)}, check=True)
    assert result.ok and result.lock is None and not state.exists()
    assert result.to_dict()["lock"] is None


# ---- sudo on the head: a test double of sudo(8)'s -n and -S -p '' -----------------------------

FAKE_SUDO = """#!/bin/bash
# sudo(8) as the lock uses it: -n fails when a password is needed; -S reads the password from the
# first line of stdin (one byte at a time, like sudo: the rest of stdin is the command's), asks
# again after "Sorry, try again." and gives up after 3 attempts. Every argv is logged.
printf '%s\\n' "$*" >> "$FAKE_SUDO_LOG"
case "$1" in
  -n) echo "sudo: a password is required" >&2; exit 1 ;;
  -S) shift 3
      for _ in 1 2 3; do
        IFS= read -r pw || exit 1
        if [ "$(printf %s "$pw" | sha256sum | cut -d' ' -f1)" = "$FAKE_SUDO_SHA" ]; then exec "$@"; fi
        echo "Sorry, try again." >&2
      done
      echo "sudo: 3 incorrect password attempts" >&2; exit 1 ;;
esac
exec "$@"
"""


@pytest.fixture
def fake_sudo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    password = "lock-pw-" + os.urandom(6).hex()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sudo").write_text(FAKE_SUDO)
    (bindir / "sudo").chmod(0o755)
    log = tmp_path / "sudo.log"
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SUDO_LOG", str(log))
    monkeypatch.setenv("FAKE_SUDO_SHA", hashlib.sha256(password.encode()).hexdigest())
    # The head's user is not root here: the holder goes through sudo.
    monkeypatch.setattr(HeadConnection, "root", property(lambda self: False))
    return log, password


def test_the_become_password_reaches_sudo_on_stdin_only(
    state: Path, fake_sudo: tuple[Path, str], runs_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log, password = fake_sudo
    result = cluster().run(GATE, extravars={"sparkfleet_state_dir": str(state)}, become_password=password)
    assert result.ok and result.lock.outcome == "taken"
    assert log.read_text().startswith("-S -p  ")  # sudo -S -p '' <the holder>
    captured = capsys.readouterr()
    for where, text in [
        ("sudo's argv", log.read_text()),
        ("the result", json.dumps(result.to_dict())),
        ("the output", captured.out + captured.err),
        *((str(p), p.read_text(errors="replace")) for p in runs_dir.rglob("*") if p.is_file()),
        *((str(p), p.read_text(errors="replace")) for p in state.rglob("*") if p.is_file()),
    ]:
        assert password not in text, f"the password leaked into {where}"


def test_a_wrong_become_password_is_refused_at_once(state: Path, fake_sudo: tuple[Path, str]) -> None:
    started = time.monotonic()
    with pytest.raises(RunnerError, match=r"sudo on local1 .* refused the become password") as err:
        cluster().run(
            GATE,
            extravars={"sparkfleet_state_dir": str(state)},
            become_password="not-the-password",  # noqa: S106 - a wrong one on purpose
        )
    assert time.monotonic() - started < 15 and "not-the-password" not in str(err.value)


def test_sudo_that_needs_a_password_says_how_to_give_it(state: Path, fake_sudo: tuple[Path, str]) -> None:
    with pytest.raises(RunnerError, match="asks for a password: give it with -K"):
        cluster().run(GATE, extravars={"sparkfleet_state_dir": str(state)})
    log, _ = fake_sudo
    assert log.read_text().startswith("-n ")


def test_the_holder_stops_without_heartbeats(tmp_path: Path) -> None:
    """A link that died without closing the connection: no heartbeat, so the holder lets go."""
    source = lockmod.HOLDER_SOURCE.read_text().replace("IDLE_S = 120.0", "IDLE_S = 1.0")
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-c", source, str(state), "take", json.dumps({"run_id": "x"})],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert json.loads(proc.stdout.readline())["event"] == "held"
        assert json.loads(proc.stdout.readline()) == {
            "event": "gone",
            "why": "no heartbeat from the controller for 1s",
        }
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert lock_is_free(state) and record(state)["run_id"] == "x"


def test_a_holder_lost_during_the_run_is_taken_again(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head went away under the run (a reboot kills the holder, no word from it): at the next
    heartbeat the run notices, and takes the lock again once the head answers."""
    monkeypatch.setattr(lockmod, "HEARTBEAT_S", 0.2)
    first = Background(state, tmp_path / "gate")
    held = record(state)
    os.kill(held["holder_pid"], 9)
    retaken = wait_for(
        "the lock to be taken again", lambda: (record(state) or {}).get("holder_pid") != held["holder_pid"]
    )
    assert retaken and record(state)["run_id"] == held["run_id"]
    result = first.finish()
    assert result.ok and result.lock.outcome == "taken"
    assert result.lock.notes == [
        "lost the cluster lock on local1 (the connection to the head closed); taking it again",
        f"took the cluster lock on local1 ({state}/lock) again",
    ]
    assert record(state) is None


def test_a_take_during_a_break_yields_to_the_breaker_and_a_stale_mark_is_ignored(tmp_path: Path) -> None:
    """The race that made --break-lock fail now and then: the broken run's keeper takes the lock again
    the moment its holder dies, before the breaker's next try. A take that finds a live breaker's mark
    lets the flock go and answers busy with the breaker's record; a mark whose process is gone is
    ignored (a breaker that died mid-break must not lock everyone out)."""
    state = tmp_path / "state"
    state.mkdir()
    me = os.getpid()
    breaker = {
        "run_id": "breaker",
        "user": "bob",
        "holder_pid": me,
        "holder_start": lock_holder.proc_start(me),
        "boot_id": lock_holder.boot_id(),
    }
    (state / "lock.breaking").write_text(json.dumps(breaker))

    def take(run_id: str) -> tuple[int, list[dict]]:
        proc = subprocess.run(
            [sys.executable, str(lockmod.HOLDER_SOURCE), str(state), "take", json.dumps({"run_id": run_id})],
            input=lock_holder.RELEASE.decode(),
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
        return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines()]

    rc, events = take("late-retake")
    assert (rc, events) == (EXIT_LOCKED, [{"event": "busy", "holder": breaker}])
    assert lock_is_free(state) and record(state) is None

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], check=True, capture_output=True, text=True
    )
    stale = {**breaker, "holder_pid": int(gone.stdout)}  # that process has exited
    (state / "lock.breaking").write_text(json.dumps(stale))
    rc, events = take("after-a-dead-breaker")
    assert rc == 0 and [e["event"] for e in events] == ["held", "released"]
    assert (state / "lock.breaking").exists()  # not its mark: a take never removes it

"""`sparkfleet` as a user runs it (a subprocess): exit codes, --json against the schema, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import jsonschema
import pytest
from sparkfleet.runner import SCHEMA_FILE, SCHEMA_VERSION

REPO = Path(__file__).resolve().parents[2]
PB = REPO / "tests" / "unit" / "playbooks"
LOCAL = PB / "inventory" / "local.yml"
VALIDATOR = jsonschema.Draft202012Validator(
    json.loads(SCHEMA_FILE.read_text()), format_checker=jsonschema.FormatChecker()
)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = dict(os.environ)
    e["SPARKFLEET_RUNS_DIR"] = str(tmp_path / "runs")
    e.pop("SPARKFLEET_PROJECT", None)
    return e


def sparkfleet(*argv: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sparkfleet", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_schema_file_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(json.loads(SCHEMA_FILE.read_text()))


def test_human_output_ok(tmp_path: Path, env: dict[str, str]) -> None:
    proc = sparkfleet(
        "run",
        "tests/unit/playbooks/basic.yml",
        "-i",
        str(LOCAL),
        "-i",
        str(PB / "inventory" / "extra.yml"),
        "-e",
        f"workdir={tmp_path}",
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "PLAY Basic play" in out and "  local2: layered=from-extra" in out
    assert "RECAP  tests/unit/playbooks/basic.yml" in out
    assert "result: successful (exit 0)" in out
    artifacts = Path(next(line for line in out.splitlines() if line.startswith("artifacts: "))[11:])
    assert (artifacts / "job_events").is_dir()
    assert artifacts.is_relative_to(tmp_path / "runs")


@pytest.mark.parametrize(
    "case",
    [
        ("basic.yml", "local.yml", 0, "successful"),
        ("fail.yml", "local.yml", 2, "failed"),
        ("reach.yml", "unreachable.yml", 4, "unreachable"),
    ],
)
def test_json_document_and_exit_code(tmp_path: Path, env: dict[str, str], case: tuple) -> None:
    playbook, inventory, code, status = case
    proc = sparkfleet(
        "run",
        str(PB / playbook),
        "-i",
        str(PB / "inventory" / inventory),
        "-e",
        f"workdir={tmp_path}",
        "--json",
        env=env,
    )
    assert proc.returncode == code, proc.stderr
    doc = json.loads(proc.stdout)  # stdout is exactly one JSON document
    VALIDATOR.validate(doc)
    assert doc["schema_version"] == SCHEMA_VERSION
    assert doc["status"] == status and doc["exit_code"] == code
    assert "RECAP" in proc.stderr  # humans still get the recap, on stderr
    if code == 2:
        assert doc["failures"][0]["host"] == "local2"
        assert doc["failures"][0]["detail"] == "disk /dev/nvme9 is missing"
    if code == 4:
        assert doc["hosts"]["dead"]["unreachable"] == 1


def test_json_of_a_broken_playbook(tmp_path: Path, env: dict[str, str]) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text("- name: Broken\n  hosts: all\n  tasks:\n    - ansible.builtin.debug: {msg: [\n")
    proc = sparkfleet("run", str(broken), "-i", str(LOCAL), "--json", "-q", env=env)
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    VALIDATOR.validate(doc)
    assert doc["status"] == "error" and doc["failures"][0]["kind"] == "error"
    assert proc.stderr == ""  # -q: no progress, no recap


def _descendants(root: int) -> dict[int, str]:
    """pid → cmdline of every live process below `root` (Linux /proc)."""
    parents: dict[int, int] = {}
    cmdlines: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
            fields = stat[stat.rindex(b")") + 2 :].split()
            if fields[0] == b"Z":
                continue
            parents[int(entry)] = int(fields[1])
            cmdlines[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                found[child] = cmdlines[child]
                frontier.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state != b"Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_ctrl_c_stops_ansible_and_exits_130(env: dict[str, str]) -> None:
    marker = f"sparkfleet-test-{uuid.uuid4().hex[:12]}"
    argv = ["run", str(PB / "sleep.yml"), "-i", str(LOCAL), "-e", f"marker={marker}", "--json"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparkfleet", *argv],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        below: dict[int, str] = {}
        while time.monotonic() < deadline:
            below = _descendants(proc.pid)
            if any(marker in cmd and "sleep 300" in cmd for cmd in below.values()):
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the long task never started: {below}")
        ansible = [pid for pid, cmd in below.items() if "ansible-playbook" in cmd]
        assert ansible, below
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to the foreground process
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert time.monotonic() - started < 15  # well before the 300 s task would have ended
    doc = json.loads(out)
    VALIDATOR.validate(doc)
    assert doc["status"] == "interrupted" and doc["failures"][0]["kind"] == "interrupted"
    assert doc["failures"][0]["task"] == "Sleep for a long time"
    assert "INTERRUPTED" in err
    # ansible-playbook, its workers and the task's own process are all gone (they were sent their
    # signals; on a busy machine dying can take a moment, a process left running stays 300 s).
    deadline = time.monotonic() + 10
    while (left := [pid for pid in below if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], {pid: below[pid] for pid in left}

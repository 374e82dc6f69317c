"""Rank 0's watch (roles/engine_service/files/sparkfleet-engine-watch) decides from what the workers answer.

The watch runs as it does on rank 0's node (/bin/sh, its environment file), with two doubles first on PATH:
`ssh`, which answers each remote command with the next answer scripted for that worker (the text and exit
code Docker and OpenSSH give: `docker inspect --format '<status> exit <code> <started>'`, `docker wait`
printing the exit code when the container stops, "Error: No such object" with exit 1 for a container that is
gone, exit 255 when SSH itself failed), and `systemctl`, which records the stop. The tests/lab tests run the
real thing on a lab (rank 1 SIGKILLed, a worker node restarted, Docker stopped on a worker); these cover each
verdict alone, including one a lab cannot bring about on demand (a new run between two looks).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WATCH = ROOT / "roles/engine_service/files/sparkfleet-engine-watch"
T1 = "2026-12-06T23:10:01.123456789Z"
T2 = "2026-12-06T23:11:07.987654321Z"
FORMAT = "{{.State.Status}} exit {{.State.ExitCode}} {{.State.StartedAt}}"

SSH = r"""#!/bin/sh
# the ssh double: the remote command is the last argument(s) after user@address
while [ $# -gt 0 ]; do case $1 in *@*) addr=${1#*@}; shift; break ;; *) shift ;; esac; done
echo "$addr $*" >> "$STATE/calls"
answers="$STATE/answers-$addr"
line=$(head -n 1 "$answers")
[ -n "$line" ] || { sleep 3600; exit 0; }  # nothing more scripted: a look that never returns
sed -i 1d "$answers"
rc=${line%% *}
printf '%b\n' "${line#* }"
exit "$rc"
"""

SYSTEMCTL = """#!/bin/sh
echo "systemctl $*" >> "$STATE/calls"
"""


def inspect(status: str, code: int = 0, started: str = T1) -> str:
    return f"0 {status} exit {code} {started}"


def run_watch(
    tmp_path: Path,
    answers: dict[str, list[str]],
    workers: str,
    until: str,
    *,
    timeout: float = 20,
    times: int = 1,
):
    """The watch until its calls log holds `until` `times` times (or the timeout); returns (its output, the
    calls)."""
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for name, text in (("ssh", SSH), ("systemctl", SYSTEMCTL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    for addr, lines in answers.items():
        (state / f"answers-{addr}").write_text("".join(line + "\n" for line in lines))
    (state / "calls").write_text("")
    env_file = tmp_path / "watch.env"
    env_file.write_text(
        "NAME=sparkfleet-engine\nINTERVAL=1\nMISSES=3\nSSH_USER=spark\nSSH_KEY=/nonexistent/key\n"
        "KNOWN_HOSTS=/nonexistent/known\nSSH_OPTIONS='-o BatchMode=yes'\nREMOTE_SUDO='sudo -n'\n"
        f"WORKERS='{workers}'\n"
    )
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "STATE": str(state),
        "SPARKFLEET_ENGINE_WATCH_ENV": str(env_file),
    }
    proc = subprocess.Popen(
        ["/bin/sh", str(WATCH), "watch"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while (state / "calls").read_text().count(until) < times and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # anything more it would do right after
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=10)
    return out, (state / "calls").read_text().splitlines()


STOP = "systemctl stop --no-block sparkfleet-engine.service"


def test_a_container_that_exits_stops_the_engine_as_soon_as_docker_wait_returns(tmp_path):
    out, calls = run_watch(
        tmp_path,
        {"10.0.0.2": [inspect("running"), "0 137", inspect("exited", 137)]},
        "1:spark2=10.0.0.2",
        STOP,
        timeout=5,  # no look INTERVAL apart: the wait's return is the news
    )
    assert "rank 1 on spark2 failed: its container is exited exit 137; stopping the whole engine" in out, out
    look = f"10.0.0.2 sudo -n docker inspect --format '{FORMAT}' sparkfleet-engine"
    assert calls == [look, "10.0.0.2 sudo -n docker wait sparkfleet-engine", look, STOP], calls


def test_a_container_running_again_as_a_new_run_has_failed(tmp_path):
    """docker wait returned (the container stopped) and by the next look the worker's unit had started a new
    run (its node came back): a formed cluster takes no new member."""
    out, _ = run_watch(
        tmp_path,
        {"10.0.0.2": [inspect("running"), "0 143", inspect("running", started=T2)]},
        "1:spark2=10.0.0.2",
        STOP,
    )
    why = f"its container runs again as a new run (started {T2}, was {T1})"
    assert f"rank 1 on spark2 failed: {why}" in out, out


def test_the_same_run_is_followed_again_after_docker_wait_ends_without_a_stop(tmp_path):
    """docker wait ended with an error (e.g. Docker's API restarted under it) but the same run still runs: the
    watch waits on it again and stops nothing."""
    out, calls = run_watch(
        tmp_path,
        {"10.0.0.2": [inspect("running"), "1 error during connect", inspect("running")]},
        "1:spark2=10.0.0.2",
        "docker wait",
        times=2,
    )
    assert sum("docker wait" in c for c in calls) == 2 and STOP not in calls, calls
    assert " failed: " not in out, out


def test_a_worker_that_stops_answering_fails_after_misses_looks_in_a_row(tmp_path):
    ssh_failed = "255 ssh: connect to host 10.0.0.2 port 22: Connection timed out"
    start = time.monotonic()
    timed_out = "255 Timeout, server 10.0.0.2 not responding."
    out, _ = run_watch(
        tmp_path,
        {"10.0.0.2": [inspect("running"), timed_out, ssh_failed, ssh_failed]},
        "1:spark2=10.0.0.2",
        STOP,
    )
    took = time.monotonic() - start
    assert "rank 1 on spark2 failed: spark2 did not answer 3 times in a row (ssh: connect to host" in out, out
    assert took >= 2, took  # two looks INTERVAL (1 s) apart after the wait's SSH failed


def test_a_worker_not_running_yet_is_waited_for_then_a_gone_container_has_failed(tmp_path):
    out, calls = run_watch(
        tmp_path,
        {
            "10.0.0.2": [
                "1 \\nError: No such object: sparkfleet-engine",  # not created yet: no verdict
                inspect("created"),  # not running yet: no verdict
                inspect("running"),
                "1 Error response from daemon: No such container: sparkfleet-engine",  # removed while waited
                "1 \\nError: No such object: sparkfleet-engine",
            ]
        },
        "1:spark2=10.0.0.2",
        STOP,
    )
    gone = "its container is gone (Error: No such object: sparkfleet-engine)"
    assert f"rank 1 on spark2 failed: {gone}" in out, out
    assert sum("docker inspect" in c for c in calls) == 4, calls


def test_every_worker_is_followed_at_once_and_only_the_failed_rank_is_named(tmp_path):
    out, calls = run_watch(
        tmp_path,
        {
            "10.0.0.2": [inspect("running")],  # rank 1 runs: its wait never returns
            "10.0.0.3": [inspect("running"), "0 137", inspect("exited", 137)],
        },
        "1:spark2=10.0.0.2 2:spark3=10.0.0.3",
        STOP,
    )
    assert "rank 2 on spark3 failed: its container is exited exit 137" in out, out
    assert "rank 1" not in out.split("watching ranks:")[1].split("\n", 1)[1], out
    assert "10.0.0.2 sudo -n docker wait sparkfleet-engine" in calls, calls


def test_nothing_is_stopped_for_a_worker_never_seen_running(tmp_path):
    """Docker not answering on one worker, SSH refused by the other: neither ran yet, so the cluster may still
    be forming; each is asked again every INTERVAL (1 s) and nothing is stopped."""
    out, calls = run_watch(
        tmp_path,
        {
            "10.0.0.2": ["1 Cannot connect to the Docker daemon"] * 4,
            "10.0.0.3": ["255 Connection refused"] * 4,
        },
        "1:spark2=10.0.0.2 2:spark3=10.0.0.3",
        "never",
        timeout=4,
    )
    assert STOP not in calls and " failed: " not in out, (out, calls)
    for addr in ("10.0.0.2", "10.0.0.3"):
        assert sum(c.startswith(f"{addr} sudo -n docker inspect") for c in calls) >= 3, calls

"""earlyoom under real memory pressure (molecule/vm): on a VM with its own kernel, RAM and swap, a process
that stands in for the engine (its process name is the one earlyoom's --prefer regex names) allocates memory
until something stops it. earlyoom, as the role configured it, must be what stops it: its journal names the
stand-in, the stand-in died of that signal, the kernel's OOM killer never ran, and sshd, systemd (and docker
where a node has it) live on with the same pids and OOM scores. The stand-in's unit and script are removed
afterwards."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.usefixtures("lab")

ROOT = Path(__file__).resolve().parents[2]
EARLYOOM = yaml.safe_load((ROOT / "roles/earlyoom/defaults/main.yml").read_text())
# the engine's process name, as the lab's inventory (inventory/tp2) names it to earlyoom
NAME = yaml.safe_load((ROOT / "inventory/tp2/group_vars/all/host.yml").read_text())["earlyoom_prefer_names"]
NAME = NAME[0]
UNIT = "sparkfleet-vm-oom-standin"
DIR = "/var/tmp/sparkfleet-vm-oom"
KILLED = re.compile(r'sending (SIGTERM|SIGKILL) to process (\d+) uid (\d+) "([^"]*)"')

# The stand-in: a script's process name (comm) is its file name. It prints its pid, then takes memory in 8 MiB
# steps, every page written (bytes of 0x01, not lazily zeroed pages), up to a ceiling above RAM + swap, so
# that something must stop it; if nothing does within its time it says so and exits 0.
STANDIN = """#!/usr/bin/python3
import os, sys, time
print(os.getpid(), flush=True)
ceiling, seconds = int(sys.argv[1]) << 20, int(sys.argv[2])
held, step = [], 8 << 20
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    if len(held) * step < ceiling:
        held.append(b"\\x01" * step)
    time.sleep(0.02)
print("not stopped: held", len(held) * step >> 20, "MiB", flush=True)
"""


def _ssh(lab, host: str, cmd: str, timeout: float, stdin: str | None = None) -> subprocess.CompletedProcess:
    """One plain SSH command (no shared master: a node under memory pressure answers keep-alives late)."""
    return subprocess.run(
        ["ssh", "-F", str(lab.ssh_config), "-o", "ConnectTimeout=30", host, cmd],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _survivors(h) -> dict[str, tuple[int, str, int]]:
    """{unit: (main pid, process name, oom_score_adj)} of the protected units this node runs, and systemd
    (pid 1)."""
    out = {}
    for unit in EARLYOOM["earlyoom_protected_units"]:
        pid = int(h.check_output(f"systemctl show -p MainPID --value {unit}") or 0)
        if pid:
            out[unit] = pid
    out["systemd"] = 1
    return {
        what: (
            pid,
            h.check_output(f"cat /proc/{pid}/comm"),
            int(h.check_output(f"cat /proc/{pid}/oom_score_adj")),
        )
        for what, pid in out.items()
    }


@pytest.fixture
def standin(lab):
    host = lab.hosts[-1]
    put = _ssh(lab, host, f"sudo install -d -m 0755 {DIR} && sudo tee {DIR}/{NAME} >/dev/null", 60, STANDIN)
    assert put.returncode == 0, put.stderr
    assert _ssh(lab, host, f"sudo chmod 0755 {DIR}/{NAME}", 60).returncode == 0
    yield host
    # whatever happened: no stand-in left running, no unit left failed, no file left
    cleanup = f"sudo systemctl stop {UNIT}; sudo systemctl reset-failed {UNIT}; sudo rm -rf {DIR}; true"
    _ssh(lab, host, cleanup, 120)


def test_earlyoom_kills_the_engine_stand_in_and_spares_sshd_and_systemd(lab, node, standin):
    h = node(standin)
    # the running earlyoom prefers the stand-in's name (its arguments, as the role started it)
    earlyoom = h.check_output("systemctl show -p MainPID --value earlyoom")
    argv = h.check_output(f"tr '\\0' '\\n' < /proc/{earlyoom}/cmdline").split()
    prefer = argv[argv.index("--prefer") + 1]
    assert re.search(prefer, NAME) and not re.search(prefer, "python3"), prefer
    meminfo = dict(line.split(":", 1) for line in h.check_output("cat /proc/meminfo").splitlines())
    ram_mib, swap_mib = (int(meminfo[k].split()[0]) >> 10 for k in ("MemTotal", "SwapTotal"))
    assert swap_mib > 0  # host_tuning's swapfile: earlyoom acts on memory alone (-s 100)
    before = _survivors(h)
    assert "ssh.service" in before
    since = h.check_output("date +%s")

    # the stand-in as a service (as the engine runs: OOM score 0), waited for, its output piped back
    ceiling = ram_mib + swap_mib + 256
    run = _ssh(
        lab,
        standin,
        f"sudo systemd-run --unit={UNIT} --collect --wait --pipe -p RuntimeMaxSec=400 "
        f"{shlex.quote(f'{DIR}/{NAME}')} {ceiling} 300",
        timeout=600,
    )
    pid = int(run.stdout.split()[0])
    assert "not stopped" not in run.stdout, run.stdout + run.stderr
    # it died of a signal, not of its own accord ("... terminated with: code=killed, status=15/TERM")
    status = re.search(r"code=killed, status=\d+/(\w+)", run.stderr)
    assert status, run.stdout + run.stderr

    journal = h.check_output(f"sudo journalctl -u earlyoom.service --since @{since} -o cat --no-pager")
    kills = [m.groups() for m in KILLED.finditer(journal)]
    assert kills, f"earlyoom sent no signal:\n{journal}"
    # every signal earlyoom sent went to the stand-in, by name, and the last one is what it died of
    assert {(int(p), name) for _sig, p, _uid, name in kills} == {(pid, NAME)}, journal
    assert kills[-1][0] == f"SIG{status.group(1)}", (kills, run.stderr)
    kernel = h.check_output(f"sudo journalctl -k --since @{since} -o cat --no-pager")
    assert "Out of memory" not in kernel and "oom-kill" not in kernel, kernel  # earlyoom acted first

    after = _survivors(h)
    assert after == before, (before, after)  # the same processes, alive, with the same OOM scores
    for unit, (_pid, _name, adj) in after.items():
        if unit != "systemd":
            assert adj <= EARLYOOM["earlyoom_oom_score_adjust"], (unit, adj)
    assert h.service("earlyoom").is_running

"""The chaos suite: faults a real cluster meets, each asserting the message the admin gets and the recovery.

Runs in the TP3 lab (the tp3 molecule scenario's verify, so in CI), after the read-only tests, and leaves the
cluster converged and serving. Each test drives the `sparkfleet` command as an admin would (a subprocess,
plain output) and disturbs the lab from outside, as the fault would:

- Ctrl-C during a long step (the engine's first load), then a rerun finishes;
- two cables swapped on a node (its two ports' netdevs trade names, so each port's addresses sit on the
  other cable, as when the cables are swapped; a rename, no reboot): the link check names rail, expected and
  actual peer and the cluster_plan_cabling that matches; `network --discover` says the same and changes
  nothing; swapping back heals;
- Docker stopped on a worker while `start` waits for it: named as such, in the failing task and in status;
  the next `start` (which starts docker.service, desired state) heals;
- the disk filling up during the weights copy (a tmpfs over a worker's model directory, filled by another
  writer as soon as the copy's rsync daemon starts): the error names node and path, no cut-off file is at
  its final path, status notes the cut-off copy; after freeing space a rerun completes;
- a worker's container stopped while the cluster loads: `start` stops cleanly naming the node; status says
  which node; the next `start` recovers.

Two more chaos cases live beside the tests of their subject: two changing runs at once (tests/lab/
test_lock.py) and rank 1 killed with SIGKILL while serving (tests/lab/test_engine.py).
`SPARKFLEET_LAB=<tp3 lab> pytest tests/lab/test_chaos.py` (a converged lab).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
from lab_cli import command, env, sparkfleet

pytestmark = [pytest.mark.destructive, pytest.mark.topology("tp3")]

ENGINE = "sparkfleet-engine"
MODELS = "/srv/sparkfleet/models"
SNAPSHOT = f"{MODELS}/snapshot"
MANIFEST = f"{MODELS}/.sparkfleet/manifest.json"
PORTS = {0: ("enp1s0f0np0", "enP2p1s0f0np0"), 1: ("enp1s0f1np1", "enP2p1s0f1np1")}


class Background:
    """A `sparkfleet` run in the background whose output is read line by line, so a test can act when a
    given task begins (as an admin or a fault would, mid-run)."""

    def __init__(self, lab, *argv: str) -> None:
        self.proc = subprocess.Popen(
            command(lab, *argv),
            cwd=lab.project_dir,
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # a Ctrl-C is sent to it alone, as a terminal would
        )
        self.lines: list[str] = []
        self._seen = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._seen:
                self.lines.append(line.rstrip("\n"))
                self._seen.notify_all()
        with self._seen:
            self._seen.notify_all()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 600) -> str:
        """The first output line matching `pattern`; fails (with the output) when the run ends first."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._seen:
            while True:
                for line in self.lines:
                    if rx.search(line):
                        return line
                if self.proc.poll() is not None and not self._reader.is_alive():
                    raise AssertionError(f"the run ended before {pattern!r}:\n{self.output[-4000:]}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {pattern!r} within {timeout} s:\n{self.output[-4000:]}")
                self._seen.wait(min(left, 1.0))

    def __enter__(self) -> Background:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:  # the test left early: nothing of the run is left behind
            os.killpg(self.proc.pid, signal.SIGKILL)

    def _tree(self) -> list[int]:
        """The run's processes, parents first: the wrapper, then ansible-playbook (ansible-runner spawns it
        in a session of its own on a pty: the run's process group does not hold it), its workers, ssh."""
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue  # gone meanwhile
                children.setdefault(ppid, []).append(int(entry))
        order, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop(0)
            order.append(pid)
            todo += children.get(pid, [])
        return order

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The run held still (SIGSTOP, parents before children, so none forks past it) while the test acts,
        then let go (SIGCONT): a fault lands between two of the run's steps, not racing them."""
        stopped: list[int] = []
        try:
            for _ in range(2):  # a second walk finds what a parent forked before it stopped
                for pid in self._tree():
                    if pid not in stopped:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGSTOP)
                            stopped.append(pid)
            yield
        finally:
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def finish(self, timeout: float = 900) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise
        self._reader.join(timeout=30)
        return rc


def result_of(proc: subprocess.CompletedProcess[str]) -> dict:
    """The run's result document (sparkfleet-result.json in the artifacts directory its last line names)."""
    found = re.search(r"^artifacts: (\S+)$", proc.stdout, re.MULTILINE)
    assert found, proc.stdout[-4000:]
    with open(os.path.join(found.group(1), "sparkfleet-result.json"), encoding="utf-8") as f:
        return json.load(f)


def task_started(name: str) -> str:
    """The plain-output line of a task's start (`[1m15s] TASK role : name`)."""
    return r"^\[[^]]+\] TASK [a-z_]+ : " + re.escape(name)


def status(lab) -> dict:
    proc = sparkfleet(lab, "status", "--json", "-q")
    doc = json.loads(proc.stdout)
    return doc["data"]["engine_status"]


def healthy(lab) -> bool:
    return bool(status(lab)["healthy"])


def recovered(lab) -> None:
    """`sparkfleet start` brings the cluster back and the status it ends with says healthy (one run: start
    reads the status as `sparkfleet status` does, playbooks/start.yml)."""
    start = sparkfleet(lab, "start", "--json")
    assert start.returncode == 0, start.stdout[-4000:] + start.stderr
    doc = json.loads(start.stdout)["data"]["engine_status"]
    assert doc["healthy"], doc


def stopped(lab) -> None:
    stop = sparkfleet(lab, "stop")
    assert stop.returncode == 0, stop.stdout[-4000:] + stop.stderr


# ---- Ctrl-C ------------------------------------------------------------------------------------------------


def test_ctrl_c_during_the_engines_load_then_a_rerun_finishes(lab) -> None:
    stopped(lab)
    with Background(lab, "start", "-e", "engine_service_ready_poll=1") as run:
        run.wait_for(task_started("Wait until the API is ready"))
        time.sleep(2)  # a probe or two: the step is under way
        os.killpg(run.proc.pid, signal.SIGINT)  # the terminal's Ctrl-C goes to the whole foreground group
        rc = run.finish(timeout=120)
    assert rc == 130, run.output[-4000:]
    assert "result: interrupted (exit 130)" in run.output, run.output[-4000:]
    # nothing of that run is left on the controller (ansible and its ssh children are gone)
    left = subprocess.run(["pgrep", "-s", str(run.proc.pid)], capture_output=True, text=True, check=False)
    assert left.stdout.strip() == "", left.stdout
    recovered(lab)


# ---- two cables swapped -----------------------------------------------------------------------------------


def swap_ports(lab, host: str) -> None:
    """Swap the cables of a node's port 0 and port 1: the netdevs trade names (the link follows its cable),
    then systemd-networkd applies each name's configuration again, so each address sits on the other cable."""
    script = ["set -e"]
    for a, b in zip(PORTS[0], PORTS[1], strict=True):
        script += [
            f"ip link set dev {a} down",
            f"ip link set dev {b} down",
            f"ip link set dev {a} name sfswap",
            f"ip link set dev {b} name {a}",
            f"ip link set dev sfswap name {b}",
            f"ip -4 addr flush dev {a}",
            f"ip -4 addr flush dev {b}",
            f"ip link set dev {a} up",
            f"ip link set dev {b} up",
        ]
    names = " ".join(PORTS[0] + PORTS[1])
    script += ["networkctl reload", f"networkctl reconfigure {names}"]
    lab.exec(host, "sh", "-c", "\n".join(script))


def test_two_swapped_cables_are_named_and_swapping_back_heals(lab) -> None:
    head = lab.hosts[0]
    swap_ports(lab, head)
    try:
        proc = sparkfleet(lab, "network")
        out = proc.stdout
        assert proc.returncode == 2, out[-4000:]
        # per rail: the port, expected peer and what it really reaches
        assert re.search(
            rf"{head} {PORTS[0][0]} \(port 0\) rail 1: expected {lab.hosts[1]} .*found {lab.hosts[2]}", out
        ), out[-4000:]
        assert re.search(
            rf"{head} {PORTS[1][0]} \(port 1\) rail 1: expected {lab.hosts[2]} .*found {lab.hosts[1]}", out
        ), out[-4000:]
        assert "cluster_plan_cabling that matches the real cables" in out, out[-4000:]
        discover = sparkfleet(lab, "network", "--discover")
        assert discover.returncode == 0, discover.stdout[-4000:]
        assert "cabling found by ARP probes" in discover.stdout
        assert re.search(r"- \{a: \{node: 1, port: 0\}, b: \{node: 3, port: 0\}\}", discover.stdout), (
            discover.stdout[-4000:]
        )
        assert all(h["changed"] == 0 for h in result_of(discover)["hosts"].values()), discover.stdout[-4000:]
    finally:
        swap_ports(lab, head)
    healed = sparkfleet(lab, "network")
    assert healed.returncode == 0, healed.stdout[-4000:]


# ---- Docker stopped on a worker ---------------------------------------------------------------------------


def test_docker_stopped_on_a_worker_during_start_is_named_and_a_rerun_heals(lab) -> None:
    worker = lab.hosts[2]
    stopped(lab)
    with Background(lab, "start") as run:
        # The worker's unit has been started (Requires=docker.service: starting it would start Docker again).
        # Held still here, the run meets the stopped Docker in its wait for the worker; when the worker passed
        # its checks before the freeze, in every rank's words after rank 0's failed rendezvous, or in the
        # status it ends with (roles/engine_service/README.md, start step 4). Each way names Docker.
        run.wait_for(task_started("Wait until each worker passed its argument checks"))
        with run.frozen():
            lab.exec(worker, "systemctl", "stop", "docker.socket", "docker.service")
            docker = lab.exec(worker, "systemctl", "is-active", "docker.service", check=False).strip()
            assert docker != "active", docker
        rc = run.finish()
    assert rc == 2, run.output[-4000:]
    assert f"Docker is not running on {worker}" in run.output, run.output[-4000:]
    notes = " ".join(status(lab)["notes"])
    assert f"Docker is not running on {worker}" in notes, notes
    recovered(lab)  # start makes docker.service run again (desired state), then the engine


# ---- the disk filling up during the copy ------------------------------------------------------------------


FILLER = """
set -e
# the copy has begun on this worker: an rsync (transports ssh, rsyncd) or the tcp transport's receiver
while ! pgrep -x rsync >/dev/null && ! pgrep -f 'import [h]mac, os, socket' >/dev/null; do sleep 0.02; done
# the copy writes while this measures: a fill that no longer fits is tried again with what is left
for try in 1 2 3 4 5 6 7 8 9 10; do
  avail=$(df --output=avail -B1 {dir} | tail -n1)
  fallocate -l $((avail - 65536)) {dir}/.chaos-filler.$try 2>/dev/null && break
done
echo filled
"""


def test_the_disk_filling_up_during_the_copy_is_named_and_a_rerun_after_freeing_space_completes(lab) -> None:
    head, worker = lab.hosts[0], lab.hosts[1]
    if not healthy(lab):  # an earlier test left it down: this one shows a copy fault leaves serving alone
        recovered(lab)
    need = int(lab.exec(head, "du", "-sb", "--apparent-size", MODELS).split()[0])
    size_kib = need * 2 // 1024 + 4096
    # an empty filesystem of its own over the worker's model directory, big enough for the disk check
    lab.exec(worker, "mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "chaos", MODELS)
    try:
        filler = subprocess.Popen(
            ["docker", "exec", lab.container(worker), "sh", "-c", FILLER.format(dir=MODELS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        no_margin = ["-e", "model_weights_disk_margin_gb=0", "-e", "model_weights_rank_margin_gb=0"]
        proc = sparkfleet(lab, "weights", *no_margin)
        filled = filler.communicate(timeout=30)[0]
        assert "filled" in filled, filled
        out = proc.stdout
        assert proc.returncode == 2, out[-4000:]
        assert f"{worker}: the disk is full at {MODELS}" in out, out[-4000:]
        assert "No space left on device while writing" in out
        # no cut-off file at its final path: whatever is there is whole
        listing = lab.exec(
            worker,
            "sh",
            "-c",
            f"cd {SNAPSHOT} 2>/dev/null && find . -path ./.rsync-partial -prune -o -type f -print",
        ).split()
        head_sums = {f["path"]: f["sha256"] for f in json.loads(lab.exec(head, "cat", MANIFEST))["files"]}
        for found in listing:
            rel = found.removeprefix("./")
            if rel in head_sums:
                got = lab.exec(worker, "sha256sum", f"{SNAPSHOT}/{rel}").split()[0]
                assert got == head_sums[rel], f"{rel} is at its final path but cut off"
        notes = " ".join(status(lab)["notes"])
        assert f"{worker}: the disk is full at {SNAPSHOT}" in notes, notes
        assert "the copy of the weights was cut off" in notes, notes
        # free the space: the rerun completes, resuming what was there
        lab.exec(worker, "sh", "-c", f"rm -f {MODELS}/.chaos-filler*")
        again = sparkfleet(lab, "weights", *no_margin)
        assert again.returncode == 0, again.stdout[-4000:]
        record = json.loads(lab.exec(worker, "cat", MANIFEST))
        assert {f["path"]: f["sha256"] for f in record["files"]} == head_sums
    finally:
        lab.exec(worker, "sh", "-c", f"umount {MODELS} || umount -l {MODELS}", check=False)
    assert healthy(lab)


# ---- a worker's container stopped mid-run -----------------------------------------------------------------


def test_a_worker_container_stopped_while_the_cluster_loads_stops_start_cleanly(lab) -> None:
    worker = lab.hosts[1]
    stopped(lab)
    # rank 0 then waits at the rendezvous for the stopped rank (600 s, as TensorFold does): the run's ready
    # timeout ends the wait, then every rank's log is read; 30 s of it is enough to show that
    timeout = ("-e", "engine_service_ready_timeout=30", "-e", "engine_service_ready_poll=1")
    with Background(lab, "start", *timeout) as run:
        run.wait_for(task_started("Wait until the API is ready"))
        lab.exec(worker, "docker", "stop", ENGINE)
        rc = run.finish()
    assert rc == 2, run.output[-4000:]
    assert "timeout in seconds 30" in run.output, run.output[-4000:]
    # the failure names the stopped rank and how it ended (docker stop: SIGTERM, exit 143)
    assert f"{worker} (rank 1) stopped: killed by SIGTERM (exit 143)" in run.output, run.output[-4000:]
    doc = status(lab)
    assert not doc["healthy"]
    notes = " ".join(doc["notes"])
    assert f"{worker} (rank 1)" in notes, notes
    recovered(lab)

"""Host tuning, earlyoom and whole-cluster reboots on a live lab (converged by site.yml, or at least by
playbooks/host.yml and playbooks/clocks.yml). See tests/lab/conftest.py for the fixtures."""

from __future__ import annotations

import json
import shlex
import subprocess
import time

import pytest
from lab_events import Events

SPEC_EARLYOOM_AVOID = "(^|/)(sshd|systemd|dockerd|containerd|containerd-shim.*)$"


def changed(result) -> dict[str, int]:
    return {h: s.changed for h, s in result.hosts.items()}


def sudo(node, host: str, cmd: str) -> str:
    return node(host).check_output(f"sudo sh -c {shlex.quote(cmd)}")


def docker_exec(lab, host: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", "exec", lab.container(host), *cmd], capture_output=True, text=True, check=check
    )


def _engine_running(lab) -> bool:
    """Whether engine_service's containers run on any node (they carry its label)."""
    return any(
        docker_exec(
            lab, h, "docker", "ps", "-q", "--filter", "label=io.sparkfleet.engine.managed=true", check=False
        ).stdout.strip()
        for h in lab.hosts
    )


def pid1_start(lab, host: str) -> str:
    """Changes on every boot of a lab node (its container restarts under the same kernel)."""
    return docker_exec(lab, host, "cut", "-d", " ", "-f22", "/proc/1/stat").stdout.strip()


# ---- what host.yml leaves on every node --------------------------------------------------------------
def test_host_tuning_files_and_state(lab, node):
    for host in lab.hosts:
        h = node(host)
        sysctl = h.file("/etc/sysctl.d/60-sparkfleet.conf").content_string
        for line in ("vm.swappiness = 10", "vm.watermark_boost_factor = 0", "vm.min_free_kbytes = 45166"):
            assert line in sysctl.splitlines(), (host, line)
        assert "vm.swappiness = 0" not in sysctl
        grub = h.file("/etc/default/grub.d/99-sparkfleet.cfg")
        assert grub.exists and h.run(f"sh -n {grub.path}").rc == 0
        cmdline = sudo(
            node,
            host,
            "GRUB_CMDLINE_LINUX_DEFAULT='quiet splash'; . /etc/default/grub.d/99-sparkfleet.cfg; "
            'echo "$GRUB_CMDLINE_LINUX_DEFAULT"',
        )
        assert cmdline.strip() == "quiet"  # splash removed, the rest kept
        thp = h.file("/etc/tmpfiles.d/sparkfleet-thp.conf").content_string
        assert (
            "/sys/kernel/mm/transparent_hugepage/enabled - - - - madvise" in thp
        )  # the lab runs the stock profile
        swap = h.file("/swap.sparkfleet")
        assert swap.exists and swap.mode == 0o600
        page = int(h.check_output("getconf PAGESIZE"))
        sig = sudo(node, host, f"dd if=/swap.sparkfleet bs=1 skip={page - 10} count=10 2>/dev/null")
        assert sig == "SWAPSPACE2"
        assert "/swap.sparkfleet none swap sw 0 0" in h.file("/etc/fstab").content_string
        if lab.topology == "tp3":  # the TP3 inventory runs headless; TP2 leaves the boot target alone
            assert h.check_output("systemctl get-default") == "multi-user.target"


def test_earlyoom_runs_with_the_spec_arguments(lab, node):
    for host in lab.hosts:
        h = node(host)
        assert h.service("earlyoom").is_running and h.service("earlyoom").is_enabled
        pid = h.check_output("systemctl show -p MainPID --value earlyoom")
        argv = sudo(node, host, f"tr '\\0' '\\n' < /proc/{pid}/cmdline").splitlines()
        assert argv[1:7] == ["-m", "4,2", "-s", "100", "-r", "60"]
        assert argv[argv.index("--avoid") + 1] == SPEC_EARLYOOM_AVOID
        assert "tensorfold" in argv[argv.index("--prefer") + 1]
        for unit in ("ssh", "docker", "containerd"):
            dropin = h.file(f"/etc/systemd/system/{unit}.service.d/50-sparkfleet-oom.conf").content_string
            assert "OOMScoreAdjust=-900" in dropin
            assert "OOMScoreAdjust=-900" in h.check_output(f"systemctl cat {unit}.service")


@pytest.mark.any_topology
def test_container_limits_are_said_not_hidden(lab, play):
    # host_tuning applies in full (its phase record removed): the limits are said when the role applies
    for host in lab.hosts:
        docker_exec(lab, host, "rm", "-f", "/var/lib/sparkfleet/phases/host_tuning.json")
    events = Events()
    result = play("playbooks/host.yml", tags="host_tuning", on_event=events)
    assert result.exit_code == 0, result.failures
    said = " ".join(
        json.dumps(r) for r in events.results("Say which kernel parameters a container cannot set").values()
    )
    assert "live apply is skipped" in said
    grub = events.results("Say what a container does not do with the bootloader")
    assert set(grub) == set(lab.hosts) and all("update-grub is skipped" in r["msg"] for r in grub.values())
    swap = events.results("Say what a container does not do with swap")
    assert all("made and validated only" in r["msg"] for r in swap.values())


@pytest.mark.any_topology
def test_host_status_reports_every_check(lab, play):
    events = Events()
    result = play(
        "playbooks/host_status.yml", on_event=events, extravars={"host_tuning_status_strict": False}
    )
    assert result.exit_code == 0, result.failures
    reports = {h: r["msg"] for h, r in events.results(f"Report the host of {lab.hosts[0]}").items()}
    assert set(reports) == set(lab.hosts)
    for lines in reports.values():
        checks = [line[5:].split(":")[0] for line in lines]
        for expected in (
            "OS release",
            "kernel",
            "page size",
            "NVIDIA driver",
            "ConnectX-7 firmware",
            "memory saver",
            "THP",
            "swap",
            "GPU clock cap",
        ):
            assert expected in checks, (expected, lines)
        assert any(line.startswith(" ok  NVIDIA driver: 580.") for line in lines)
        # the lab's RDMA stand-in carries the receipts' ConnectX-7 firmware: checked, not waved through
        assert any(line.startswith(" ok  ConnectX-7 firmware: roce") for line in lines), lines
        # a container has no board firmware or memory saver of its own: not verifiable, so not ready
        assert any(line.startswith("n/a  EC firmware") for line in lines), lines
        assert "NOT READY  memory saver" in lines and "NOT READY  firmware" in lines
    said = next(iter(events.results("Sum up the readiness before the engine").values()))["msg"]
    assert said.startswith("not ready to run the engine: ") and all(h in said for h in lab.hosts)


@pytest.mark.topology("tp3")
def test_the_readiness_gate_names_each_node_and_missing_item(lab, play):
    """TP3 on lab nodes: no memory saver, no board firmware of their own. Without the lab's override the gate
    fails every node, one line per missing item; with it the run goes on and says the same as warnings."""
    refused = play("playbooks/host_ready.yml", extravars={"host_tuning_ready_override": False})
    assert refused.exit_code == 2
    failed = {f.host for f in refused.failures}
    assert failed == set(lab.hosts), refused.failures
    for f in refused.failures:
        text = f.msg if isinstance(f.msg, str) else " ".join(f.msg)
        assert f"{f.host}: not ready for the engine: memory saver: " in text
        assert f"{f.host}: not ready for the engine: firmware: EC firmware cannot be verified here" in text
        assert "host_tuning_ready_override: true" in text
    events = Events()
    allowed = play("playbooks/host_ready.yml", on_event=events)  # the lab's inventory: override true
    assert allowed.exit_code == 0, allowed.failures
    warned = events.results("Start anyway, as host_tuning_ready_override says")
    assert set(warned) == set(lab.hosts)
    for host, res in warned.items():
        assert any(
            f"{host}: NOT READY (host_tuning_ready_override is true): memory saver" in w
            for w in map(str, res["warnings"])
        )


@pytest.mark.topology("tp2")
def test_tp2_has_no_readiness_gate(lab, play):
    events = Events()
    result = play(
        "playbooks/host_ready.yml", on_event=events, extravars={"host_tuning_ready_override": False}
    )
    assert result.exit_code == 0, result.failures
    said = next(iter(events.results("Say what the readiness of this topology checks").values()))["msg"]
    assert said.startswith("no readiness checks for tp2")


@pytest.mark.topology("tp2")
def test_the_tp2_head_keeps_its_desktop(lab, play, node):
    """The TP2 inventory is not headless: a display manager and the graphical boot target stay as they are."""
    host = lab.hosts[0]
    before = docker_exec(lab, host, "systemctl", "get-default").stdout.strip()
    _make_dummy_unit(lab, host, "gdm.service")
    docker_exec(lab, host, "systemctl", "set-default", "graphical.target")
    try:
        events = Events()
        result = play("playbooks/host.yml", tags="host_tuning", on_event=events)
        assert result.exit_code == 0, result.failures
        h = node(host)
        assert h.service("gdm").is_running and h.service("gdm").is_enabled
        assert h.check_output("systemctl get-default") == "graphical.target"
        # the role says so when it runs; a clean phase gate (the desktop is not its state) ends it first
        said = host in events.results("Say that the desktop stays")
        gate = events.results("Read host_tuning's phase record and re-read the state it lists").get(host, {})
        assert said or gate.get("clean") is True, (said, gate)
        assert changed(result)[host] == 0
    finally:
        docker_exec(lab, host, "systemctl", "disable", "--now", "gdm.service", check=False)
        docker_exec(lab, host, "rm", "-f", "/usr/lib/systemd/system/gdm.service")
        docker_exec(lab, host, "systemctl", "daemon-reload")
        docker_exec(lab, host, "systemctl", "set-default", before)


@pytest.mark.any_topology
def test_reboot_refuses_part_of_a_cluster(lab, play):
    before = {h: pid1_start(lab, h) for h in lab.hosts}
    result = play("playbooks/reboot.yml", limit=lab.hosts[-1], extravars={"host_tuning_reboot_force": True})
    assert result.exit_code == 2
    assert any("reboots every node of a cluster together or none" in f.msg for f in result.failures)
    assert {h: pid1_start(lab, h) for h in lab.hosts} == before


# ---- faults and real actions (ordered last; they leave the cluster converged) ------------------------
def _make_dummy_unit(lab, host: str, name: str) -> None:
    """A stand-in for a vendor unit, where packages put theirs (masking needs /etc/systemd/system free)."""
    unit = f"[Unit]\nDescription=test stand-in for {name}\n[Service]\nExecStart=/bin/sleep infinity\n"
    unit += "[Install]\nWantedBy=multi-user.target\n"
    docker_exec(lab, host, "sh", "-c", f"printf '%s' {shlex.quote(unit)} > /usr/lib/systemd/system/{name}")
    docker_exec(lab, host, "systemctl", "daemon-reload")
    docker_exec(lab, host, "systemctl", "enable", "--now", name)


@pytest.mark.destructive
@pytest.mark.topology("tp3")  # the TP3 inventory is headless (host_tuning_headless: true)
def test_present_services_are_disabled_and_masked(lab, play, node):
    host = lab.hosts[-1]
    names = ("gdm.service", "cups.service", "nvidia-nvme-interrupt-coalescing.service")
    for name in names:
        _make_dummy_unit(lab, host, name)
    try:
        result = play("playbooks/host.yml", tags="host_tuning")
        assert result.exit_code == 0, result.failures
        h = node(host)
        for name in ("cups", "gdm"):  # the TP3 inventory runs headless: the display manager goes too
            service = h.service(name)
            assert not service.is_running and not service.is_enabled
        assert (
            h.check_output("systemctl is-enabled nvidia-nvme-interrupt-coalescing.service || true")
            == "masked"
        )
        assert not h.service("nvidia-nvme-interrupt-coalescing").is_running
        assert changed(play("playbooks/host.yml", tags="host_tuning"))[host] == 0
    finally:
        for name in names:
            docker_exec(lab, host, "systemctl", "unmask", name, check=False)
            docker_exec(lab, host, "systemctl", "disable", "--now", name, check=False)
            docker_exec(lab, host, "rm", "-f", f"/usr/lib/systemd/system/{name}")
        docker_exec(lab, host, "systemctl", "daemon-reload")


HOG = """#!/usr/bin/python3
import sys, time
step, limit = int(sys.argv[1]) << 20, int(sys.argv[2]) << 20
held = []
while len(held) * step < limit:
    held.append(b"\\x01" * step)  # touched, not just reserved
    time.sleep(float(sys.argv[3]))
time.sleep(600)
"""


def _avail_percent(lab, host: str) -> float:
    meminfo = docker_exec(lab, host, "cat", "/proc/meminfo").stdout
    values = {line.split(":")[0]: int(line.split()[1]) for line in meminfo.splitlines()}
    return 100.0 * values["MemAvailable"] / values["MemTotal"]


def _pids(lab, host: str, name: str) -> set[str]:
    return set(docker_exec(lab, host, "pgrep", "-x", name, check=False).stdout.split())


@pytest.mark.destructive
def test_earlyoom_kills_the_engine_first_and_spares_sshd_and_dockerd(lab, play):
    """A real kill: a memory hog named like the engine dies first, although a bigger process runs;
    sshd, dockerd and containerd survive. Test-only thresholds, set just below the memory free now."""
    host = lab.hosts[0]
    # The engine's processes carry the preferred name and --oom-score-adj 1000: with the engine up, earlyoom
    # would (rightly) kill a rank first. Stop the cluster's engine for this test, start it again afterwards.
    engine_ran = _engine_running(lab)
    if engine_ran:
        stop = play("playbooks/stop.yml")
        assert stop.exit_code == 0, stop.failures
    docker_exec(lab, host, "mkdir", "-p", "/tmp/oomtest")
    for name in ("tensorfold", "bigdecoy"):
        subprocess.run(
            ["docker", "exec", "-i", lab.container(host), "sh", "-c", f"cat > /tmp/oomtest/{name}"],
            input=HOG,
            text=True,
            check=True,
        )
        docker_exec(lab, host, "chmod", "755", f"/tmp/oomtest/{name}")
    # a decoy bigger than the hog will be when it is killed: without --prefer earlyoom would pick the decoy
    subprocess.run(
        ["docker", "exec", "-d", lab.container(host), "/tmp/oomtest/bigdecoy", "200", "1200", "0"], check=True
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rss = docker_exec(lab, host, "sh", "-c", "ps -o rss= -C bigdecoy || true").stdout.split()
            if rss and int(rss[0]) > 1100 * 1024:
                break
            time.sleep(0.5)
        else:
            pytest.fail("the decoy did not allocate its memory")
        term = int(_avail_percent(lab, host)) - 4
        config = play(
            "playbooks/host.yml",
            tags="earlyoom",
            limit=host,
            extravars={"earlyoom_mem_term_percent": term, "earlyoom_mem_kill_percent": term - 2},
        )
        assert config.exit_code == 0, config.failures
        protected = {name: _pids(lab, host, name) for name in ("sshd", "dockerd", "containerd")}
        assert all(protected.values()), protected
        started = time.time()
        hog = subprocess.run(
            ["docker", "exec", lab.container(host), "/tmp/oomtest/tensorfold", "50", "6000", "0.05"],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert hog.returncode in (143, 137), f"the hog was not killed (exit {hog.returncode})"
        journal = docker_exec(
            lab,
            host,
            "journalctl",
            "-u",
            "earlyoom",
            "--since",
            f"@{int(started) - 1}",
            "--no-pager",
            "-o",
            "cat",
        ).stdout
        assert "sending SIGTERM to process" in journal and '"tensorfold"' in journal, journal
        assert '"bigdecoy"' not in journal
        assert _pids(lab, host, "bigdecoy"), "the bigger, non-preferred process was killed"
        assert {name: _pids(lab, host, name) for name in protected} == protected
    finally:
        docker_exec(lab, host, "pkill", "-x", "bigdecoy", check=False)
        docker_exec(lab, host, "pkill", "-x", "tensorfold", check=False)
        restore = play("playbooks/host.yml", tags="earlyoom", limit=host)
        assert restore.exit_code == 0, restore.failures
        if engine_ran:
            start = play("playbooks/start.yml")
            assert start.exit_code == 0, start.failures


@pytest.mark.destructive
def test_reboot_only_when_allowed_then_the_whole_cluster_together(lab, play):
    policy = subprocess.run(
        ["docker", "inspect", "-f", "{{.HostConfig.RestartPolicy.Name}}", lab.container(lab.hosts[0])],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if policy in ("", "no"):
        pytest.skip(
            "lab nodes have no restart policy: a reboot inside a node stops its container for good "
            "(the lab needs `--restart unless-stopped` on its nodes)"
        )
    worker = lab.hosts[-1]
    engine_ran = _engine_running(lab)
    docker_exec(lab, worker, "sh", "-c", "echo '*** System restart required ***' > /run/reboot-required")
    before = {h: pid1_start(lab, h) for h in lab.hosts}

    events = Events()
    reported = play("playbooks/reboot.yml", on_event=events, extravars={"host_tuning_reboot": "report"})
    assert reported.exit_code == 0, reported.failures
    msg = next(iter(events.results("Say which nodes need a reboot and why").values()))["msg"]
    assert msg.startswith(f"reboot required on: {worker} ") and "not rebooting" in msg
    assert {h: pid1_start(lab, h) for h in lab.hosts} == before

    rebooted = play("playbooks/reboot.yml", extravars={"host_tuning_reboot": "allowed"})
    assert rebooted.exit_code == 0, rebooted.failures
    after = {h: pid1_start(lab, h) for h in lab.hosts}
    assert all(after[h] != before[h] for h in lab.hosts), "every node reboots, not only the one that asked"
    assert docker_exec(lab, worker, "test", "-e", "/run/reboot-required", check=False).returncode == 1
    # the boot unit re-applied the configured GPU cap (the simulator's state was lost with /run)
    for host in lab.hosts:
        conf = docker_exec(lab, host, "cat", "/var/lib/sparkfleet/clocks/gpu.conf").stdout
        cap = int(conf.rsplit("GPU_CLOCK_CAP_MHZ=", 1)[1])
        applied = docker_exec(lab, host, "cat", "/run/sparkfleet/clocks/gpu.applied").stdout.strip()
        assert applied == str(cap)
        query = (
            "nvidia-smi",
            "--query-gpu=clocks.sm,clocks_event_reasons.active",
            "--format=csv,noheader,nounits",
        )
        sm, reasons = docker_exec(lab, host, *query).stdout.split(",")
        # idle (the engine not restarted): the simulator's idle clock, whatever the cap
        if int(reasons, 16) & 0x1:
            assert int(sm) == 345
        # under load (the simulator's switch) the lock holds the clock under the cap (2418 MHz without one)
        docker_exec(lab, host, "sh", "-c", "mkdir -p /run/nvidia-sim && touch /run/nvidia-sim/load")
        try:
            loaded = int(docker_exec(lab, host, *query).stdout.split(",")[0])
            assert loaded < cap if cap else loaded == 2418
        finally:
            docker_exec(lab, host, "rm", "-f", "/run/nvidia-sim/load")
        # the oneshot finished before the container runtime started (Before=docker.service)
        clocks_done = int(
            docker_exec(
                lab,
                host,
                "systemctl",
                "show",
                "-p",
                "ExecMainExitTimestampMonotonic",
                "--value",
                "sparkfleet-clocks",
            ).stdout
        )
        docker_started = int(
            docker_exec(
                lab, host, "systemctl", "show", "-p", "ExecMainStartTimestampMonotonic", "--value", "docker"
            ).stdout
        )
        assert 0 < clocks_done <= docker_started, (host, clocks_done, docker_started)
    # the engine does not restart by itself (--restart no): bring the cluster back as site.yml left it
    if engine_ran:
        start = play("playbooks/start.yml")
        assert start.exit_code == 0, start.failures


@pytest.mark.destructive
@pytest.mark.topology("tp3")
def test_up_stops_before_the_engine_when_a_node_is_not_ready(lab, play):
    """`sparkfleet up` (site.yml) without the lab's override: the readiness gate at the end of reboot.yml
    fails every lab node (no memory saver, no board firmware of its own) and no play after it runs: the
    engine stays down. The cluster is started again afterwards, as site.yml with the override left it."""
    engine_ran = _engine_running(lab)
    if engine_ran:
        stop = play("playbooks/stop.yml")
        assert stop.exit_code == 0, stop.failures
    plays: set[str] = set()

    def on_event(event: dict) -> None:
        if event.get("event") == "playbook_on_play_start":
            plays.add(str(event.get("event_data", {}).get("play", "")))

    try:
        result = play("site.yml", extravars={"host_tuning_ready_override": False}, on_event=on_event)
        assert result.exit_code == 2
        assert {f.task for f in result.failures} == {"Refuse to start the engine on a node that is not ready"}
        assert {f.host for f in result.failures} == set(lab.hosts)
        assert "Readiness of every node before the engine" in plays
        assert not plays & {"Model weights", "Engine image", "Start the engine", "Clock caps"}, plays
        assert not _engine_running(lab)
    finally:
        start = play("playbooks/start.yml")
        assert start.exit_code == 0, start.failures

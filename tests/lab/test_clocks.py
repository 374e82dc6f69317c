"""GPU clock caps on a live lab: set, re-run, show, reset, a latched GPU, a cap that does not take, the boot
unit's order, and the engine left alone. The lab's nvidia-smi is the GB10 simulator
(lab/sparkfleet_lab/sim/nvidia_smi.py); without a lock its SM clock floats at GB10's stock 2418 MHz."""

from __future__ import annotations

import subprocess

import pytest
import yaml

STOCK = 2418


def smi(lab, host: str, query: str) -> str:
    return subprocess.run(
        [
            "docker",
            "exec",
            lab.container(host),
            "nvidia-smi",
            f"--query-gpu={query}",
            "--format=csv,noheader,nounits",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def inventory_cap(lab) -> int:
    clocks = yaml.safe_load(
        (lab.project_dir / "inventory" / lab.topology / "group_vars/all/clocks.yml").read_text()
    )
    return int(clocks["gpu_clocks_cap_mhz"])


def containers(lab, host: str) -> str:
    """The node's nested containers (the engine) with their start times: a restart would change them."""
    return subprocess.run(
        [
            "docker",
            "exec",
            lab.container(host),
            "sh",
            "-c",
            "docker ps -q | xargs -r docker inspect -f '{{.Id}} {{.State.StartedAt}}'",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def show(lab, play) -> dict[str, list[str]]:
    lines: dict[str, list[str]] = {}

    def on_event(event: dict) -> None:
        data = event.get("event_data", {})
        if event.get("event") == "runner_on_ok" and str(data.get("task", "")).startswith(
            "Show the clocks of"
        ):
            lines[data["host"]] = data["res"]["msg"]

    result = play("playbooks/clocks.yml", tags="show", on_event=on_event)
    assert result.exit_code == 0, result.failures
    assert sum(s.changed for s in result.hosts.values()) == 0  # show changes nothing
    return lines


def node_file(lab, host: str, path: str) -> str:
    return subprocess.run(
        ["docker", "exec", lab.container(host), "cat", path], capture_output=True, text=True, check=True
    ).stdout


def verify_record(lab, host: str) -> dict[str, str]:
    text = node_file(lab, host, "/run/sparkfleet/clocks/gpu.verify")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


def test_the_inventory_cap_is_in_effect_and_was_checked(lab):
    cap = inventory_cap(lab)
    for host in lab.hosts:
        sm, persistence = (v.strip() for v in smi(lab, host, "clocks.sm,persistence_mode").split(","))
        assert (
            persistence == "Disabled"
        )  # -pm 1 only when gpu_clocks_persistence_mode asks (the receipts: no)
        assert (int(sm) < cap) if cap else int(sm) == STOCK
        record = verify_record(lab, host)
        assert record["CAP"] == str(cap) and record["RESULT"] == ("held" if cap else "stock")


def test_the_boot_unit_runs_after_persistenced_and_before_docker(lab):
    for host in lab.hosts:
        props = subprocess.run(
            [
                "docker",
                "exec",
                lab.container(host),
                "systemctl",
                "show",
                "-p",
                "After",
                "-p",
                "Before",
                "-p",
                "Wants",
                "-p",
                "Type",
                "sparkfleet-clocks.service",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        values = dict(line.split("=", 1) for line in props.splitlines() if "=" in line)
        assert "nvidia-persistenced.service" in values["After"].split()
        assert "nvidia-persistenced.service" in values["Wants"].split()
        assert "docker.service" in values["Before"].split() and values["Type"] == "oneshot"
        docker_after = subprocess.run(
            ["docker", "exec", lab.container(host), "systemctl", "show", "-p", "After", "docker.service"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "sparkfleet-clocks.service" in docker_after.split("=", 1)[1].split()  # what systemd loaded


@pytest.mark.destructive
@pytest.mark.tp2_faults
def test_set_rerun_show_and_reset_leave_the_engine_running(lab, play):
    engines = {h: containers(lab, h) for h in lab.hosts}
    try:
        first = play("playbooks/clocks.yml", extravars={"gpu_clocks_cap_mhz": 2100})
        assert first.exit_code == 0, first.failures
        assert all(s.changed > 0 for s in first.hosts.values())
        for host in lab.hosts:
            assert 2060 <= int(smi(lab, host, "clocks.sm")) < 2100  # SPEC: 2100 lands at ~2080
        again = play("playbooks/clocks.yml", extravars={"gpu_clocks_cap_mhz": 2100})
        assert {h: s.changed for h, s in again.hosts.items()} == dict.fromkeys(lab.hosts, 0)
        dry = play("playbooks/clocks.yml", extravars={"gpu_clocks_cap_mhz": 0}, check=True, diff=True)
        assert all(s.changed > 0 for s in dry.hosts.values())
        assert all(int(smi(lab, h, "clocks.sm")) < 2100 for h in lab.hosts)  # a dry run changed nothing

        report = show(lab, play)
        for host in lab.hosts:
            lines = report[host]
            assert lines[0] == "GPU cap: 2100 MHz, applied since this boot"
            assert lines[1].startswith("GPU cap check: held: no SM clock sample above 2100 MHz")
            assert (
                "NVIDIA GB10: SM 2080 MHz (max 3003 MHz), persistence Disabled, clock event reasons 0x"
                in lines[2]
            )
            assert any(line.startswith("CPU cap:") for line in lines)
            assert not any("LATCHED" in line for line in lines)

        reset = play("playbooks/clocks.yml", extravars={"gpu_clocks_cap_mhz": 0})
        assert reset.exit_code == 0, reset.failures
        assert all(int(smi(lab, h, "clocks.sm")) == STOCK for h in lab.hosts)
        assert {h: containers(lab, h) for h in lab.hosts} == engines  # `clocks set` restarts nothing
    finally:
        restore = play("playbooks/clocks.yml")
        assert restore.exit_code == 0, restore.failures


@pytest.mark.destructive
@pytest.mark.tp2_faults
def test_show_flags_a_latched_gpu(lab, play):
    host = lab.hosts[-1]
    subprocess.run(
        [
            "docker",
            "exec",
            lab.container(host),
            "sh",
            "-c",
            "mkdir -p /run/nvidia-sim && touch /run/nvidia-sim/latched",
        ],
        check=True,
    )
    try:
        report = show(lab, play)
        latched = [line for line in report[host] if "LATCHED" in line]
        assert latched and "AC power cycle" in latched[0] and "under 1000 MHz" in latched[0]
        for other in lab.hosts[:-1]:
            assert not any("LATCHED" in line for line in report[other])
    finally:
        subprocess.run(
            ["docker", "exec", lab.container(host), "rm", "-f", "/run/nvidia-sim/latched"], check=True
        )


@pytest.mark.destructive
@pytest.mark.tp2_faults
def test_a_cap_the_gpu_ignores_is_reported_not_taken(lab, play):
    """The simulator's ignore-lock switch: -lgc answers success and the clock keeps floating (a GB10 that does
    not pin): the run, `clocks show` and a re-run say NOT TAKEN, and the re-run does not loop."""
    host = lab.hosts[-1]
    subprocess.run(
        [
            "docker",
            "exec",
            lab.container(host),
            "sh",
            "-c",
            "mkdir -p /run/nvidia-sim && touch /run/nvidia-sim/ignore-lock",
        ],
        check=True,
    )
    try:
        said: dict[str, str] = {}

        def on_event(event: dict) -> None:
            data = event.get("event_data", {})
            if (
                event.get("event") == "runner_on_ok"
                and data.get("task") == "Report a GPU cap that did not take"
            ):
                said[data["host"]] = data["res"]["msg"]

        first = play("playbooks/clocks.yml", extravars={"gpu_clocks_cap_mhz": 2100}, on_event=on_event)
        assert first.exit_code == 0, first.failures
        assert set(said) == {host}, said  # only the GPU that ignored the lock
        assert "NOT TAKEN" in said[host] and f"{STOCK} MHz" in said[host]
        assert int(smi(lab, host, "clocks.sm")) == STOCK
        assert verify_record(lab, host)["RESULT"] == "not-taken"
        for other in lab.hosts[:-1]:
            assert verify_record(lab, other)["RESULT"] == "held"
        again = play("playbooks/clocks.yml", extravars={"gpu_clocks_cap_mhz": 2100})
        assert again.hosts[host].changed == 0  # reported again, not re-applied every run
        report = show(lab, play)
        assert any(line.startswith("GPU cap check: NOT TAKEN") for line in report[host])
    finally:
        subprocess.run(
            ["docker", "exec", lab.container(host), "rm", "-f", "/run/nvidia-sim/ignore-lock"], check=True
        )
        restore = play("playbooks/clocks.yml")
        assert restore.exit_code == 0, restore.failures

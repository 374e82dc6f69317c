"""GPU clock caps on a live lab: set, re-run, show, reset, an idle GPU reported idle, a latched GPU under
load, a cap that does not take, the boot unit's order, and the engine left alone. The lab's nvidia-smi is the
GB10 simulator (lab/sparkfleet_lab/sim/README.md): idle (no engine process) its SM clock drops to 345 MHz
with reason GPU idle; under load (the engine running, or its `load` switch) it runs at 2418 MHz or at the
cap."""

from __future__ import annotations

import subprocess

import pytest
import yaml

IDLE = 345  # the simulator's idle clock (the H200 recording's)
LOAD = 2418  # the simulator under load without a lock (GB10's applications clock)


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


def switch(lab, host: str, name: str, on: bool) -> None:
    """One of the simulator's switches in /run/nvidia-sim (load, latched, ignore-lock)."""
    command = (
        f"mkdir -p /run/nvidia-sim && touch /run/nvidia-sim/{name}" if on else f"rm -f /run/nvidia-sim/{name}"
    )
    subprocess.run(["docker", "exec", lab.container(host), "sh", "-c", command], check=True)


def engine_running(lab) -> bool:
    """Whether engine_service's containers run on any node (they carry its label)."""
    return any(
        subprocess.run(
            ["docker", "exec", lab.container(h), "docker", "ps", "-q", "--filter",
             "label=io.sparkfleet.engine.managed=true"], capture_output=True, text=True, check=False,
        ).stdout.strip()
        for h in lab.hosts
    )  # fmt: skip


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
        sm, persistence, reasons = (
            v.strip()
            for v in smi(lab, host, "clocks.sm,persistence_mode,clocks_event_reasons.active").split(",")
        )
        # -pm 1 only when gpu_clocks_persistence_mode asks (the receipts: no)
        assert persistence == "Disabled"
        if int(reasons, 16) & 0x1:  # idle (no engine on this node): the idle clock, whatever the cap
            assert int(sm) == IDLE
        else:  # the engine runs: under the cap, or the power-capped clock without one
            assert (int(sm) < cap) if cap else int(sm) == LOAD
        record = verify_record(lab, host)
        # a cap checked with the GPU busy held; one checked idle (at boot, before the engine) is unverified
        assert record["CAP"] == str(cap)
        assert record["RESULT"] in (("held", "unverified") if cap else ("stock",)), record


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
    for host in lab.hosts:  # under load whether or not the engine serves: the cap shows only then
        switch(lab, host, "load", True)
    try:
        first = play("playbooks/clocks.yml", extravars={"gpu_clocks_cap_mhz": 2100})
        assert first.exit_code == 0, first.failures
        assert all(s.changed > 0 for s in first.hosts.values())
        for host in lab.hosts:  # docs/recipes.md "Clocks": 2100 lands at ~2080
            assert 2060 <= int(smi(lab, host, "clocks.sm")) < 2100
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
            assert ": busy (" in lines[2]
            assert any(line.startswith("CPU cap:") for line in lines)
            assert not any("LATCHED" in line for line in lines)

        reset = play("playbooks/clocks.yml", extravars={"gpu_clocks_cap_mhz": 0})
        assert reset.exit_code == 0, reset.failures
        assert all(int(smi(lab, h, "clocks.sm")) == LOAD for h in lab.hosts)
        assert {h: containers(lab, h) for h in lab.hosts} == engines  # `clocks set` restarts nothing
    finally:
        for host in lab.hosts:
            switch(lab, host, "load", False)
        restore = play("playbooks/clocks.yml")
        assert restore.exit_code == 0, restore.failures


@pytest.mark.destructive
@pytest.mark.tp2_faults
def test_an_idle_gpu_is_reported_idle_and_a_low_clock_under_load_latched(lab, play):
    """With the engine stopped every GPU idles at 345 MHz (reason GPU idle): `clocks show` says idle and
    advises no power cycle, also on a node whose simulator is latched (idle, a latch does not show). Under the
    lab's load switch that node's clock sticks at 855 MHz: LATCHED, with the AC power cycle; the others not.
    The engine is started again afterwards if it ran."""
    host = lab.hosts[-1]
    engine_ran = engine_running(lab)
    if engine_ran:
        stop = play("playbooks/stop.yml")
        assert stop.exit_code == 0, stop.failures
    switch(lab, host, "latched", True)
    try:
        idle = show(lab, play)
        for node in lab.hosts:
            gpu = next(line for line in idle[node] if line.startswith("GPU 0 NVIDIA GB10: "))
            assert gpu.startswith(f"GPU 0 NVIDIA GB10: SM {IDLE} MHz (max 3003 MHz)"), gpu
            assert gpu.endswith(": idle (clock event reason GPU idle)"), gpu
            assert f"GPU 0: idle: SM {IDLE} MHz is its idle clock, not a fault" in "\n".join(idle[node])
            advice = [
                line for line in idle[node] if "LATCHED" in line or "power cycle" in line or "unplug" in line
            ]
            assert advice == [], (node, advice)
        switch(lab, host, "load", True)
        loaded = show(lab, play)
        assert (
            "GPU 0: LATCHED: SM clock 855 MHz under load is under 1000 MHz; only an AC power cycle clears it "
            "(shut down, unplug for 30 s)"
        ) in loaded[host]
        for other in lab.hosts[:-1]:
            assert not any("LATCHED" in line for line in loaded[other])
    finally:
        switch(lab, host, "load", False)
        switch(lab, host, "latched", False)
        if engine_ran:
            start = play("playbooks/start.yml")
            assert start.exit_code == 0, start.failures


@pytest.mark.destructive
@pytest.mark.tp2_faults
def test_a_cap_the_gpu_ignores_is_reported_not_taken(lab, play):
    """The simulator's ignore-lock switch: -lgc answers success and under load the clock keeps running at
    2418 MHz (a GB10 that does not pin): the run, `clocks show` and a re-run say NOT TAKEN, and the re-run
    does not loop. Every node under the load switch: an idle clock would prove nothing either way."""
    host = lab.hosts[-1]
    switch(lab, host, "ignore-lock", True)
    for node in lab.hosts:
        switch(lab, node, "load", True)
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
        assert "NOT TAKEN" in said[host] and f"{LOAD} MHz" in said[host]
        assert "power-cycle" not in said[host]  # a lock GB10 ignores is no latch
        assert int(smi(lab, host, "clocks.sm")) == LOAD
        assert verify_record(lab, host)["RESULT"] == "not-taken"
        for other in lab.hosts[:-1]:
            assert verify_record(lab, other)["RESULT"] == "held"
        again = play("playbooks/clocks.yml", extravars={"gpu_clocks_cap_mhz": 2100})
        assert again.hosts[host].changed == 0  # reported again, not re-applied every run
        report = show(lab, play)
        assert any(line.startswith("GPU cap check: NOT TAKEN") for line in report[host])
    finally:
        switch(lab, host, "ignore-lock", False)
        for node in lab.hosts:
            switch(lab, node, "load", False)
        restore = play("playbooks/clocks.yml")
        assert restore.exit_code == 0, restore.failures

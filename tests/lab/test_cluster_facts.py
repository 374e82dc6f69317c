"""Cluster facts from the field (issue 22) on a live lab, each with the stand-in's switch for the state the
real thing shows: a node on another NVIDIA driver and on a 590.x driver (the nvidia-smi simulator's
`driver-version`), a next kernel without its NVIDIA module (sim/kernels.py), a worker whose engine image
differs from the head's. Each test puts the node back as it found it; none restarts or reboots anything
(the refusals come first).

Needs a converged lab: `SPARKFLEET_LAB=<name> pytest tests/lab/test_cluster_facts.py`."""

from __future__ import annotations

import json
import subprocess

import pytest
from lab_events import Events

SIM_DIR = "/run/nvidia-sim"
KERNELS = "/opt/sparkfleet-lab/sim/kernels.py"
ENGINE = "sparkfleet-engine"
NEW_KERNEL = "7.0.0-1020-nvidia-64k"


def sh(lab, host: str, cmd: str, check: bool = True) -> str:
    return subprocess.run(
        ["docker", "exec", lab.container(host), "sh", "-c", cmd], capture_output=True, text=True, check=check
    ).stdout


def pid1_start(lab, host: str) -> str:
    return sh(lab, host, "cut -d' ' -f22 /proc/1/stat").strip()


def failures(result) -> str:
    return " | ".join(
        f"{f.host}: {f.msg if isinstance(f.msg, str) else ' '.join(f.msg)}" for f in result.failures
    )


def host_report(lab, play) -> dict[str, list[str]]:
    events = Events()
    result = play(
        "playbooks/host_status.yml", on_event=events, extravars={"host_tuning_status_strict": False}
    )
    assert result.exit_code == 0, failures(result)
    return {h: r["msg"] for h, r in events.results(f"Report the host of {lab.hosts[0]}").items()}


def line(lines: list[str], check: str) -> str:
    """The report's line of one check ('<status>  <check>: <value>...', the status right-aligned)."""
    return next(x for x in lines if x.strip().split("  ", 1)[-1].startswith(f"{check}: "))


@pytest.fixture
def driver_switch(lab):
    """Set a node's simulated driver version; every switch is removed afterwards."""
    touched: list[str] = []

    def put(host: str, version: str) -> None:
        sh(lab, host, f"mkdir -p {SIM_DIR} && echo {version} > {SIM_DIR}/driver-version")
        touched.append(host)

    yield put
    for host in touched:
        sh(lab, host, f"rm -f {SIM_DIR}/driver-version")


@pytest.mark.any_topology
def test_a_node_on_another_driver_is_named_in_host_status_and_refused_by_preflight(lab, play, driver_switch):
    worker = lab.hosts[-1]
    driver_switch(worker, "580.126.09")  # the published GB10 table's driver, beside the sim's 580.159.04
    reports = host_report(lab, play)
    for host, lines in reports.items():
        same = line(lines, "NVIDIA driver on every node")
        assert same.startswith("off") and f"{worker} 580.126.09" in same and "580.159.04" in same, (
            host,
            same,
        )
        assert line(lines, "NVIDIA driver family").startswith(" ok"), lines
    refused = play("playbooks/preflight.yml")
    assert refused.exit_code == 2
    text = failures(refused)
    assert "nvidia_driver: " in text and f"{worker}=580.126.09" in text, text


@pytest.mark.any_topology
def test_a_590_driver_is_a_warning_with_the_reason(lab, play, driver_switch):
    for host in lab.hosts:
        driver_switch(host, "590.44.01")
    reports = host_report(lab, play)
    for lines in reports.values():
        family = line(lines, "NVIDIA driver family")
        assert family.startswith("warn") and "deadlocks in CUDA-graph capture on GB10" in family, family
        assert line(lines, "NVIDIA driver on every node").startswith(" ok")
    events = Events()
    result = play("playbooks/preflight.yml", on_event=events)
    assert result.exit_code == 0, failures(result)  # a warning, not a refusal
    warned = events.results(
        "Warn about a 590.x driver (it runs, and deadlocks in CUDA-graph capture on GB10)"
    )
    assert set(warned) == set(lab.hosts), warned


@pytest.mark.any_topology
def test_a_reboot_into_a_kernel_without_its_nvidia_module_is_refused(lab, play):
    worker = lab.hosts[-1]
    before = {h: pid1_start(lab, h) for h in lab.hosts}
    sh(lab, worker, f"python3 {KERNELS} install {NEW_KERNEL} --without-nvidia")
    try:
        lines = host_report(lab, play)[worker]
        nk = line(lines, "next kernel")
        assert nk.startswith("off") and f"no nvidia.ko under /lib/modules/{NEW_KERNEL}" in nk, nk
        refused = play("playbooks/reboot.yml", extravars={"host_tuning_reboot_force": True})
        assert refused.exit_code == 2
        text = failures(refused)
        assert (
            f"{worker} would boot a kernel without an NVIDIA module, so no node of the cluster is rebooted"
            in text
        )
        assert f"linux-modules-nvidia-580-open-{NEW_KERNEL}" in text, text
        assert {h: pid1_start(lab, h) for h in lab.hosts} == before  # no node rebooted
        # its modules installed, the same kernel is a fine reboot target (host-status says so; no reboot here)
        sh(lab, worker, f"python3 {KERNELS} install {NEW_KERNEL}")
        nk = line(host_report(lab, play)[worker], "next kernel")
        assert nk.startswith(" ok") and f"/lib/modules/{NEW_KERNEL}/kernel/nvidia-580-open/nvidia.ko" in nk, (
            nk
        )
    finally:
        sh(lab, worker, f"python3 {KERNELS} remove {NEW_KERNEL}")


def engine(lab, host: str) -> dict:
    out = subprocess.run(
        ["docker", "exec", lab.container(host), "docker", "inspect", ENGINE],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return (json.loads(out) or [{}])[0] if out.strip() else {}


def test_a_start_is_refused_while_a_worker_has_another_engine_image(lab, play):
    started = play("playbooks/start.yml")
    assert started.exit_code == 0, failures(started)
    worker = lab.hosts[-1]
    ref = engine(lab, worker)["Config"]["Image"]
    original = sh(lab, worker, f"docker image inspect --format '{{{{.Id}}}}' {ref}").strip()
    before = {h: engine(lab, h)["State"]["StartedAt"] for h in lab.hosts}
    # the same tag, another image: what a build on the worker itself, or a copy that was cut off, leaves
    sh(
        lab,
        worker,
        f"printf 'FROM {ref}\\nLABEL io.sparkfleet.test=other-build\\n'"
        f" | docker build -q --network host -t {ref} -",
    )
    try:
        other = sh(lab, worker, f"docker image inspect --format '{{{{.Id}}}}' {ref}").strip()
        assert other != original
        refused = play("playbooks/start.yml")
        assert refused.exit_code == 2
        text = failures(refused)
        assert "is not the same on every node, so nothing was stopped or started" in text, text
        assert f"{worker} (rank {len(lab.hosts) - 1}) has image {other[:19]}" in text, text
        assert f"{lab.hosts[0]} {original[:19]}" in text, text
        assert {h: engine(lab, h)["State"]["StartedAt"] for h in lab.hosts} == before  # nothing restarted
    finally:
        sh(lab, worker, f"docker tag {original} {ref} && docker rmi {other}", check=False)
    assert sh(lab, worker, f"docker image inspect --format '{{{{.Id}}}}' {ref}").strip() == original

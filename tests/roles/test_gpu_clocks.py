"""Role gpu_clocks on one lab node (molecule/gpu_clocks, cap 2300 MHz): the GPU (the lab's nvidia-smi
simulator) runs capped, the cap is recorded, and a restart of the node (a reboot: the GPU forgets its lock)
gets it back from sparkfleet-clocks.service."""

from __future__ import annotations

import subprocess
import time

import pytest

pytestmark = pytest.mark.usefixtures("lab")
CAP = 2300


def sm_clock(host) -> int:
    return int(host.check_output("nvidia-smi --query-gpu=clocks.sm --format=csv,noheader,nounits"))


def test_gpu_runs_capped_persistence_mode_left_as_it_was(node):
    host = node("spark1")
    assert 1000 <= sm_clock(host) <= CAP
    # gpu_clocks_persistence_mode defaults to false: the receipts run nvidia-persistenced without it
    assert host.check_output("nvidia-smi --query-gpu=persistence_mode --format=csv,noheader") == "Disabled"
    assert (
        f"GPU_CLOCK_CAP_MHZ={CAP}" in host.file("/var/lib/sparkfleet/clocks/gpu.conf").content_string.split()
    )


def test_boot_unit_is_enabled(node):
    assert node("spark1").service("sparkfleet-clocks").is_enabled


def test_a_restarted_node_gets_its_cap_back_at_boot(lab, node):
    host = node("spark1")
    subprocess.run(["docker", "restart", lab.container("spark1")], check=True, capture_output=True)
    deadline = time.monotonic() + 120
    while True:  # boot: systemd, then the clocks unit (after nvidia-persistenced, with retries)
        state = subprocess.run(
            ["docker", "exec", lab.container("spark1"), "systemctl", "show", "-p", "ActiveState", "--value",
             "sparkfleet-clocks.service"], capture_output=True, text=True, check=False,
        ).stdout.strip()  # fmt: skip
        if state in ("active", "failed") or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert state == "active", f"sparkfleet-clocks.service is {state!r} after the restart"
    assert sm_clock(host) <= CAP
    assert host.file("/run/sparkfleet/clocks/gpu.applied").content_string.strip() == str(CAP)

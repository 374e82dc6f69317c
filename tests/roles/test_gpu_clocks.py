"""Role gpu_clocks on one lab node (molecule/gpu_clocks, cap 2300 MHz): the GPU (the lab's nvidia-smi
simulator, lab/sparkfleet_lab/sim/README.md) idles at a low clock and runs capped under load, the cap is
recorded, a restart of the node (a reboot: the GPU forgets its lock) gets it back from
sparkfleet-clocks.service, and `clocks show` reports an idle GPU as idle and a low clock under load as
latched."""

from __future__ import annotations

import subprocess
import time

import pytest

pytestmark = pytest.mark.usefixtures("lab")
CAP = 2300
IDLE = 345  # the simulator's idle clock (the H200 recording's)


def sm_clock(host) -> int:
    return int(host.check_output("nvidia-smi --query-gpu=clocks.sm --format=csv,noheader,nounits"))


def switch(lab, name: str, on: bool) -> None:
    """One of the simulator's switches in /run/nvidia-sim (load, latched, ...)."""
    command = (
        f"mkdir -p /run/nvidia-sim && touch /run/nvidia-sim/{name}" if on else f"rm -f /run/nvidia-sim/{name}"
    )
    subprocess.run(["docker", "exec", lab.container("spark1"), "sh", "-c", command], check=True)


def show(play) -> list[str]:
    """The lines `clocks show` prints for spark1 (the role's report, molecule/gpu_clocks/show.yml)."""
    lines: list[str] = []

    def on_event(event: dict) -> None:
        data = event.get("event_data", {})
        if event.get("event") == "runner_on_ok" and str(data.get("task", "")).startswith(
            "Show the clocks of"
        ):
            lines.extend(data["res"]["msg"])

    result = play("molecule/gpu_clocks/show.yml", on_event=on_event)
    assert result.exit_code == 0, result.failures
    assert lines, "no report of spark1"
    return lines


def test_gpu_idles_low_and_runs_capped_under_load_persistence_mode_left_as_it_was(lab, node):
    host = node("spark1")
    assert sm_clock(host) == IDLE  # idle: the lock does not raise the clock, and a low one is normal
    switch(lab, "load", True)
    try:
        assert CAP - 40 <= sm_clock(host) < CAP  # under load the lock holds it just under the cap
    finally:
        switch(lab, "load", False)
    # gpu_clocks_persistence_mode defaults to false: the receipts run nvidia-persistenced without it
    assert host.check_output("nvidia-smi --query-gpu=persistence_mode --format=csv,noheader") == "Disabled"
    assert (
        f"GPU_CLOCK_CAP_MHZ={CAP}" in host.file("/var/lib/sparkfleet/clocks/gpu.conf").content_string.split()
    )
    # the converge set the cap on an idle GPU: the check after -lgc does not claim it held
    assert "RESULT=unverified" in host.file("/run/sparkfleet/clocks/gpu.verify").content_string.split()


def test_boot_unit_is_enabled(node):
    assert node("spark1").service("sparkfleet-clocks").is_enabled


def test_an_idle_gpu_is_reported_idle_and_a_low_clock_under_load_latched(lab, play):
    idle = show(play)
    gpu = next(line for line in idle if line.startswith("GPU 0 NVIDIA GB10: "))
    assert gpu.startswith(f"GPU 0 NVIDIA GB10: SM {IDLE} MHz (max 3003 MHz)")
    assert gpu.endswith(": idle (clock event reason GPU idle)")
    assert f"GPU 0: idle: SM {IDLE} MHz is its idle clock, not a fault" in "\n".join(idle)
    assert not [line for line in idle if "LATCHED" in line or "power cycle" in line or "unplug" in line]
    switch(lab, "latched", True)  # idle, even a latched GPU looks idle: still no advice to unplug
    try:
        assert not [line for line in show(play) if "LATCHED" in line or "unplug" in line]
        switch(lab, "load", True)
        loaded = show(play)
        assert (
            "GPU 0: LATCHED: SM clock 855 MHz under load is under 1000 MHz; only an AC power cycle clears it "
            "(shut down, unplug for 30 s)"
        ) in loaded
    finally:
        switch(lab, "load", False)
        switch(lab, "latched", False)


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
    assert host.file("/run/sparkfleet/clocks/gpu.applied").content_string.strip() == str(CAP)
    # at boot the GPU idles (the engine starts after the unit): recorded as not verified, not as held
    verify = host.file("/run/sparkfleet/clocks/gpu.verify").content_string.split()
    assert "RESULT=unverified" in verify and f"CAP={CAP}" in verify
    switch(lab, "load", True)
    try:
        assert CAP - 40 <= sm_clock(host) < CAP  # the boot unit's lock holds under load
    finally:
        switch(lab, "load", False)

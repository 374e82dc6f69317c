"""sparkfleet's clock parsers over the real tool's text: the H200 recordings (driver 580.159.04) served
verbatim by the lab simulator's replay switch. An idle GPU is reported idle with no power-cycle advice, the
power-capped load is not latched, a low clock under load is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.sparkfleet.cluster.plugins.modules import gpu_clocks as gpu_mod

ROOT = Path(__file__).resolve().parents[2]
SIM = ROOT / "lab/sparkfleet_lab/sim/nvidia_smi.py"
H200 = ROOT / "tests/unit/fixtures/nvidia-smi/h200-driver-580.159.04"
RECORDED_FIELDS = "index,name,persistence_mode,clocks.sm,clocks.max.sm,clocks_event_reasons.active"
RECORDED_QUERY = (f"--query-gpu={RECORDED_FIELDS}", "--format=csv,noheader,nounits")
POWER_CYCLE_WORDS = ("power cycle", "power-cycle", "unplug", "LATCHED")


@pytest.fixture
def replay(tmp_path):
    """nvidia-smi in replay of the H200 recordings; `replay(*args, load=False)` -> its stdout."""
    state = tmp_path / "nvidia-sim"
    state.mkdir()
    (state / "replay").write_text(f"{H200}\n")
    (tmp_path / "proc").mkdir()
    env = {
        **os.environ,
        "SPARKFLEET_NVIDIA_SIM_DIR": str(state),
        "SPARKFLEET_NVIDIA_SIM_PROC": str(tmp_path / "proc"),
    }

    def run(*args: str, load: bool = False) -> str:
        if load:
            (state / "load").touch()
        else:
            (state / "load").unlink(missing_ok=True)
        proc = subprocess.run(
            [sys.executable, "-S", str(SIM), *args], env=env, capture_output=True, text=True, check=True
        )
        return proc.stdout

    run.env = env
    return run


def advice(lines: list[str]) -> list[str]:
    return [line for line in lines if any(word in line for word in POWER_CYCLE_WORDS)]


def test_the_replay_is_the_recording(replay):
    recorded = (H200 / "query-idle-and-load.txt").read_text().splitlines(keepends=True)
    assert replay(*RECORDED_QUERY) == recorded[2]
    assert replay(*RECORDED_QUERY, load=True) == recorded[3]


def test_the_idle_h200_at_345_mhz_is_idle_and_never_told_to_power_cycle(replay):
    gpus = gpu_mod.parse_gpus(replay(*RECORDED_QUERY), 1000, fields=RECORDED_FIELDS.split(","))
    (gpu,) = gpus
    assert (gpu["name"], gpu["sm_mhz"], gpu["max_sm_mhz"]) == ("NVIDIA H200", 345, 1980)
    assert gpu["activity"] == "idle" and gpu["activity_why"] == "clock event reason GPU idle"
    assert gpu["latched"] is False and gpu["event_reason_names"] == ["GPU idle"]
    assert gpu_mod.latched_warnings(gpus, 1000) == []
    lines = gpu_mod.report(None, None, gpus, 1000)
    assert advice(lines) == []
    assert (
        "GPU 0: idle: SM 345 MHz is its idle clock, not a fault; whether it is latched shows only under "
        "load (`sparkfleet clocks show` while the engine serves)"
    ) in lines


def test_the_power_capped_load_at_1500_mhz_is_busy_and_not_latched(replay):
    gpus = gpu_mod.parse_gpus(replay(*RECORDED_QUERY, load=True), 1000, fields=RECORDED_FIELDS.split(","))
    (gpu,) = gpus
    assert (gpu["sm_mhz"], gpu["event_reasons"]) == (1500, "0x0000000000000004")
    assert gpu["activity"] == "busy" and "SW power cap" in gpu["activity_why"]
    assert gpu["latched"] is False and gpu["event_reason_names"] == ["SW power cap"]
    assert advice(gpu_mod.report(None, None, gpus, 1000)) == []


@pytest.mark.parametrize("mhz", [1485, 855, 500])
def test_the_recorded_load_line_at_other_clocks(replay, mhz):
    """The real load line with only its clock changed: the range the H200 ran in (1485-1500 MHz) is not
    latched; a latched GB10's 500-890 MHz under the same load is."""
    line = replay(*RECORDED_QUERY, load=True).replace(", 1500, ", f", {mhz}, ")
    gpus = gpu_mod.parse_gpus(line, 1000, fields=RECORDED_FIELDS.split(","))
    assert gpus[0]["activity"] == "busy" and gpus[0]["latched"] is (mhz < 1000)
    lines = gpu_mod.report(None, None, gpus, 1000)
    if mhz < 1000:
        assert lines[-1] == (
            f"GPU 0: LATCHED: SM clock {mhz} MHz under load is under 1000 MHz; only an AC power cycle "
            "clears it (shut down, unplug for 30 s)"
        )
        assert "power-cycle the Spark at the wall" in gpu_mod.latched_warnings(gpus, 1000)[0]
    else:
        assert advice(lines) == []


def test_the_csv_with_header_and_units_parses_the_same(replay):
    fields = (
        "index,name,uuid,persistence_mode,clocks.sm,clocks.max.sm,clocks.gr,clocks.max.gr,"
        "clocks_event_reasons.active,clocks_event_reasons.sw_power_cap,power.draw,temperature.gpu,driver_version"
    )
    out = replay(f"--query-gpu={fields}", "--format=csv")
    assert out.startswith("index, name, uuid, persistence_mode, clocks.current.sm [MHz]")
    (gpu,) = gpu_mod.parse_gpus(out, 1000, fields=fields.split(","), header=True)
    assert (gpu["sm_mhz"], gpu["max_sm_mhz"], gpu["uuid"]) == (
        345,
        1980,
        "GPU-ad6c663a-011a-5da4-852e-a5a5d84d8f12",
    )
    assert gpu["activity"] == "idle" and gpu["latched"] is False


def test_a_low_clock_with_nothing_said_about_load_is_not_judged(replay):
    """The recording's short query has no reasons and no utilization: 345 MHz alone says nothing."""
    fields = ["clocks.sm", "clocks.max.sm", "persistence_mode"]
    gpus = gpu_mod.parse_gpus(
        replay("--query-gpu=clocks.sm,clocks.max.sm,persistence_mode", "--format=csv,noheader,nounits"),
        1000,
        fields=fields,
    )
    assert gpus[0]["activity"] == "unknown" and gpus[0]["latched"] is False
    lines = gpu_mod.report(None, None, gpus, 1000)
    assert advice(lines) == [] and any("not judged" in line for line in lines)


def test_every_field_the_module_queries_is_one_the_real_tool_knows():
    known = (H200 / "help-query-gpu.txt").read_text()
    for field in gpu_mod.QUERY_FIELDS:
        assert f'"{field}"' in known, field


def test_the_module_reports_a_query_the_recordings_lack_instead_of_failing(replay, tmp_path):
    """Replay refuses what was not recorded (the module's own query): clocks show says so, no crash."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec {sys.executable} -S {SIM} "$@"\n')  # -S: standard library only
    smi.chmod(0o755)
    args = tmp_path / "args.json"
    args.write_text(
        json.dumps(
            {
                "ANSIBLE_MODULE_ARGS": {
                    "state": "query",
                    "nvidia_smi": str(smi),
                    "state_file": str(tmp_path / "gpu.conf"),
                    "applied_file": str(tmp_path / "gpu.applied"),
                    "verify_file": str(tmp_path / "gpu.verify"),
                }
            }
        )
    )
    proc = subprocess.run(
        [sys.executable, str(ROOT / "plugins/modules/gpu_clocks.py"), str(args)],
        env=replay.env,
        capture_output=True,
        text=True,
        check=False,
    )
    result = json.loads(proc.stdout)
    assert result.get("failed") is not True, result
    assert (
        "failed (exit 3)" in result["gpu_error"]
        and "no recording of `nvidia-smi --query-gpu=" in result["gpu_error"]
    )
    assert result["gpus"] == [] and result["latched"] is False
    assert any(line.startswith("GPU clocks not read: nvidia-smi --query-gpu=") for line in result["report"])

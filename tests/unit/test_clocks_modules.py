"""sparkfleet_gpu_clocks / sparkfleet_cpu_clocks run as Ansible runs them (JSON in, JSON out: their main()
in this process, tests/unit/module_runner.py; one run of each is the module file run as a process of its
own), against the GPU simulator and a fake cpufreq tree; and the boot script that re-applies the caps after
a restart."""

from __future__ import annotations

import json
import os
import py_compile
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import module_runner
import pytest
import yaml
from ansible.plugins.filter.core import FilterModule as AnsibleFilters
from ansible.plugins.test.core import TestModule as AnsibleTests
from ansible_collections.sparkfleet.cluster.plugins.module_utils import cpu_freq as cpu_mod
from ansible_collections.sparkfleet.cluster.plugins.modules import gpu_clocks as gpu_mod

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles/gpu_clocks"
SIM = ROOT / "lab/sparkfleet_lab/sim/nvidia_smi.py"


class Node:
    """One simulated Spark: a GPU simulator, /var/lib (persists) and /run (a restart empties it)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.run_dir = root / "run"
        self.sim_dir = self.run_dir / "nvidia-sim"
        self.state_dir = root / "var/lib/sparkfleet/clocks"
        self.bin = root / "bin"
        self.bin.mkdir(parents=True)
        smi = self.bin / "nvidia-smi"
        # -S: the simulator is standard library only, run as on a node's own Python (no site-packages to
        # set up, which was a third of each of the hundreds of calls these tests make). It runs from its
        # bytecode, compiled once per node here: `python FILE.py` compiles the 1100 lines at every call.
        code = root / "nvidia_smi.pyc"
        py_compile.compile(str(SIM), cfile=str(code), doraise=True)
        smi.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -S {shlex.quote(str(code))} "$@"\n')
        smi.chmod(0o755)
        (root / "proc").mkdir()  # the simulator's engine-process scan sees none of this machine's
        self.env = {
            **os.environ,
            "SPARKFLEET_NVIDIA_SIM_DIR": str(self.sim_dir),
            "SPARKFLEET_NVIDIA_SIM_PROC": str(root / "proc"),
        }

    def smi(self, *args: str) -> str:
        return subprocess.run(
            [str(self.bin / "nvidia-smi"), *args], env=self.env, capture_output=True, text=True, check=True
        ).stdout

    def sm(self) -> int:
        return int(self.smi("--query-gpu=clocks.sm", "--format=csv,noheader,nounits"))

    def persistence(self) -> str:
        return self.smi("--query-gpu=persistence_mode", "--format=csv,noheader").strip()

    def verify(self) -> dict | None:
        return gpu_mod.read_verify(str(self.run_dir / "sparkfleet/clocks/gpu.verify"))

    def restart(self) -> None:
        shutil.rmtree(self.run_dir, ignore_errors=True)  # /run is a tmpfs (the simulator's switches too)

    def switch(self, name: str, content: str = "") -> None:
        """One of the simulator's switches: load, latched, ignore-lock, idle-mhz, replay."""
        self.sim_dir.mkdir(parents=True, exist_ok=True)
        self.sim_dir.joinpath(name).write_text(content)

    def unswitch(self, name: str) -> None:
        self.sim_dir.joinpath(name).unlink()

    def module(self, name: str, check: bool = False, real: bool = False, **args: object) -> dict:
        args = {"_ansible_check_mode": check, "_ansible_diff": True, **args}
        return module_runner.run(name, args, self.env, real=real)

    def gpu(self, cap: int | None = None, check: bool = False, real: bool = False, **args: object) -> dict:
        base = {
            "nvidia_smi": str(self.bin / "nvidia-smi"),
            "state_file": str(self.state_dir / "gpu.conf"),
            "applied_file": str(self.run_dir / "sparkfleet/clocks/gpu.applied"),
            "verify_file": str(self.run_dir / "sparkfleet/clocks/gpu.verify"),
            "verify_interval_ms": 10,
        }
        if cap is not None:
            base["cap_mhz"] = cap
        return self.module("gpu_clocks", check=check, real=real, **{**base, **args})


@pytest.fixture
def node(tmp_path):
    return Node(tmp_path)


# ---- the GPU module against the simulator ------------------------------------------------------------
IDLE = 345  # the simulator's idle clock (the H200 recording's)
LOAD = 2418  # the simulator's SM clock under load without a lock (GB10's applications clock)


def test_set_under_load_then_a_second_run_reports_no_change(node):
    node.switch("load")
    first = node.gpu(2300, real=True)  # the module file run as a process of its own
    assert first["changed"] is True, first
    assert first["commands"] == ["nvidia-smi -lgc 0,2300"]  # no -pm 1 unless asked: the receipts run without
    assert 2270 <= node.sm() < 2300
    assert node.persistence() == "Disabled"
    assert "GPU_CLOCK_CAP_MHZ=2300\n" in (node.state_dir / "gpu.conf").read_text()
    assert first["gpus"][0]["sm_mhz"] == node.sm() and first["gpus"][0]["activity"] == "busy"
    assert first["pinned"] is True and not first.get("warnings")
    assert node.verify() == {"min": 0, "cap": 2300, "result": "held", "sm_mhz": node.sm()}
    assert any(
        line.startswith("GPU cap check: held: no SM clock sample above 2300 MHz under load")
        for line in first["report"]
    )
    second = node.gpu(2300)
    assert second["changed"] is False, second
    assert second["commands"] == []


@pytest.mark.skipif(os.geteuid() != 0, reason="files_pending wants root-owned files, as the role writes them")
def test_the_cap_reads_the_boot_files_so_the_files_task_runs_only_on_a_difference(node):
    """gpu_clocks' files task (the boot-time script and unit) is skipped when the cap's own read (observe)
    finds them as the files module would leave them; an edited file, a disabled unit or a unit systemd must
    reload each make it run."""
    from ansible_collections.sparkfleet.cluster.plugins.filter.engine import files_pending

    script, unit = node.root / "sparkfleet-clocks", node.root / "sparkfleet-clocks.service"
    files = [{"path": str(script), "content": "#!/bin/sh\n", "mode": "0755"},
             {"path": str(unit), "content": "[Unit]\n", "mode": "0644"}]  # fmt: skip
    for f in files:
        Path(f["path"]).write_text(f["content"])
        Path(f["path"]).chmod(int(f["mode"], 8))
    state = node.root / "unit-state"
    state.write_text("UnitFileState=enabled\nNeedDaemonReload=no\n")
    (node.bin / "systemctl").write_text(f'#!/bin/sh\n[ "$1" = show ] && cat {shlex.quote(str(state))}\n')
    (node.bin / "systemctl").chmod(0o755)
    node.env["PATH"] = f"{node.bin}{os.pathsep}{node.env['PATH']}"
    observe = {"paths": [str(script), str(unit)], "units": ["sparkfleet-clocks.service"]}

    def pending() -> list:
        out = node.gpu(2300, observe=observe)
        assert not out.get("failed"), out
        return files_pending(out["observed"], files=files, enable=["sparkfleet-clocks.service"])

    assert pending() == []
    script.write_text("#!/bin/sh\n# edited\n")
    assert pending() == [f"{script}: content"]
    script.write_text(files[0]["content"])
    unit.chmod(0o600)
    assert pending() == [f"{unit}: mode or owner"]
    unit.chmod(0o644)
    state.write_text("UnitFileState=disabled\nNeedDaemonReload=yes\n")
    assert pending() == ["sparkfleet-clocks.service: systemd reload", "sparkfleet-clocks.service: enable"]
    assert "observed" not in node.gpu(2300)  # only when asked


def test_a_cap_set_while_idle_is_not_claimed_as_held(node):
    first = node.gpu(2300)
    assert first["changed"] is True and node.sm() == IDLE
    assert node.verify() == {"min": 0, "cap": 2300, "result": "unverified", "sm_mhz": IDLE}
    assert first["pinned"] is None and not first.get("warnings")
    check = next(line for line in first["report"] if line.startswith("GPU cap check"))
    assert check.startswith("GPU cap check: not verified: the GPU idled right after -lgc 0,2300")
    assert "`sparkfleet clocks show` while the engine serves" in check
    assert node.gpu(2300)["changed"] is False  # nothing to re-apply: an idle clock is under the cap
    node.switch("load")
    shown = node.gpu(state="query")
    assert shown["gpus"][0]["activity"] == "busy" and shown["gpus"][0]["sm_mhz"] < 2300
    assert not any("not holding" in line for line in shown["report"])


def test_the_lock_range_min_is_the_inventorys_and_a_new_min_re_applies(node):
    first = node.gpu(2200, min_mhz=300)
    assert first["commands"] == ["nvidia-smi -lgc 300,2200"]  # Bizuayeu's unit: -lgc 300,2200
    assert node.gpu(2200, min_mhz=300)["changed"] is False
    moved = node.gpu(2200, min_mhz=0)
    assert moved["changed"] is True and moved["commands"] == ["nvidia-smi -lgc 0,2200"]
    assert "lock range was 300,2200" in moved["reasons"][0]
    assert node.gpu(2200, min_mhz=2200)["failed"] is True  # min must sit under the cap


def test_persistence_mode_is_optional_and_its_failure_only_a_warning(node):
    node.switch("load")
    on = node.gpu(2300, persistence_mode=True)
    assert on["commands"] == ["nvidia-smi -pm 1", "nvidia-smi -lgc 0,2300"]
    assert node.persistence() == "Enabled"
    node.restart()
    node.switch("load")
    refusing = node.bin / "no-pm-smi"
    refusing.write_text(
        '#!/bin/sh\ncase "$1" in -pm) echo "Unable to set persistence mode for GPU 0000000F:01:00.0: '
        'Not Supported"; exit 3;; esac\nexec "$(dirname "$0")/nvidia-smi" "$@"\n'
    )
    refusing.chmod(0o755)
    result = node.gpu(2300, persistence_mode=True, nvidia_smi=str(refusing))
    assert result.get("failed") is not True, result
    assert result["changed"] is True and node.sm() < 2300 < LOAD  # the cap is set anyway
    assert "persistence mode not enabled" in json.dumps(result["warnings"])


def test_a_cap_that_does_not_take_is_reported_and_not_retried_every_run(node):
    node.switch("load")
    node.switch("ignore-lock")  # -lgc answers success, the clock keeps running at the power-capped clock
    first = node.gpu(2300)
    assert first["changed"] is True and first["commands"] == ["nvidia-smi -lgc 0,2300"]
    assert node.sm() == LOAD > 2300
    assert first["pinned"] is False
    assert node.verify() == {"min": 0, "cap": 2300, "result": "not-taken", "sm_mhz": LOAD}
    warnings = json.dumps(first["warnings"])
    assert "the cap did not take" in warnings and "power-cycle" not in warnings  # not a latch: no unplugging
    assert any(line.startswith("GPU cap check: NOT TAKEN") for line in first["report"])
    second = node.gpu(2300)  # re-running -lgc would not help: report, do not loop
    assert second["changed"] is False and second["pinned"] is False
    assert "the cap did not take" in json.dumps(second["warnings"])
    shown = node.gpu(state="query")
    assert shown["pinned"] is False and any("NOT TAKEN" in line for line in shown["report"])
    assert any(
        "2418 MHz under load, above the 2300 MHz cap: the cap is not holding" in line
        for line in shown["report"]
    )
    node.unswitch("ignore-lock")
    node.restart()  # the next boot: the GPU honours the lock again
    node.switch("load")
    fixed = node.gpu(2300)
    assert fixed["changed"] is True and fixed["pinned"] is True and node.sm() < 2300


def test_an_idle_gpu_that_ignores_the_lock_cannot_be_caught_idle(node):
    node.switch("ignore-lock")
    result = node.gpu(2300)
    assert node.verify()["result"] == "unverified" and result["pinned"] is None  # not claimed held


def test_check_mode_reports_the_change_and_changes_nothing(node):
    node.switch("load")
    node.gpu(2300)
    dry = node.gpu(2100, check=True)
    assert dry["changed"] is True
    assert dry["commands"] == ["nvidia-smi -lgc 0,2100"]
    assert dry["diff"]["before"].endswith("GPU_CLOCK_CAP_MHZ=2300\n")
    assert dry["diff"]["after"].endswith("GPU_CLOCK_CAP_MHZ=2100\n")
    assert 2270 <= node.sm() < 2300
    assert "GPU_CLOCK_CAP_MHZ=2300" in (node.state_dir / "gpu.conf").read_text()
    assert node.verify()["cap"] == 2300
    assert node.gpu(2300, check=True)["changed"] is False


def test_change_cap_and_reset_to_stock(node):
    node.switch("load")
    node.gpu(2300)
    changed = node.gpu(2100)
    assert changed["changed"] and changed["commands"] == ["nvidia-smi -lgc 0,2100"]
    assert 2060 <= node.sm() < 2100  # docs/recipes.md "Clocks": 2100 lands at ~2080
    reset = node.gpu(0)
    assert reset["changed"] and reset["commands"] == ["nvidia-smi -rgc"]
    assert node.sm() == LOAD and reset["pinned"] is None
    assert node.verify()["result"] == "stock"
    assert "GPU_CLOCK_CAP_MHZ=0\n" in (node.state_dir / "gpu.conf").read_text()
    assert node.gpu(0)["changed"] is False


def test_cap_is_reapplied_after_a_restart(node):
    node.gpu(2300, persistence_mode=True)
    node.restart()
    node.switch("load")
    assert node.sm() == LOAD and node.persistence() == "Disabled"  # lost, as on a real reboot
    query = node.gpu(state="query")
    assert query["cap_mhz"] == 2300 and query["applied"] is None and query["in_effect"] is False
    again = node.gpu(2300, persistence_mode=True)
    assert again["changed"] is True
    assert again["reasons"][-1] == "no cap applied since this boot"
    assert again["commands"] == ["nvidia-smi -pm 1", "nvidia-smi -lgc 0,2300"]
    assert node.sm() < 2300
    assert node.gpu(2300, persistence_mode=True)["changed"] is False


def test_a_lost_lock_is_detected_by_the_running_clock_under_load(node):
    node.switch("load")
    node.gpu(2300)
    node.smi("-rgc")  # e.g. a GPU reset after a hang: the marker still says 2300, and it took before
    result = node.gpu(2300)
    assert result["changed"] is True
    assert "above the cap" in result["reasons"][0]
    assert node.sm() < 2300 and result["pinned"] is True


def test_latched_is_a_low_clock_under_load_with_a_power_cycle_fix(node):
    node.gpu(2300)
    node.switch("latched")
    node.switch("load")
    result = node.gpu(state="query")
    assert result["changed"] is False
    assert result["latched"] is True
    gpu = result["gpus"][0]
    assert gpu["sm_mhz"] == 855 and gpu["activity"] == "busy" and gpu["latched"] is True
    warnings = json.dumps(result["warnings"])
    assert "GPU 0 (NVIDIA GB10) runs its SM clock at 855 MHz under load (utilization 96 %)" in warnings
    assert "unplug AC" in warnings
    latched = [line for line in result["report"] if "LATCHED" in line]
    assert latched == [
        "GPU 0: LATCHED: SM clock 855 MHz under load is under 1000 MHz; only an AC power cycle clears it "
        "(shut down, unplug for 30 s)"
    ]
    assert result["report"][0] == "GPU cap: 2300 MHz, applied since this boot"
    # a latched clock is under the cap: no re-apply loop
    assert node.gpu(2300)["changed"] is False


def test_an_idle_gpu_is_reported_idle_with_no_power_cycle_advice(node):
    node.switch("latched")  # even a GPU that is latched looks idle when idle: nothing can be said then
    for idle_mhz in (None, "968", "2502"):  # the sim's idle clock (the H200's), and GB10 idle samples
        if idle_mhz:
            node.switch("idle-mhz", idle_mhz)
        result = node.gpu(state="query")
        gpu = result["gpus"][0]
        assert gpu["activity"] == "idle" and gpu["activity_why"] == "clock event reason GPU idle"
        assert result["latched"] is False and not result.get("warnings")
        text = "\n".join(result["report"])
        assert "LATCHED" not in text and "power cycle" not in text and "unplug" not in text
        if gpu["sm_mhz"] < 1000:
            assert f"GPU 0: idle: SM {gpu['sm_mhz']} MHz is its idle clock, not a fault" in text


def test_query_of_an_unconfigured_node_wanting_stock_is_in_effect(node):
    result = node.gpu(state="query")
    assert result["cap_mhz"] is None and result["latched"] is False and result["in_effect"] is True
    assert result["report"][0].startswith("GPU cap: never configured by sparkfleet: stock clocks")
    assert "persistence Disabled" in result["report"][1]
    assert "GPU idle" in result["report"][1] and result["report"][1].endswith(
        ": idle (clock event reason GPU idle)"
    )
    assert not any("clocks reset" in line or "NOT applied" in line for line in result["report"])


def test_missing_nvidia_smi_fails_a_change_and_is_a_line_in_the_report(node):
    result = node.gpu(2300, nvidia_smi=str(node.root / "nope/nvidia-smi"))
    assert result["failed"] is True
    assert "not found" in result["msg"]
    shown = node.gpu(state="query", nvidia_smi=str(node.root / "nope/nvidia-smi"))
    assert shown.get("failed") is not True, shown
    assert shown["gpus"] == [] and shown["latched"] is False
    assert "nope/nvidia-smi not found: is the NVIDIA driver installed on this node?" in shown["gpu_error"]
    assert f"GPU clocks not read: {shown['gpu_error']}" in shown["report"]


def test_an_nvidia_smi_error_fails_with_its_output(node):
    broken = node.bin / "broken-smi"
    broken.write_text(
        '#!/bin/sh\ncase "$*" in *query*) exec "$(dirname "$0")/nvidia-smi" "$@";; esac\n'
        'echo "The current user does not have permission to change clocks for GPU 0000000F:01:00.0."\n'
        "exit 4\n"
    )
    broken.chmod(0o755)
    result = node.gpu(2300, nvidia_smi=str(broken), persistence_mode=False)
    assert result["failed"] is True
    assert "exit 4" in result["msg"] and "permission" in result["msg"]
    assert not (node.state_dir / "gpu.conf").exists()  # nothing recorded that did not happen


def test_parse_judge_and_plan_are_pure():
    row = "0, NVIDIA GB10, GPU-1, {pm}, {sm}, 3003, {reasons}, {util}\n"
    low_busy = gpu_mod.parse_gpus(
        row.format(pm="Enabled", sm=855, reasons="0x0000000000000000", util=96), 1000
    )
    assert low_busy[0]["latched"] is True and low_busy[0]["event_reason_names"] == []
    assert low_busy[0]["activity_why"] == "utilization 96 %"
    low_idle = gpu_mod.parse_gpus(
        row.format(pm="Enabled", sm=855, reasons="0x0000000000000001", util=0), 1000
    )
    assert low_idle[0]["latched"] is False and low_idle[0]["activity"] == "idle"
    # no reason, no utilization reported, no process: nothing says load
    unknown = gpu_mod.parse_gpus(
        row.format(pm="Enabled", sm=855, reasons="0x0000000000000000", util="[N/A]"), 1000
    )
    assert unknown[0]["activity"] == "unknown" and unknown[0]["latched"] is False
    with_proc = gpu_mod.parse_gpus(
        row.format(pm="Enabled", sm=855, reasons="0x0000000000000000", util="[N/A]"),
        1000,
        processes=gpu_mod.parse_processes("GPU-1, 4242, /usr/local/bin/tensorfold\n"),
    )
    assert (
        with_proc[0]["latched"] is True
        and with_proc[0]["activity_why"] == "compute process 4242 (/usr/local/bin/tensorfold)"
    )
    no_pm = gpu_mod.parse_gpus(row.format(pm="Disabled", sm=2288, reasons="0x0000000000000003", util=0), 1000)
    todo = gpu_mod.plan(2300, no_pm, configured=2300, applied=2300, persistence=True)
    assert todo == {
        "commands": [["-pm", "1"]],
        "write_state": False,
        "reasons": ["persistence mode is disabled"],
    }
    todo = gpu_mod.plan(2300, low_busy, configured=2300, applied=2300, persistence=False)
    assert todo == {"commands": [], "write_state": False, "reasons": []}
    over = gpu_mod.parse_gpus(row.format(pm="Disabled", sm=2418, reasons="0x0000000000000004", util=96), 1000)
    held = {"min": 0, "cap": 2300, "result": "held", "sm_mhz": 2288}
    not_taken = {**held, "result": "not-taken", "sm_mhz": 2418}
    relock = gpu_mod.plan(2300, over, configured=2300, applied=2300, persistence=False, verify=held)
    assert relock["commands"] == [["-lgc", "0,2300"]]  # it took before: the lock was lost
    assert gpu_mod.plan(2300, over, 2300, 2300, False, verify=not_taken)["commands"] == []
    assert gpu_mod.plan(2300, over, 2300, 2300, False, min_mhz=300, verify=not_taken)["commands"] == [
        ["-lgc", "300,2300"]
    ]
    assert gpu_mod.verdict(2300, [(2288, True), (2301, False)]) == "not-taken"
    assert gpu_mod.verdict(2300, [(2288, False), (2300, True)]) == "held"
    assert gpu_mod.verdict(2300, [(345, False), (345, False)]) == "unverified"  # idle proves nothing
    assert gpu_mod.verdict(2300, []) == "unverified" and gpu_mod.verdict(0, [(2418, True)]) == "stock"
    todo = gpu_mod.plan(0, low_busy, configured=None, applied=None, persistence=True)
    assert todo["commands"] == [["-rgc"]] and todo["write_state"] is True
    assert gpu_mod.stock_or_applied(None, None) and gpu_mod.stock_or_applied(0, None)
    assert not gpu_mod.stock_or_applied(2300, None) and not gpu_mod.stock_or_applied(None, 2300)
    with pytest.raises(gpu_mod.ClockError):
        gpu_mod.parse_gpus("", 1000)
    with pytest.raises(gpu_mod.ClockError, match="want 8 fields"):
        gpu_mod.parse_gpus("0, NVIDIA GB10, Enabled, 855, 3003, 0x0\n", 1000)
    assert gpu_mod.read_cap("/nonexistent") is None


# ---- the CPU module against a fake cpufreq tree ------------------------------------------------------
def make_cpufreq(root: Path) -> Path:
    cpufreq = root / "cpufreq"
    # GB10: ten performance cores (policy0, up to 3.9 GHz) and ten efficiency cores (policy10, 2.8 GHz)
    for name, cpus, max_khz in (("policy0", "0-9", 3900000), ("policy10", "10-19", 2808000)):
        d = cpufreq / name
        d.mkdir(parents=True)
        (d / "cpuinfo_max_freq").write_text(f"{max_khz}\n")
        (d / "cpuinfo_min_freq").write_text("338000\n")
        (d / "scaling_max_freq").write_text(f"{max_khz}\n")
        (d / "related_cpus").write_text(f"{cpus}\n")
    return cpufreq


def cpu(
    node: Node, cpufreq: Path, cap: int | None = None, check: bool = False, real: bool = False, **args: object
) -> dict:
    base = {"cpufreq_root": str(cpufreq), "state_file": str(node.state_dir / "cpu.conf")}
    if cap is not None:
        base["cap_mhz"] = cap
    return node.module("cpu_clocks", check=check, real=real, **base, **args)


def test_cpu_cap_limits_only_the_faster_cores_and_is_idempotent(node, tmp_path):
    cpufreq = make_cpufreq(tmp_path)
    result = cpu(node, cpufreq, 3600, real=True)  # the module file run as a process of its own
    assert result["changed"] is True and result["written"] == ["policy0"]
    assert (cpufreq / "policy0/scaling_max_freq").read_text() == "3600000\n"
    assert (cpufreq / "policy10/scaling_max_freq").read_text() == "2808000\n"
    assert "CPU_CLOCK_CAP_MHZ=3600" in (node.state_dir / "cpu.conf").read_text()
    assert cpu(node, cpufreq, 3600)["changed"] is False
    dry = cpu(node, cpufreq, 0, check=True)
    assert dry["changed"] is True and (cpufreq / "policy0/scaling_max_freq").read_text() == "3600000\n"
    assert cpu(node, cpufreq, 0)["changed"] is True
    assert (cpufreq / "policy0/scaling_max_freq").read_text() == "3900000\n"
    assert cpu(node, cpufreq, 0)["changed"] is False
    shown = cpu(node, cpufreq, state="query")
    assert shown["report"][0] == "CPU cap: 0 = stock"
    assert "CPU policy0 (cpus 0-9): max 3900 MHz of 3900 MHz" in shown["report"]


def test_the_gpu_task_caps_the_cpu_in_the_same_round_trip_as_cpu_clocks_does(node, tmp_path):
    """gpu_clocks' `cpu` option (the role's one round trip for both caps) gives what cpu_clocks gives for the
    same node and cap, and the task is changed when only the CPU cap changed; a bad CPU cap fails the task."""
    node.switch("load")
    node.gpu(2300)  # the GPU cap in place: from here only the CPU cap changes
    alone, both = make_cpufreq(tmp_path / "alone"), make_cpufreq(tmp_path / "both")
    cpu_state = {"state_file": str(node.state_dir / "cpu-both.conf")}
    for cap in (3600, 3600, 0):
        want = cpu(node, alone, cap)
        got = node.gpu(2300, cpu={"cap_mhz": cap, "cpufreq_root": str(both), **cpu_state})
        assert got["changed"] is want["changed"], (cap, got)
        mine = {k: v for k, v in got["cpu"].items() if k != "policies"}
        theirs = {k: v for k, v in want.items() if k not in ("policies", "diff", "invocation")}
        assert mine == {**theirs, "report": [r.replace(str(alone), str(both)) for r in theirs["report"]]}
        assert got["diff"][1]["after"] == want["diff"]["after"]
        assert (both / "policy0/scaling_max_freq").read_text() == (
            alone / "policy0/scaling_max_freq"
        ).read_text()
    bad = node.gpu(2300, cpu={"cap_mhz": 100, "cpufreq_root": str(both), **cpu_state})
    assert bad["failed"] is True and "under the CPUs' minimum clock" in bad["msg"]


def test_cpu_without_cpufreq_is_skipped_with_a_reason(node, tmp_path):
    result = cpu(node, tmp_path / "no-cpufreq", 3600)
    assert result["skipped_reason"].startswith("no cpufreq policies")
    assert result["written"] == []
    assert result["changed"] is True  # the configured cap is recorded for the boot unit
    assert cpu(node, tmp_path / "no-cpufreq", 3600)["changed"] is False
    assert "skipped" in cpu(node, tmp_path / "no-cpufreq", state="query")["report"][0]


def test_cpu_cap_under_the_minimum_fails(node, tmp_path):
    result = cpu(node, make_cpufreq(tmp_path), 200)
    assert result["failed"] is True and "minimum" in result["msg"]


def test_cpu_tolerates_a_driver_rounding_the_ceiling():
    policy = {"max_khz": 3900000, "current_max_khz": 3596000}
    assert cpu_mod.in_effect(policy, 3600000)
    assert not cpu_mod.in_effect({**policy, "current_max_khz": 3900000}, 3600000)


# ---- the boot script re-applies what is configured --------------------------------------------------
def render(template: str, **overrides: object) -> str:
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    # Ansible's template module: trim_blocks, no autoescape (these are shell scripts and unit files).
    env = jinja2.Environment(  # noqa: S701
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True
    )
    # Ansible's own filters and tests (quote, bool, ...); Jinja's built-ins stay
    for name, fn in AnsibleFilters().filters().items():
        env.filters.setdefault(name, fn)
    for name, fn in AnsibleTests().tests().items():
        env.tests.setdefault(name, fn)
    values = {**defaults, **overrides}
    return env.from_string((ROLE / "templates" / template).read_text()).render(**values)


def boot_script(node: Node, tmp_path: Path, cpufreq: Path, **overrides: object) -> Path:
    script = tmp_path / "sparkfleet-clocks"
    script.write_text(
        render(
            "sparkfleet-clocks.sh.j2",
            **{
                "gpu_clocks_state_dir": str(node.state_dir),
                "gpu_clocks_run_dir": str(node.run_dir / "sparkfleet/clocks"),
                "gpu_clocks_cpufreq_root": str(cpufreq),
                "gpu_clocks_nvidia_smi": str(node.bin / "nvidia-smi"),
                "gpu_clocks_verify_interval_ms": 10,
                **overrides,
            },
        )
    )
    subprocess.run(["sh", "-n", str(script)], check=True)
    return script


def test_boot_script_reapplies_the_caps_after_a_restart(node, tmp_path):
    cpufreq = make_cpufreq(tmp_path)
    node.gpu(2300)
    cpu(node, cpufreq, 3600)
    node.restart()
    (cpufreq / "policy0/scaling_max_freq").write_text("3900000\n")  # the kernel boots at stock
    script = boot_script(node, tmp_path, cpufreq)
    proc = subprocess.run(["sh", str(script)], env=node.env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "GPU cap 2300 MHz applied" in proc.stdout
    assert node.persistence() == "Disabled"  # -pm 1 only when asked
    # at boot the GPU idles (the engine starts after the unit): the check cannot prove the cap
    assert node.verify() == {"min": 0, "cap": 2300, "result": "unverified", "sm_mhz": IDLE}
    assert (cpufreq / "policy0/scaling_max_freq").read_text().strip() == "3600000"
    assert node.gpu(2300)["changed"] is False  # the module sees the boot unit's work
    node.switch("load")
    assert node.sm() < 2300  # the boot unit's lock holds under load


def test_boot_script_under_load_records_held(node, tmp_path):
    node.gpu(2300)
    node.restart()
    node.switch("load")
    proc = subprocess.run(
        ["sh", str(boot_script(node, tmp_path, tmp_path / "none"))],
        env=node.env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert node.verify() == {"min": 0, "cap": 2300, "result": "held", "sm_mhz": node.sm()}
    assert node.sm() < 2300


def test_boot_script_runs_the_inventorys_range_and_says_when_the_cap_does_not_take(node, tmp_path):
    node.gpu(2200, min_mhz=300)
    node.restart()
    node.switch("ignore-lock")
    node.switch("load")  # a clock above the cap shows only when the GPU would run above it
    script = boot_script(node, tmp_path, tmp_path / "none", gpu_clocks_min_mhz=300)
    proc = subprocess.run(["sh", str(script)], env=node.env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr  # reported, not a failed boot
    assert "WARNING: nvidia-smi -lgc 300,2200 answered success" in proc.stderr
    assert node.verify() == {"min": 300, "cap": 2200, "result": "not-taken", "sm_mhz": LOAD}
    result = node.gpu(2200, min_mhz=300)  # the module reads the boot's verdict: no re-apply loop
    assert result["changed"] is False and result["pinned"] is False


def test_boot_script_persistence_failure_is_not_fatal(node, tmp_path):
    node.gpu(2300)
    node.restart()
    refusing = node.bin / "no-pm-smi"
    refusing.write_text(
        '#!/bin/sh\ncase "$1" in -pm) exit 3;; esac\nexec "$(dirname "$0")/nvidia-smi" "$@"\n'
    )
    refusing.chmod(0o755)
    script = boot_script(
        node,
        tmp_path,
        tmp_path / "none",
        gpu_clocks_persistence_mode=True,
        gpu_clocks_nvidia_smi=str(refusing),
    )
    proc = subprocess.run(["sh", str(script)], env=node.env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "persistence mode not enabled (going on)" in proc.stderr
    node.switch("load")
    assert node.sm() < 2300


def test_boot_script_retries_then_fails_when_the_driver_never_comes(node, tmp_path):
    node.gpu(2300)
    script = boot_script(
        node,
        tmp_path,
        tmp_path / "none",
        gpu_clocks_nvidia_smi="/bin/false",
        gpu_clocks_boot_retries=3,
        gpu_clocks_boot_retry_delay_s=0,
    )
    proc = subprocess.run(["sh", str(script)], env=node.env, capture_output=True, text=True, check=False)
    assert proc.returncode == 1
    assert proc.stderr.count("not ready") == 2 and "not applied after 3 tries" in proc.stderr


def test_boot_unit_orders_after_persistenced_and_before_docker():
    unit = render("sparkfleet-clocks.service.j2")
    assert "After=nvidia-persistenced.service systemd-modules-load.service\n" in unit
    assert "Wants=nvidia-persistenced.service\n" in unit
    assert "Before=docker.service\n" in unit  # the engine's containers never start uncapped
    assert "Type=oneshot" in unit and "RemainAfterExit=yes" in unit and "WantedBy=multi-user.target" in unit
    assert "Before=" not in render("sparkfleet-clocks.service.j2", gpu_clocks_boot_before=[])

"""host_status degrades: a missing tool or an unreadable file is a row that says what could not be read,
never a crash of the report (issue 22); and stock clocks wanted on a node never capped is ok. The module's
main() runs in this process (tests/unit/module_runner.py); one test runs the module file as a process."""

from __future__ import annotations

from pathlib import Path

import module_runner

EXPECT = {
    "os": {"ubuntu": "24.04"},
    "kernel_min": "6.11",
    "driver_min": "580.95.05",
    "thp": "never",
    "swap_min_mib": 1024,
    "sysctl": {"vm.swappiness": 10},
    "gpu_cap_mhz": 0,
    "cpu_cap_mhz": 0,
}


def node_root(tmp: Path, *, driver: bool = True, marks: tuple[str, ...] = ()) -> Path:
    root = tmp / "root"

    def put(path: str, text: str) -> None:
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    put("/etc/os-release", 'PRETTY_NAME="Ubuntu 24.04.3 LTS"\nID=ubuntu\nVERSION_ID="24.04"\n')
    put("/proc/cmdline", "BOOT_IMAGE=/boot/vmlinuz ro quiet\n")
    put("/sys/kernel/mm/transparent_hugepage/enabled", "always madvise [never]\n")
    put("/proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n/swap.img file 2097148 0 -2\n")
    put("/proc/sys/vm/swappiness", "10\n")
    put("/proc/1/environ", "PATH=/usr/bin\0HOME=/\0")
    if driver:
        put("/sys/module/nvidia/version", "580.159.04\n")
    for mark in marks:
        put(mark, "docker\n")
    return root


def status(tmp: Path, root: Path, real: bool = False, **args: object) -> dict:
    module_args = {
        "expect": EXPECT,
        "root": str(root),
        "kernel_release": "6.17.0-1014-nvidia",
        "page_size": 4096,
        "state_dir": "/var/lib/sparkfleet",
        "run_dir": "/run/sparkfleet",
        "nvidia_smi": str(tmp / "no-nvidia-smi"),
        "systemd_detect_virt": str(tmp / "no-systemd-detect-virt"),
        "fwupdmgr": str(tmp / "no-fwupdmgr"),
        **args,
    }
    result = module_runner.run("host_status", module_args, real=real)
    assert result.get("failed") is not True, result
    return result


def by_check(result: dict) -> dict[str, dict]:
    return {c["check"]: c for c in result["checks"]}


def stub(tmp: Path, name: str, script: str) -> Path:
    path = tmp / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return path


def test_a_container_without_systemd_detect_virt_is_detected_from_its_files_and_said(tmp_path):
    """The module file run as a process of its own, as Ansible runs it."""
    result = status(tmp_path, node_root(tmp_path, marks=("/.dockerenv",)), real=True)
    assert result["facts"]["container"] is True
    row = by_check(result)["container detection"]
    missing = f"{tmp_path / 'no-systemd-detect-virt'} not found"
    assert row["status"] == "n/a" and row["value"] == f"{missing}; a container by /.dockerenv"
    assert "install systemd-detect-virt" in row["fix"]
    assert by_check(result)["THP"]["status"] == "ok"  # the rest is read and checked
    assert any(line.startswith("n/a  container detection: ") for line in result["report"])
    assert result["off"] == []  # a missing tool is said, it does not fail the playbook


def test_a_machine_without_systemd_detect_virt_and_without_container_files_is_no_container(tmp_path):
    result = status(tmp_path, node_root(tmp_path))
    assert result["facts"]["container"] is False
    value = by_check(result)["container detection"]["value"]
    assert (
        "not found; not a container (none of /run/systemd/container, /.dockerenv, /run/.containerenv" in value
    )


def test_podman_and_systemds_own_marks_and_pid1s_environment_count(tmp_path):
    assert status(tmp_path, node_root(tmp_path, marks=("/run/.containerenv",)))["facts"]["container"] is True
    root = node_root(tmp_path / "b")
    (root / "proc/1/environ").write_text("container=docker\0PATH=/usr/bin\0")
    result = status(tmp_path, root)
    assert result["facts"]["container"] is True
    assert "container=docker in /proc/1/environ" in by_check(result)["container detection"]["value"]


def test_systemd_detect_virt_decides_where_it_runs_and_a_broken_one_is_said(tmp_path):
    root = node_root(tmp_path, marks=("/.dockerenv",))
    docker = stub(tmp_path, "sdv-docker", "echo docker; exit 0")
    result = status(tmp_path, root, systemd_detect_virt=str(docker))
    assert result["facts"]["container"] is True and "container detection" not in by_check(result)
    assert result["facts"]["virtualization"]["how"] == f"{docker} --container: docker"
    none = stub(tmp_path, "sdv-none", "echo none; exit 1")
    assert (
        status(tmp_path, root, systemd_detect_virt=str(none))["facts"]["container"] is False
    )  # the tool wins
    broken = stub(
        tmp_path, "sdv-broken", "echo 'Failed to check for container: Permission denied' >&2; exit 2"
    )
    result = status(tmp_path, root, systemd_detect_virt=str(broken))
    assert result["facts"]["container"] is True  # the files decided
    assert (
        "failed (exit 2): Failed to check for container: Permission denied"
        in by_check(result)["container detection"]["value"]
    )


def test_the_container_given_by_the_role_wins_and_the_missing_tool_is_still_said(tmp_path):
    result = status(tmp_path, node_root(tmp_path), container=True)
    assert result["facts"]["container"] is True
    assert by_check(result)["sysctl"]["status"] == "ok"  # (ok stays ok; only off becomes n/a in a container)
    assert by_check(result)["container detection"]["status"] == "n/a"


def test_detection_alone_with_no_expectations_is_what_the_role_asks_first(tmp_path):
    result = status(tmp_path, node_root(tmp_path, marks=("/run/systemd/container",)), expect={})
    assert result["facts"]["container"] is True
    assert result["facts"]["virtualization"]["how"] == "a container by /run/systemd/container"
    assert result["changed"] is False


def test_missing_nvidia_smi_and_no_driver_module_is_a_driver_row(tmp_path):
    result = status(tmp_path, node_root(tmp_path, driver=False))
    row = by_check(result)["NVIDIA driver"]
    assert row["status"] == "off"
    assert row["value"] == (
        "not found: /sys/module/nvidia/version missing (the nvidia module is not loaded), and "
        f"{tmp_path / 'no-nvidia-smi'} not found"
    )
    assert "install the NVIDIA 580 driver" in row["fix"]
    assert by_check(result)["OS release"]["status"] == "ok" and len(result["checks"]) >= 8


def test_nvidia_smi_answers_the_driver_where_the_module_file_is_missing(tmp_path):
    smi = stub(tmp_path, "smi", 'echo "580.159.04"')
    result = status(tmp_path, node_root(tmp_path, driver=False), nvidia_smi=str(smi))
    assert by_check(result)["NVIDIA driver"] == {
        **by_check(result)["NVIDIA driver"],
        "status": "ok",
        "value": "580.159.04",
    }
    broken = stub(
        tmp_path, "smi-broken", 'echo "NVIDIA-SMI has failed because it could not communicate"; exit 9'
    )
    row = by_check(status(tmp_path, node_root(tmp_path / "b", driver=False), nvidia_smi=str(broken)))[
        "NVIDIA driver"
    ]
    assert "failed (exit 9): NVIDIA-SMI has failed because it could not communicate" in row["value"]


def test_a_reader_that_fails_is_its_checks_marked_not_readable_and_the_report_stands(tmp_path):
    root = node_root(tmp_path)
    (root / "proc/swaps").write_text("Filename\tType\tSize\tUsed\tPriority\n/swap.img file lots 0 -2\n")
    result = status(tmp_path, root)
    swap = by_check(result)["swap"]
    assert swap["status"] == "n/a"
    assert swap["value"].startswith("not readable (swap): ValueError: invalid literal for int()")
    assert result["facts"]["unreadable"] == {"swap": swap["value"].split(": ", 1)[1]}
    assert by_check(result)["THP"]["status"] == "ok" and by_check(result)["sysctl"]["status"] == "ok"


def test_stock_wanted_and_never_capped_is_ok(tmp_path):
    root = node_root(tmp_path)
    cap = by_check(status(tmp_path, root))["GPU clock cap"]
    assert cap["status"] == "ok" and cap["value"] == "configured never MHz, applied since boot nothing"
    (root / "var/lib/sparkfleet/clocks").mkdir(parents=True)
    (root / "var/lib/sparkfleet/clocks/gpu.conf").write_text("GPU_CLOCK_CAP_MHZ=0\n")
    assert by_check(status(tmp_path, root))["GPU clock cap"]["status"] == "ok"  # reset, then rebooted
    (root / "var/lib/sparkfleet/clocks/gpu.conf").write_text("GPU_CLOCK_CAP_MHZ=2300\n")
    off = by_check(status(tmp_path, root))["GPU clock cap"]
    assert off["status"] == "off" and off["fix"] == "`sparkfleet clocks reset`"  # a cap where stock is wanted


def test_a_cap_checked_on_an_idle_gpu_is_ok_and_says_it_is_not_verified(tmp_path):
    root = node_root(tmp_path)
    (root / "var/lib/sparkfleet/clocks").mkdir(parents=True)
    (root / "var/lib/sparkfleet/clocks/gpu.conf").write_text("GPU_CLOCK_CAP_MHZ=2300\n")
    (root / "run/sparkfleet/clocks").mkdir(parents=True)
    (root / "run/sparkfleet/clocks/gpu.applied").write_text("2300\n")
    (root / "run/sparkfleet/clocks/gpu.verify").write_text("MIN=0\nCAP=2300\nRESULT=unverified\nSM_MHZ=345\n")
    cap = by_check(status(tmp_path, root, expect={**EXPECT, "gpu_cap_mhz": 2300}))["GPU clock cap"]
    assert cap["status"] == "ok" and "(not verified: the GPU idled during the check" in cap["value"]
    (root / "run/sparkfleet/clocks/gpu.verify").write_text("MIN=0\nCAP=2300\nRESULT=not-taken\nSM_MHZ=2418\n")
    cap = by_check(status(tmp_path, root, expect={**EXPECT, "gpu_cap_mhz": 2300}))["GPU clock cap"]
    assert (
        cap["status"] == "off" and "power" not in cap["fix"]
    )  # GB10 accepts -lgc without pinning: no unplug

"""Cluster facts from the field (issue 22): the NVIDIA driver's family and sameness, the next kernel's NVIDIA
module; host_status and module_utils/boot.py over real recordings and the real module layout, and the lab's
stand-ins for them (the nvidia-smi simulator's `driver-version` switch, sim/kernels.py)."""

from __future__ import annotations

import ctypes.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.sparkfleet.cluster.plugins.module_utils import boot, engine_status
from ansible_collections.sparkfleet.cluster.plugins.modules import engine_nccl
from test_host_modules import (
    EXPECT,
    FWUPD_READY,
    KERNEL_64K,
    ROOT,
    fake_fwupdmgr,
    run_module,
    spark_root,
    status,
)

FIXTURES = ROOT / "tests/unit/fixtures/nvidia-smi"
SIM = ROOT / "lab/sparkfleet_lab/sim/nvidia_smi.py"
KERNELS = ROOT / "lab/sparkfleet_lab/sim/kernels.py"
NEWER = "7.0.0-1020-nvidia-64k"

# grub.cfg as update-grub writes it on Ubuntu (10_linux): the first entry boots the newest kernel, the others
# sit in the "Advanced options" submenu, each with a recovery twin.
GRUB_CFG = f"""
set default="0"
menuentry 'Ubuntu' --class ubuntu $menuentry_id_option 'gnulinux-simple-1234' {{
    linux /boot/vmlinuz-{NEWER} root=UUID=1234 ro quiet
}}
submenu 'Advanced options for Ubuntu' $menuentry_id_option 'gnulinux-advanced-1234' {{
    menuentry 'Ubuntu, with Linux {NEWER}' $menuentry_id_option 'gnulinux-{NEWER}-advanced-1234' {{
        linux /boot/vmlinuz-{NEWER} root=UUID=1234 ro quiet
    }}
    menuentry 'Ubuntu, with Linux {NEWER} (recovery mode)' $menuentry_id_option 'gnulinux-{NEWER}-rec-1' {{
        linux /boot/vmlinuz-{NEWER} root=UUID=1234 ro recovery nomodeset
    }}
    menuentry 'Ubuntu, with Linux {KERNEL_64K}' $menuentry_id_option 'gnulinux-{KERNEL_64K}-advanced-1234' {{
        linux /boot/vmlinuz-{KERNEL_64K} root=UUID=1234 ro quiet
    }}
}}
"""


def put(root: Path, path: str, text: str = "") -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def grubenv(**values: str) -> str:
    """grubenv as grub-editenv writes it: a 1024-byte block padded with '#'."""
    body = "# GRUB Environment Block\n" + "".join(f"{k}={v}\n" for k, v in values.items())
    return body + "#" * (1024 - len(body))


def kernels(root: Path, *args: str) -> None:
    subprocess.run([sys.executable, str(KERNELS), *args, "--root", str(root)], check=True)


# ---- which kernel boots next -----------------------------------------------------------------------------
def test_grub_default_0_boots_the_first_entry_the_newest_kernel(tmp_path):
    put(tmp_path, "/boot/grub/grub.cfg", GRUB_CFG)
    put(tmp_path, "/etc/default/grub", "GRUB_DEFAULT=0\nGRUB_TIMEOUT=0\n")
    found = boot.next_kernel(str(tmp_path))
    assert found["release"] == NEWER and "GRUB_DEFAULT=0" in found["how"]


def test_a_grub_reboot_entry_wins_over_the_default(tmp_path):
    put(tmp_path, "/boot/grub/grub.cfg", GRUB_CFG)
    put(tmp_path, "/etc/default/grub", "GRUB_DEFAULT=0\n")
    # what `grub-reboot 'gnulinux-advanced-1234>gnulinux-<kernel>-advanced-1234'` leaves (the 64K trial boot)
    spec = f"gnulinux-advanced-1234>gnulinux-{KERNEL_64K}-advanced-1234"
    put(tmp_path, "/boot/grub/grubenv", grubenv(next_entry=spec))
    found = boot.next_kernel(str(tmp_path))
    assert found["release"] == KERNEL_64K and "next_entry" in found["how"]


def test_grub_default_saved_reads_saved_entry_and_grub_d_overrides_the_main_file(tmp_path):
    put(tmp_path, "/boot/grub/grub.cfg", GRUB_CFG)
    put(tmp_path, "/etc/default/grub", "GRUB_DEFAULT=0\n")
    put(tmp_path, "/etc/default/grub.d/99-pin.cfg", 'GRUB_DEFAULT="saved"\n')
    put(tmp_path, "/boot/grub/grubenv", grubenv(saved_entry="1>2"))  # by number: the submenu's third entry
    found = boot.next_kernel(str(tmp_path))
    assert found["release"] == KERNEL_64K and "saved_entry=1>2" in found["how"]


def test_without_grub_cfg_the_newest_installed_kernel_is_next(tmp_path):
    kernels(tmp_path, "install", KERNEL_64K)
    kernels(tmp_path, "install", NEWER, "--without-nvidia")
    found = boot.next_kernel(str(tmp_path))
    assert found["release"] == NEWER and found["kernels"] == [KERNEL_64K, NEWER]
    assert "not readable" in found["how"]


def test_the_nvidia_module_is_found_where_the_prebuilt_package_puts_it(tmp_path):
    kernels(tmp_path, "install", KERNEL_64K)
    assert boot.nvidia_modules(KERNEL_64K, str(tmp_path)) == [
        f"/lib/modules/{KERNEL_64K}/kernel/nvidia-580-open/nvidia.ko"
    ]
    put(tmp_path, f"/lib/modules/{NEWER}/updates/dkms/nvidia.ko.zst")  # DKMS, compressed
    assert boot.nvidia_modules(NEWER, str(tmp_path)) == [f"/lib/modules/{NEWER}/updates/dkms/nvidia.ko.zst"]
    put(tmp_path, "/lib/modules/9.9.9/kernel/nvidia-580-open/nvidia-uvm.ko")  # not the nvidia module
    assert boot.nvidia_modules("9.9.9", str(tmp_path)) == []


# ---- host_status: next kernel ----------------------------------------------------------------------------
def next_kernel_check(result: dict) -> dict:
    return next(c for c in result["checks"] if c["check"] == "next kernel")


def test_a_next_kernel_without_nvidia_module_is_off_and_names_the_package(tmp_path):
    root = spark_root(tmp_path, ready=True)
    kernels(root, "install", NEWER, "--without-nvidia")  # an apt upgrade that held the modules back
    c = next_kernel_check(status(tmp_path, root, KERNEL_64K, 65536))
    assert c["status"] == "off", c
    assert NEWER in c["value"] and f"no nvidia.ko under /lib/modules/{NEWER}" in c["value"]
    assert f"linux-modules-nvidia-580-open-{NEWER}" in c["fix"]
    kernels(root, "remove", NEWER)
    c = next_kernel_check(status(tmp_path, root, KERNEL_64K, 65536))
    assert c["status"] == "ok" and f"{KERNEL_64K}/kernel/nvidia-580-open/nvidia.ko" in c["value"], c


def test_a_node_without_kernels_says_next_kernel_n_a(tmp_path):
    root = tmp_path / "empty"
    put(root, "/etc/os-release", "ID=debian\nVERSION_ID=13\n")
    c = next_kernel_check(status(tmp_path, root, "6.1.0", 4096, container=True))
    assert c["status"] == "n/a" and "no kernel in /boot" in c["fix"]


# ---- host_status: the driver family, from the versions real nvidia-smi printed ---------------------------
def recorded_drivers() -> list[str]:
    """The driver versions in the real recordings: a GB10's table and the H200's --query-gpu CSV."""
    table = (FIXTURES / "gb10-public-reports/nvidia-smi.txt").read_text()
    csv = (FIXTURES / "h200-driver-580.159.04/query-csv.txt").read_text().splitlines()
    column = [h.strip() for h in csv[0].split(",")].index("driver_version")
    return [re.search(r"Driver Version:\s+(\S+)", table).group(1), csv[1].split(",")[column].strip()]


def driver_status(tmp_path: Path, version: str) -> dict:
    """host_status on a Spark whose nvidia module is not loaded: the driver comes from nvidia-smi's answer."""
    root = spark_root(tmp_path, ready=True)
    (root / "sys/module/nvidia/version").unlink()
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{version}'\n")
    smi.chmod(0o755)
    return run_module(
        ROOT / "plugins/modules/host_status.py",
        expect={**EXPECT, "driver_family": "580"},
        root=str(root),
        container=False,
        kernel_release=KERNEL_64K,
        page_size=65536,
        state_dir="/var/lib/sparkfleet",
        run_dir="/run/sparkfleet",
        nvidia_smi=str(smi),
        fwupdmgr=str(fake_fwupdmgr(tmp_path, FWUPD_READY)),
    )


def family(result: dict) -> dict:
    return next(c for c in result["checks"] if c["check"] == "NVIDIA driver family")


def test_the_recorded_580_drivers_are_of_the_580_family(tmp_path):
    versions = recorded_drivers()
    assert versions == ["580.126.09", "580.159.04"]
    for version in versions:
        result = driver_status(tmp_path, version)
        assert result["facts"]["driver"] == version
        assert family(result)["status"] == "ok", family(result)


def test_a_590_driver_warns_with_the_reason_and_another_family_is_off(tmp_path):
    result = driver_status(tmp_path, "590.44.01")
    c = family(result)
    assert c["status"] == "warn" and "deadlocks in CUDA-graph capture on GB10" in c["fix"]
    assert [w["check"] for w in result["warned"]] == ["NVIDIA driver family"]
    assert "590.44.01" in str(result.get("warnings")), result.get("warnings")  # an Ansible warning too
    assert "NVIDIA driver family" not in [o["check"] for o in result["off"]]
    other = family(driver_status(tmp_path, "575.64.05"))
    assert other["status"] == "off" and "the 575 family" in other["value"]


# ---- the simulator's driver-version switch ---------------------------------------------------------------
@pytest.fixture
def sim(tmp_path):
    state, procs = tmp_path / "nvidia-sim", tmp_path / "proc"
    state.mkdir()
    procs.mkdir()
    env = {**os.environ, "SPARKFLEET_NVIDIA_SIM_DIR": str(state), "SPARKFLEET_NVIDIA_SIM_PROC": str(procs)}

    def run(*args: str) -> str:
        return subprocess.run(
            [sys.executable, "-S", str(SIM), *args], env=env, capture_output=True, text=True, check=True
        ).stdout

    run.state = state
    return run


def test_the_simulator_reports_the_driver_its_switch_names(sim):
    ask = ("--query-gpu=driver_version", "--format=csv,noheader")
    assert sim(*ask).strip() == "580.159.04"  # the recording's driver
    (sim.state / "driver-version").write_text("580.126.09\n")  # the published GB10 table's
    assert sim(*ask).strip() == "580.126.09"
    assert "Driver Version: 580.126.09" in sim()
    assert re.search(r"Driver Version\s+: 580\.126\.09", sim("-q"))
    (sim.state / "driver-version").write_text("not a version\n")
    assert sim(*ask).strip() == "580.159.04"


# ---- the NCCL library a rank loaded: module engine_nccl over a real process's memory maps ---------------
REAL_LIB = Path(ctypes.util.find_library("z") or "libz.so.1")


def real_library() -> Path:
    """A real shared library of this machine (zlib), to be mapped under NCCL's names."""
    for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib64"):
        if (Path(d) / REAL_LIB.name).exists():
            return Path(d) / REAL_LIB.name
    pytest.skip(f"no {REAL_LIB} on this machine")


@pytest.fixture
def mapped(tmp_path):
    """Start a process that loads each given file with the dynamic loader; yield its pid."""
    procs = []

    def start(*paths: Path) -> int:
        code = "import ctypes, sys, time\nfor p in sys.argv[1:]: ctypes.CDLL(p)\nprint('up', flush=True)\n"
        code += "time.sleep(60)\n"
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *map(str, paths)], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout.readline().strip() == "up"
        procs.append(proc)
        return proc.pid

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_the_nccl_library_and_its_version_are_read_from_the_processes_memory_maps(tmp_path, mapped):
    lib = real_library()
    system = tmp_path / "usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9"  # DGX OS's libnccl2 names its version
    wheel = tmp_path / "site-packages/nvidia/nccl/lib/libnccl.so.2"  # pip's nvidia-nccl-cu13 does not
    (tmp_path / "site-packages/nvidia_nccl_cu13-2.28.9.dist-info").mkdir(parents=True)
    for target in (system, wheel):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, target)
    pid = mapped(system)
    assert engine_nccl.read("/proc", pid) == [
        {"path": str(system), "version": "2.28.9", "version_from": "file name", "pids": [pid]}
    ]
    found = engine_nccl.read("/proc", mapped(wheel))
    assert [(x["path"], x["version"], x["version_from"]) for x in found] == [
        (str(wheel), "2.28.9", "nvidia_nccl_cu13-2.28.9.dist-info")
    ]
    assert engine_nccl.summary(True, found) == f"NCCL 2.28.9 ({wheel})"
    # neither: the version string NCCL carries (appended here; a loader ignores bytes past the ELF's end)
    bare = tmp_path / "opt/nccl/libnccl.so.2"
    bare.parent.mkdir(parents=True)
    bare.write_bytes(lib.read_bytes() + b"\0NCCL version \0" + b"2.30.7+cuda13.0\0")
    found = engine_nccl.read("/proc", mapped(bare))
    assert [(x["version"], x["version_from"]) for x in found] == [("2.30.7", "embedded string")]


def test_a_process_without_nccl_reports_none_loaded(mapped):
    found = engine_nccl.read("/proc", mapped())
    assert found == [] and engine_nccl.summary(True, found).startswith("no NCCL loaded")


def test_status_names_each_ranks_nccl_and_an_image_or_library_that_differs():
    plan = {"head": "a", "hosts_by_rank": ["a", "b"], "ranks": {"a": 0, "b": 1}}
    lib = {"path": "/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9", "version": "2.28.9"}
    wheel = {
        "path": "/usr/local/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2",
        "version": "2.28.9",
    }

    def node(image: str, nccl: dict) -> dict:
        return {
            "container": {"running": True},
            "image": {"id": image},
            "nccl": {"running": True, "libraries": [nccl]},
        }

    same = engine_status.status_rows(
        {"a": node("sha256:" + "1" * 64, lib), "b": node("sha256:" + "1" * 64, lib)},
        plan,
        {"state": "ok"},
        "",
    )
    assert [r["nccl"] for r in same["rows"]] == [f"2.28.9 {lib['path']}"] * 2 and same["healthy"], same
    differ = engine_status.status_rows(
        {"a": node("sha256:" + "1" * 64, lib), "b": node("sha256:" + "2" * 64, wheel)},
        plan,
        {"state": "ok"},
        "",
    )
    notes = " ".join(differ["notes"])
    assert (
        not differ["healthy"]
        and "the engine image differs between nodes (a sha256:111111111111, b sha256:2222" in notes
    )
    assert "the ranks loaded different NCCL libraries" in notes and wheel["path"] in notes, notes

"""host_tuning's and earlyoom's modules, run as Ansible runs them (JSON in, JSON out: their main() in this
process, tests/unit/module_runner.py; for each module one run is the module file run as a process of its
own), against fake /proc, /sys and /boot trees; and the GRUB drop-in template, sourced by sh the way
update-grub sources it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import jinja2
import module_runner
import pytest
import yaml
from ansible.plugins.filter.core import FilterModule as AnsibleFilters
from ansible.plugins.test.core import TestModule as AnsibleTests
from ansible_collections.sparkfleet.cluster.plugins.module_utils import node as node_mod
from ansible_collections.sparkfleet.cluster.plugins.modules import grub_entry as grub_mod
from ansible_collections.sparkfleet.cluster.plugins.modules import host_status as status_mod

ROOT = Path(__file__).resolve().parents[2]
HOST = ROOT / "roles/host_tuning"
EARLYOOM = ROOT / "roles/earlyoom"


def run_module(
    module_path: Path, check: bool = False, env: dict | None = None, real: bool = False, **args: object
) -> dict:
    module_args = {"_ansible_check_mode": check, **args}
    return module_runner.run(module_path.stem, module_args, {**os.environ, **(env or {})}, real=real)


# ---- sparkfleet_sysctl ---------------------------------------------------------------------------------
@pytest.fixture
def proc_sys(tmp_path):
    root = tmp_path / "proc/sys"
    (root / "vm").mkdir(parents=True)
    (root / "vm/swappiness").write_text("60\n")
    (root / "vm/min_free_kbytes").write_text("67584\n")
    (root / "vm/watermark_boost_factor").write_text("15000\n")
    (root / "net/ipv4").mkdir(parents=True)
    (root / "net/ipv4/tcp_rmem").write_text("4096\t131072\t6291456\n")
    return root


def sysctl(proc_sys, check=False, **args):
    return run_module(ROOT / "plugins/modules/sysctl.py", check=check, proc_sys=str(proc_sys), **args)


WANTED = {"vm.swappiness": 10, "vm.min_free_kbytes": 1048576, "vm.watermark_boost_factor": 0}


def test_sysctl_sets_what_differs_then_reports_no_change(tmp_path, proc_sys):
    dry = sysctl(proc_sys, check=True, settings=WANTED)
    assert dry["changed"] is True and (proc_sys / "vm/swappiness").read_text() == "60\n"
    result = sysctl(proc_sys, settings=WANTED, real=True)  # the module file run as a process of its own
    assert result["changed"] is True
    assert {k["key"]: k["state"] for k in result["keys"]} == dict.fromkeys(WANTED, "set")
    assert (proc_sys / "vm/min_free_kbytes").read_text() == "1048576\n"
    assert sysctl(proc_sys, settings=WANTED)["changed"] is False
    # multi-value keys compare by their words, whatever the whitespace
    assert sysctl(proc_sys, settings={"net.ipv4.tcp_rmem": "4096 131072  6291456"})["changed"] is False


def test_sysctl_in_a_container_validates_and_skips(tmp_path, proc_sys):
    result = sysctl(proc_sys, settings=WANTED, apply=False)
    assert result["changed"] is False
    assert sorted(result["not_applied"]) == sorted(WANTED)
    assert (proc_sys / "vm/swappiness").read_text() == "60\n"


def test_sysctl_unknown_key_fails_naming_it(tmp_path, proc_sys):
    result = sysctl(proc_sys, settings={**WANTED, "vm.swapiness": 10})
    assert result["failed"] is True and "vm.swapiness" in result["msg"]


# ---- sparkfleet_swapfile ---------------------------------------------------------------------------------
def swapfile(tmp_path, check=False, **args):
    proc_swaps = tmp_path / "swaps"
    if not proc_swaps.exists():
        proc_swaps.write_text("Filename\tType\tSize\tUsed\tPriority\n")
    return run_module(ROOT / "plugins/modules/swapfile.py", check=check, proc_swaps=str(proc_swaps), **args)


needs_mkswap = pytest.mark.skipif(shutil.which("mkswap") is None, reason="mkswap (util-linux) not installed")


@needs_mkswap
def test_swapfile_is_made_for_the_page_size_and_remade_for_another(tmp_path):
    path = tmp_path / "swap.sparkfleet"
    args = {"path": str(path), "size_mib": 4, "activate": False}
    assert swapfile(tmp_path, check=True, page_size=4096, **args)["changed"] is True
    assert not path.exists()
    made = swapfile(tmp_path, page_size=4096, real=True, **args)  # the module file run as a process
    assert made["changed"] and made["created"] and made["reasons"] == [f"{path} does not exist"]
    assert "host's kernel" in made["activation_skipped"]
    assert path.stat().st_size == 4 << 20 and (path.stat().st_mode & 0o777) == 0o600
    assert path.read_bytes()[4096 - 10 : 4096] == b"SWAPSPACE2"
    assert swapfile(tmp_path, page_size=4096, **args)["changed"] is False
    # booted into a 64K-page kernel: the 4K signature is unusable, the file is made again
    again = swapfile(tmp_path, page_size=65536, **args)
    assert again["created"] and "no swap signature for 65536-byte pages" in again["reasons"][0]
    assert path.read_bytes()[65536 - 10 : 65536] == b"SWAPSPACE2"
    # resized when the wanted size changes
    bigger = swapfile(tmp_path, page_size=65536, **{**args, "size_mib": 8})
    assert bigger["created"] and path.stat().st_size == 8 << 20


@needs_mkswap
def test_swapfile_mode_is_fixed(tmp_path):
    path = tmp_path / "swap.sparkfleet"
    swapfile(tmp_path, page_size=4096, path=str(path), size_mib=1, activate=False)
    path.chmod(0o644)
    result = swapfile(tmp_path, page_size=4096, path=str(path), size_mib=1, activate=False)
    assert result["changed"] and result["mode_fixed"] and not result["created"]
    assert (path.stat().st_mode & 0o777) == 0o600


def test_swapfile_active_is_read_from_proc_swaps(tmp_path):
    path = tmp_path / "swap.sparkfleet"
    (tmp_path / "swaps").write_text(f"Filename\tType\tSize\tUsed\tPriority\n{path} file 1024 0 -2\n")
    from ansible_collections.sparkfleet.cluster.plugins.modules.swapfile import is_active

    assert is_active(str(tmp_path / "swaps"), str(path))
    assert not is_active(str(tmp_path / "swaps"), str(tmp_path / "other"))


# ---- sparkfleet_grub_entry -------------------------------------------------------------------------------
GRUB_CFG = """\
function load_video {
  insmod all_video
}
menuentry 'Ubuntu' --class ubuntu $menuentry_id_option 'gnulinux-simple-1234' {
    linux /boot/vmlinuz-6.11.0-1016-nvidia root=UUID=1234 ro quiet splash
}
submenu 'Advanced options' $menuentry_id_option 'gnulinux-advanced-1234' {
    menuentry 'Linux 64k' $menuentry_id_option 'gnulinux-6.11.0-1016-nvidia-64k-advanced-1234' {
        if [ x$feature_all_video_module = xy ]; then
          insmod all_video
        fi
        linux /boot/vmlinuz-6.11.0-1016-nvidia-64k root=UUID=1234 ro quiet splash
    }
    menuentry 'Linux 64k (recovery)' $menuentry_id_option 'gnulinux-6.11.0-1016-nvidia-64k-recovery-1234' {
        linux /boot/vmlinuz-6.11.0-1016-nvidia-64k root=UUID=1234 ro recovery nomodeset
    }
    menuentry 'Linux' $menuentry_id_option 'gnulinux-6.11.0-1016-nvidia-advanced-1234' {
        linux /boot/vmlinuz-6.11.0-1016-nvidia root=UUID=1234 ro quiet splash
    }
}
"""


def test_grub_entry_of_the_64k_kernel_is_the_submenu_path():
    found = grub_mod.entries(GRUB_CFG)
    assert (
        found["6.11.0-1016-nvidia-64k"]
        == "gnulinux-advanced-1234>gnulinux-6.11.0-1016-nvidia-64k-advanced-1234"
    )
    # the top-level simple entry boots it too, but that one boots whichever kernel sorts newest: a pin to it
    # would follow the next kernel update; the submenu entry names the release
    assert found["6.11.0-1016-nvidia"] == "gnulinux-advanced-1234>gnulinux-6.11.0-1016-nvidia-advanced-1234"


def test_grub_entry_of_the_newest_kernel_is_its_own_entry_not_the_simple_one():
    # the wanted kernel sorts newest: update-grub's first entry boots it (as on the arm64 VM, whose 16K kernel
    # sorts after the stock one), and the pin must still be the release's own entry
    newest = GRUB_CFG.replace("vmlinuz-6.11.0-1016-nvidia root", "vmlinuz-6.11.0-1016-nvidia-64k root", 1)
    assert grub_mod.entries(newest)["6.11.0-1016-nvidia-64k"] == (
        "gnulinux-advanced-1234>gnulinux-6.11.0-1016-nvidia-64k-advanced-1234"
    )
    # a flat menu (GRUB_DISABLE_SUBMENU=y puts every entry at the top level), then a menu of one entry
    flat = """menuentry 'Debian' $menuentry_id_option 'gnulinux-simple-9' {
    linux /boot/vmlinuz-6.12.48+deb13-amd64 root=UUID=9 ro
}
menuentry 'Debian, Linux 6.12.48' $menuentry_id_option 'gnulinux-6.12.48+deb13-amd64-advanced-9' {
    linux /boot/vmlinuz-6.12.48+deb13-amd64 root=UUID=9 ro
}
"""
    assert grub_mod.entries(flat)["6.12.48+deb13-amd64"] == "gnulinux-6.12.48+deb13-amd64-advanced-9"
    only = flat.split("menuentry 'Debian, Linux", maxsplit=1)[0]
    assert grub_mod.entries(only)["6.12.48+deb13-amd64"] == "gnulinux-simple-9"  # the one there is


def test_grub_entry_missing_kernel_fails_listing_what_is_there(tmp_path):
    cfg = tmp_path / "grub.cfg"
    cfg.write_text(GRUB_CFG)
    ok = run_module(  # the module file run as a process of its own
        ROOT / "plugins/modules/grub_entry.py", real=True, release="6.11.0-1016-nvidia-64k", grub_cfg=str(cfg)
    )
    assert ok["entry"].endswith(">gnulinux-6.11.0-1016-nvidia-64k-advanced-1234")
    bad = run_module(ROOT / "plugins/modules/grub_entry.py", release="7.0.0-1-nvidia-64k", grub_cfg=str(cfg))
    assert bad["failed"] and "update-grub" in bad["msg"] and "6.11.0-1016-nvidia-64k" in bad["msg"]


def test_grub_entry_reads_the_pending_one_time_entry_and_the_kernel_it_boots(tmp_path):
    """grub_entry says which kernel a pending next_entry boots (host_tuning clears its trial's stuck one)."""
    module = ROOT / "plugins/modules/grub_entry.py"
    cfg = tmp_path / "grub.cfg"
    cfg.write_text(GRUB_CFG)
    none = run_module(module, real=True, release="6.11.0-1016-nvidia-64k", grub_cfg=str(cfg))
    assert (none["next_entry"], none["next_entry_release"]) == ("", "")  # no grubenv yet: nothing pending
    env = tmp_path / "grubenv"
    trial = "gnulinux-advanced-1234>gnulinux-6.11.0-1016-nvidia-64k-advanced-1234"
    for pending, boots in ((trial, "6.11.0-1016-nvidia-64k"), ("gnulinux-simple-1234", "6.11.0-1016-nvidia"),
                           ("1>2", "6.11.0-1016-nvidia"), ("no-such-entry", "")):  # fmt: skip
        # the layout grub-editenv writes: a 1024-byte block padded with '#'
        block = f"# GRUB Environment Block\nsaved_entry=0\nnext_entry={pending}\n"
        env.write_text(block + "#" * (1024 - len(block)))
        got = run_module(module, real=True, release="6.11.0-1016-nvidia-64k", grub_cfg=str(cfg))
        assert (got["next_entry"], got["next_entry_release"]) == (pending, boots)
    other = tmp_path / "elsewhere"
    other.write_text("# GRUB Environment Block\n" + "#" * 1000)
    got = run_module(module, release="6.11.0-1016-nvidia-64k", grub_cfg=str(cfg), grubenv=str(other))
    assert got["next_entry"] == ""  # the grubenv option, not the one beside grub.cfg
    assert got["grubenv"] == str(other) and none["grubenv"] == str(env)  # what the role gives grub-editenv


# ---- sparkfleet_host_status ------------------------------------------------------------------------------
# A prepared TP3 Spark as the public three-Spark receipts have it (christopherowen/spark-ds41f): the 64K
# kernel 7.0.0-1019-nvidia-64k with driver 580.178.04, the memory saver on, its firmware identities.
KERNEL_64K = "7.0.0-1019-nvidia-64k"
DRIVER = "580.178.04"
EXPECT = {
    "os": {"ubuntu": "24.04"},
    "kernel_min": "6.11",
    "page_size": 65536,
    "driver_min": "580.95.05",
    "firmware_min": {
        "bios": "5.36_0ACUM027",
        "soc": "0x02009b0b",
        "ec": "0x03000508",
        "pd": "0x00000516",
        "connectx7": "28.45.4028",
    },
    "memory_saver": True,
    "memory_saver_pairs": [{"kernel": KERNEL_64K, "driver": DRIVER}],
    "kernel_pairs": [{"kernel": KERNEL_64K, "driver": DRIVER}],
    "thp": "never",
    "swap_min_mib": 16384,
    "swapfile": "/swap.sparkfleet",
    "sysctl": {"vm.swappiness": 10},
    "gpu_cap_mhz": 2300,
    "cpu_cap_mhz": 0,
    "cmdline_add": ["kho=off"],
    "cmdline_remove": ["splash"],
    "kernel_release": KERNEL_64K,
    "ready_checks": ["page size", "memory saver", "firmware", "kernel pair"],
}
# What `fwupdmgr get-devices --json` lists for a Spark's board firmware (fwupd's hex version form)
FWUPD_READY = {
    "Devices": [
        {"Name": "Embedded Controller", "Version": "0x03000508", "Plugin": "uefi_capsule"},
        {"Name": "UEFI Device Firmware", "Version": "0x02009b0b", "Plugin": "uefi_capsule"},
        {"Name": "USB Power Delivery Controller", "Version": "0x00000516", "Plugin": "uefi_capsule"},
        {"Name": "NVMe SSD", "Version": "1.0"},
    ]
}
FWUPD_OLD = {
    "Devices": [
        {"Name": "Embedded Controller", "Version": "0x03000302"},
        {"Name": "UEFI Device Firmware", "Version": "0x0200980f"},
        {"Name": "USB Power Delivery Controller", "Version": "0x00000507"},
    ]
}


def fake_fwupdmgr(tmp: Path, devices: dict | None) -> Path:
    """An fwupdmgr that prints `devices` for `get-devices --json` (None: the daemon does not answer)."""
    path = tmp / "fwupdmgr"
    if devices is None:
        path.write_text("#!/bin/sh\necho 'Failed to connect to daemon' >&2\nexit 1\n")
    else:
        path.write_text(f"#!/bin/sh\ncat <<'JSON'\n{json.dumps(devices)}\nJSON\n")
    path.chmod(0o755)
    return path


def spark_root(tmp: Path, ready: bool) -> Path:
    """A DGX Spark's files: ready = prepared as the TP3 recipe wants it."""
    root = tmp / "root"

    def put(path: str, text: str) -> None:
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    put("/etc/os-release", 'PRETTY_NAME="Ubuntu 24.04.3 LTS"\nID=ubuntu\nVERSION_ID="24.04"\n')
    put("/proc/cmdline", "BOOT_IMAGE=/boot/vmlinuz ro quiet " + ("kho=off" if ready else "splash") + "\n")
    put("/sys/module/nvidia/version", (DRIVER if ready else "580.95.05") + "\n")
    put("/sys/class/dmi/id/bios_version", ("5.36_0ACUM027" if ready else "5.36_0ACUM023") + "\n")
    for hca in ("rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1"):
        put(f"/sys/class/infiniband/{hca}/fw_ver", ("28.45.4028" if ready else "28.39.2048") + "\n")
    put("/sys/module/nvidia_uvm/parameters/uvm_pack_sysmem_leaf_tables", "Y\n" if ready else "N\n")
    put(
        "/sys/kernel/mm/transparent_hugepage/enabled",
        "always madvise [never]\n" if ready else "always [madvise] never\n",
    )
    swaps = "Filename\tType\tSize\tUsed\tPriority\n"
    if ready:
        swaps += "/swap.sparkfleet file 16777152 0 -2\n"
    put("/proc/swaps", swaps)
    put("/proc/sys/vm/swappiness", "10\n" if ready else "0\n")
    put("/var/lib/sparkfleet/clocks/gpu.conf", "# x\nGPU_CLOCK_CAP_MHZ=2300\n")
    # The installed kernel and its NVIDIA modules where linux-modules-nvidia-580-open-<kernel> puts them (a
    # published `modinfo nvidia` of a Spark:
    # /lib/modules/6.17.0-1014-nvidia/kernel/nvidia-580-open/nvidia.ko).
    put(f"/boot/vmlinuz-{KERNEL_64K}", "")
    for ko in ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm", "nvidia-peermem"):
        put(f"/lib/modules/{KERNEL_64K}/kernel/nvidia-580-open/{ko}.ko", "")
    if ready:
        put("/run/sparkfleet/clocks/gpu.applied", "2300\n")
        put("/run/sparkfleet/clocks/gpu.verify", "MIN=0\nCAP=2300\nRESULT=held\nSM_MHZ=2288\n")
    else:
        put("/run/reboot-required", "*** System restart required ***\n")
        put("/run/reboot-required.pkgs", f"linux-image-{KERNEL_64K}\n")
    return root


def status(tmp_path, root, kernel, page_size, *, container=False, expect=None, fwupd=FWUPD_READY, **args):
    return run_module(
        ROOT / "plugins/modules/host_status.py",
        expect=expect or EXPECT,
        root=str(root),
        container=container,
        kernel_release=kernel,
        page_size=page_size,
        state_dir="/var/lib/sparkfleet",  # under root
        run_dir="/run/sparkfleet",
        nvidia_smi=str(tmp_path / "no-nvidia-smi"),
        fwupdmgr=str(fake_fwupdmgr(tmp_path, fwupd)),
        **args,
    )


def test_status_of_a_prepared_spark_is_all_ok_and_ready(tmp_path):
    """The module file run as a process of its own, as Ansible runs it."""
    result = status(tmp_path, spark_root(tmp_path, ready=True), KERNEL_64K, 65536, real=True)
    assert result["changed"] is False
    assert [c["check"] for c in result["off"]] == []
    assert [c["check"] for c in result["checks"]] == [
        "OS release",
        "kernel",
        "page size",
        "kernel command line",
        "NVIDIA driver",
        "kernel pair",
        "next kernel",
        "BIOS firmware",
        "SoC firmware",
        "EC firmware",
        "PD firmware",
        "ConnectX-7 firmware",
        "memory saver",
        "THP",
        "swap",
        "sysctl",
        "GPU clock cap",
        "CPU clock cap",
    ]
    assert result["reboot_reasons"] == []
    assert result["facts"]["cx7_firmware"]["rocep1s0f0"] == "28.45.4028"
    assert result["facts"]["firmware"] == {
        "bios": "5.36_0ACUM027",
        "ec": "0x03000508",
        "soc": "0x02009b0b",
        "pd": "0x00000516",
    }
    assert all(line.startswith(" ok  ") for line in result["report"])
    assert [r["item"] for r in result["readiness"] if r["ready"]] == EXPECT["ready_checks"]
    assert result["not_ready"] == []
    assert result["readiness_report"][0] == "ready      page size"


def test_status_of_a_fresh_spark_says_what_is_off_and_how_to_fix_it(tmp_path):
    result = status(tmp_path, spark_root(tmp_path, ready=False), "6.11.0-1016-nvidia", 4096, fwupd=FWUPD_OLD)
    off = {c["check"]: c for c in result["off"]}
    assert set(off) == {
        "page size",
        "kernel command line",
        "kernel pair",
        "BIOS firmware",
        "SoC firmware",
        "EC firmware",
        "PD firmware",
        "ConnectX-7 firmware",
        "memory saver",
        "THP",
        "swap",
        "sysctl",
        "GPU clock cap",
    }
    assert "host_tuning_kernel_profile: 64k" in off["page size"]["fix"]
    assert "fwupdmgr" in off["ConnectX-7 firmware"]["fix"]
    assert off["kernel command line"]["value"] == "splash"
    assert off["EC firmware"]["value"] == "0x03000302" and off["EC firmware"]["expected"] == ">= 0x03000508"
    assert "applied since boot nothing" in off["GPU clock cap"]["value"]
    assert "sparkfleet clocks set 2300" in off["GPU clock cap"]["fix"]
    assert "is not a validated pair" in off["memory saver"]["value"]
    reasons = result["reboot_reasons"]
    assert any("kho=off missing" in r and "splash still present" in r for r in reasons)
    assert any(f"64K kernel {KERNEL_64K}" in r for r in reasons)
    assert any(f"linux-image-{KERNEL_64K} asked for a reboot" in r for r in reasons)
    assert any(line.startswith("off  memory saver: off") for line in result["report"])
    # the readiness table: every item not ready, one line per missing check
    assert [r["item"] for r in result["readiness"] if not r["ready"]] == EXPECT["ready_checks"]
    lines = result["not_ready"]
    assert lines[0].startswith("page size: page size off: 4096 (expected 65536)")
    assert sum(line.startswith("firmware: ") for line in lines) == 5  # BIOS, SoC, EC, PD, ConnectX-7
    assert sum(line.startswith("memory saver: ") for line in lines) == 2  # the module parameter and swap
    assert any(
        line.startswith("kernel pair: kernel pair off: 6.11.0-1016-nvidia + driver 580.95.05")
        for line in lines
    )


def test_page_size_and_module_parameter_each_decide_readiness(tmp_path):
    root = spark_root(tmp_path, ready=True)
    on_4k = status(tmp_path, root, KERNEL_64K, 4096)  # a 64K kernel's name, 4 KiB pages: not ready
    assert [r["item"] for r in on_4k["readiness"] if not r["ready"]] == ["page size"]
    (root / "sys/module/nvidia_uvm/parameters/uvm_pack_sysmem_leaf_tables").write_text("N\n")
    packing_off = status(tmp_path, root, KERNEL_64K, 65536)
    assert [r["item"] for r in packing_off["readiness"] if not r["ready"]] == ["memory saver"]
    assert "uvm_pack_sysmem_leaf_tables=N" in packing_off["not_ready"][0]
    (root / "sys/module/nvidia_uvm/parameters/uvm_pack_sysmem_leaf_tables").unlink()  # a stock nvidia-uvm
    stock = status(tmp_path, root, KERNEL_64K, 65536)
    assert "stock module" in stock["not_ready"][0]
    not_required = status(tmp_path, root, KERNEL_64K, 65536, expect={**EXPECT, "memory_saver": False})
    assert not_required["not_ready"] == []
    assert "ready      memory saver (not required)" in not_required["readiness_report"]


def test_kernel_pairs_are_exact(tmp_path):
    root = spark_root(tmp_path, ready=True)
    (root / "sys/module/nvidia/version").write_text("580.173.02\n")  # a newer/older driver on the same kernel
    result = status(tmp_path, root, KERNEL_64K, 65536)
    off = {c["check"] for c in result["off"]}
    assert off == {"kernel pair", "memory saver"}  # the memory saver is validated on one pair only
    paired = {**EXPECT, "kernel_pairs": [{"kernel": KERNEL_64K, "driver": "580.173.02"}]}
    assert "kernel pair" not in {
        c["check"] for c in status(tmp_path, root, KERNEL_64K, 65536, expect=paired)["off"]
    }


def test_firmware_that_cannot_be_read_or_compared_is_not_ready(tmp_path):
    root = spark_root(tmp_path, ready=True)
    silent = status(tmp_path, root, KERNEL_64K, 65536, fwupd=None)
    soc = next(c for c in silent["checks"] if c["check"] == "SoC firmware")
    assert soc["status"] == "off" and "not readable" in soc["value"] and "Failed to connect" in soc["value"]
    (root / "sys/class/dmi/id/bios_version").write_text("GX10DGX.0102.2025.1111.1531\n")  # an OEM board
    oem = status(tmp_path, root, KERNEL_64K, 65536)
    bios = next(c for c in oem["checks"] if c["check"] == "BIOS firmware")
    assert bios["status"] == "off" and "another format" in bios["fix"]
    nothing = status(tmp_path, root, KERNEL_64K, 65536, expect={**EXPECT, "firmware_min": {}})
    assert nothing["not_ready"] == [
        "firmware: no minimums in host_tuning_firmware_min: nothing says this node is ready"
    ]


def test_firmware_strings_compare_as_versions():
    ok = status_mod.firmware_at_least
    assert (
        ok("0x03000508", "0x03000508")
        and ok("0x03000601", "0x03000508")
        and not ok("0x03000302", "0x03000508")
    )
    assert ok("3.5.8", "0x03000508") and not ok("2.155.10", "0x02009b0b")  # dotted (DMI) against fwupd's hex
    assert ok("0x00000516", "0.5.22") and not ok("0x00000507", "0.5.22")
    assert (
        ok("28.45.4028", "28.45.4028") and not ok("28.45.1020", "28.45.4028") and ok("28.46.0", "28.45.4028")
    )
    assert ok("5.36_0ACUM027", "5.36_0ACUM027") and not ok("5.36_0ACUM023", "5.36_0ACUM027")
    assert ok("GX10DGX.0102.2025.1111.1531", "5.36_0ACUM027") is None  # another vendor's format
    assert ok(None, "1.0") is False


def test_a_cap_that_did_not_take_is_a_clock_finding(tmp_path):
    root = spark_root(tmp_path, ready=True)
    (root / "run/sparkfleet/clocks/gpu.verify").write_text("MIN=0\nCAP=2300\nRESULT=not-taken\nSM_MHZ=2418\n")
    result = status(tmp_path, root, KERNEL_64K, 65536)
    cap = next(c for c in result["checks"] if c["check"] == "GPU clock cap")
    assert cap["status"] == "off" and "NOT TAKEN (SM clock 2418 MHz" in cap["value"]


def test_status_in_a_container_marks_host_bound_checks_not_applicable(tmp_path):
    root = spark_root(tmp_path, ready=False)
    swapfile = root / "swap.sparkfleet"
    swapfile.write_bytes(bytes(4086) + b"SWAPSPACE2" + bytes(4096))
    result = status(tmp_path, root, "6.18.44", 4096, container=True, fwupd=None)
    by_check = {c["check"]: c for c in result["checks"]}
    assert by_check["sysctl"]["status"] == "n/a" and by_check["kernel command line"]["status"] == "n/a"
    assert by_check["EC firmware"]["status"] == "n/a" and by_check["memory saver"]["status"] == "n/a"
    assert "not switched on in a container" in by_check["swap"]["value"]
    assert [c["check"] for c in result["off"]] == ["GPU clock cap"]  # not hardware: a real finding
    # a container boots no kernel: only /run/reboot-required can ask for its restart
    assert result["reboot_reasons"] == [f"/run/reboot-required: linux-image-{KERNEL_64K} asked for a reboot"]
    # what cannot be verified is not ready
    assert all(not r["ready"] for r in result["readiness"])
    assert any("EC firmware cannot be verified here" in line for line in result["not_ready"])


def test_the_labs_rdma_stand_in_is_the_nodes_own_connectx7(tmp_path):
    root = spark_root(tmp_path, ready=False)
    for hca in ("rocep1s0f1", "roceP2p1s0f1"):
        target = root / "run/sparkfleet-lab/sysfs/class/infiniband" / hca / "fw_ver"
        target.parent.mkdir(parents=True)
        target.write_text("28.45.4028\n")
    result = status(
        tmp_path, root, "6.18.44", 4096, container=True, sysfs_root="/run/sparkfleet-lab/sysfs", fwupd=None
    )
    cx7 = next(c for c in result["checks"] if c["check"] == "ConnectX-7 firmware")
    assert cx7["status"] == "ok" and cx7["value"] == "roceP2p1s0f1 28.45.4028, rocep1s0f1 28.45.4028"
    low = status(
        tmp_path,
        root,
        "6.18.44",
        4096,
        container=True,
        sysfs_root="/run/sparkfleet-lab/sysfs",
        fwupd=None,
        expect={**EXPECT, "firmware_min": {"connectx7": "28.46.0"}},
    )
    cx7 = next(c for c in low["checks"] if c["check"] == "ConnectX-7 firmware")
    assert cx7["status"] == "off"  # the stand-in's value is checked, never waved through as n/a


def test_kernel_config_and_board_firmware_parsers():
    text = "CONFIG_ARM64_64K_PAGES=y\n# CONFIG_ARM64_4K_PAGES is not set\nCONFIG_KEXEC_HANDOVER=y\n"
    text += "CONFIG_KEXEC_HANDOVER_ENABLE_DEFAULT=y\nCONFIG_CMA_SIZE_MBYTES=0\n"
    assert node_mod.parse_kernel_config(text) == {
        "CONFIG_ARM64_64K_PAGES": "y",
        "CONFIG_KEXEC_HANDOVER": "y",
        "CONFIG_KEXEC_HANDOVER_ENABLE_DEFAULT": "y",
    }
    assert node_mod.parse_kernel_config(None) is None
    assert node_mod.parse_fwupd_devices(json.dumps(FWUPD_READY)) == {
        "ec": "0x03000508",
        "soc": "0x02009b0b",
        "pd": "0x00000516",
    }
    assert node_mod.parse_fwupd_devices("not json") == {}


def test_version_compare():
    assert status_mod.at_least("580.159.04", "580.95.05")
    assert not status_mod.at_least("575.57.08", "580.95.05")
    assert status_mod.at_least("28.45.1020", "28.45.1020")
    assert not status_mod.at_least(None, "1")


# ---- the GRUB drop-in, sourced like update-grub sources it -------------------------------------------
def render(template: Path, **values: object) -> str:
    env = jinja2.Environment(  # noqa: S701 - Ansible's template module: shell text, no autoescape
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True
    )
    # Ansible's own filters and tests (quote, bool, regex_replace, ...); Jinja's built-ins stay
    for name, fn in AnsibleFilters().filters().items():
        env.filters.setdefault(name, fn)
    for name, fn in AnsibleTests().tests().items():
        env.tests.setdefault(name, fn)
    return env.from_string(template.read_text()).render(**values)


def grub_values(**overrides: object) -> dict:
    defaults = yaml.safe_load((HOST / "defaults/main.yml").read_text())
    return {**defaults, "__host_tuning_kernel_args_add": ["kho=off"], **overrides}


def source(tmp_path: Path, base: str, dropin: str, times: int = 1) -> tuple[str, str, str]:
    (tmp_path / "grub").write_text(base)
    (tmp_path / "99-sparkfleet.cfg").write_text(dropin)
    script = '. "$1"; ' + 'i=0; while [ $i -lt "$3" ]; do . "$2"; i=$((i+1)); done; '
    script += 'printf "%s\\n%s\\n%s" "$GRUB_CMDLINE_LINUX_DEFAULT" "$GRUB_CMDLINE_LINUX" "${GRUB_DEFAULT:-}"'
    out = subprocess.run(
        ["sh", "-c", script, "sh", str(tmp_path / "grub"), str(tmp_path / "99-sparkfleet.cfg"), str(times)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    default, linux, grub_default = out.split("\n")
    return default, linux, grub_default


BASE = 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\nGRUB_CMDLINE_LINUX="console=tty0 kho=on"\n'


def test_grub_dropin_removes_splash_adds_kho_off_and_keeps_the_rest(tmp_path):
    dropin = render(HOST / "templates/grub.cfg.j2", **grub_values())
    subprocess.run(["sh", "-n", "-c", dropin], check=True)
    default, linux, grub_default = source(tmp_path, BASE, dropin)
    assert default == "quiet"
    assert linux == "console=tty0 kho=off"
    assert grub_default == "0"
    assert source(tmp_path, BASE, dropin, times=2)[:2] == (default, linux)  # sourcing twice changes nothing


def test_grub_dropin_without_additions_and_with_a_pinned_64k_kernel(tmp_path):
    entry = "gnulinux-advanced-1234>gnulinux-6.11.0-1016-nvidia-64k-advanced-1234"
    dropin = render(
        HOST / "templates/grub.cfg.j2",
        **grub_values(__host_tuning_kernel_args_add=[], __host_tuning_grub_default=entry),
    )
    default, linux, grub_default = source(tmp_path, 'GRUB_CMDLINE_LINUX_DEFAULT="splash"\n', dropin)
    assert (default, linux, grub_default) == ("", "", entry)


def test_grub_dropin_does_not_expand_globs(tmp_path):
    dropin = render(HOST / "templates/grub.cfg.j2", **grub_values())
    (tmp_path / "quiet-file").write_text("")
    default, _linux, _ = source(tmp_path, 'GRUB_CMDLINE_LINUX_DEFAULT="quiet* splash"\n', dropin)
    assert default == "quiet*"


def test_sysctl_dropin_lists_every_value():
    values = {"host_tuning_sysctl": {"vm.swappiness": 10, "vm.min_free_kbytes": 1048576}}
    text = render(HOST / "templates/sysctl.conf.j2", **values)
    assert text.splitlines()[-2:] == ["vm.min_free_kbytes = 1048576", "vm.swappiness = 10"]


# ---- earlyoom: sparkfleet_oom_score_adj and the config ---------------------------------------------------
def fake_systemctl(tmp_path: Path, units: dict[str, tuple[str, int]]) -> Path:
    lines = ['case "$5" in']
    for name, (load, pid) in units.items():
        lines.append(f'  {name}) printf "Id={name}\\nLoadState={load}\\nMainPID={pid}\\n";;')
    lines.append('  *) printf "Id=$5\\nLoadState=not-found\\nMainPID=0\\n";;')
    lines.append("esac")
    path = tmp_path / "systemctl"
    path.write_text("#!/bin/sh\n" + "\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


def fake_proc(tmp_path: Path, pids: dict[int, int], cap_sys_resource: bool) -> Path:
    proc = tmp_path / "proc"
    for pid, score in pids.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "oom_score_adj").write_text(f"{score}\n")
    (proc / "self").mkdir(parents=True)
    cap = (1 << 24) if cap_sys_resource else 0
    (proc / "self/status").write_text(f"Name:\tpython3\nCapEff:\t{cap | 0x3FF:016x}\n")
    return proc


def oom(proc, systemctl, check=False, real=False):
    return run_module(
        ROOT / "plugins/modules/oom_score_adj.py",
        check=check,
        real=real,
        units=["ssh.service", "docker.service", "containerd.service", "gone.service"],
        value=-900,
        proc_root=str(proc),
        systemctl=str(systemctl),
    )


def test_oom_score_is_set_on_running_services_once(tmp_path):
    systemctl = fake_systemctl(
        tmp_path,
        {
            "ssh.service": ("loaded", 101),
            "docker.service": ("loaded", 202),
            "containerd.service": ("loaded", 0),
        },
    )
    proc = fake_proc(tmp_path, {101: 0, 202: -500}, cap_sys_resource=True)
    dry = oom(proc, systemctl, check=True)
    assert dry["changed"] and (proc / "101/oom_score_adj").read_text() == "0\n"
    result = oom(proc, systemctl, real=True)  # the module file run as a process of its own
    states = {u["id"]: u["state"] for u in result["units"]}
    assert states == {
        "ssh.service": "set",
        "docker.service": "set",
        "containerd.service": "stopped",
        "gone.service": "absent",
    }
    assert (proc / "202/oom_score_adj").read_text() == "-900\n"
    assert oom(proc, systemctl)["changed"] is False


def test_oom_score_already_lower_is_kept_never_raised(tmp_path):
    """sshd sets its own oom_score_adj to -1000 on Linux after systemd applied the drop-in's -900 (the VM
    lab's real kernel): the module keeps it, in check mode and in a real run."""
    systemctl = fake_systemctl(tmp_path, {"ssh.service": ("loaded", 101), "docker.service": ("loaded", 202)})
    proc = fake_proc(tmp_path, {101: -1000, 202: -900}, cap_sys_resource=True)
    for check in (True, False):
        result = oom(proc, systemctl, check=check)
        assert result["changed"] is False, result
        assert {u["id"]: u["state"] for u in result["units"]}["ssh.service"] == "ok"
    assert (proc / "101/oom_score_adj").read_text() == "-1000\n"


def test_oom_score_without_cap_sys_resource_is_reported_not_claimed(tmp_path):
    systemctl = fake_systemctl(tmp_path, {"ssh.service": ("loaded", 101)})
    proc = fake_proc(tmp_path, {101: 0}, cap_sys_resource=False)
    for check in (True, False):
        result = oom(proc, systemctl, check=check)
        assert result["changed"] is False
        assert "CAP_SYS_RESOURCE" in result["not_applied"][0]
    assert (proc / "101/oom_score_adj").read_text() == "0\n"


def test_a_module_run_in_this_process_gives_what_its_own_process_gives(tmp_path):
    """tests/unit/module_runner.py runs a module's main() in this pytest process, where Ansible's controller
    is imported: the document is the one the module file's own process prints, its warnings included."""
    systemctl = fake_systemctl(tmp_path, {"ssh.service": ("loaded", 101)})
    proc = fake_proc(tmp_path, {101: 0}, cap_sys_resource=False)
    here, real = oom(proc, systemctl, check=True), oom(proc, systemctl, check=True, real=True)
    assert here == real
    assert len(real["warnings"]) == 1 and "CAP_SYS_RESOURCE" in json.dumps(real["warnings"]), real


def test_earlyoom_arguments_are_the_spec():
    defaults = yaml.safe_load((EARLYOOM / "defaults/main.yml").read_text())
    avoid = "(^|/)(" + "|".join(defaults["earlyoom_avoid_names"]) + ")$"
    # docs/recipes.md "earlyoom", verbatim
    assert avoid == "(^|/)(sshd|systemd|dockerd|containerd|containerd-shim.*)$"
    assert (defaults["earlyoom_mem_term_percent"], defaults["earlyoom_mem_kill_percent"]) == (4, 2)
    assert (defaults["earlyoom_swap_term_percent"], defaults["earlyoom_report_interval_s"]) == (100, 60)


KHO_ON = "CONFIG_KEXEC_HANDOVER=y\nCONFIG_KEXEC_HANDOVER_ENABLE_DEFAULT=y\n"
KHO_OFF = "CONFIG_KEXEC_HANDOVER=y\n# CONFIG_KEXEC_HANDOVER_ENABLE_DEFAULT is not set\n"


@pytest.mark.parametrize(
    ("config", "release", "needed"),
    [
        (KHO_ON, KERNEL_64K, True),  # 7.0.0-1019-nvidia-64k's config (roles/host_tuning/README.md)
        (KHO_OFF, KERNEL_64K, False),  # a config says no: the release does not matter
        ("CONFIG_ARM64_64K_PAGES=y\n", "6.17.0-1032-nvidia", False),
        (None, "7.0.0-1019-nvidia", True),  # no config file: 7.x and later
        (None, "6.17.0-1032-nvidia", False),
        (None, "", False),  # no kernel known (no facts)
    ],
)
def test_host_status_decides_kho_off_in_its_round_trip_as_the_grub_dropin_does(
    tmp_path, config, release, needed
):
    """tasks/reboot_reasons.yml no longer reads /boot/config-<kernel> in a round trip of its own: host_status
    reads it and puts kho=off first in the expected command line when it is needed, the decision the role's
    variables make for the GRUB drop-in (filter kho_auto over the grep of tasks/kconfig.yml: one function)."""
    from ansible_collections.sparkfleet.cluster.plugins.filter.host import kho_auto

    root = spark_root(tmp_path, ready=False)  # /proc/cmdline has splash, not kho=off
    if config is not None and release:
        (root / "boot" / f"config-{release}").write_text(config)
    expect = {**EXPECT, "cmdline_add": ["iommu.passthrough=1"]}  # host_tuning_kernel_args_extra
    result = status(tmp_path, root, KERNEL_64K, 4096, expect=expect, kho_off="auto", kconfig_release=release)
    assert result["facts"]["kho"]["kho_off"] is needed
    cmdline = next(c for c in result["checks"] if c["check"] == "kernel command line")
    wanted = (["kho=off"] if needed else []) + ["iommu.passthrough=1"]
    assert all(arg in str(cmdline["expected"]) for arg in wanted), cmdline
    assert ("kho=off" in str(cmdline["expected"])) is needed
    assert any("kho=off missing" in r for r in result["reboot_reasons"]) is needed
    # the role's side: the lines `grep -E '^CONFIG_(KEXEC_HANDOVER|...)=' /boot/config-<release>` prints
    # (rc 2, no file: none), through the filter the GRUB drop-in's variables use
    lines = None if config is None else [ln for ln in config.splitlines() if ln.startswith("CONFIG_")]
    assert kho_auto(lines, release) is needed


def test_host_status_kho_on_and_off_need_no_file_and_unset_takes_the_command_line_as_given(tmp_path):
    root = spark_root(tmp_path, ready=False)
    expect = {**EXPECT, "cmdline_add": ["iommu.passthrough=1"]}
    for mode, want in (("on", True), ("off", False)):
        forced = status(tmp_path, root, KERNEL_64K, 4096, expect=expect, kho_off=mode, kconfig_release="")
        assert forced["facts"]["kho"]["kho_off"] is want
    given = status(tmp_path, root, KERNEL_64K, 4096, expect=EXPECT)
    assert given["facts"]["kho"] is None
    assert any("kho=off missing" in r for r in given["reboot_reasons"])

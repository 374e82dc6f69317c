"""After molecule/vm_arm64's converge (host_tuning, 64k profile at host_tuning_kernel_64k_page_size 16384,
reboots allowed): the arm64 guest runs Debian's 16K-page kernel, pinned in GRUB and held in apt, and a plain
reboot comes back on it. Read from the guest over SSH (README "The 64K kernel")."""

from __future__ import annotations

import subprocess
import time

HOST = "spark1"


def sh(lab, cmd: str, timeout: float = 120) -> str:
    return lab.ssh(HOST, cmd, timeout=timeout).strip()


def next_entry(lab) -> str:
    """grubenv's one-time entry ('' when none is pending: GRUB's save_env leaves `next_entry=` once used)."""
    env = dict(
        ln.split("=", 1)
        for ln in sh(lab, "sudo grub-editenv /boot/grub/grubenv list").splitlines()
        if "=" in ln
    )
    return env.get("next_entry", "")


def test_the_page_size_is_16k(lab):
    assert sh(lab, "getconf PAGESIZE") == "16384"


def test_the_16k_kernel_runs(lab, kernel_16k):
    release = sh(lab, "uname -r")
    assert release.endswith("-arm64-16k")
    assert release == kernel_16k["release"]
    assert sh(lab, "uname -m") == "aarch64"


def test_the_kernel_command_line_is_the_16k_kernels(lab, kernel_16k):
    cmdline = sh(lab, "cat /proc/cmdline").split()
    assert f"BOOT_IMAGE=/boot/vmlinuz-{kernel_16k['release']}" in cmdline
    assert "console=ttyAMA0,115200" in cmdline
    assert "splash" not in cmdline  # host_tuning_kernel_args_remove, through the GRUB drop-in


def test_grub_boots_the_16k_kernel_by_default(lab, kernel_16k):
    """The pin: GRUB_DEFAULT in the role's drop-in is the id path grub_entry found for the 16K kernel,
    update-grub wrote it as grub.cfg's default, and the entry it names boots vmlinuz-<16K release>. It is the
    release's own entry in the Advanced options submenu, not the top-level `gnulinux-simple-UUID` (which boots
    whichever kernel sorts newest, as the 16K kernel does here): a pin to it would follow a kernel update."""
    dropin = sh(lab, "sudo grep -h '^GRUB_DEFAULT=' /etc/default/grub.d/*.cfg")
    pinned = dropin.split("=", 1)[1].strip().strip("'\"")
    assert ">" in pinned and kernel_16k["release"] in pinned.split(">")[-1]
    cfg = sh(lab, "sudo cat /boot/grub/grub.cfg")
    assert f'set default="{pinned}"' in cfg
    leaf = pinned.split(">")[-1]
    block = cfg[cfg.index(f"'{leaf}'") :]
    linux = next(ln for ln in block.splitlines() if ln.strip().startswith("linux"))
    assert f"/vmlinuz-{kernel_16k['release']} " in linux


def test_grub_ran_every_command_of_its_configuration_at_every_boot(lab, kernel_16k):
    """The guest's serial console since the lab started, the trial boot of the 16K kernel included: GRUB
    found every command grub.cfg uses (`[`, load_env and save_env come from its command list in normal
    mode; without them grubenv is neither read nor written and grub-reboot does nothing)."""
    console = lab.console_log(HOST).read_bytes().decode(errors="replace")
    assert f"Linux version {kernel_16k['release']} " in console
    assert "can't find command" not in console


def test_the_16k_kernel_package_is_installed_at_its_version_and_held(lab, kernel_16k):
    pkg = kernel_16k["package"]
    assert sh(lab, f"dpkg-query -W -f '${{Version}}' {pkg}") == kernel_16k["version"]
    assert pkg in sh(lab, "apt-mark showhold").split()


def test_apt_reaches_only_the_images_local_repository(lab):
    sources = [
        ln for ln in sh(lab, "cat /etc/apt/sources.list").splitlines() if ln and not ln.startswith("#")
    ]
    assert sources == ["deb [trusted=yes] file:/opt/sparkfleet-lab/apt ./"]
    assert sh(lab, "ls /etc/apt/sources.list.d/ | wc -l") == "0"


def test_a_plain_reboot_comes_back_on_the_16k_kernel(lab, kernel_16k):
    """The pin survives: no grub-reboot pending, a reboot boots GRUB's default, which is the 16K kernel.
    (GRUB cleared the trial's next_entry as it booted it: the image's GRUB reads and writes grubenv.)"""
    assert next_entry(lab) == ""
    before = sh(lab, "cat /proc/sys/kernel/random/boot_id")
    lab.ssh(HOST, "sudo systemd-run --on-active=2 systemctl reboot", check=False)
    start = time.monotonic()
    deadline = start + 900
    while True:
        time.sleep(10)
        try:
            now = lab.ssh(HOST, "cat /proc/sys/kernel/random/boot_id", check=False, timeout=30).strip()
        except subprocess.TimeoutExpired:
            now = ""
        if now and now != before:
            break
        assert time.monotonic() < deadline, "the guest did not come back within 900 s"
    print(f"plain reboot: SSH back after {time.monotonic() - start:.0f} s")
    assert sh(lab, "uname -r") == kernel_16k["release"]
    assert sh(lab, "getconf PAGESIZE") == "16384"
    assert next_entry(lab) == ""

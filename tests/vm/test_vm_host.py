"""The host concern on real kernels (molecule/vm): what the container lab can only write to files, a VM
lab node runs. The scenario converged playbooks/host.yml and then playbooks/reboot.yml with reboots allowed,
so every node was rebooted (a real reset: firmware, GRUB, kernel) after the role wrote its files."""

from __future__ import annotations

import pytest
from lab_events import Events
from sparkfleet_lab.vm import image

pytestmark = pytest.mark.usefixtures("lab")


def _boot_time(host) -> int:
    """When the running kernel booted (seconds since the epoch, from /proc/stat)."""
    stat = host.check_output("cat /proc/stat")
    return int(next(line.split()[1] for line in stat.splitlines() if line.startswith("btime ")))


def _mtime(host, path: str) -> int:
    return int(host.check_output(f"stat -c %Y {path}"))


@pytest.fixture(params=["spark1", "spark2"])
def vm(request, node):
    return node(request.param)


def test_every_node_rebooted_after_the_role_wrote_its_boot_settings(vm):
    # the whole-cluster reboot: each node's running kernel booted after its sysctl drop-in and GRUB config
    booted = _boot_time(vm)
    assert booted > _mtime(vm, "/etc/sysctl.d/60-sparkfleet.conf")
    assert booted > _mtime(vm, "/boot/grub/grub.cfg")


def test_sysctls_are_live_in_the_booted_kernel(vm):
    assert vm.check_output("cat /proc/sys/vm/swappiness") == "10"
    assert vm.check_output("cat /proc/sys/vm/watermark_boost_factor") == "0"
    assert vm.check_output("cat /proc/sys/vm/min_free_kbytes") == "45166"


def test_kernel_arguments_are_on_the_running_kernels_command_line(vm):
    cmdline = vm.check_output("cat /proc/cmdline").split()
    assert "nmi_watchdog=0" in cmdline  # the scenario's extra argument, added by the role's GRUB drop-in
    assert "splash" not in cmdline  # the image boots with it; the role removes it
    assert "console=ttyS0,115200" in cmdline  # the distribution's own arguments stay
    assert vm.check_output("cat /proc/sys/kernel/nmi_watchdog") == "0"  # and the kernel acted on it


def test_swapfile_is_switched_on(vm):
    swaps = vm.check_output("cat /proc/swaps").splitlines()[1:]
    ours = [line.split() for line in swaps if line.split()[0] == "/swap.sparkfleet"]
    assert ours, f"/swap.sparkfleet is not active: {swaps}"
    assert int(ours[0][2]) >= 512 * 1024 - 4  # KiB; the header page is not swap
    assert "/swap.sparkfleet none swap sw 0 0" in vm.check_output("cat /etc/fstab")  # and at every boot


def test_transparent_huge_pages_are_madvise_in_the_running_kernel(vm):
    assert "[madvise]" in vm.check_output("cat /sys/kernel/mm/transparent_hugepage/enabled")


def test_grub_boots_debians_configuration_with_both_kernel_flavours(vm):
    with vm.sudo():
        cfg = vm.check_output("cat /boot/grub/grub.cfg")
    assert "sparkfleet-vm-bootstrap" not in cfg  # update-grub wrote it in the guest
    releases = vm.check_output("ls /boot").split()
    kernels = [r.removeprefix("vmlinuz-") for r in releases if r.startswith("vmlinuz-")]
    assert any("-cloud-amd64" in k for k in kernels) and any("-cloud-" not in k for k in kernels)
    for k in kernels:
        assert f"/boot/vmlinuz-{k} " in cfg
    running = vm.check_output("uname -r")
    assert running in kernels and "-cloud-" not in running  # GRUB's default: the generic kernel, by its id
    default = vm.check_output("grep ^GRUB_DEFAULT= /etc/default/grub")
    assert f"gnulinux-{running}-advanced-" in default


def test_not_a_container(vm):
    assert vm.run("systemd-detect-virt --container").stdout.strip() == "none"
    assert vm.check_output("systemd-detect-virt --vm") == "qemu"


# The host-status rows a VM has for real (its own kernel, swap, sysctls, command line): ok, where the
# container lab answers n/a. The rest (driver, board and ConnectX-7 firmware, memory saver) need a Spark.
VM_ROWS = ("kernel", "page size", "THP", "swap", "kernel command line", "sysctl")


def test_host_status_rows_a_vm_has_are_ok(lab, play):
    events = Events()
    result = play(
        "playbooks/host_status.yml", on_event=events, extravars={"host_tuning_status_strict": False}
    )
    assert result.exit_code == 0, result.failures
    reports = {h: r["msg"] for h, r in events.results(f"Report the host of {lab.hosts[0]}").items()}
    assert set(reports) == set(lab.hosts)
    for host, lines in reports.items():
        status = {line[5:].split(":")[0]: line[:4].strip() for line in lines if line[4:5] == " "}
        for row in VM_ROWS:
            assert status.get(row) == "ok", (host, row, lines)


def test_the_lab_image_loads_no_driver_for_an_emulated_device_a_spark_lacks(vm):
    # the lab's own image, not a role (lab/sparkfleet_lab/vm/image.py): qemu's PC offers a floppy
    # controller, a parallel port, a CD-ROM, nested virtualisation...; their drivers stay out of the booted
    # kernel, and its initramfs carries only the root file system's and the NICs' drivers. Under TCG each
    # costs seconds of every boot.
    loaded = {line.split()[0] for line in vm.check_output("cat /proc/modules").splitlines()}
    assert not loaded & set(image.AMD64_BLACKLIST), sorted(loaded & set(image.AMD64_BLACKLIST))
    assert {"virtio_blk", "ext4"} <= loaded
    initramfs = vm.check_output("cat /etc/initramfs-tools/conf.d/sparkfleet-lab.conf").splitlines()
    assert "MODULES=list" in initramfs

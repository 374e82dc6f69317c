"""Role host_tuning on one lab node (molecule/host_tuning). A container boots no kernel of its own and
cannot write /proc/sys: what it can show is the persistent half (what systemd-sysctl, systemd-tmpfiles,
GRUB and the swap tools will read) and the boot target."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("lab")


def test_systemd_sysctl_loads_the_memory_settings(node):
    host = node("spark1")
    loaded = host.check_output("systemd-analyze cat-config sysctl.d")
    settings = dict(
        (k.strip(), v.strip()) for k, _, v in (ln.partition("=") for ln in loaded.splitlines()) if v
    )  # fmt: skip - later files win, as in systemd-sysctl
    assert settings["vm.watermark_boost_factor"] == "0"
    assert settings["vm.swappiness"] != "0"  # a swappiness of 0 has locked whole clusters
    assert settings["vm.min_free_kbytes"] == "45166"  # the stock profile's value of the receipts


def test_swapfile_is_a_private_swap_area_for_this_page_size(node):
    host = node("spark1")
    with host.sudo():
        swap = host.file("/swap.sparkfleet")
        assert swap.is_file and swap.mode == 0o600 and swap.size == 64 << 20
        page = int(host.check_output("getconf PAGESIZE"))
        sig = host.check_output(f"dd if=/swap.sparkfleet bs=1 skip={page - 10} count=10 2>/dev/null")
        assert sig == "SWAPSPACE2"
        assert host.run("swaplabel /swap.sparkfleet").rc == 0  # util-linux reads it as a swap area


def test_grub_drop_in_removes_splash_from_what_the_distribution_boots(node):
    # grub-mkconfig sources /etc/default/grub, then the drop-ins: do that with a typical command line
    script = (
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"; GRUB_CMDLINE_LINUX="console=tty1"; '
        ". /etc/default/grub.d/99-sparkfleet.cfg; "
        'printf "%s|%s" "$GRUB_CMDLINE_LINUX_DEFAULT" "$GRUB_CMDLINE_LINUX"'
    )
    default, linux = node("spark1").check_output(f"sh -c '{script}'").split("|")
    assert default.split() == ["quiet"]
    assert "console=tty1" in linux.split() and "splash" not in linux.split()


def test_keeps_the_desktop_with_thp_set_at_boot(node):
    host = node("spark1")
    # host_tuning_headless defaults to false: the boot target stays what it was (the lab node's graphical)
    assert host.check_output("systemctl get-default") == "graphical.target"
    thp = host.check_output("systemd-analyze cat-config tmpfiles.d/sparkfleet-thp.conf")
    assert "/sys/kernel/mm/transparent_hugepage/enabled" in thp

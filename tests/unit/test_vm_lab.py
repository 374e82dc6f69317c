"""The VM lab's decisions before it starts a qemu (sparkfleet_lab.vm): how the cables become UDP links between
the qemus, what each guest is told through fw_cfg, what the inventory says, and the disk image's content key.
No qemu here (molecule/vm boots them)."""

from __future__ import annotations

import subprocess

import pytest
from sparkfleet_lab.core import LabError
from sparkfleet_lab.vm import image
from sparkfleet_lab.vm.lab import VmLab


@pytest.fixture
def lab(tmp_path, monkeypatch):
    root = tmp_path / "checkout"
    root.mkdir()
    from sparkfleet_lab.core import default_project_dir

    real = default_project_dir()
    for sub in ("roles", "inventory"):
        (root / sub).symlink_to(real / sub)
    lab = VmLab(name="unit-vm", topology_name="tp2", project_dir=root, say=lambda _m: None)
    lab.state.update(
        ports={"spark1": 40001, "spark2": 40002},
        rail_ports={
            f"{r.index}{side}": 41000 + 2 * r.index + (side == "b") for r in lab.rails() for side in "ab"
        },
        lan_port=42000,
    )
    return lab


def _netdevs(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "-netdev"]


def test_each_rail_is_a_udp_link_whose_ends_point_at_each_other(lab):
    one = [n for n in _netdevs(lab.qemu_argv(1, "spark1")) if n.startswith("socket,id=rail")]
    two = [n for n in _netdevs(lab.qemu_argv(2, "spark2")) if n.startswith("socket,id=rail")]
    assert len(one) == len(two) == len(lab.rails()) == 2
    for a, b in zip(one, two, strict=True):
        fa = dict(kv.split("=", 1) for kv in a.split(",")[1:])
        fb = dict(kv.split("=", 1) for kv in b.split(",")[1:])
        assert fa["udp"] == fb["localaddr"] and fb["udp"] == fa["localaddr"]  # crosswise: one cable
        assert fa["udp"].startswith("127.0.0.1:")  # only on this machine's loopback


def test_management_nic_has_no_route_out_and_ssh_only_on_loopback(lab):
    mgmt = next(n for n in _netdevs(lab.qemu_argv(1, "spark1")) if n.startswith("user,"))
    assert "restrict=on" in mgmt.split(",")
    assert "hostfwd=tcp:127.0.23.11:40001-:22" in mgmt.split(",")


def test_the_nodes_share_one_management_lan_on_loopback_and_each_lab_has_its_own(lab):
    lans = [
        [n for n in _netdevs(lab.qemu_argv(i, h)) if n.startswith("socket,id=lan,")]
        for i, h in enumerate(lab.hosts, start=1)
    ]
    assert all(len(x) == 1 for x in lans), lans
    fields = [dict(kv.split("=", 1) for kv in x[0].split(",")[2:]) for x in lans]
    # one multicast group and port for every node of this lab (the hub), sent and joined on loopback only
    assert {f["mcast"] for f in fields} == {"230.0.23.1:42000"}
    assert {f["localaddr"] for f in fields} == {"127.0.0.1"}
    # the port is the lab's own: a free UDP port taken once and kept in its state
    assert lab.state["lan_port"] == 42000
    macs = [a for a in lab.qemu_argv(1, "spark1") if a.startswith("virtio-net-pci,netdev=lan,")]
    assert macs == ["virtio-net-pci,netdev=lan,mac=52:54:00:5f:01:10"]


def test_rail_nics_carry_jumbo_frames(lab):
    devices = [a for a in lab.qemu_argv(1, "spark1") if a.startswith("virtio-net-pci,netdev=rail")]
    assert devices and all("host_mtu=9000" in d for d in devices)


def test_rail_nics_announce_a_connectx7_half_ports_speed(lab):
    # the soft-RoCE port's rate follows the NIC's speed (200 Gb/sec (4X HDR) in the guest: network_links'
    # minimum); without it the kernel reads an unknown speed as 1 Gb/s and rxe reports 2.5 Gb/sec (1X SDR)
    devices = [a for a in lab.qemu_argv(1, "spark1") if a.startswith("virtio-net-pci,netdev=rail")]
    for d in devices:
        assert {"speed=200000", "duplex=full"} <= set(d.split(","))
    mgmt = next(a for a in lab.qemu_argv(1, "spark1") if a.startswith("virtio-net-pci,netdev=mgmt"))
    assert "speed=" not in mgmt


def test_the_guest_is_told_the_spark_names_and_hcas_of_its_ports(lab):
    lab.key_file.parent.mkdir(parents=True)
    lab.key_file.with_suffix(".pub").write_text("ssh-ed25519 AAAAkey sparkfleet-lab-unit-vm\n")
    lines = lab._fw_cfg(2, "spark2").splitlines()
    assert lines[0] == "hostname spark2"
    assert lines[1] == "authorized_key ssh-ed25519 AAAAkey sparkfleet-lab-unit-vm"
    nics = [tuple(line.split()[1:]) for line in lines if line.startswith("nic ")]
    rxe = [tuple(line.split()[1:]) for line in lines if line.startswith("rxe ")]
    ends = [end for _rail, _side, end in lab._node_rails(2)]
    assert [name for _mac, name in nics] == ["labssh0", "enP7s7", *[e.netdev for e in ends]]
    # the controller's NIC (qemu's user network, MAC index 0) and the LAN NIC (index 0x10) by their MACs
    assert nics[:2] == [("52:54:00:5f:02:00", "labssh0"), ("52:54:00:5f:02:10", "enP7s7")]
    assert rxe == [(e.netdev, e.hca) for e in ends]
    # the lab's own links: DHCP from qemu on the controller's, the node's LAN address on enP7s7
    assert [line for line in lines if line.split()[0] in ("dhcp", "address")] == [
        "dhcp labssh0",
        "address enP7s7 10.99.0.12/24",
    ]


def test_every_node_gets_its_own_address_in_the_inventory(lab):
    import yaml

    lab._write_inventory()
    hosts = yaml.safe_load((lab.inventory_dir / "hosts.yml").read_text())
    cluster = hosts["all"]["children"]["cluster"]["children"]
    head = cluster["head"]["hosts"]["spark1"]
    worker = cluster["workers"]["hosts"]["spark2"]
    assert (head["ansible_host"], head["ansible_port"]) == ("127.0.23.11", 40001)
    assert (worker["ansible_host"], worker["ansible_port"]) == ("127.0.23.12", 40002)
    # the plan's management addresses (SSH between the nodes, MASTER_ADDR): the LAN's, not the controller's
    assert head["sparkfleet_mgmt_address"] == "10.99.0.11"
    assert worker["sparkfleet_mgmt_address"] == "10.99.0.12"
    assert (lab.inventory_dir / "group_vars/all/10-host.yml").exists()  # the VM lab's own overrides


def test_a_container_lab_of_that_name_is_refused(tmp_path):
    state = tmp_path / ".lab" / "unit-c" / "state.json"
    state.parent.mkdir(parents=True)
    state.write_text('{"topology": "tp2"}')
    with pytest.raises(LabError, match="is a container lab"):
        VmLab(name="unit-c", project_dir=tmp_path)


def test_the_disk_image_key_follows_its_inputs(monkeypatch):
    before = image.image_tag()
    assert image.image_tag() == before  # the same inputs, the same cached disk
    original = image.packages
    monkeypatch.setattr(image, "packages", lambda arch="amd64": [*original(arch), "htop"])
    assert image.image_tag() != before
    monkeypatch.setattr(image, "packages", original)
    monkeypatch.setitem(image.GRUB_DEFAULTS, "GRUB_TIMEOUT", "5")
    assert image.image_tag() != before


def test_the_arm64_disk_has_a_key_of_its_own():
    assert image.image_tag("arm64") != image.image_tag("amd64")
    assert image.image_path("arm64").name.startswith("debian-trixie-arm64-")
    assert "linux-image-arm64" in image.packages("arm64")
    assert "grub-efi-arm64" in image.packages("arm64")
    with pytest.raises(ValueError, match="arch"):
        image.packages("riscv64")


def test_the_arm64_lab_is_one_node_without_rails(tmp_path):
    lab = VmLab(name="unit-arm", project_dir=tmp_path, arch="arm64", say=lambda _m: None)
    assert lab.hosts == ["spark1"]
    assert lab.rails() == []
    assert lab.inventories == [lab.inventory_dir]
    lab.state = {"ports": {"spark1": 2222}}
    argv = lab.qemu_argv(1, "spark1")
    assert argv[0] == "qemu-system-aarch64"
    assert "virt,accel=tcg" in argv
    # UEFI: the firmware read-only, the node's own variable store
    assert any("AAVMF_CODE.fd" in a and "readonly=on" in a for a in argv)
    assert any("efivars.fd" in a for a in argv)
    # the management network stays restricted: no route out, only SSH forwarded from loopback
    netdev = argv[argv.index("-netdev") + 1]
    assert "restrict=on" in netdev and "hostfwd=tcp:127.0.23.11:2222-:22" in netdev
    assert argv.count("-netdev") == 1  # no rails
    smp = int(argv[argv.index("-smp") + 1])
    assert smp <= 2
    # one NIC, no peers: it is the management link itself (named as a Spark's), on DHCP from qemu
    lab.key_file.parent.mkdir(parents=True)
    lab.key_file.with_suffix(".pub").write_text("ssh-ed25519 AAAAkey sparkfleet-lab-unit-arm\n")
    lines = lab._fw_cfg(1, "spark1").splitlines()
    links = [line for line in lines if line.split()[0] in ("nic", "dhcp", "address")]
    assert links == ["nic 52:54:00:5f:01:00 enP7s7", "dhcp enP7s7"]
    assert lab.mgmt_address("spark1") == "127.0.23.11"


def test_a_tp3_lab_takes_the_tp2_examples_pins_not_the_tp3_placeholders(lab):
    import yaml

    t3 = VmLab(name="unit-t3", topology_name="tp3", project_dir=lab.project_dir, say=lambda _m: None)
    t3.state.update(ports={h: 40001 + i for i, h in enumerate(t3.hosts)})
    t3._write_inventory()
    pins = yaml.safe_load((t3.inventory_dir / "group_vars/all/00-lab.yml").read_text())["sparkfleet_pins"]
    tp2 = yaml.safe_load((lab.project_dir / "inventory/tp2/group_vars/all/pins.yml").read_text())
    assert pins == tp2["sparkfleet_pins"]
    assert "CHANGE-ME" not in yaml.safe_dump(pins)
    hosts = yaml.safe_load((t3.inventory_dir / "hosts.yml").read_text())["all"]["children"]["cluster"]
    workers = hosts["children"]["workers"]["hosts"]
    assert [w["sparkfleet_mgmt_address"] for w in workers.values()] == ["10.99.0.12", "10.99.0.13"]


def test_a_boot_that_times_out_says_how_far_the_guest_got(lab, monkeypatch):
    # CI removes the lab (and its console file) after a failure: the error carries the console's end
    console = lab.console_log("spark1")
    console.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"[  {i}.0] line {i}" for i in range(40)]
    last = "\x1b[0;32m  OK  \x1b[0m] Reached target sysinit.target."
    console.write_text("\r\n".join([*lines[:-1], last]) + "\r\n")
    monkeypatch.setattr(VmLab, "running", lambda self, host: True)
    calls = []

    def no_ssh(argv, **_kw):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 255, "", "Connection refused")

    monkeypatch.setattr("sparkfleet_lab.vm.lab.subprocess.run", no_ssh)
    with pytest.raises(LabError) as err:
        lab.wait_ssh("spark1", timeout=0)
    msg = str(err.value)
    assert msg.startswith("spark1: no SSH within 0 s (Connection refused); the last 15 lines of its console")
    assert "  OK  ] Reached target sysinit.target." in msg and "\x1b" not in msg
    assert "line 25" in msg and "line 24" not in msg
    assert len(calls) == 1


def test_a_guest_whose_qemu_died_says_so_with_its_console(lab, monkeypatch):
    monkeypatch.setattr(VmLab, "running", lambda self, host: False)
    with pytest.raises(LabError, match=r"spark2's qemu is not running; its console .*: unreadable"):
        lab.wait_ssh("spark2", timeout=0)

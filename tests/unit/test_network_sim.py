"""The lab's RDMA sysfs stand-in (lab/sparkfleet_lab/sim/rdma_sysfs.py): names agree with the
ConnectX-7 table, the tree has the real layout, and the real discovery module reads it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SIM = ROOT / "lab/sparkfleet_lab/sim/rdma_sysfs.py"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


sim = _load("rdma_sysfs", SIM)
rdma = _load("sparkfleet_rdma_facts", ROOT / "plugins/modules/rdma_facts.py")

MAC = "02:42:0a:fb:02:0a"


def test_netdev_to_hca_follows_the_connectx7_table_of_the_plan():
    table = yaml.safe_load((ROOT / "roles/cluster_plan/defaults/main.yml").read_text())[
        "cluster_plan_port_netdevs"
    ]
    for rails in table.values():
        for r in rails:
            assert sim.hca_name(r["netdev"]) == r["hca"]
    assert sim.hca_name("enP7s7") is None  # the management link has no RDMA device
    assert sim.hca_name("lo") is None


def test_default_gid_is_the_eui64_link_local_of_the_mac():
    assert str(sim.default_gid("02:42:0a:fb:02:0a")) == "fe80::42:aff:fefb:20a"
    assert sim.gid_text(sim.default_gid(MAC)) == "fe80:0000:0000:0000:0042:0aff:fefb:020a"
    # IPv4-mapped GIDs are hex groups too (Python 3.13's `exploded` would print 10.12.1.1)
    assert (
        sim.gid_text(sim.ipaddress.IPv6Address("::ffff:10.12.1.1"))
        == "0000:0000:0000:0000:0000:ffff:0a0c:0101"
    )


def write_tree(tmp_path: Path, devs: list) -> Path:
    root = tmp_path / "sysfs"
    sim.Writer(root).sync(sim.render(devs, table_size=16))
    return root


def test_tree_layout_and_discovery_without_ipv6(tmp_path):
    dev = sim.Netdev("enp1s0f1np1", MAC, up=True, ipv4=("10.12.1.1",))
    root = write_tree(tmp_path, [dev, sim.Netdev("enP7s7", "02:42:0a:fa:02:0b", True, ("10.250.2.11",))])
    base = root / "class/infiniband"
    assert sorted(p.name for p in base.iterdir()) == ["rocep1s0f1"]
    port = base / "rocep1s0f1/ports/1"
    assert (port / "state").read_text() == "4: ACTIVE\n"
    assert (port / "rate").read_text() == "200 Gb/sec (2X NDR)\n"
    assert (base / "rocep1s0f1/device/net/enp1s0f1np1").is_dir()
    assert (base / "rocep1s0f1/fw_ver").read_text() == "28.45.4028\n"  # the receipts' ConnectX-7 firmware
    assert (port / "gids/0").read_text().strip() == "fe80:0000:0000:0000:0042:0aff:fefb:020a"
    assert (port / "gids/3").read_text().strip() == "0000:0000:0000:0000:0000:ffff:0a0c:0101"
    assert (port / "gid_attrs/types/2").read_text().strip() == "IB/RoCE v1"
    assert (port / "gid_attrs/types/3").read_text().strip() == "RoCE v2"
    assert (port / "gid_attrs/ndevs/3").read_text().strip() == "enp1s0f1np1"
    assert (port / "gids/15").read_text().strip() == sim.ZERO_GID
    assert not (port / "gid_attrs/types/15").exists()
    r = rdma.inspect(str(root), [{"netdev": "enp1s0f1np1", "hca": "rocep1s0f1", "address": "10.12.1.1"}])
    assert r["problems"] == [] and r["devices"][0]["gid_index"] == 3


def test_ipv6_moves_the_index_and_a_down_link_is_down(tmp_path):
    devs = [
        sim.Netdev("enp1s0f1np1", MAC, up=True, ipv4=("10.12.1.1",), ipv6=("2001:db8::1",)),
        sim.Netdev("enP2p1s0f1np1", "02:42:0a:fb:02:0b", up=False, ipv4=("10.12.2.1",)),
    ]
    root = write_tree(tmp_path, devs)
    links = [
        {"netdev": "enp1s0f1np1", "hca": "rocep1s0f1", "address": "10.12.1.1"},
        {"netdev": "enP2p1s0f1np1", "hca": "roceP2p1s0f1", "address": "10.12.2.1"},
    ]
    r = rdma.inspect(str(root), links)
    assert r["devices"][0]["gid_index"] == 5
    assert r["devices"][1]["state"] == "DOWN"
    assert any("roceP2p1s0f1 port 1 is DOWN" in p for p in r["problems"])


def test_sync_rewrites_only_changes_and_removes_what_went_away(tmp_path):
    root = tmp_path / "sysfs"
    w = sim.Writer(root)
    a = sim.Netdev("enp1s0f1np1", MAC, up=True, ipv4=("10.12.1.1",))
    b = sim.Netdev("enp1s0f0np0", "02:42:0a:fb:02:02", up=True, ipv4=("10.12.9.1",))
    w.sync(sim.render([a, b], table_size=8))
    gid3 = root / "class/infiniband/rocep1s0f1/ports/1/gids/3"
    before = gid3.stat().st_mtime_ns
    w.sync(sim.render([a, b], table_size=8))
    assert gid3.stat().st_mtime_ns == before  # unchanged content is not rewritten
    a2 = sim.Netdev("enp1s0f1np1", MAC, up=True, ipv4=())  # address removed
    w.sync(sim.render([a2], table_size=8))
    assert gid3.read_text().strip() == sim.ZERO_GID
    assert not (root / "class/infiniband/rocep1s0f1/ports/1/gid_attrs/types/3").exists()
    assert not (root / "class/infiniband/rocep1s0f0").exists()


def test_parse_ip_json():
    text = json.dumps(
        [
            {
                "ifname": "lo",
                "flags": ["LOOPBACK", "UP", "LOWER_UP"],
                "address": "00:00:00:00:00:00",
                "addr_info": [],
            },
            {
                "ifname": "enp1s0f1np1",
                "flags": ["BROADCAST", "UP", "LOWER_UP"],
                "address": MAC,
                "addr_info": [
                    {"family": "inet", "local": "10.12.1.1", "prefixlen": 24},
                    {"family": "inet6", "local": "fe80::1", "prefixlen": 64},
                ],
            },
            {"ifname": "enP2p1s0f1np1", "flags": ["BROADCAST", "UP"], "address": MAC, "addr_info": []},
        ]
    )
    devs = {d.name: d for d in sim.parse_ip_json(text)}
    assert devs["enp1s0f1np1"].ipv4 == ("10.12.1.1",) and devs["enp1s0f1np1"].ipv6 == ("fe80::1",)
    assert devs["enp1s0f1np1"].up and not devs["enP2p1s0f1np1"].up  # no carrier
    assert "lo" in devs  # filtered later: lo has no ConnectX name


def test_once_runs_standalone(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SIM), "--root", str(tmp_path / "t"), "--once"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "t/class/infiniband").is_dir()


def test_simulator_is_stdlib_only():
    """The simulator runs on the nodes: it imports nothing outside the standard library (Python 3.11-3.13).
    The modules and module_utils are checked by test_module_utils.py."""
    imports = {
        ln.split()[1].split(".")[0]
        for ln in SIM.read_text().splitlines()
        if ln.strip().startswith(("import ", "from ")) and "__future__" not in ln
    }
    assert imports <= set(sys.stdlib_module_names), imports


def _can_unshare_net() -> bool:
    probe = ["unshare", "--net", "ip", "link", "add", "t0", "type", "veth", "peer", "name", "t1"]
    try:
        return subprocess.run(probe, capture_output=True, check=False).returncode == 0
    except OSError:
        return False


@pytest.mark.skipif(
    not _can_unshare_net(), reason="needs root: a network namespace of the test's own with a veth"
)
def test_a_change_announced_by_the_kernel_is_in_the_tree_at_once_not_at_the_next_interval(tmp_path):
    """The daemon refreshes on the kernel's netlink announcements (`ip monitor link address`), not only every
    --interval seconds: in a network namespace of the test's own (no traffic leaves it), a ConnectX-named veth
    and then an IPv4 address on it show up in the tree within 5 s although the interval is 120 s. The first
    look finds no HCA (the namespace has only lo), so only an announced change can make the tree."""
    root = tmp_path / "t"
    gid3 = root / "class/infiniband/rocep1s0f0/ports/1/gids/3"
    script = f"""
set -e
{sys.executable} {SIM} --root {root} --interval 120 > {tmp_path}/sim.log 2>&1 & sim=$!
trap 'kill $sim' EXIT
wait_for() {{ i=0; while ! [ -e "$1" ] || ! grep -q "$2" "$1"; do
    i=$((i + 1)); [ $i -lt 50 ] || {{ echo "not in 5 s: $1 $2"; exit 1; }}; sleep 0.1; done; }}
sleep 0.5
[ ! -e {root}/class/infiniband/rocep1s0f0 ]
ip link add enp1s0f0np0 address {MAC} type veth peer name peer0
ip link set peer0 up
ip link set enp1s0f0np0 up
wait_for {root}/class/infiniband/rocep1s0f0/ports/1/state "4: ACTIVE"
ip addr add 10.77.0.1/24 dev enp1s0f0np0
wait_for {gid3} "0000:0000:0000:0000:0000:ffff:0a4d:0001"
"""
    proc = subprocess.run(
        ["unshare", "--net", "sh", "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

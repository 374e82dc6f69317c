"""RDMA/GID discovery (sparkfleet_rdma_facts) over fixture sysfs trees, and the NCCL environment
computed from it (network_links filters)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "sysfs"
MODULE = ROOT / "plugins/modules/rdma_facts.py"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


rdma = _load("sparkfleet_rdma_facts", MODULE)
net = _load("sparkfleet_network", ROOT / "plugins/filter/network.py")
plan_mod = _load("sparkfleet_plan", ROOT / "plugins/filter/plan.py")
DEFAULTS = yaml.safe_load((ROOT / "roles/cluster_plan/defaults/main.yml").read_text())

# spark1 of a TP2 cluster (the fixtures' node)
SPARK1_TP2 = [
    {"netdev": "enp1s0f1np1", "hca": "rocep1s0f1", "address": "10.12.1.1"},
    {"netdev": "enP2p1s0f1np1", "hca": "roceP2p1s0f1", "address": "10.12.2.1"},
]


def gid_indexes(result: dict) -> list:
    return [d["gid_index"] for d in result["devices"]]


def test_normal_tree_gives_index_3_on_both_rails():
    r = rdma.inspect(str(FIXTURES / "normal"), SPARK1_TP2)
    assert r["present"] is True
    assert r["problems"] == []
    assert gid_indexes(r) == [3, 3]
    assert r["gid_indexes"] == [3]
    dev = r["devices"][0]
    assert dev["state"] == "ACTIVE" and dev["active"] and dev["rate_gbps"] == 200.0
    assert dev["gid"] == "0000:0000:0000:0000:0000:ffff:0a0c:0101"
    assert dev["netdevs"] == ["enp1s0f1np1"]


def test_gid_drift_3_to_4_is_discovered_not_assumed():
    r = rdma.inspect(str(FIXTURES / "gid_drift"), SPARK1_TP2)
    assert r["problems"] == []
    # index 3 of roceP2p1s0f1 is an IPv6 RoCE v1 entry and 2 is the IPv4 RoCE v1 one: neither is it
    assert gid_indexes(r) == [3, 4]
    assert r["gid_indexes"] == [3, 4]


def test_ipv6_addresses_push_the_ipv4_roce_v2_entry_to_5():
    r = rdma.inspect(str(FIXTURES / "ipv6_present"), SPARK1_TP2)
    assert r["problems"] == []
    assert gid_indexes(r) == [5, 5]  # 3 is RoCE v2 too, but of the IPv6 address


def test_a_port_down_is_a_problem_naming_the_port_and_the_cable():
    r = rdma.inspect(str(FIXTURES / "port_down"), SPARK1_TP2)
    assert len(r["problems"]) == 1
    msg = r["problems"][0]
    assert "roceP2p1s0f1 port 1 is DOWN (phys Disabled), not ACTIVE" in msg
    assert "enP2p1s0f1np1" in msg
    assert r["devices"][0]["problems"] == []


def test_no_rdma_devices_means_not_present_and_no_problems(tmp_path):
    r = rdma.inspect(str(tmp_path), SPARK1_TP2)
    assert r == {"present": False, "devices": [], "problems": [], "gid_indexes": []}


def test_missing_device_wrong_netdev_slow_rate_and_missing_address(tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "normal", root)
    ib = root / "class/infiniband"
    (ib / "rocep1s0f1/ports/1/rate").write_text("100 Gb/sec (2X HDR)\n")
    links = [
        {"netdev": "enp1s0f1np1", "hca": "rocep1s0f1", "address": "10.12.1.1"},
        {"netdev": "enP2p1s0f1np1", "hca": "roceP2p1s0f1", "address": "10.99.2.1"},  # not on the device
        {"netdev": "enp1s0f0np0", "hca": "rocep1s0f0", "address": "10.13.1.1"},  # no such device
        {"netdev": "enp1s0f0np0", "hca": "roceP2p1s0f1", "address": "10.12.2.1"},  # wrong pairing
    ]
    r = rdma.inspect(str(root), links)
    text = "\n".join(r["problems"])
    assert "runs at 100 Gb/sec (2X HDR), below network_links_rdma_min_rate_gbps=200" in text
    assert "no RoCE v2 GID for ::ffff:10.99.2.1" in text
    assert "RDMA device rocep1s0f0 (for enp1s0f0np0) is missing" in text
    assert "RDMA device roceP2p1s0f1 belongs to netdev enP2p1s0f1np1, not enp1s0f0np0" in text
    assert rdma.inspect(str(root), links[:1], min_rate_gbps=100)["problems"] == []


def test_unreadable_gid_entries_are_skipped(tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "normal", root)
    port = root / "class/infiniband/rocep1s0f1/ports/1"
    (port / "gids/7").write_text("garbage\n")
    (port / "gid_attrs/types/3").unlink()  # the kernel answers EINVAL: treated as no type
    r = rdma.inspect(str(root), SPARK1_TP2[:1])
    assert r["devices"][0]["gid_index"] is None
    assert "no RoCE v2 GID" in r["problems"][0]


def test_parsers():
    assert rdma.parse_state("4: ACTIVE") == "ACTIVE"
    assert rdma.parse_state("1: DOWN\n") == "DOWN"
    assert rdma.parse_state(None) == ""
    assert rdma.parse_rate("200 Gb/sec (2X NDR)") == 200.0
    assert rdma.parse_rate("26.5 Gb/sec (1X)") == 26.5
    assert rdma.parse_rate("junk") is None


def test_module_runs_as_ansible_runs_it(tmp_path):
    args = tmp_path / "args.json"
    args.write_text(
        json.dumps({"ANSIBLE_MODULE_ARGS": {"sysfs_root": str(FIXTURES / "gid_drift"), "links": SPARK1_TP2}})
    )
    proc = subprocess.run(
        [sys.executable, str(MODULE), str(args)], capture_output=True, text=True, check=False
    )
    out = json.loads(proc.stdout)
    assert proc.returncode == 0, out
    assert out["changed"] is False and out["present"] is True
    assert [d["gid_index"] for d in out["devices"]] == [3, 4]
    assert "real_hcas" in out and "perftest" in out  # what the bandwidth test's gate reads
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"links": [{"netdev": "x"}]}}))
    proc = subprocess.run(
        [sys.executable, str(MODULE), str(args)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 1 and "lacks hca, address" in json.loads(proc.stdout)["msg"]


# ---- NCCL environment -----------------------------------------------------------------------


def make_plan(topology: str) -> dict:
    n = 2 if topology == "tp2" else 3
    hosts = {
        f"spark{i}": {
            "node": i,
            "mgmt_address": f"192.168.1.{10 + i}",
            "group": "head" if i == 1 else "workers",
        }
        for i in range(1, n + 1)
    }
    return plan_mod.cluster_plan(
        hosts,
        topology,
        DEFAULTS["cluster_plan_default_cabling"][topology],
        DEFAULTS["cluster_plan_port_netdevs"],
        DEFAULTS["cluster_plan_subnet_template"],
    )


def facts_for(plan: dict, index_of=lambda host, hca: 3) -> dict:
    return {
        h: {
            "present": True,
            "devices": [{"hca": r["hca"], "gid_index": index_of(h, r["hca"])} for r in plan["interfaces"][h]],
        }
        for h in plan["hosts_by_rank"]
    }


def test_tp2_env_is_the_real_tp2_receipts():
    plan = make_plan("tp2")
    for host in plan["hosts_by_rank"]:
        env = net.nccl_env(plan, host, facts_for(plan), "enP7s7")
        # sfxnz's TP2 receipt: bootstrap on the cabled netdev, rendezvous at rank 0's fabric address,
        # both RoCE devices of the one cabled port
        assert env == {
            "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
            "MASTER_ADDR": "10.12.1.1",
            "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
            "NCCL_IB_GID_INDEX": "3",
            "NCCL_DEBUG": "WARN",
        }


def test_tp3_env_has_the_devices_toward_both_peers_and_the_three_spark_settings():
    plan = make_plan("tp3")
    env = net.nccl_env(plan, "spark1", facts_for(plan), "enP7s7")
    # rank 1 (spark2) over port 0 first, then rank 2 (spark3) over port 1
    assert env == {
        "NCCL_SOCKET_IFNAME": "enP7s7",
        "MASTER_ADDR": "192.168.1.11",  # rank 0's management address: no fabric subnet joins all three
        "NCCL_IB_HCA": "rocep1s0f0,roceP2p1s0f0,rocep1s0f1,roceP2p1s0f1",
        "NCCL_IB_GID_INDEX": "3",
        "NCCL_NET": "IB",
        "NCCL_NET_PLUGIN": "none",
        "NCCL_IB_DISABLE": "0",
        "NCCL_IB_ROCE_VERSION_NUM": "2",
        "NCCL_IB_ADDR_FAMILY": "AF_INET",
        "NCCL_IB_SUBNET_AWARE_ROUTING": "1",
        "NCCL_CROSS_NIC": "1",
        "NCCL_P2P_DISABLE": "1",
        "NCCL_SHM_DISABLE": "1",
        "NCCL_IB_SUBNET_PREFIX_LEN": "24",
        "NCCL_DEBUG": "WARN",
    }
    for host in plan["hosts_by_rank"]:
        other = net.nccl_env(plan, host, facts_for(plan), "enP7s7")
        assert other["MASTER_ADDR"] == "192.168.1.11" and other["NCCL_SOCKET_IFNAME"] == "enP7s7"
        assert len(other["NCCL_IB_HCA"].split(",")) == 4  # two lanes toward each of the two peers


def test_gid_index_only_when_identical_on_every_device_of_the_rank():
    plan = make_plan("tp3")
    drift = facts_for(plan, lambda h, hca: 4 if (h, hca) == ("spark3", "roceP2p1s0f1") else 3)
    # spark3's devices disagree: NCCL picks per device there; the other ranks keep their uniform index
    assert "NCCL_IB_GID_INDEX" not in net.nccl_env(plan, "spark3", drift, "enP7s7")
    for host in ("spark1", "spark2"):
        assert net.nccl_env(plan, host, drift, "enP7s7")["NCCL_IB_GID_INDEX"] == "3"
    assert net.node_gid_index(plan, drift, "spark3") is None
    assert net.uniform_gid_index(plan, drift) is None  # the cluster-wide view, for the role's message
    moved = facts_for(plan, lambda h, hca: 5 if h == "spark2" else 3)  # a whole node at 5: its own index
    assert net.nccl_env(plan, "spark2", moved, "enP7s7")["NCCL_IB_GID_INDEX"] == "5"
    assert net.uniform_gid_index(plan, facts_for(plan, lambda h, hca: 5)) == 5
    missing = facts_for(plan)
    del missing["spark2"]  # a host without facts (e.g. --limit): no claim about the whole cluster
    assert net.uniform_gid_index(plan, missing) is None
    partial = facts_for(plan)
    partial["spark1"]["devices"] = partial["spark1"]["devices"][:2]  # a device without a discovered index
    assert net.node_gid_index(plan, partial, "spark1") is None


def test_without_rdma_nccl_is_told_so():
    plan = make_plan("tp2")
    env = net.nccl_env(plan, "spark1", {"spark1": {"present": False, "devices": []}}, "enP7s7")
    assert env == {"NCCL_SOCKET_IFNAME": "enp1s0f1np1", "MASTER_ADDR": "10.12.1.1", "NCCL_IB_DISABLE": "1"}
    plan = make_plan("tp3")
    env = net.nccl_env(plan, "spark3", {"spark3": {"present": False, "devices": []}}, "enP7s7")
    assert env == {"NCCL_SOCKET_IFNAME": "enP7s7", "MASTER_ADDR": "192.168.1.11", "NCCL_IB_DISABLE": "1"}


def test_env_from_discovered_fixture_trees():
    plan = make_plan("tp2")
    head = rdma.inspect(str(FIXTURES / "gid_drift"), SPARK1_TP2)
    worker = rdma.inspect(str(FIXTURES / "normal"), SPARK1_TP2)  # same device names on spark2
    env = net.nccl_env(plan, "spark1", {"spark1": head, "spark2": worker}, "enP7s7")
    assert "NCCL_IB_GID_INDEX" not in env  # the drifted head: its two devices disagree
    env = net.nccl_env(plan, "spark2", {"spark1": head, "spark2": worker}, "enP7s7")
    assert env["NCCL_IB_GID_INDEX"] == "3"
    env = net.nccl_env(plan, "spark1", {"spark1": worker, "spark2": worker}, "enP7s7")
    assert env["NCCL_IB_GID_INDEX"] == "3"


def test_fabric_peers_give_each_rank_its_addresses_toward_each_peer():
    plan = make_plan("tp3")
    peers = net.fabric_peers(plan, "spark2")
    assert list(peers) == ["spark1", "spark3"]
    assert peers["spark1"] == {
        "rank": 0,
        "cables": ["n1p0-n2p1"],
        "addresses": ["10.12.1.2", "10.12.2.2"],
        "peer_addresses": ["10.12.1.1", "10.12.2.1"],
        "netdevs": ["enp1s0f1np1", "enP2p1s0f1np1"],
        "hcas": ["rocep1s0f1", "roceP2p1s0f1"],
    }
    assert peers["spark3"]["peer_addresses"] == ["10.23.1.3", "10.23.2.3"]


def test_hostvar_map_and_readable_failures():
    assert net.hostvar_map({"a": {"x": 1}, "b": {}}, ["a", "b"], "x") == {"a": 1}
    rails = [
        {
            "netdev": "enp1s0f1np1",
            "cable": "n1p1-n2p1",
            "rail": 1,
            "address": "10.12.1.1",
            "peer_host": "spark2",
            "peer_netdev": "enp1s0f1np1",
            "peer_address": "10.12.1.2",
        },
        {
            "netdev": "enP2p1s0f1np1",
            "cable": "n1p1-n2p1",
            "rail": 2,
            "address": "10.12.2.1",
            "peer_host": "spark2",
            "peer_netdev": "enP2p1s0f1np1",
            "peer_address": "10.12.2.2",
        },
    ]
    ok = (
        "RAIL enp1s0f1np1 10.12.1.2 rc=0 3 packets transmitted, 3 received, 0% packet loss, time 401ms \n"
        "RAIL enP2p1s0f1np1 10.12.2.2 rc=0 3 packets transmitted, 3 received, 0% packet loss, time 400ms \n"
    )
    assert net.ping_failures(ok, rails) == []
    bad = (
        "RAIL enP2p1s0f1np1 10.12.2.2 rc=0 3 packets transmitted, 3 received, 0% packet loss \n"
        "RAIL enp1s0f1np1 10.12.1.2 rc=1 3 packets transmitted, 0 received, 100% packet loss, time 2ms \n"
    )
    assert net.ping_failures(bad, rails) == [
        "enp1s0f1np1 (cable n1p1-n2p1 rail 1, 10.12.1.1) -> spark2 enp1s0f1np1 10.12.1.2: "
        "3 packets transmitted, 0 received, 100% packet loss, time 2ms"
    ]
    # a rail without a result line (the shell died) is a failure, not a pass
    assert len(net.ping_failures(ok.splitlines()[0], rails)) == 1
    assert net.ping_failures("", rails)[0].endswith("no result")


IB_WRITE_BW = """
---------------------------------------------------------------------------------------
                    RDMA_Write Bidirectional BW Test
 Dual-port       : OFF          Device         : rocep1s0f1
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 65536      1669400          0.00               364.71             0.695636
---------------------------------------------------------------------------------------
"""


@pytest.mark.parametrize(("below", "expected"), [(None, 1), (300.0, 0), (400.0, 1)])
def test_bandwidth_lines(below, expected):
    item = {
        "cable": "n1p1-n2p1",
        "rail": 1,
        "a": {"hca": "rocep1s0f1"},
        "b": {"host": "spark2", "hca": "rocep1s0f1"},
    }
    assert net.bw_average(IB_WRITE_BW) == 364.71
    lines = net.bw_lines([{"item": item, "stdout": IB_WRITE_BW, "rc": 0}, {"skipped": True}], below)
    assert len(lines) == expected
    if lines:
        assert lines[0] == "n1p1-n2p1 rail 1 rocep1s0f1 <-> spark2 rocep1s0f1: 364.71 Gb/s both ways"
    assert net.bw_lines([{"item": item, "stdout": "error", "rc": 1}], 0.0) == [
        "n1p1-n2p1 rail 1 rocep1s0f1 <-> spark2 rocep1s0f1: no result (1)"
    ]

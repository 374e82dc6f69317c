"""Cabling discovery: the ARP probe module (fabric_neighbors) on a real veth pair, and the controller's
reading of the answers (filter cabling_discovery): per rail expected vs actual, the cabling that matches."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from ansible_collections.sparkfleet.cluster.plugins.filter import network as net
from ansible_collections.sparkfleet.cluster.plugins.filter import plan as plan_mod
from ansible_collections.sparkfleet.cluster.plugins.modules import fabric_neighbors as fn

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = yaml.safe_load((ROOT / "roles/cluster_plan/defaults/main.yml").read_text())
PORTS = DEFAULTS["cluster_plan_port_netdevs"]
TEMPLATE = DEFAULTS["cluster_plan_subnet_template"]
SWAPPED_AT_1 = [  # spark1's two cables swapped between its ports
    {"a": {"node": 1, "port": 1}, "b": {"node": 2, "port": 1}},
    {"a": {"node": 2, "port": 0}, "b": {"node": 3, "port": 1}},
    {"a": {"node": 3, "port": 0}, "b": {"node": 1, "port": 0}},
]


def hosts(n: int) -> dict:
    return {
        f"spark{i}": {
            "node": i,
            "mgmt_address": f"192.168.1.{10 + i}",
            "group": "head" if i == 1 else "workers",
        }
        for i in range(1, n + 1)
    }


def make_plan(topology: str, cabling: list | None = None) -> dict:
    cabling = cabling or DEFAULTS["cluster_plan_default_cabling"][topology]
    return plan_mod.cluster_plan(hosts(2 if topology == "tp2" else 3), topology, cabling, PORTS, TEMPLATE)


def mac(host: str, netdev: str) -> str:
    n = int(host.removeprefix("spark"))
    i = [r["netdev"] for rails in PORTS.values() for r in rails].index(netdev)
    return f"02:00:00:00:{n:02x}:{i:02x}"


def probe_answers(
    plan: dict, real: list, *, arp_ignore: int = 0, configured: dict | None = None
) -> dict[str, dict]:
    """What fabric_neighbors reports on every node when the cables are `real` and the addresses are the
    plan's (each netdev keeps its planned address, wherever its cable goes). Linux answers a probe for any
    of its addresses on any port (arp_ignore 0) or only for the receiving port's (1)."""
    nodes = plan["nodes"]
    by_node = {n: h for h, n in nodes.items()}
    addrs = {h: {r["netdev"]: r["address"] for r in plan["interfaces"][h]} for h in plan["hosts_by_rank"]}
    configured = configured or addrs
    far: dict[tuple[str, str], tuple[str, str]] = {}
    for cable in real:
        for ra, rb in zip(PORTS[cable["a"]["port"]], PORTS[cable["b"]["port"]], strict=True):
            a = (by_node[cable["a"]["node"]], ra["netdev"])
            b = (by_node[cable["b"]["node"]], rb["netdev"])
            far[a], far[b] = b, a
    wanted = [a for h in addrs for a in addrs[h].values()]
    found: dict[str, dict] = {}
    for host in plan["hosts_by_rank"]:
        found[host] = {}
        for rails in PORTS.values():
            for r in rails:
                netdev = r["netdev"]
                port = {"mac": mac(host, netdev), "state": "up", "answers": [], "error": ""}
                if netdev not in configured[host]:
                    port.update(state="down", error=f"{netdev} is down (not configured)")
                elif (host, netdev) in far:
                    peer, peer_dev = far[(host, netdev)]
                    if peer_dev in configured[peer]:
                        mine = configured[peer] if arp_ignore == 0 else {peer_dev: configured[peer][peer_dev]}
                        port["answers"] = [
                            {"address": a, "mac": mac(peer, peer_dev)} for a in wanted if a in mine.values()
                        ]
                found[host][netdev] = port
    return found


def test_the_planned_cabling_is_found_as_planned():
    plan = make_plan("tp3")
    cabling = DEFAULTS["cluster_plan_default_cabling"]["tp3"]
    got = net.cabling_discovery(probe_answers(plan, cabling), plan, PORTS, cabling)
    assert got["matches_plan"] and got["problems"] == []
    assert got["cabling"] == cabling
    assert all(r["ok"] for r in got["rails"]) and len(got["rails"]) == 12
    assert all(": as planned, " in line for lines in got["lines"].values() for line in lines)


@pytest.mark.parametrize("arp_ignore", [0, 1])
def test_two_swapped_cables_name_rail_expected_and_actual_peer(arp_ignore):
    plan = make_plan("tp3")
    planned = DEFAULTS["cluster_plan_default_cabling"]["tp3"]
    got = net.cabling_discovery(
        probe_answers(plan, SWAPPED_AT_1, arp_ignore=arp_ignore), plan, PORTS, planned
    )
    assert not got["matches_plan"] and got["problems"] == []
    assert (
        "spark1 enp1s0f0np0 (port 0) rail 1: expected spark2 enp1s0f1np1 (port 1, 10.12.1.2), "
        "found spark3 enp1s0f0np0 (port 0)"
    ) in got["lines"]["spark1"]
    assert (
        "spark2 enP2p1s0f1np1 (port 1) rail 2: expected spark1 enP2p1s0f0np0 (port 0, 10.12.2.1), "
        "found spark1 enP2p1s0f1np1 (port 1)"
    ) in got["lines"]["spark2"]
    # spark2 - spark3 was not touched
    assert any(
        line.startswith("spark2 enp1s0f0np0 (port 0) rail 1: as planned") for line in got["lines"]["spark2"]
    )
    # the cabling that matches: the untouched cable first, as the plan has it; the new ones after it
    assert got["cabling"] == [
        {"a": {"node": 2, "port": 0}, "b": {"node": 3, "port": 1}},
        {"a": {"node": 1, "port": 0}, "b": {"node": 3, "port": 0}},
        {"a": {"node": 1, "port": 1}, "b": {"node": 2, "port": 1}},
    ]
    assert got["cabling_text"][0] == "  - {a: {node: 2, port: 0}, b: {node: 3, port: 1}}"
    assert plan_mod.plan_problems(hosts(3), "tp3", got["cabling"], PORTS, TEMPLATE) == []
    # with that cabling as the plan, the same cables are what the plan says
    fixed = make_plan("tp3", got["cabling"])
    again = net.cabling_discovery(probe_answers(fixed, SWAPPED_AT_1), fixed, PORTS, got["cabling"])
    assert again["matches_plan"], again["lines"]


def test_tp2_cable_in_the_wrong_port_of_an_unconfigured_peer_is_said_not_guessed():
    plan = make_plan("tp2")
    real = [{"a": {"node": 1, "port": 1}, "b": {"node": 2, "port": 0}}]  # spark2's end in port 0
    got = net.cabling_discovery(
        probe_answers(plan, real), plan, PORTS, DEFAULTS["cluster_plan_default_cabling"]["tp2"]
    )
    assert not got["matches_plan"]
    line = next(x for x in got["lines"]["spark1"] if x.startswith("spark1 enp1s0f1np1"))
    # spark2's port 0 has no address (only planned rails are configured): nothing answers on spark1's rail
    assert line.endswith("found nothing (no answer to any planned fabric address)")
    down = next(x for x in got["lines"]["spark2"] if x.startswith("spark2 enp1s0f1np1"))
    assert "found nothing" in down
    assert got["cabling"] == [] and len(got["problems"]) == 4


def test_a_node_that_was_not_probed_is_a_problem_not_a_guess():
    plan = make_plan("tp3")
    found = probe_answers(plan, DEFAULTS["cluster_plan_default_cabling"]["tp3"])
    del found["spark3"]
    got = net.cabling_discovery(found, plan, PORTS, DEFAULTS["cluster_plan_default_cabling"]["tp3"])
    assert "spark3: not probed (unreachable, or not in this run)" in got["problems"]
    assert not got["matches_plan"]
    # spark3's MACs are unknown: its ports are known by the addresses that answered (the host, not the port)
    line = next(x for x in got["lines"]["spark1"] if x.startswith("spark1 enp1s0f1np1"))
    assert line.endswith("found spark3 ? (port ?)")


# ---- the module on a real link: a veth pair, the far end in its own network namespace -------------


@pytest.fixture
def veth():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (a veth pair in a network namespace)")
    tag = uuid.uuid4().hex[:6]
    ns, near, far = f"sfcab{tag}", f"sfa{tag}", f"sfb{tag}"

    def ip(*args: str, netns: str | None = None) -> None:
        cmd = ["ip", "netns", "exec", netns, "ip", *args] if netns else ["ip", *args]
        subprocess.run(cmd, check=True, capture_output=True)

    try:
        ip("netns", "add", ns)
        ip("link", "add", near, "type", "veth", "peer", "name", far)
    except subprocess.CalledProcessError as exc:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        pytest.skip(f"cannot make a veth pair here: {exc.stderr.decode().strip()}")
    try:
        ip("link", "set", far, "netns", ns)
        ip("addr", "add", "10.13.1.3/24", "dev", far, netns=ns)  # another subnet than the near end's
        ip("addr", "add", "10.23.1.3/24", "dev", "lo", netns=ns)  # an address of another port of that node
        ip("link", "set", far, "up", netns=ns)
        ip("addr", "add", "10.12.1.1/24", "dev", near)
        ip("link", "set", near, "up")
        far_mac = subprocess.run(
            ["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{far}/address"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        yield near, far_mac, ns
    finally:
        subprocess.run(["ip", "link", "del", near], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


@pytest.mark.xdist_group("host-interfaces")  # adds a veth pair to this machine
def test_the_probe_finds_the_far_port_across_subnets_and_leaves_no_trace(veth):
    near, far_mac, ns = veth
    ports = {n: fn.port_state("/sys/class/net", n) for n in (near, "sfnothere0")}
    fn.probe(ports, ["10.13.1.3", "10.23.1.3", "10.12.1.2"], wait_s=1.0, rounds=3)
    assert ports["sfnothere0"]["state"] == "absent"
    assert ports[near]["state"] == "up"
    got = {(a["address"], a["mac"]) for a in ports[near]["answers"]}
    assert got == {("10.13.1.3", far_mac), ("10.23.1.3", far_mac)}
    # sender 0.0.0.0: the far end learned nothing from the probes
    show = ["ip", "netns", "exec", ns, "ip", "neigh", "show"]
    neigh = subprocess.run(show, capture_output=True, text=True, check=True)
    assert "10.12.1.1" not in neigh.stdout


@pytest.mark.xdist_group("host-interfaces")  # adds a veth pair to this machine
def test_a_down_port_is_reported_not_brought_up(veth):
    near, _, _ = veth
    subprocess.run(["ip", "link", "set", near, "down"], check=True)
    ports = {near: fn.port_state("/sys/class/net", near)}
    fn.probe(ports, ["10.13.1.3"], wait_s=0.2, rounds=1)
    assert ports[near]["state"] == "down" and ports[near]["answers"] == []
    assert "down" in Path(f"/sys/class/net/{near}/operstate").read_text()


def test_arp_frames():
    frame = fn.arp_probe("02:00:00:00:01:02", "10.12.1.2")
    assert len(frame) == 42 and frame[:6] == b"\xff" * 6 and frame[28:32] == b"\0\0\0\0"
    reply = bytearray(frame)
    reply[20:22] = b"\x00\x02"  # op = reply
    reply[22:28] = bytes.fromhex("020000000301")
    reply[28:32] = bytes([10, 12, 1, 2])
    assert fn.parse_reply(bytes(reply)) == ("10.12.1.2", "02:00:00:00:03:01")
    assert fn.parse_reply(frame) is None  # a request is no answer


def test_network_discover_passes_the_roles_variable():
    from sparkfleet import cli

    parser = cli.build_parser()
    args = parser.parse_args(["network", "-i", "inventory/tp3", "--discover"])
    assert cli.verb_extravars(args) == {"network_links_discover": True}
    assert cli.verb_extravars(parser.parse_args(["network", "-i", "inventory/tp3"])) == {}

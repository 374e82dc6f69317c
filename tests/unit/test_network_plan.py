"""cluster_plan's filter: the plan of docs/CONTRACTS.md from the inventory, and the problems it refuses."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = yaml.safe_load((ROOT / "roles/cluster_plan/defaults/main.yml").read_text())


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


plan_mod = _load("sparkfleet_plan", ROOT / "plugins/filter/plan.py")
PORTS = DEFAULTS["cluster_plan_port_netdevs"]
TEMPLATE = DEFAULTS["cluster_plan_subnet_template"]


def hosts(n: int, **over) -> dict:
    out = {
        f"spark{i}": {
            "node": i,
            "mgmt_address": f"192.168.1.{10 + i}",
            "group": "head" if i == 1 else "workers",
        }
        for i in range(1, n + 1)
    }
    for h, v in over.items():
        out[h] = {**out.get(h, {}), **v}
    return out


def plan(topology: str, h: dict | None = None, cabling: list | None = None, template: str = TEMPLATE) -> dict:
    h = h or hosts(2 if topology == "tp2" else 3)
    cabling = DEFAULTS["cluster_plan_default_cabling"][topology] if cabling is None else cabling
    return plan_mod.cluster_plan(h, topology, cabling, PORTS, template)


def problems(topology: str, h: dict | None = None, cabling=None, ports=PORTS, template=TEMPLATE) -> list[str]:
    h = h or hosts(2 if topology == "tp2" else 3)
    cabling = DEFAULTS["cluster_plan_default_cabling"].get(topology, []) if cabling is None else cabling
    return plan_mod.plan_problems(h, topology, cabling, ports, template)


def test_tp2_plan_is_one_cable_on_port_1_with_two_rails():
    p = plan("tp2")
    assert p["topology"] == "tp2" and p["size"] == 2 and p["head"] == "spark1"
    assert p["ranks"] == {"spark1": 0, "spark2": 1}
    assert p["hosts_by_rank"] == ["spark1", "spark2"]
    # TP2 meets on the fabric, as the real TP2 receipts (rank 0's address on the cable's first rail)
    assert p["master_addr"] == "10.12.1.1"
    assert p["rendezvous"] == {
        "network": "fabric",
        "address": "10.12.1.1",
        "subnet": "10.12.1.0/24",
        "netdevs": {"spark1": "enp1s0f1np1", "spark2": "enp1s0f1np1"},
    }
    assert [(x["cable"], x["rail"], x["subnet"]) for x in p["links"]] == [
        ("n1p1-n2p1", 1, "10.12.1.0/24"),
        ("n1p1-n2p1", 2, "10.12.2.0/24"),
    ]
    rail1 = p["links"][0]
    assert rail1["a"] == {
        "host": "spark1",
        "node": 1,
        "port": 1,
        "netdev": "enp1s0f1np1",
        "hca": "rocep1s0f1",
        "address": "10.12.1.1",
    }
    assert rail1["b"]["address"] == "10.12.1.2" and rail1["b"]["netdev"] == "enp1s0f1np1"
    assert [(i["netdev"], i["address"], i["peer_address"]) for i in p["interfaces"]["spark2"]] == [
        ("enp1s0f1np1", "10.12.1.2", "10.12.1.1"),
        ("enP2p1s0f1np1", "10.12.2.2", "10.12.2.1"),
    ]


def test_tp2_rendezvous_is_rank_0s_end_of_the_first_cable_whichever_end_it_is():
    h = hosts(2)
    h["spark1"]["group"], h["spark2"]["group"] = "workers", "head"  # spark2 is rank 0, the cable's b end
    p = plan("tp2", h, cabling=[{"a": {"node": 1, "port": 0}, "b": {"node": 2, "port": 1}}])
    assert p["master_addr"] == "10.12.1.2"
    assert p["rendezvous"]["netdevs"] == {"spark1": "enp1s0f0np0", "spark2": "enp1s0f1np1"}


def test_tp3_plan_is_the_nvidia_ring_with_every_pair_connected():
    p = plan("tp3")
    assert p["master_addr"] == "192.168.1.11" and p["rendezvous"]["network"] == "management"
    assert {x["subnet"] for x in p["links"]} == {
        "10.12.1.0/24",
        "10.12.2.0/24",
        "10.23.1.0/24",
        "10.23.2.0/24",
        "10.13.1.0/24",
        "10.13.2.0/24",
    }
    # N1.P0-N2.P1: spark1 uses port 0 toward spark2, spark2 port 1
    toward2 = [i for i in p["interfaces"]["spark1"] if i["peer_host"] == "spark2"]
    assert [(i["netdev"], i["hca"], i["address"], i["peer_netdev"]) for i in toward2] == [
        ("enp1s0f0np0", "rocep1s0f0", "10.12.1.1", "enp1s0f1np1"),
        ("enP2p1s0f0np0", "roceP2p1s0f0", "10.12.2.1", "enP2p1s0f1np1"),
    ]
    # N3.P0-N1.P1: spark1's port 1 goes to spark3 on 10.13.x
    toward3 = [i for i in p["interfaces"]["spark1"] if i["peer_host"] == "spark3"]
    assert [(i["netdev"], i["address"], i["peer_address"]) for i in toward3] == [
        ("enp1s0f1np1", "10.13.1.1", "10.13.1.3"),
        ("enP2p1s0f1np1", "10.13.2.1", "10.13.2.3"),
    ]
    for host, rails in p["interfaces"].items():
        assert len(rails) == 4, host
        assert len({r["netdev"] for r in rails}) == 4, host  # every netdev used once


def test_ranks_follow_node_numbers_and_master_addr_prefers_the_mgmt_address():
    h = {
        "head-a": {"node": 2, "mgmt_address": "10.0.0.2", "group": "head"},
        "w-late": {"node": 3, "mgmt_address": "10.0.0.3", "group": "workers"},
        "w-early": {"node": 1, "mgmt_address": "10.0.0.1", "group": "workers"},
    }
    p = plan("tp3", h)
    assert p["hosts_by_rank"] == ["head-a", "w-early", "w-late"]
    assert p["ranks"] == {"head-a": 0, "w-early": 1, "w-late": 2}
    assert p["master_addr"] == "10.0.0.2"  # TP3: rank 0's management address
    assert p["rendezvous"] == {"network": "management", "address": "10.0.0.2", "netdevs": {}}

    class HV(dict):
        pass

    hostvars = {
        "spark1": HV(ansible_host="spark1.lan", sparkfleet_mgmt_address="192.168.7.1", sparkfleet_node=1),
        "spark2": HV(ansible_host="192.168.7.2", sparkfleet_node=2),
    }
    groups = {"cluster": ["spark1", "spark2"], "head": ["spark1"], "workers": ["spark2"]}
    read = plan_mod._hosts_from_hostvars(hostvars, groups)
    assert read["spark1"] == {"node": 1, "mgmt_address": "192.168.7.1", "group": "head"}
    assert read["spark2"]["mgmt_address"] == "192.168.7.2"


def test_a_cabling_override_changes_ports_and_addresses():
    cabling = [{"a": {"node": 1, "port": 0}, "b": {"node": 2, "port": 0}}]
    p = plan("tp2", cabling=cabling)
    assert p["links"][0]["cable"] == "n1p0-n2p0"
    assert [i["netdev"] for i in p["interfaces"]["spark1"]] == ["enp1s0f0np0", "enP2p1s0f0np0"]


def test_two_cables_between_the_same_pair_need_a_template_that_separates_them():
    two = [
        {"a": {"node": 1, "port": 0}, "b": {"node": 2, "port": 0}},
        {"a": {"node": 1, "port": 1}, "b": {"node": 2, "port": 1}},
    ]
    found = problems("tp2", cabling=two)
    assert any("overlaps" in p and "cluster_plan_subnet_template" in p for p in found), found
    p = plan("tp2", cabling=two, template="10.{lo}{hi}.{rail}{a}.0/24")
    assert [x["subnet"] for x in p["links"]] == [
        "10.12.10.0/24",
        "10.12.20.0/24",
        "10.12.11.0/24",
        "10.12.21.0/24",
    ]


@pytest.mark.parametrize(
    ("topology", "h", "cabling", "template", "expected"),
    [
        ("tp4", None, [], TEMPLATE, "sparkfleet_topology='tp4'"),
        ("tp3", hosts(2), None, TEMPLATE, "tp3 needs exactly 3"),
        ("tp2", hosts(2, spark2={"group": "head"}), None, TEMPLATE, "group head=['spark1', 'spark2']"),
        ("tp2", hosts(2, spark2={"node": 1}), None, TEMPLATE, "sparkfleet_node=1 is also spark1's"),
        (
            "tp2",
            hosts(2, spark2={"node": "2"}),
            None,
            TEMPLATE,
            "sparkfleet_node='2': expected a whole number",
        ),
        ("tp2", hosts(2, spark2={"node": 12}), None, TEMPLATE, "sparkfleet_node=12"),
        (
            "tp2",
            None,
            [{"a": {"node": 1, "port": 1}, "b": {"node": 1, "port": 0}}],
            TEMPLATE,
            "connects node 1 to itself",
        ),
        (
            "tp2",
            None,
            [{"a": {"node": 1, "port": 1}, "b": {"node": 3, "port": 1}}],
            TEMPLATE,
            "cluster_plan_cabling[0].b.node=3: no host has that sparkfleet_node",
        ),
        (
            "tp2",
            None,
            [{"a": {"node": 1, "port": 2}, "b": {"node": 2, "port": 1}}],
            TEMPLATE,
            "cluster_plan_cabling[0].a.port=2",
        ),
        (
            "tp3",
            None,
            [
                {"a": {"node": 1, "port": 0}, "b": {"node": 2, "port": 1}},
                {"a": {"node": 2, "port": 1}, "b": {"node": 3, "port": 1}},
                {"a": {"node": 3, "port": 0}, "b": {"node": 1, "port": 1}},
            ],
            TEMPLATE,
            "node 2 port 1 is already used by cluster_plan_cabling[0]",
        ),
        (
            "tp3",
            None,
            [
                {"a": {"node": 1, "port": 0}, "b": {"node": 2, "port": 1}},
                {"a": {"node": 3, "port": 0}, "b": {"node": 1, "port": 1}},
            ],
            TEMPLATE,
            "no cable between nodes 2-3",
        ),
        ("tp2", None, "n1-n2", TEMPLATE, "cluster_plan_cabling='n1-n2': expected a list"),
        (
            "tp2",
            None,
            [{"a": {"node": 1}, "b": {"node": 2, "port": 1}}],
            TEMPLATE,
            "cluster_plan_cabling[0].a=",
        ),
        ("tp2", None, None, "10.{lo}{hi}.0.0/24", "it must use {rail}"),
        ("tp2", None, None, "10.{lo}{hi}.{rail}.{x}/24", "placeholders ['hi', 'lo', 'rail', 'x']"),
        ("tp2", None, None, "10.{lo}{hi}.{rail}.1/24", "gives no valid IPv4 subnet"),
        ("tp2", None, None, "10.{lo}{hi}.{rail}.0/31", "has no host 2"),
        ("tp2", None, None, 42, "cluster_plan_subnet_template=42"),
        (
            "tp2",
            hosts(2, spark2={"mgmt_address": "10.12.1.50"}),
            None,
            TEMPLATE,
            "management address 10.12.1.50 lies in the fabric subnet 10.12.1.0/24",
        ),
    ],
)
def test_bad_inputs_are_refused_with_the_variable_named(topology, h, cabling, template, expected):
    found = problems(topology, h, cabling, template=template)
    assert any(expected in p for p in found), found
    with pytest.raises(ValueError, match="cluster plan inputs are not valid"):
        plan_mod.cluster_plan(
            h or hosts(2 if topology == "tp2" else 3),
            topology,
            DEFAULTS["cluster_plan_default_cabling"].get(topology, []) if cabling is None else cabling,
            PORTS,
            template,
        )


def test_bad_port_table_is_refused():
    found = problems("tp2", ports={0: [{"rail": 1, "netdev": "x"}]})
    assert any("cluster_plan_port_netdevs[0]" in p for p in found), found
    found = problems(
        "tp2", ports={1: [{"rail": 1, "netdev": "a", "hca": "b"}, {"rail": 1, "netdev": "c", "hca": "d"}]}
    )
    assert any("rail numbers [1, 1] repeat" in p for p in found), found


def test_default_inputs_have_no_problems():
    assert problems("tp2") == []
    assert problems("tp3") == []


def test_the_lab_wires_the_same_plan(tmp_path):
    """The lab builds its cables from the same defaults file, so lab rails = plan rails."""
    from sparkfleet_lab import topology

    for topo in ("tp2", "tp3"):
        p = plan(topo)
        lab = {(r.cable, r.rail, r.a.netdev, r.b.netdev) for r in topology.rails(ROOT, topo)}
        mine = {(x["cable"], x["rail"], x["a"]["netdev"], x["b"]["netdev"]) for x in p["links"]}
        assert lab == mine

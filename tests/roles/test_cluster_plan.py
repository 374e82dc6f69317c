"""Role cluster_plan on a two-node lab (molecule/cluster_plan): the plan the role computes from the
inventory matches the lab's nodes and cables (the management address rank 0 is reached on, every planned
netdev on its node, every planned rail a cable of the lab)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("lab")


@pytest.fixture(scope="module")
def role_plan(play):
    events = []
    result = play("molecule/cluster_plan/converge.yml", on_event=events.append)
    assert result.ok, result.failures
    shown = [
        e["event_data"]["res"]["sparkfleet_plan"]
        for e in events
        if e.get("event") == "runner_on_ok"
        and "sparkfleet_plan" in (e.get("event_data", {}).get("res") or {})
    ]
    assert shown, "the converge playbook did not show the plan"
    return shown[0]


def test_head_is_rank_0_and_tp2s_master_addr_is_its_first_fabric_address(role_plan, node, lab):
    assert role_plan["head"] == "spark1" and role_plan["ranks"] == {"spark1": 0, "spark2": 1}
    mgmt = node("spark1").interface("enP7s7").addresses
    # TP2: the rendezvous on the first cable's first rail, as the real TP2 receipts (--master 10.100.8.1)
    first = role_plan["links"][0]
    head_end = next(end for end in (first["a"], first["b"]) if end["host"] == "spark1")
    assert role_plan["master_addr"] == head_end["address"] and role_plan["master_addr"] not in mgmt


def test_every_planned_rail_is_a_cable_of_the_lab(role_plan, lab, node):
    planned = {
        frozenset({(link["a"]["host"], link["a"]["netdev"]), (link["b"]["host"], link["b"]["netdev"])})
        for link in role_plan["links"]
    }
    cabled = {
        frozenset({(f"spark{r.a.node}", r.a.netdev), (f"spark{r.b.node}", r.b.netdev)}) for r in lab.rails()
    }
    assert planned == cabled
    for host, rails in role_plan["interfaces"].items():
        for rail in rails:
            assert node(host).interface(rail["netdev"]).exists, (host, rail["netdev"])

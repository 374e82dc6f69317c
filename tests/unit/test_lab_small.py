"""A small lab for a role scenario (`sparkfleet lab up --nodes N --no-hub`): the first N Sparks of the
topology, only the cables whose both ends exist, no hub; refused as a cluster to converge. No Docker here:
these are the lab's decisions before it creates anything."""

from __future__ import annotations

import argparse

import pytest
from sparkfleet_lab import cli
from sparkfleet_lab.core import Lab, LabError


def test_two_nodes_of_tp3_get_only_their_cable():
    lab = Lab(name="unit-small-tp3", topology_name="tp3", nodes=2, hub=False)
    assert lab.hosts == ["spark1", "spark2"] and not lab.with_hub
    assert {r.cable for r in lab.rails()} == {"n1p0-n2p1"}  # the ring's other cables reach spark3
    assert len(lab.rails()) == 2  # both rails of that cable
    assert lab.hosts_of_topology() == ["spark1", "spark2", "spark3"]


def test_a_full_lab_is_the_default():
    lab = Lab(name="unit-full-tp2", topology_name="tp2")
    assert lab.hosts == ["spark1", "spark2"] and lab.with_hub and len(lab.rails()) == 2


@pytest.mark.parametrize("nodes", [-1, 3])
def test_node_count_outside_the_topology_is_refused(nodes):
    with pytest.raises(LabError, match=r"a tp2 lab has 1\.\.2"):
        Lab(name="unit-bad-nodes", topology_name="tp2", nodes=nodes)


def test_role_scenario_lab_names_may_carry_underscores():
    assert Lab(name="molecule-engine_service", topology_name="tp2").name == "molecule-engine_service"
    with pytest.raises(LabError, match="1-24 lowercase"):
        Lab(name="Molecule-X", topology_name="tp2")


def test_a_small_lab_is_not_converged(capsys):
    args = argparse.Namespace(
        lab_cmd="up",
        name="unit-small-up",
        topology="tp2",
        nodes=1,
        no_hub=True,
        no_converge=False,
        no_verify=False,
    )
    assert cli._run(args) == 64
    assert "--no-converge" in capsys.readouterr().err

"""Fixtures of the role scenarios' verify step (molecule/<role>/; SPARKFLEET_LAB names the lab: a 1-node
role's own, or the shared two-node lab of the walk, molecule/default).

The same fixtures as the cluster scenarios' tests (tests/lab/conftest.py: lab, node, play), loaded from
there rather than written twice. Each molecule/<role>/molecule.yml selects its module with `-k`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "sparkfleet_lab_fixtures", Path(__file__).parents[1] / "lab/conftest.py"
)
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)

lab = _fixtures.lab
node = _fixtures.node
play = _fixtures.play


@pytest.fixture(scope="session")
def plan(lab):
    """The cluster plan of this lab, computed by the role's own filter from the lab's inventory."""
    import yaml

    root = Path(lab.project_dir)
    if str(root / ".collections") not in sys.path:  # the checkout is the collection (ansible.cfg)
        sys.path.insert(0, str(root / ".collections"))
    from ansible_collections.sparkfleet.cluster.plugins.filter.plan import cluster_plan

    defaults = yaml.safe_load((root / "roles/cluster_plan/defaults/main.yml").read_text())
    base = yaml.safe_load((root / "inventory" / lab.topology / "hosts.yml").read_text())
    nodes = {}
    for group in ("head", "workers"):
        for host, hv in (base["all"]["children"]["cluster"]["children"][group]["hosts"] or {}).items():
            nodes[host] = {"node": hv["sparkfleet_node"], "group": group}
    hosts = {
        h: {**nodes[h], "mgmt_address": lab.mgmt_ip(nodes[h]["node"])} for h in lab.hosts
    }  # the lab's nodes only
    return cluster_plan(
        hosts,
        lab.topology,
        defaults["cluster_plan_default_cabling"][lab.topology],
        defaults["cluster_plan_port_netdevs"],
        defaults["cluster_plan_subnet_template"],
    )

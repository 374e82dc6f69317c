"""The cluster-wide constants have one home, plugins/module_utils/cluster_constants.py: the code imports them,
Jinja reads them through the filter cluster_constant, and every literal copy Ansible needs (role defaults and
argument specs, module DOCUMENTATION and argument specs, the sample inventories) is checked equal to them
here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from ansible_collections.sparkfleet.cluster.plugins.filter import cluster as cluster_filter
from ansible_collections.sparkfleet.cluster.plugins.filter import plan, preflight
from ansible_collections.sparkfleet.cluster.plugins.module_utils import clock_state
from ansible_collections.sparkfleet.cluster.plugins.module_utils import cluster_constants as cc

ROOT = Path(__file__).resolve().parents[2]


def _yaml(path: str) -> dict:
    return yaml.safe_load((ROOT / path).read_text()) or {}


def test_the_code_imports_the_constants():
    from sparkfleet.collection import CONSTANTS
    from sparkfleet.runner import head
    from sparkfleet_lab import topology

    assert plan.NODE_COUNT is cc.NODE_COUNT and preflight.NODE_COUNT is cc.NODE_COUNT
    assert clock_state.STATE_DIR == cc.STATE_DIR
    # the CLI and the lab load the file by its path in their checkout (sparkfleet.collection)
    assert Path(CONSTANTS.__file__).parts[-3:] == ("plugins", "module_utils", "cluster_constants.py")
    assert topology.NODE_COUNT is CONSTANTS.NODE_COUNT and head.DEFAULT_STATE_DIR == cc.STATE_DIR
    assert CONSTANTS.NODE_COUNT == cc.NODE_COUNT and CONSTANTS.API_PORT == cc.API_PORT


def test_no_other_copy_of_the_node_counts():
    pattern = re.compile(r"""['"]?tp2['"]?\s*:\s*2\b""")
    hits = []
    for top in ("plugins", "python", "lab/sparkfleet_lab", "roles", "playbooks", "inventory"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix in (".py", ".yml", ".j2") and path.name != "cluster_constants.py":
                lines = enumerate(path.read_text().splitlines(), 1)
                hits += [f"{path.relative_to(ROOT)}:{n}" for n, line in lines if pattern.search(line)]
    assert hits == [], "the node counts are cluster_constants.NODE_COUNT (filter cluster_constant in Jinja)"


def test_the_filter_reads_the_constants():
    f = cluster_filter.FilterModule().filters()["cluster_constant"]
    assert [f("node_count", t) for t in ("tp2", "tp3")] == [2, 3]
    assert f("api_port", "tp3") == cc.API_PORT["tp3"] and f("master_port", "tp2") == cc.MASTER_PORT["tp2"]
    assert f("state_dir") == "/var/lib/sparkfleet" and f("topologies") == ["tp2", "tp3"]
    with pytest.raises(Exception, match=r"sparkfleet_topology='tp4': expected one of tp2, tp3"):
        f("node_count", "tp4")
    with pytest.raises(Exception, match=r"cluster constant 'nodes': expected one of"):
        f("nodes", "tp2")


def test_role_sparkfleet_keeps_the_constants():
    defaults = _yaml("roles/sparkfleet/defaults/main.yml")
    options = _yaml("roles/sparkfleet/meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    assert defaults["sparkfleet_state_dir"] == cc.STATE_DIR
    assert options["sparkfleet_state_dir"]["default"] == cc.STATE_DIR
    assert tuple(options["sparkfleet_topology"]["choices"]) == cc.TOPOLOGIES


def test_state_dir_fallbacks_in_roles_and_playbooks():
    found = []
    for top in ("roles", "playbooks"):
        for path in sorted((ROOT / top).rglob("*.yml")):
            found += re.findall(r"sparkfleet_state_dir \| default\('(/[^'/][^']*)'\)", path.read_text())
    assert found, "no fallback found: the pattern no longer matches how roles write it"
    assert set(found) == {cc.STATE_DIR}


@pytest.mark.parametrize("topology", cc.TOPOLOGIES)
def test_sample_inventories_keep_the_constants(topology):
    cluster = _yaml(f"inventory/{topology}/group_vars/all/cluster.yml")
    engine = _yaml(f"inventory/{topology}/group_vars/all/engine.yml")
    assert cluster["sparkfleet_topology"] == topology
    assert cluster["sparkfleet_state_dir"] == cc.STATE_DIR
    assert engine["engine_service_port"] == cc.API_PORT[topology]
    assert engine["engine_service_master_port"] == cc.MASTER_PORT[topology]
    hosts = _yaml(f"inventory/{topology}/hosts.yml")
    nodes = set()
    for group in hosts["all"]["children"]["cluster"]["children"].values():
        nodes |= set((group or {}).get("hosts") or {})
    assert len(nodes) == cc.NODE_COUNT[topology]


def test_module_state_paths_start_at_the_state_dir():
    """Every /var/lib/ default of a module (its DOCUMENTATION and its argument spec) is under the state
    directory."""
    found = []
    for path in sorted((ROOT / "plugins" / "modules").glob("*.py")):
        text = path.read_text()
        found += [(path.name, p) for p in re.findall(r"""default"?:\s*"?(/var/lib/[\w./-]*)""", text)]
    assert found, "no module documents a state path: the pattern no longer matches"
    wrong = [(name, p) for name, p in found if p != cc.STATE_DIR and not p.startswith(cc.STATE_DIR + "/")]
    assert wrong == []


def test_built_in_engine_profiles_keep_the_ports():
    """A built-in profile's settings are its recipe's values (role engine_service README), ports included."""
    profiles = _yaml("roles/engine_service/vars/main.yml")["__engine_service_builtin_profiles"]
    assert profiles
    for name, profile in profiles.items():
        (size,) = profile["tp_sizes"]
        (topology,) = [t for t, n in cc.NODE_COUNT.items() if n == size]
        assert profile["settings"]["port"] == cc.API_PORT[topology], name
        assert profile["settings"]["master_port"] == cc.MASTER_PORT[topology], name

"""ssh_trust filters: the names and addresses the head reaches each worker by."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


ssh = _load("sparkfleet_ssh", ROOT / "plugins/filter/ssh.py")
plan_mod = _load("sparkfleet_plan", ROOT / "plugins/filter/plan.py")
D = yaml.safe_load((ROOT / "roles/cluster_plan/defaults/main.yml").read_text())


def tp3_plan() -> dict:
    hosts = {
        f"spark{i}": {
            "node": i,
            "mgmt_address": f"192.168.1.{10 + i}",
            "group": "head" if i == 1 else "workers",
        }
        for i in (1, 2, 3)
    }
    return plan_mod.cluster_plan(
        hosts,
        "tp3",
        D["cluster_plan_default_cabling"]["tp3"],
        D["cluster_plan_port_netdevs"],
        D["cluster_plan_subnet_template"],
    )


def test_names_are_the_worker_its_mgmt_address_and_its_fabric_addresses_toward_the_head():
    p = tp3_plan()
    assert ssh.ssh_names("spark2", p) == ["spark2", "192.168.1.12", "10.12.1.2", "10.12.2.2"]
    assert ssh.ssh_names("spark3", p) == ["spark3", "192.168.1.13", "10.13.1.3", "10.13.2.3"]
    assert ssh.ssh_names("spark3", p, fabric=False) == ["spark3", "192.168.1.13"]


def test_targets_leave_out_the_alias_names_and_sources_are_the_heads_addresses():
    p = tp3_plan()
    names = {w: ssh.ssh_names(w, p) for w in p["workers"]}
    targets = ssh.ssh_targets(names, p)
    assert ["spark2", "10.12.2.2"] in targets
    assert all(t[1] not in p["hosts_by_rank"] for t in targets)
    assert len(targets) == 6
    assert ssh.ssh_sources(p, "spark1", "spark3") == ["192.168.1.11", "10.13.1.1", "10.13.2.1"]


def test_any_changed_and_failure_text():
    hv = {"spark1": {"__k": {"changed": False}}, "spark2": {"__a": {"changed": True}}}
    assert ssh.any_changed(hv, ["spark1", "spark2"], ["__k", "__a"]) is True
    assert ssh.any_changed(hv, ["spark1"], ["__k", "__a"]) is False
    expected = [["spark2", "10.12.1.2"], ["spark2", "192.168.1.12"], ["spark2", "spark2"]]
    out = (
        "SSH spark2 10.12.1.2 rc=255 Host key verification failed.\n"
        "SSH spark2 192.168.1.12 rc=0 \n"
        "SSH spark2 spark2 rc=0 \n"
    )
    assert ssh.ssh_failures(out, expected) == ["spark2 at 10.12.1.2: Host key verification failed."]
    assert ssh.ssh_failures(out.replace("rc=255", "rc=0"), expected) == []
    assert ssh.ssh_failures(out.replace("rc=255", "rc=0").splitlines(), expected) == []  # stdout_lines
    assert ssh.ssh_failures("", expected[2:]) == ["spark2 (by name, ~/.ssh/config): no result"]

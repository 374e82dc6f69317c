"""`sparkfleet lab up/down` as a whole: idempotent up, restart-safe names, down leaves nothing.

Creates its own small lab (tp2, name `lifecycle`) and removes it; needs Docker and root
(the image build uses debootstrap), so it runs in `make test`, not in `make unit`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sparkfleet_lab import docker as d
from sparkfleet_lab.core import LABEL, Lab

NAME = "lifecycle"


def _ids(lab: Lab) -> dict[str, str]:
    return {c: d.inspect("container", c)["Id"] for c in d.ls("container", f"{LABEL}={lab.name}")}


@pytest.fixture(scope="module")
def lab():
    lab = Lab(name=NAME, topology_name="tp2")
    lab.down()
    assert lab.up(converge=False) == 0
    yield lab
    lab.down()


def test_up_makes_two_nodes_one_cable_two_rails_and_a_hub(lab):
    containers = d.ls("container", f"{LABEL}={NAME}")
    assert containers == sorted([lab.container("spark1"), lab.container("spark2"), lab.hub_container])
    rails = [n for n in d.ls("network", f"{LABEL}={NAME}") if n != lab.mgmt_network]
    assert len(rails) == 2
    for net in rails:
        info = d.inspect("network", net)
        assert info["Internal"] is True
        assert info["Options"]["com.docker.network.driver.mtu"] == "9000"
        attached = sorted(c["Name"] for c in info["Containers"].values())
        assert attached == [lab.container("spark1"), lab.container("spark2")]


def test_a_rail_carries_jumbo_frames_between_plan_addresses(lab):
    # Addresses outside Docker's placeholder subnet, as the addressing plan assigns them.
    for host, addr in (("spark1", "10.12.1.1/24"), ("spark2", "10.12.1.2/24")):
        lab.exec(host, "ip", "addr", "add", addr, "dev", "enp1s0f1np1")
    try:
        out = lab.exec("spark1", "ping", "-c", "2", "-W", "2", "-M", "do", "-s", "8972", "10.12.1.2")
        assert " 0% packet loss" in out
    finally:
        for host, addr in (("spark1", "10.12.1.1/24"), ("spark2", "10.12.1.2/24")):
            lab.exec(host, "ip", "addr", "del", addr, "dev", "enp1s0f1np1", check=False)


def test_second_up_changes_nothing(lab):
    before = _ids(lab)
    inventory = (lab.inventory_dir / "hosts.yml").read_text()
    assert lab.up(converge=False) == 0
    assert _ids(lab) == before
    assert (lab.inventory_dir / "hosts.yml").read_text() == inventory


def test_inventory_layers_on_the_topology_inventory(lab):
    out = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-inventory"),
            *[arg for p in lab.inventories for arg in ("-i", str(p))],
            "--host",
            "spark2",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=lab.ansible_env(),
    )
    hostvars = json.loads(out.stdout)
    assert hostvars["ansible_host"] == lab.mgmt_ip(2)
    assert hostvars["sparkfleet_node"] == 2  # from inventory/tp2, not copied
    assert hostvars["sparkfleet_lab"] is True
    assert hostvars["sparkfleet_topology"] == "tp2"


def test_interface_names_survive_a_restart(lab):
    name = lab.container("spark2")
    d.docker("restart", name)
    lab._wait_booted("spark2")
    links = lab.exec("spark2", "ip", "-o", "link", "show")
    for netdev in ("enp1s0f1np1", "enP2p1s0f1np1", "enP7s7"):
        assert f" {netdev}@" in links or f" {netdev}:" in links, links
    assert "eth" not in lab.exec("spark2", "ls", "/sys/class/net")


def test_down_removes_everything_it_made_and_nothing_else():
    bystander = "sparkfleet-test-bystander"
    d.docker("network", "create", "--label", f"{LABEL}=someone-else", bystander)
    try:
        lab = Lab(name=NAME, topology_name="tp2")
        lab.down()
        label = f"{LABEL}={NAME}"
        assert d.ls("container", label) == []
        assert d.ls("network", label) == []
        assert d.ls("volume", label) == []
        assert not lab.state_dir.exists()
        rules = subprocess.run(["iptables", "-S", "DOCKER-USER"], capture_output=True, text=True, check=False)
        rules = rules.stdout
        assert lab.prefix not in rules
        assert d.inspect("network", bystander) is not None
    finally:
        d.docker("network", "rm", bystander)


def _sparkfleet(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sparkfleet", *args], capture_output=True, text=True, check=False)


def test_down_and_status_of_a_lab_never_created_need_no_topology():
    """Molecule's first step is destroy: on a clean machine the lab does not exist yet."""
    down = _sparkfleet("lab", "down", "--name", "never-made-1")
    assert down.returncode == 0, down.stderr
    assert "removing" not in down.stderr
    status = _sparkfleet("lab", "status", "--name", "never-made-1")
    assert status.returncode == 0 and "not created" in status.stdout
    up = _sparkfleet("lab", "up", "--name", "never-made-1", "--no-converge")
    assert up.returncode == 2 and "--topology tp2|tp3" in up.stderr
    assert not Lab(name="never-made-1", require_topology=False).state_dir.exists()

"""The API listener is tried on rank 0 before a start changes anything (plugins/module_utils/binds.py,
engine_node's `binds`, roles/engine_service/tasks/start.yml). Real sockets on this machine: loopback and
an address from TEST-NET-1 (192.0.2.0/24, never assigned to a host); nothing is sent."""

from __future__ import annotations

import socket
from pathlib import Path

import yaml
from ansible_collections.sparkfleet.cluster.plugins.module_utils.binds import bind_problem

ROOT = Path(__file__).resolve().parents[2]


def test_a_free_port_on_an_address_of_this_node_binds():
    assert bind_problem("127.0.0.1", 0) is None
    assert bind_problem("0.0.0.0", 0) is None  # noqa: S104 - the wildcard the engine may be told to bind


def test_an_address_this_node_does_not_have_is_named():
    problem = bind_problem("192.0.2.77", 8000)
    assert problem and problem.startswith("192.0.2.77 is not an address of this node"), problem


def test_a_port_another_process_listens_on_is_named_unless_the_engine_runs():
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        assert bind_problem("127.0.0.1", port) == f"port {port} on 127.0.0.1 is in use by another process"
        assert bind_problem("127.0.0.1", port, ours_listening=True) is None
    assert bind_problem("127.0.0.1", port) is None  # closed: free again


def test_start_checks_the_bind_before_it_configures_or_stops_anything():
    tasks = yaml.safe_load((ROOT / "roles/engine_service/tasks/start.yml").read_text())
    names = [t.get("name", "") for t in tasks]
    check = next(i for i, n in enumerate(names) if n.startswith("The API can listen where the settings say"))
    assert names.index("Read the engine state") < check < names.index("Configure the engine")
    assert check < names.index("Stop the cluster in order")
    probe = yaml.safe_load((ROOT / "roles/engine_service/tasks/probe.yml").read_text())
    node = next(t for t in probe if "sparkfleet.cluster.engine_node" in t)
    assert "engine_service_host" in node["sparkfleet.cluster.engine_node"]["binds"]

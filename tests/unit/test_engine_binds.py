"""The API listener is tried on rank 0 before a start changes anything (plugins/module_utils/binds.py,
engine_node's `binds`, roles/engine_service/tasks/start.yml). Real sockets on this machine: loopback and
an address from TEST-NET-1 (192.0.2.0/24, never assigned to a host); nothing is sent."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import yaml
from ansible_collections.sparkfleet.cluster.plugins.module_utils.binds import _in_use, bind_problem, listeners

ROOT = Path(__file__).resolve().parents[2]


def test_a_free_port_on_an_address_of_this_node_binds():
    assert bind_problem("127.0.0.1", 0) is None
    assert bind_problem("0.0.0.0", 0) is None  # noqa: S104 - the wildcard the engine may be told to bind


def test_an_address_this_node_does_not_have_is_named():
    problem = bind_problem("192.0.2.77", 8000)
    assert problem and problem.startswith("192.0.2.77 is not an address of this node"), problem


def test_a_port_in_use_is_traced_to_the_process_listening_on_it():
    """Real sockets and the real /proc: the listener is this test's own process."""
    me = {"pid": os.getpid(), "comm": Path("/proc/self/comm").read_text().strip()}
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        assert {k: v for k, v in listeners(port)[0].items() if k != "pid_ns"} == me
        named = bind_problem("127.0.0.1", port)
        assert named == f"port {port} on 127.0.0.1 is in use by {me['comm']} (pid {me['pid']})", named
        # a running engine whose processes share the listener's PID namespace: its own port
        assert bind_problem("127.0.0.1", port, engine_pid=os.getpid()) is None
    assert bind_problem("127.0.0.1", port) is None  # closed: free again


def fake_proc(root: Path, port: int, holder_ns: str, engine_ns: str) -> Path:
    """/proc as the kernel lays it out (net/tcp columns, fd and ns symlinks), for PID namespaces this test
    cannot make: a listener (pid 4242, nginx) and the engine's main process (pid 777)."""
    (root / "net").mkdir(parents=True)
    head = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    )
    row = f"   0: 0100007F:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0 "
    row += "       0 91817 1"
    (root / "net/tcp").write_text(head + row + "\n")
    (root / "net/tcp6").write_text(head)
    for pid, comm, ns in ((4242, "nginx", holder_ns), (777, "tensorfold", engine_ns)):
        (root / str(pid) / "fd").mkdir(parents=True)
        (root / str(pid) / "ns").mkdir()
        (root / str(pid) / "comm").write_text(comm + "\n")
        (root / str(pid) / "ns/pid").symlink_to(ns)
    (root / "4242/fd/3").symlink_to("socket:[91817]")
    (root / "777/fd/0").symlink_to("/dev/null")
    return root


def test_a_port_held_outside_the_running_engine_is_named_with_its_process(tmp_path):
    proc = fake_proc(tmp_path / "proc", 8000, holder_ns="pid:[4026531836]", engine_ns="pid:[4026532999]")
    assert _in_use("127.0.0.1", 8000, 777, str(proc)) == (
        "port 8000 on 127.0.0.1 is in use by nginx (pid 4242), not by the running engine"
    )


def test_a_port_held_inside_the_running_engine_is_its_own(tmp_path):
    proc = fake_proc(tmp_path / "proc", 8000, holder_ns="pid:[4026532999]", engine_ns="pid:[4026532999]")
    assert _in_use("127.0.0.1", 8000, 777, str(proc)) is None


def test_a_listener_that_cannot_be_traced_is_the_engines_only_while_it_runs(tmp_path):
    proc = fake_proc(tmp_path / "proc", 8001, holder_ns="pid:[1]", engine_ns="pid:[2]")  # nothing on 8000
    assert _in_use("127.0.0.1", 8000, 777, str(proc)) is None
    assert (
        _in_use("127.0.0.1", 8000, None, str(proc)) == "port 8000 on 127.0.0.1 is in use by another process"
    )


def test_start_checks_the_bind_before_it_configures_or_stops_anything():
    tasks = yaml.safe_load((ROOT / "roles/engine_service/tasks/start.yml").read_text())
    names = [t.get("name", "") for t in tasks]
    check = next(i for i, n in enumerate(names) if n.startswith("The API can listen where the settings say"))
    assert names.index("Read the engine state") < check < names.index("Configure the engine")
    assert check < names.index(
        "Restart the cluster in order (rank 0 stops first, the workers start first, rank 0 last)"
    )
    restart = yaml.safe_load((ROOT / "roles/engine_service/tasks/restart.yml").read_text())
    assert "Stop the cluster in order" in [t.get("name", "") for t in restart]
    probe = yaml.safe_load((ROOT / "roles/engine_service/tasks/probe.yml").read_text())
    node = next(t for t in probe if "sparkfleet.cluster.engine_node" in t)
    assert "engine_service_host" in node["sparkfleet.cluster.engine_node"]["binds"]

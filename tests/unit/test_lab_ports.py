"""lab/sparkfleet_lab/ports.py: the lab's listeners get ports below the kernel's ephemeral range, free when
chosen, for TCP and UDP (a port from the ephemeral range can be taken by any outgoing connection before the
listener binds it: a CI rehearsal's engine double failed so)."""

from __future__ import annotations

import socket

import pytest
from sparkfleet_lab import ports
from sparkfleet_lab.engine import local


@pytest.mark.parametrize("kind", [socket.SOCK_STREAM, socket.SOCK_DGRAM], ids=["tcp", "udp"])
def test_a_free_port_below_the_ephemeral_range_binds(kind):
    low = ports.ephemeral_low()
    port = ports.free_port(kind, "127.0.0.1")
    assert ports.LOWEST <= port < low
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_not_chosen(monkeypatch):
    held = socket.socket()
    held.bind(("0.0.0.0", 0))  # noqa: S104 - the probe binds 0.0.0.0 too
    taken = held.getsockname()[1]
    draws = iter([taken, taken + 1])  # the first draw is held: the second is taken
    monkeypatch.setattr(ports, "LOWEST", 1024)
    monkeypatch.setattr(ports, "ephemeral_low", lambda: 65535)
    monkeypatch.setattr(ports.random.SystemRandom, "randrange", lambda self, a, b: next(draws))
    try:
        assert ports.free_port() == taken + 1
    finally:
        held.close()


def test_the_engine_doubles_ports_come_from_there():
    port = local.free_port()
    assert ports.LOWEST <= port < ports.ephemeral_low()

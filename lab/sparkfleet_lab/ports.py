"""Ports for the lab's own listeners on this machine: the engine double's API and rendezvous ports
(engine/local.py), the VM lab's forwarded SSH ports and socket links (vm/lab.py), the tests' receivers.

Chosen below the kernel's ephemeral range (net.ipv4.ip_local_port_range), never by binding port 0, which
hands out a port from that very range: between the choice and the listener's own bind, the port can become
the source port of any outgoing connection on the machine (CI runs three lanes of SSH beside the unit tests),
or, for the engine double's rendezvous port that worker ranks keep connecting to before rank 0 listens, of a
worker's own connect (TCP's self-connect, source port = destination port); the listener then fails with
"Address already in use". A CI rehearsal failed so: rank 0 of the TP3 double could not listen on 44625.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10000  # below: well-known and commonly configured service ports


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 when it cannot be read)."""
    try:
        return int(RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(kind: int = socket.SOCK_STREAM, address: str = "0.0.0.0") -> int:  # noqa: S104 - a probe bind
    """A port of `kind` (TCP or UDP) that nothing holds on `address` now, below the ephemeral range."""
    low = ephemeral_low()
    if low <= LOWEST + 1000:
        raise RuntimeError(f"{RANGE}: the ephemeral range starts at {low}, leaving the lab no ports below it")
    pick = random.SystemRandom()
    for _ in range(500):
        port = pick.randrange(LOWEST, low)
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind((address, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port between {LOWEST} and {low} on {address} after 500 tries")

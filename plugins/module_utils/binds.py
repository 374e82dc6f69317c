# sparkfleet: whether a listener could bind an address and port on this node (stdlib only).
"""Tried with the call the engine's API server makes when it starts (bind), never by reading tables: an
address this node does not have fails with EADDRNOTAVAIL, a port another process listens on with
EADDRINUSE. The socket is closed at once; nothing listens and nothing is sent."""

from __future__ import annotations

import errno
import socket


def bind_problem(host: str, port: int, ours_listening: bool = False) -> str | None:
    """Why binding (host, port) would fail here, in words; None when it would work. `ours_listening`: the
    engine is running, so the port in use is (or may be) its own and is not a problem."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"{host!r} does not resolve on this node ({exc.strerror})"
    family, kind, proto, _name, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                return f"{host} is not an address of this node ({exc.strerror})"
            if exc.errno == errno.EADDRINUSE:
                return None if ours_listening else f"port {port} on {host} is in use by another process"
            return f"{host} port {port}: {exc.strerror}"
    return None

# sparkfleet: whether a listener could bind an address and port on this node (stdlib only).
"""Tried with the call the engine's API server makes when it starts (bind), never by reading tables: an
address this node does not have fails with EADDRNOTAVAIL, a port another process listens on with
EADDRINUSE. The socket is closed at once; nothing listens and nothing is sent.

A port in use is then traced to the processes listening on it (/proc/net/tcp and tcp6: the socket's
inode; /proc/PID/fd: who holds it): a listener inside the running engine container (the same PID
namespace as the container's main process: the engine runs with the host's network) is the engine's own
and no problem; anyone else's is named with its command and PID."""

from __future__ import annotations

import errno
import os
import socket

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def _listening_inodes(port: int, proc: str) -> set[str]:
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc, "net", table), encoding="ascii") as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def pid_namespace(pid: int | str, proc: str = "/proc") -> str:
    """The PID namespace of a process (`pid:[4026531836]`), "" when it cannot be read."""
    try:
        return os.readlink(os.path.join(proc, str(pid), "ns", "pid"))
    except OSError:
        return ""


def listeners(port: int, proc: str = "/proc") -> list[dict]:
    """The processes that hold a socket listening on `port` (TCP, IPv4 or IPv6): pid, comm, pid_ns."""
    inodes = _listening_inodes(port, proc)
    found = []
    if not inodes:
        return found
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for pid in (d for d in os.listdir(proc) if d.isdigit()):
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(os.path.join(fd_dir, fd)) in wanted:
                    comm = _read(os.path.join(proc, pid, "comm"))
                    found.append({"pid": int(pid), "comm": comm, "pid_ns": pid_namespace(pid, proc)})
                    break
            except OSError:
                continue
    return found


def bind_problem(host: str, port: int, engine_pid: int | None = None, proc: str = "/proc") -> str | None:
    """Why binding (host, port) would fail here, in words; None when it would work. `engine_pid`: the main
    process of the running engine container (None: the engine does not run); a port its processes listen on
    is the engine's own and no problem."""
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
                return _in_use(host, port, engine_pid, proc)
            return f"{host} port {port}: {exc.strerror}"
    return None


def _in_use(host: str, port: int, engine_pid: int | None, proc: str) -> str | None:
    holders = listeners(port, proc)
    ours = pid_namespace(engine_pid, proc) if engine_pid else ""
    others = [h for h in holders if not ours or h["pid_ns"] != ours]
    if holders and not others:
        return None  # the running engine's own listener
    if not holders:
        if engine_pid:
            return None  # not traced (another network namespace, /proc hidden): taken to be the engine's
        return f"port {port} on {host} is in use by another process"
    who = ", ".join(f"{h['comm'] or '?'} (pid {h['pid']})" for h in others)
    return f"port {port} on {host} is in use by {who}" + (", not by the running engine" if engine_pid else "")

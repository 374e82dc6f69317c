"""Ctrl-C: the first one asks ansible to stop, a second one (or the end of a grace period) has
ansible-runner kill it; afterwards what ansible left running below it is stopped too."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

# After the first Ctrl-C ansible gets this long to stop by itself before it is killed.
INTERRUPT_GRACE_S = 10.0


def _ansible_children() -> list[int]:
    """Our ansible-playbook child processes (Linux /proc; empty elsewhere)."""
    me = os.getpid()
    found = []
    for pid, (ppid, _start) in _proc_table().items():
        if ppid != me:
            continue
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as fh:
            if b"ansible-playbook" in fh.read():
                found.append(pid)
    return found


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, start time) of every live process (Linux /proc; empty elsewhere)."""
    table: dict[int, tuple[int, int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
            fields = stat[stat.rindex(b")") + 2 :].split()
            if fields[0] != b"Z":
                table[int(entry)] = (int(fields[1]), int(fields[19]))
        except (OSError, ValueError, IndexError):
            continue
    return table


def _descendants(root: int) -> dict[int, int]:
    """pid -> start time of every live process below `root`."""
    table = _proc_table()
    below: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, (ppid, _) in table.items() if ppid in frontier} - below
        below |= frontier
    return {pid: table[pid][1] for pid in below}


class Interrupt:
    """First Ctrl-C: ask ansible to stop (SIGINT to its process group). Second, or after a grace
    period: tell ansible-runner to cancel, which kills the group."""

    def __init__(self, grace: float = INTERRUPT_GRACE_S, tick: Callable[[], None] | None = None) -> None:
        self.grace = grace
        self.tick = tick
        self.count = 0
        self.first_at: float | None = None
        self.forwarded = False
        self.tree: dict[int, int] = {}  # what ran below ansible at the first Ctrl-C: pid -> start time
        self._saved: dict[int, Any] = {}

    @property
    def interrupted(self) -> bool:
        return self.count > 0

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._saved[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()

    def _handle(self, signum: int, frame: object) -> None:
        self.count += 1
        if self.count == 1:
            self.first_at = time.monotonic()
            children = _ansible_children()
            # What runs below ansible, read before it is signalled: once a worker dies of the SIGINT its
            # task processes are re-parented (to init) and would no longer be found below ansible.
            for pid in children:
                self.tree.update(_descendants(pid))
            for pid in children:
                with contextlib.suppress(OSError):
                    if os.getpgid(pid) == pid:
                        os.killpg(pid, signal.SIGINT)
                    else:
                        os.kill(pid, signal.SIGINT)
                    self.forwarded = True

    def reap(self) -> list[int]:
        """After ansible ended: stop what it left running below it (the same pids, not reused ones).
        mitogen's task processes ignore SIGINT (inherited from its workers) and outlive ansible."""
        table = _proc_table()
        left = [pid for pid, start in self.tree.items() if pid in table and table[pid][1] == start]
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        return left

    def cancel(self) -> bool:
        """ansible-runner's cancel_callback: called about once a second while ansible runs."""
        if self.tick is not None:
            with contextlib.suppress(Exception):
                self.tick()
        if not self.interrupted:
            return False
        if not self.forwarded or self.count > 1:
            return True
        return self.first_at is not None and time.monotonic() - self.first_at > self.grace

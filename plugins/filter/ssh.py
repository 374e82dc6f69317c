"""ssh_trust filters: which names and addresses the head reaches each worker by, and readable
failures. Pure Python, unit-tested."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


def ssh_names(worker: str, plan: Mapping[str, Any], fabric: bool = True) -> list[str]:
    """The worker's inventory name, its management address and (with `fabric`) its addresses on the
    cables to the head, in that order."""
    names = [worker, str(plan["mgmt_addresses"][worker])]
    if fabric:
        for rail in plan["interfaces"][plan["head"]]:
            if rail["peer_host"] == worker and rail["peer_address"] not in names:
                names.append(rail["peer_address"])
    return names


def ssh_targets(names: Mapping[str, list[str]], plan: Mapping[str, Any]) -> list[list[str]]:
    """[worker, address] for every address the head must reach (inventory names excluded: those are
    ssh config aliases, checked separately)."""
    out = []
    for worker, values in names.items():
        for v in values:
            if v not in plan["hosts_by_rank"]:
                out.append([worker, v])
    return out


def ssh_sources(plan: Mapping[str, Any], head: str, worker: str) -> list[str]:
    """The addresses the head's connections to `worker` come from: its management address and its
    fabric addresses on the cables to that worker."""
    out = [str(plan["mgmt_addresses"][head])]
    for rail in plan["interfaces"][head]:
        if rail["peer_host"] == worker and rail["address"] not in out:
            out.append(rail["address"])
    return out


def any_changed(hostvars: Mapping, hosts: list[str], names: list[str]) -> bool:
    """Whether any of the registered results `names` changed on any of `hosts`."""
    for h in hosts:
        hv = hostvars[h]
        for n in names:
            if n in hv:
                r = hv[n]
                if isinstance(r, Mapping) and r.get("changed"):
                    return True
    return False


def ssh_failures(stdout: str | list[str], expected: list[list[str]]) -> list[str]:
    """Failed reachability checks. `stdout` has one line per target:
    "SSH <worker> <target> rc=<rc> <last stderr line>"; `expected` lists [worker, target] pairs
    (target = the worker's name for the check through the ssh config). A missing line is a failure."""
    seen: dict[tuple[str, str], tuple[int, str]] = {}
    lines = stdout if isinstance(stdout, list) else str(stdout or "").splitlines()
    for line in lines:
        m = re.match(r"^SSH (\S+) (\S+) rc=(\d+)\s*(.*)$", line.strip())
        if m:
            seen[(m.group(1), m.group(2))] = (int(m.group(3)), m.group(4).strip())
    out = []
    for worker, target in expected:
        rc, err = seen.get((str(worker), str(target)), (None, "no result"))
        if rc == 0:
            continue
        where = f"{worker} (by name, ~/.ssh/config)" if target == worker else f"{worker} at {target}"
        out.append(f"{where}: {err or f'exit {rc}'}")
    return out


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "ssh_names": ssh_names,
            "ssh_targets": ssh_targets,
            "ssh_sources": ssh_sources,
            "any_changed": any_changed,
            "ssh_failures": ssh_failures,
        }

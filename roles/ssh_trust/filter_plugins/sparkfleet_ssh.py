"""ssh_trust filters: which names and addresses the head reaches each worker by, and readable
failures. Pure Python, unit-tested."""

from __future__ import annotations

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


def ssh_failure(result: Mapping[str, Any]) -> str:
    item = result.get("item")
    where = f"{item[0]} at {item[1]}" if isinstance(item, list | tuple) else f"{item} (by name)"
    err = [ln for ln in str(result.get("stderr", "")).splitlines() if ln.strip()]
    return f"{where}: {err[-1].strip() if err else 'exit ' + str(result.get('rc'))}"


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "sparkfleet_ssh_names": ssh_names,
            "sparkfleet_ssh_targets": ssh_targets,
            "sparkfleet_ssh_sources": ssh_sources,
            "sparkfleet_any_changed": any_changed,
            "sparkfleet_ssh_failure": ssh_failure,
        }

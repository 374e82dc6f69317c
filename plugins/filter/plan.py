"""The cluster plan: ranks, the head, and the fabric addressing plan, computed from the inventory.

`sparkfleet_plan_problems` lists what is wrong with the inputs (each line names the variable, the
value and the fix); `sparkfleet_cluster_plan` computes the plan (see docs/CONTRACTS.md "The
cluster plan") and refuses inputs with problems. Both take the same inputs:

  hosts       {inventory_hostname: {"node": sparkfleet_node, "mgmt_address": str, "group": "head"|"workers"}}
  topology    "tp2" | "tp3"
  cabling     [{"a": {"node": int, "port": int}, "b": {...}}, ...]   (cluster_plan_cabling)
  port_netdevs {port: [{"rail": int, "netdev": str, "hca": str}, ...]} (cluster_plan_port_netdevs)
  subnet_template  "10.{lo}{hi}.{rail}.0/24" (cluster_plan_subnet_template)

Pure Python (no Ansible objects inside) so it is unit-tested directly.
"""

from __future__ import annotations

import ipaddress
import itertools
import string
from collections.abc import Mapping
from typing import Any

from ansible_collections.sparkfleet.cluster.plugins.module_utils.cluster_constants import NODE_COUNT

PLACEHOLDER = "CHANGE-ME"
TEMPLATE_FIELDS = {"lo", "hi", "rail", "a", "b", "cable"}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _norm_ports(port_netdevs: Any, problems: list[str]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    if not isinstance(port_netdevs, Mapping) or not port_netdevs:
        problems.append(
            f"cluster_plan_port_netdevs={port_netdevs!r}: expected a mapping port -> list of "
            "{rail, netdev, hca}; keep the ConnectX-7 table of roles/cluster_plan/defaults/main.yml"
        )
        return out
    for key, rails in port_netdevs.items():
        try:
            port = int(key)
        except (TypeError, ValueError):
            problems.append(f"cluster_plan_port_netdevs key {key!r}: expected a port number (0, 1)")
            continue
        ok = isinstance(rails, list) and rails
        for r in rails if ok else []:
            if not (
                isinstance(r, Mapping)
                and _is_int(r.get("rail"))
                and isinstance(r.get("netdev"), str)
                and r["netdev"]
                and isinstance(r.get("hca"), str)
                and r["hca"]
            ):
                ok = False
        if not ok:
            problems.append(
                f"cluster_plan_port_netdevs[{key}]={rails!r}: expected a list of "
                "{rail: <int>, netdev: <name>, hca: <RDMA device>}"
            )
            continue
        nums = [r["rail"] for r in rails]
        if len(set(nums)) != len(nums):
            problems.append(
                f"cluster_plan_port_netdevs[{key}]: rail numbers {nums} repeat; give each half its own rail"
            )
            continue
        out[port] = sorted(rails, key=lambda r: r["rail"])
    return out


def _cable_name(a: Mapping, b: Mapping) -> str:
    return f"n{a['node']}p{a['port']}-n{b['node']}p{b['port']}"


def _subnet(template: str, a: Mapping, b: Mapping, rail: int, index: int) -> ipaddress.IPv4Network:
    lo, hi = sorted((a["node"], b["node"]))
    text = template.format(lo=lo, hi=hi, rail=rail, a=a["port"], b=b["port"], cable=index)
    return ipaddress.IPv4Network(text, strict=True)


def _hosts_problems(
    hosts: Mapping[str, Mapping[str, Any]], topology: Any
) -> tuple[list[str], dict[int, str]]:
    """Topology, one head, group size, node numbers; returns the problems and {node: host}."""
    problems: list[str] = []
    if topology not in NODE_COUNT:
        problems.append(
            f"sparkfleet_topology={topology!r}: expected tp2 (two Sparks, one cable) or tp3 "
            "(three Sparks, every pair cabled); set it in group_vars/all/cluster.yml"
        )
    heads = [h for h, v in hosts.items() if v.get("group") == "head"]
    if len(heads) != 1:
        problems.append(
            f"group head={heads}: expected exactly one host (rank 0, the Spark that serves the API); "
            "put one host under cluster > head in hosts.yml and the others under workers"
        )
    if topology in NODE_COUNT and len(hosts) != NODE_COUNT[topology]:
        problems.append(
            f"group cluster={sorted(hosts)} has {len(hosts)} hosts: {topology} needs exactly "
            f"{NODE_COUNT[topology]}; fix hosts.yml or sparkfleet_topology"
        )
    by_node: dict[int, str] = {}
    for host, v in sorted(hosts.items()):
        node = v.get("node")
        if not _is_int(node) or not 1 <= node <= 9:
            problems.append(
                f"{host}: sparkfleet_node={node!r}: expected a whole number 1..9 without quotes "
                "(the Spark's number in the cabling plan and the host part of its fabric addresses)"
            )
        elif node in by_node:
            problems.append(
                f"{host}: sparkfleet_node={node} is also {by_node[node]}'s: give every Spark its own number"
            )
        else:
            by_node[node] = host
    return problems, by_node


def _template_problems(template: Any) -> list[str]:
    if not isinstance(template, str):
        return [
            f"cluster_plan_subnet_template={template!r}: expected a string like "
            "'10.{lo}{hi}.{rail}.0/24'"
        ]
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as exc:
        return [f"cluster_plan_subnet_template={template!r}: {exc}; use e.g. '10.{{lo}}{{hi}}.{{rail}}.0/24'"]
    if fields - TEMPLATE_FIELDS or "rail" not in fields or not ({"lo", "hi"} <= fields or "cable" in fields):
        return [
            f"cluster_plan_subnet_template={template!r}: placeholders {sorted(fields)}; it must use "
            "{rail} and either {lo}{hi} (the cable's node numbers) or {cable}, and only "
            f"{sorted(TEMPLATE_FIELDS)}, so that every rail of every cable gets its own subnet"
        ]
    return []


def _end_problems(
    i: int, side: str, end: Any, by_node: Mapping[int, str], ports: Mapping[int, list], *, used: dict
) -> list[str]:
    if not (isinstance(end, Mapping) and _is_int(end.get("node")) and _is_int(end.get("port"))):
        return [f"cluster_plan_cabling[{i}].{side}={end!r}: expected {{node: <sparkfleet_node>, port: 0|1}}"]
    problems = []
    if by_node and end["node"] not in by_node:
        problems.append(
            f"cluster_plan_cabling[{i}].{side}.node={end['node']}: no host has that sparkfleet_node "
            f"(nodes: {sorted(by_node)}); fix the cable or the host's number"
        )
    if ports and end["port"] not in ports:
        problems.append(
            f"cluster_plan_cabling[{i}].{side}.port={end['port']}: a Spark has ports {sorted(ports)} "
            "(QSFP cage 0 or 1)"
        )
    key = (end["node"], end["port"])
    if key in used:
        problems.append(
            f"cluster_plan_cabling[{i}].{side}=node {key[0]} port {key[1]} is already used by "
            f"cluster_plan_cabling[{used[key]}]: each port takes one cable"
        )
    used.setdefault(key, i)
    return problems


def _cabling_problems(
    cabling: Any, by_node: Mapping[int, str], ports: Mapping[int, list], topology: Any
) -> list[str]:
    if not isinstance(cabling, list) or not cabling:
        return [
            f"cluster_plan_cabling={cabling!r}: expected a list of cables "
            "[{a: {node: N, port: P}, b: {node: M, port: Q}}]; remove the override to use the "
            'default cabling of the topology (docs/recipes.md "Cabling and addressing")'
        ]
    problems: list[str] = []
    used: dict[tuple[int, int], int] = {}
    pairs: set[frozenset[int]] = set()
    for i, cable in enumerate(cabling):
        ends = [cable.get(side) if isinstance(cable, Mapping) else None for side in ("a", "b")]
        found = []
        for side, end in zip(("a", "b"), ends, strict=True):
            found += _end_problems(i, side, end, by_node, ports, used=used)
        problems += found
        if found:
            continue
        a, b = ends
        if a["node"] == b["node"]:
            problems.append(
                f"cluster_plan_cabling[{i}] connects node {a['node']} to itself: "
                "a cable joins two different Sparks"
            )
        pairs.add(frozenset((a["node"], b["node"])))
        if ports:
            ra = [r["rail"] for r in ports[a["port"]]]
            rb = [r["rail"] for r in ports[b["port"]]]
            if ra != rb:
                problems.append(
                    f"cluster_plan_cabling[{i}]: port {a['port']} has rails {ra}, port {b['port']} has {rb}: "
                    "both ends of a cable need the same rails (cluster_plan_port_netdevs)"
                )
    nodes = sorted(by_node)
    if not problems and topology in NODE_COUNT and len(nodes) == NODE_COUNT[topology]:
        missing = [f"{a}-{b}" for a, b in itertools.combinations(nodes, 2) if frozenset((a, b)) not in pairs]
        if missing:
            problems.append(
                f"cluster_plan_cabling: no cable between nodes {', '.join(missing)}: {topology} connects "
                "every pair of Sparks directly (TP3 ring N1.P0-N2.P1, N2.P0-N3.P1, N3.P0-N1.P1)"
            )
    return problems


def plan_problems(
    hosts: Mapping[str, Mapping[str, Any]],
    topology: Any,
    cabling: Any,
    port_netdevs: Any,
    subnet_template: Any,
) -> list[str]:
    problems, by_node = _hosts_problems(hosts, topology)
    ports = _norm_ports(port_netdevs, problems)
    template = _template_problems(subnet_template)
    problems += template
    problems += _cabling_problems(cabling, by_node, ports, topology)
    if not problems:
        problems += _address_problems(hosts, by_node, cabling, ports, subnet_template)
    return problems


def _address_problems(
    hosts: Mapping[str, Mapping[str, Any]],
    by_node: Mapping[int, str],
    cabling: list,
    ports: Mapping[int, list[dict]],
    template: str,
) -> list[str]:
    problems: list[str] = []
    seen: dict[ipaddress.IPv4Network, str] = {}
    for i, cable in enumerate(cabling):
        a, b = cable["a"], cable["b"]
        for r in ports[a["port"]]:
            where = f"{_cable_name(a, b)} rail {r['rail']}"
            try:
                net = _subnet(template, a, b, r["rail"], i)
            except (ValueError, KeyError, IndexError) as exc:
                problems.append(
                    f"cluster_plan_subnet_template={template!r} gives no valid IPv4 subnet for {where} "
                    f"({exc}); use a network address with a prefix, e.g. '10.{{lo}}{{hi}}.{{rail}}.0/24'"
                )
                continue
            for node in (a["node"], b["node"]):
                if node >= net.num_addresses - 1:
                    problems.append(
                        f"cluster_plan_subnet_template={template!r}: {net} for {where} has no host {node}; "
                        "use a larger subnet (e.g. /24)"
                    )
            for other, other_where in seen.items():
                if net.overlaps(other):
                    problems.append(
                        f"cluster_plan_subnet_template={template!r}: {where} gets {net}, which overlaps "
                        f"{other} of {other_where}; every rail of every cable needs its own subnet "
                        "(add {cable} or {a}{b} to the template when two cables join the same pair)"
                    )
            seen[net] = where
    for host, v in sorted(hosts.items()):
        try:
            mgmt = ipaddress.ip_address(str(v.get("mgmt_address", "")))
        except ValueError:
            continue
        for net, where in seen.items():
            if mgmt in net:
                problems.append(
                    f"{host}: management address {mgmt} lies in the fabric subnet {net} ({where}): "
                    "change cluster_plan_subnet_template or the management address"
                )
    return problems


def cluster_plan(
    hosts: Mapping[str, Mapping[str, Any]],
    topology: str,
    cabling: list,
    port_netdevs: Mapping,
    subnet_template: str,
) -> dict[str, Any]:
    problems = plan_problems(hosts, topology, cabling, port_netdevs, subnet_template)
    if problems:
        raise ValueError("cluster plan inputs are not valid:\n- " + "\n- ".join(problems))
    ports = _norm_ports(port_netdevs, [])
    by_node = {v["node"]: h for h, v in hosts.items()}
    head = next(h for h, v in hosts.items() if v.get("group") == "head")
    workers = sorted((h for h in hosts if h != head), key=lambda h: hosts[h]["node"])
    order = [head, *workers]
    links: list[dict[str, Any]] = []
    interfaces: dict[str, list[dict[str, Any]]] = {h: [] for h in order}
    for i, cable in enumerate(cabling):
        a, b = cable["a"], cable["b"]
        name = _cable_name(a, b)
        for ra, rb in zip(ports[a["port"]], ports[b["port"]], strict=True):
            net = _subnet(subnet_template, a, b, ra["rail"], i)
            ends = {}
            for side, end, r in (("a", a, ra), ("b", b, rb)):
                ends[side] = {
                    "host": by_node[end["node"]],
                    "node": end["node"],
                    "port": end["port"],
                    "netdev": r["netdev"],
                    "hca": r["hca"],
                    "address": str(net.network_address + end["node"]),
                }
            links.append(
                {
                    "cable": name,
                    "rail": ra["rail"],
                    "subnet": str(net),
                    "prefix": net.prefixlen,
                    "a": ends["a"],
                    "b": ends["b"],
                }
            )
            for me, peer in (("a", "b"), ("b", "a")):
                interfaces[ends[me]["host"]].append(
                    {
                        "netdev": ends[me]["netdev"],
                        "hca": ends[me]["hca"],
                        "address": ends[me]["address"],
                        "prefix": net.prefixlen,
                        "subnet": str(net),
                        "port": ends[me]["port"],
                        "peer_host": ends[peer]["host"],
                        "peer_node": ends[peer]["node"],
                        "peer_netdev": ends[peer]["netdev"],
                        "peer_hca": ends[peer]["hca"],
                        "peer_address": ends[peer]["address"],
                        "rail": ra["rail"],
                        "cable": name,
                    }
                )
    return {
        "topology": topology,
        "size": len(order),
        "head": head,
        "workers": workers,
        "ranks": {h: r for r, h in enumerate(order)},
        "hosts_by_rank": order,
        "nodes": {h: hosts[h]["node"] for h in order},
        "mgmt_addresses": {h: str(hosts[h]["mgmt_address"]) for h in order},
        **rendezvous(topology, head, {h: str(hosts[h]["mgmt_address"]) for h in order}, links),
        "links": links,
        "interfaces": interfaces,
    }


def rendezvous(
    topology: str, head: str, mgmt_addresses: Mapping[str, str], links: list[dict[str, Any]]
) -> dict[str, Any]:
    """Where the ranks meet (`--master`, MASTER_ADDR) and over which netdev each rank reaches it.

    TP2, as the real TP2 TensorFold receipts run it: on the fabric, rank 0's address on the first rail
    of the one cable (sfxnz's recipe: `--master 10.100.8.1`, NCCL_SOCKET_IFNAME the cabled netdev;
    neko-legends: "the head's address on NCCL_SOCKET_IFNAME"). Both ranks sit on that /24.
    TP3: on the management network, rank 0's management address (MiaAI's GLM 3x TensorFold recipe,
    LakyFx's and christopherowen's three-Spark recipes): in a triangle no fabric subnet joins all three
    ranks, so a fabric address of rank 0 is out of reach for one of the workers.
    `rendezvous.netdevs` is {host: netdev} on the fabric and empty on the management network (each rank
    then uses its management interface)."""
    if topology == "tp2" and links:
        first = links[0]  # the first cable's first rail (links follow the cabling, rails in order)
        ends = (first["a"], first["b"])
        rank0 = next(end for end in ends if end["host"] == head)
        return {
            "master_addr": rank0["address"],
            "rendezvous": {
                "network": "fabric",
                "address": rank0["address"],
                "subnet": first["subnet"],
                "netdevs": {end["host"]: end["netdev"] for end in ends},
            },
        }
    return {
        "master_addr": str(mgmt_addresses[head]),
        "rendezvous": {"network": "management", "address": str(mgmt_addresses[head]), "netdevs": {}},
    }


def _hosts_from_hostvars(hostvars: Mapping, groups: Mapping) -> dict[str, dict[str, Any]]:
    """The plan's view of the inventory, read from Ansible's hostvars and groups."""
    head = set(groups.get("head", []))
    out: dict[str, dict[str, Any]] = {}
    for host in groups.get("cluster", []):
        hv = hostvars[host]
        mgmt = (
            hv["sparkfleet_mgmt_address"] if "sparkfleet_mgmt_address" in hv else hv.get("ansible_host", host)
        )
        node = hv.get("sparkfleet_node")
        if isinstance(node, str) and node.strip().isdigit():  # `-e`/ini inventories give strings
            node = int(node.strip())
        out[host] = {
            "node": node,
            "mgmt_address": mgmt,
            "group": "head" if host in head else "workers",
        }
    return out


# Jinja passes filter arguments positionally.
def _filter_problems(hostvars, groups, topology, cabling, port_netdevs, subnet_template) -> list[str]:  # noqa: PLR0917
    return plan_problems(
        _hosts_from_hostvars(hostvars, groups), topology, cabling, port_netdevs, subnet_template
    )


def _filter_plan(hostvars, groups, topology, cabling, port_netdevs, subnet_template) -> dict[str, Any]:  # noqa: PLR0917
    from ansible.errors import AnsibleFilterError

    try:
        return cluster_plan(
            _hosts_from_hostvars(hostvars, groups), topology, cabling, port_netdevs, subnet_template
        )
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "plan_problems": _filter_problems,
            "cluster_plan": _filter_plan,
        }

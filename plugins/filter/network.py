"""network_links filters: the NCCL environment of one rank and its fabric peers (from the cluster
plan and the RDMA facts), and readable link-check failures.

The NCCL environment per topology, from the public receipts (the table with every source is in
roles/network_links/README.md):
- TP2 (one cable), as the real TP2 TensorFold receipts: rendezvous on the fabric (MASTER_ADDR = rank 0's
  address on the cable), NCCL_SOCKET_IFNAME = this rank's netdev on that rail, NCCL_IB_HCA = both RoCE
  devices of the cabled port, NCCL_DEBUG=WARN;
- TP3 (triangle), as the public three-Spark receipts: NCCL_SOCKET_IFNAME = the management interface and
  MASTER_ADDR = rank 0's management address, NCCL_IB_HCA = the RoCE devices toward both peers, the IB
  transport forced (NCCL_NET=IB, no net plugin, IB on), RoCE v2 over IPv4, subnet-aware routing and
  cross-NIC rings (each cable joins port 0 of one Spark to port 1 of the next), P2P and SHM off,
  NCCL_IB_SUBNET_PREFIX_LEN = the rails' prefix;
- NCCL_IB_GID_INDEX only when the discovered index is the same on every device of this rank (the index is
  a row of each local device's GID table; MiaAI's GLM 3x TensorFold recipe sets it that way).
Without RDMA devices on a rank, NCCL is told so (NCCL_IB_DISABLE=1) instead of being pointed at
devices that do not exist. Pure Python, unit-tested.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


def _rails(plan: Mapping[str, Any], host: str) -> list[Mapping[str, Any]]:
    ranks = plan["ranks"]
    return sorted(plan["interfaces"][host], key=lambda i: (ranks[i["peer_host"]], i["rail"]))


def uniform_gid_index(plan: Mapping[str, Any], rdma: Mapping[str, Mapping[str, Any]]) -> int | None:
    """The GID index if every planned device of every host has the same one, else None."""
    seen: set[int] = set()
    for host in plan["hosts_by_rank"]:
        facts = rdma.get(host) or {}
        if not facts.get("present"):
            return None
        by_hca = {d["hca"]: d for d in facts.get("devices", [])}
        for rail in plan["interfaces"][host]:
            idx = (by_hca.get(rail["hca"]) or {}).get("gid_index")
            if idx is None:
                return None
            seen.add(int(idx))
    return seen.pop() if len(seen) == 1 else None


# TP3 settings every public three-Spark receipt with the IB transport agrees on (sources: README table).
TP3_SETTINGS = {
    "NCCL_NET": "IB",
    "NCCL_NET_PLUGIN": "none",
    "NCCL_IB_DISABLE": "0",
    "NCCL_IB_ROCE_VERSION_NUM": "2",
    "NCCL_IB_ADDR_FAMILY": "AF_INET",
    "NCCL_IB_SUBNET_AWARE_ROUTING": "1",
    "NCCL_CROSS_NIC": "1",
    "NCCL_P2P_DISABLE": "1",
    "NCCL_SHM_DISABLE": "1",
}


def socket_ifname(plan: Mapping[str, Any], host: str, mgmt_iface: str) -> str:
    """The netdev NCCL's bootstrap sockets use: the one toward the rendezvous address."""
    netdevs = (plan.get("rendezvous") or {}).get("netdevs") or {}
    return str(netdevs.get(host) or mgmt_iface)


def node_gid_index(plan: Mapping[str, Any], rdma: Mapping[str, Mapping[str, Any]], host: str) -> int | None:
    """The GID index if every planned device of this host has the same one, else None."""
    facts = rdma.get(host) or {}
    if not facts.get("present"):
        return None
    by_hca = {d["hca"]: d for d in facts.get("devices", [])}
    seen: set[int] = set()
    for rail in plan["interfaces"][host]:
        idx = (by_hca.get(rail["hca"]) or {}).get("gid_index")
        if idx is None:
            return None
        seen.add(int(idx))
    return seen.pop() if len(seen) == 1 else None


def nccl_env(
    plan: Mapping[str, Any], host: str, rdma: Mapping[str, Mapping[str, Any]], mgmt_iface: str
) -> dict[str, str]:
    env = {
        "NCCL_SOCKET_IFNAME": socket_ifname(plan, host, mgmt_iface),
        "MASTER_ADDR": str(plan["master_addr"]),
    }
    mine = rdma.get(host) or {}
    if not mine.get("present"):
        env["NCCL_IB_DISABLE"] = "1"
        return env
    hcas: list[str] = []
    for rail in _rails(plan, host):
        if rail["hca"] not in hcas:
            hcas.append(rail["hca"])
    env["NCCL_IB_HCA"] = ",".join(hcas)
    idx = node_gid_index(plan, rdma, host)
    if idx is not None:
        env["NCCL_IB_GID_INDEX"] = str(idx)
    if plan["topology"] == "tp3":
        env.update(TP3_SETTINGS)
        prefixes = {int(r["prefix"]) for r in plan["interfaces"][host]}
        env["NCCL_IB_SUBNET_PREFIX_LEN"] = str(prefixes.pop() if len(prefixes) == 1 else 24)
    env["NCCL_DEBUG"] = "WARN"
    return env


def fabric_peers(plan: Mapping[str, Any], host: str) -> dict[str, dict[str, Any]]:
    """Per peer host: its rank and the addresses of the rails between this host and it."""
    out: dict[str, dict[str, Any]] = {}
    for rail in _rails(plan, host):
        peer = out.setdefault(
            rail["peer_host"],
            {
                "rank": plan["ranks"][rail["peer_host"]],
                "cables": [],
                "addresses": [],
                "peer_addresses": [],
                "netdevs": [],
                "hcas": [],
            },
        )
        if rail["cable"] not in peer["cables"]:
            peer["cables"].append(rail["cable"])
        peer["addresses"].append(rail["address"])
        peer["peer_addresses"].append(rail["peer_address"])
        peer["netdevs"].append(rail["netdev"])
        peer["hcas"].append(rail["hca"])
    return out


def hostvar_map(hostvars: Mapping, hosts: list[str], name: str) -> dict[str, Any]:
    """{host: hostvars[host][name]} for the hosts that have it."""
    out = {}
    for h in hosts:
        hv = hostvars[h]
        if name in hv:
            out[h] = hv[name]
    return out


def ping_failures(stdout: str, rails: list[Mapping[str, Any]]) -> list[str]:
    """Failed rails of the link check. `stdout` has one line per rail:
    "RAIL <netdev> <peer address> rc=<rc> <ping summary>"; a rail without a line failed too."""
    seen: dict[tuple[str, str], tuple[int, str]] = {}
    for line in str(stdout or "").splitlines():
        m = re.match(r"^RAIL (\S+) (\S+) rc=(\d+)\s*(.*)$", line.strip())
        if m:
            seen[(m.group(1), m.group(2))] = (int(m.group(3)), m.group(4).strip())
    out = []
    for rail in rails:
        rc, summary = seen.get((str(rail["netdev"]), str(rail["peer_address"])), (None, "no result"))
        if rc == 0:
            continue
        mine = (
            f"{rail.get('netdev')} (cable {rail.get('cable')} rail {rail.get('rail')}, {rail.get('address')})"
        )
        peer = f"{rail.get('peer_host')} {rail.get('peer_netdev')} {rail.get('peer_address')}"
        out.append(f"{mine} -> {peer}: {summary or 'no answer'}")
    return out


_BW_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$", re.M)


def bw_average(stdout: str) -> float | None:
    """BW average [Gb/sec] of ib_write_bw --report_gbits output (the last result row)."""
    rows = _BW_ROW.findall(stdout or "")
    return float(rows[-1][3]) if rows else None


def bw_lines(results: list[Mapping[str, Any]], below: float | None = None) -> list[str]:
    """One line per client run of the bandwidth test; with `below`, only runs slower than that."""
    out = []
    for r in results:
        if r.get("skipped"):
            continue
        item = r.get("item", {})
        bw = bw_average(str(r.get("stdout", "")))
        if below is not None and bw is not None and bw >= below:
            continue
        where = (
            f"{item.get('cable')} rail {item.get('rail')} {item['a']['hca']} <-> "
            f"{item['b']['host']} {item['b']['hca']}"
        )
        out.append(
            f"{where}: {bw:g} Gb/s both ways" if bw is not None else f"{where}: no result ({r.get('rc')})"
        )
    return out


# ---- cabling discovery ---------------------------------------------------------------------------


def _port_of(port_netdevs: Mapping) -> dict[str, tuple[int, int]]:
    """netdev -> (port, rail) from cluster_plan_port_netdevs."""
    out = {}
    for port, rails in (port_netdevs or {}).items():
        for r in rails or []:
            out[str(r["netdev"])] = (int(port), int(r["rail"]))
    return out


def _end_text(host: str, netdev: str, port: int | None, address: str = "") -> str:
    where = f"port {port}" if port is not None else "port ?"
    return f"{host} {netdev} ({where}{', ' + address if address else ''})"


def _actual_peer(
    answers: list, mac_owner: Mapping[str, tuple[str, str]], addr_owner: Mapping[str, str]
) -> tuple[str, str | None] | None:
    """(host, netdev or None) at the far end of a port, from the ARP answers it got."""
    owners = {mac_owner[a["mac"]] for a in answers if a.get("mac") in mac_owner}
    if len(owners) == 1:
        return next(iter(owners))
    hosts = {addr_owner[a["address"]] for a in answers if a.get("address") in addr_owner}
    if not owners and len(hosts) == 1:
        return next(iter(hosts)), None
    return None


def _orient(pair: frozenset, planned: list[dict]) -> tuple[int, dict]:
    """A discovered cable as {a, b}, oriented and placed as in the plan where the plan has it."""
    for i, cable in enumerate(planned):
        ends = frozenset(((cable["a"]["node"], cable["a"]["port"]), (cable["b"]["node"], cable["b"]["port"])))
        if ends == pair:
            return i, {"a": dict(cable["a"]), "b": dict(cable["b"])}
    a_ends = {(c["a"]["node"], c["a"]["port"]) for c in planned}
    x, y = sorted(pair)
    if y in a_ends and x not in a_ends:
        x, y = y, x
    return len(planned), {"a": {"node": x[0], "port": x[1]}, "b": {"node": y[0], "port": y[1]}}


def _expected(exp: Mapping[str, Any] | None, planned: Mapping) -> dict[str, Any] | None:
    if exp is None:
        return None
    peer_entry = planned.get((str(exp["peer_host"]), str(exp["peer_netdev"]))) or {}
    return {
        "host": exp["peer_host"],
        "netdev": exp["peer_netdev"],
        "port": peer_entry.get("port"),
        "address": exp["peer_address"],
    }


def _rail_line(
    host: str, netdev: str, mine: tuple, port: Mapping, *, expected: Mapping | None, actual
) -> str:
    head = _end_text(host, netdev, mine[0]) + (f" rail {mine[1]}" if mine[1] else "")
    if actual is not None:
        act_text = _end_text(actual["host"], actual["netdev"] or "?", actual["port"])
    elif port.get("state") != "up":
        act_text = f"unknown: {port.get('error') or port.get('state')}"
    else:
        act_text = "nothing (no answer to any planned fabric address)"
    if expected and actual and (actual["host"], actual["netdev"]) == (expected["host"], expected["netdev"]):
        return f"{head}: as planned, {act_text}"
    exp_text = (
        _end_text(expected["host"], expected["netdev"], expected["port"], expected["address"])
        if expected
        else "no cable (not in the plan)"
    )
    return f"{head}: expected {exp_text}, found {act_text}"


def _cables(reach: Mapping, nodes: Mapping[str, int], problems: list[str]) -> list[frozenset]:
    """The real cables as pairs of (node, port), from what each port of each node reached."""
    pairs: list[frozenset] = []
    for (host, port), peers in sorted(reach.items()):
        if len(peers) != 1 or None in {p for _, p in peers}:
            reached = ", ".join(sorted(f"{h} port {'?' if p is None else p}" for h, p in peers))
            problems.append(f"{host} port {port}: its rails reach {reached}: one cable per port expected")
            continue
        peer_host, peer_port = next(iter(peers))
        back = reach.get((peer_host, peer_port))
        if back is not None and back != {(host, port)}:
            problems.append(
                f"{host} port {port} reaches {peer_host} port {peer_port}, which reaches "
                + ", ".join(sorted(f"{h} port {p}" for h, p in back))
            )
            continue
        if host not in nodes or peer_host not in nodes:
            continue
        pair = frozenset(((nodes[host], port), (nodes[peer_host], peer_port)))
        if pair not in pairs:
            pairs.append(pair)
    return pairs


def cabling_text(cabling: list) -> list[str]:
    """cluster_plan_cabling as the YAML lines of group_vars (flow style, one cable a line)."""
    return [
        f"  - {{a: {{node: {c['a']['node']}, port: {c['a']['port']}}}, "
        f"b: {{node: {c['b']['node']}, port: {c['b']['port']}}}}}"
        for c in cabling
    ]


def _ports(result: object) -> Mapping | None:
    """fabric_neighbors' ports from its result (or the ports themselves); None for a skipped or failed one."""
    if not isinstance(result, Mapping):
        return None
    if "ports" in result:
        return result["ports"] if isinstance(result["ports"], Mapping) else None
    return result if result and all(isinstance(v, Mapping) for v in result.values()) else None


def cabling_discovery(
    found: Mapping[str, Mapping[str, Any]],
    plan: Mapping[str, Any],
    port_netdevs: Mapping,
    cabling: list | None = None,
) -> dict[str, Any]:
    """What every fabric port is really cabled to, against the plan.

    `found`: per host, fabric_neighbors' `ports` ({netdev: {mac, state, answers, error}}). Returns `rails`
    (each probed port that is planned or reached something: expected vs actual), `lines` per host, `cabling`
    (the cluster_plan_cabling of the real cables; a cable the current `cabling` has keeps its place and
    orientation), `cabling_text`, `problems` (what keeps `cabling` from being whole) and `matches_plan`."""
    found = {h: _ports(r) for h, r in found.items() if _ports(r) is not None}
    ports_of = _port_of(port_netdevs)
    nodes = {h: int(n) for h, n in (plan.get("nodes") or {}).items()}
    mac_owner = {
        str(port["mac"]).lower(): (host, netdev)
        for host, ports in found.items()
        for netdev, port in (ports or {}).items()
        if port.get("mac")
    }
    addr_owner = {str(r["address"]): h for h, rails in plan["interfaces"].items() for r in rails}
    planned = {(h, str(r["netdev"])): r for h, rails in plan["interfaces"].items() for r in rails}
    rails_out: list[dict[str, Any]] = []
    lines: dict[str, list[str]] = {h: [] for h in plan["hosts_by_rank"]}
    reach: dict[tuple[str, int], set[tuple[str, int | None]]] = {}
    problems: list[str] = []
    for host in plan["hosts_by_rank"]:
        if found.get(host) is None:
            problems.append(f"{host}: not probed (unreachable, or not in this run)")
            continue
        for netdev, port in found[host].items():
            mine = ports_of.get(netdev, (None, None))
            answers = [{**a, "mac": str(a.get("mac", "")).lower()} for a in port.get("answers") or []]
            peer = _actual_peer(answers, mac_owner, addr_owner)
            expected = _expected(planned.get((host, netdev)), planned)
            if expected is None and peer is None:
                continue  # an unplanned port that reaches nothing: nothing to say
            actual = None
            if peer is not None:
                peer_port = ports_of.get(peer[1], (None, None))[0] if peer[1] else None
                actual = {"host": peer[0], "netdev": peer[1], "port": peer_port}
                if mine[0] is not None:
                    reach.setdefault((host, mine[0]), set()).add((peer[0], peer_port))
            line = _rail_line(host, netdev, mine, port, expected=expected, actual=actual)
            ok = ": as planned, " in line
            lines[host].append(line)
            rails_out.append(
                {
                    "host": host,
                    "netdev": netdev,
                    "port": mine[0],
                    "rail": mine[1],
                    "state": port.get("state"),
                    "expected": expected,
                    "actual": actual,
                    "ok": ok,
                    "line": line,
                }
            )
            if expected is not None and actual is None:
                problems.append(line)
    current = [{"a": dict(c["a"]), "b": dict(c["b"])} for c in cabling or []]
    placed = sorted(
        (_orient(p, current) for p in _cables(reach, nodes, problems)),
        key=lambda x: (x[0], x[1]["a"]["node"], x[1]["a"]["port"]),
    )
    found_cabling = [c for _, c in placed]
    same = sorted(map(str, found_cabling)) == sorted(map(str, current))
    return {
        "rails": rails_out,
        "lines": lines,
        "cabling": found_cabling,
        "cabling_text": cabling_text(found_cabling),
        "problems": problems,
        "matches_plan": same and not problems,
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "nccl_env": nccl_env,
            "fabric_peers": fabric_peers,
            "uniform_gid_index": uniform_gid_index,
            "node_gid_index": node_gid_index,
            "hostvar_map": hostvar_map,
            "ping_failures": ping_failures,
            "bw_lines": bw_lines,
            "cabling_discovery": cabling_discovery,
        }

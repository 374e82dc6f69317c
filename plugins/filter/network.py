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
        }

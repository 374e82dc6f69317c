# RDMA devices of the fabric rails, read from sysfs: port state, rate, the RoCE v2 GID of each rail's address.
# Shared by rdma_facts (the read on its own) and fabric_links (the same read in its round trip when it changed
# nothing). Standard library only.
from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import asdict, dataclass, field

ROCE_V2 = "RoCE v2"


@dataclass
class Device:
    hca: str
    netdev: str
    address: str
    found: bool = False
    state: str = ""
    active: bool = False
    phys_state: str = ""
    rate: str = ""
    rate_gbps: float | None = None
    gid_index: int | None = None
    gid: str = ""
    netdevs: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except OSError:  # missing, or EINVAL as the kernel answers for unused GID entries
        return None


def parse_state(text: str | None) -> str:
    """'4: ACTIVE' -> 'ACTIVE'."""
    if not text:
        return ""
    return text.split(":", 1)[-1].strip()


def parse_rate(text: str | None) -> float | None:
    """'200 Gb/sec (2X NDR)' -> 200.0."""
    m = re.match(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec", text or "")
    return float(m.group(1)) if m else None


def list_hcas(sysfs_root: str) -> list[str]:
    base = os.path.join(sysfs_root, "class", "infiniband")
    try:
        return sorted(os.listdir(base))
    except OSError:
        return []


def find_gid_index(port_dir: str, ipv4: str, netdev: str | None = None) -> tuple[int | None, str]:
    """The lowest index whose GID is ::ffff:<ipv4> and whose type is RoCE v2 (and, where sysfs
    names the netdev, on that netdev). Returns (index, gid text) or (None, "")."""
    want = ipaddress.IPv6Address(f"::ffff:{ipv4}")
    gids = os.path.join(port_dir, "gids")
    try:
        names = os.listdir(gids)
    except OSError:
        return None, ""
    for name in sorted((n for n in names if n.isdigit()), key=int):
        text = _read(os.path.join(gids, name))
        try:
            gid = ipaddress.IPv6Address(text or "")
        except ValueError:
            continue
        if gid != want:
            continue
        if _read(os.path.join(port_dir, "gid_attrs", "types", name)) != ROCE_V2:
            continue
        ndev = _read(os.path.join(port_dir, "gid_attrs", "ndevs", name))
        if netdev and ndev and ndev != netdev:
            continue
        return int(name), text or ""
    return None, ""


def inspect(sysfs_root: str, links: list[dict], min_rate_gbps: float = 200, port: int = 1) -> dict:
    hcas = list_hcas(sysfs_root)
    out: dict = {"present": bool(hcas), "devices": [], "problems": [], "gid_indexes": []}
    if not hcas:
        return out
    for link in links:
        dev = Device(hca=str(link["hca"]), netdev=str(link["netdev"]), address=str(link["address"]))
        out["devices"].append(dev)
        base = os.path.join(sysfs_root, "class", "infiniband", dev.hca)
        if dev.hca not in hcas:
            dev.problems.append(
                f"RDMA device {dev.hca} (for {dev.netdev}) is missing under {sysfs_root}/class/infiniband "
                f"(present: {', '.join(hcas)}); check the ConnectX-7 driver, or cluster_plan_port_netdevs"
            )
            continue
        dev.found = True
        try:
            dev.netdevs = sorted(os.listdir(os.path.join(base, "device", "net")))
        except OSError:
            dev.netdevs = []
        if dev.netdevs and dev.netdev not in dev.netdevs:
            dev.problems.append(
                f"RDMA device {dev.hca} belongs to netdev {', '.join(dev.netdevs)}, not {dev.netdev}: "
                "fix cluster_plan_port_netdevs to the node's real pairing"
            )
        pdir = os.path.join(base, "ports", str(port))
        dev.state = parse_state(_read(os.path.join(pdir, "state")))
        dev.phys_state = parse_state(_read(os.path.join(pdir, "phys_state")))
        dev.active = dev.state == "ACTIVE"
        if not dev.active:
            dev.problems.append(
                f"{dev.hca} port {port} is {dev.state or 'unreadable'} (phys {dev.phys_state or '?'}), "
                f"not ACTIVE: check the cable on {dev.netdev} and that the peer is up"
            )
        dev.rate = _read(os.path.join(pdir, "rate")) or ""
        dev.rate_gbps = parse_rate(dev.rate)
        if dev.active and (dev.rate_gbps is None or dev.rate_gbps < min_rate_gbps):
            dev.problems.append(
                f"{dev.hca} port {port} runs at {dev.rate or 'an unreadable rate'}, below "
                f"network_links_rdma_min_rate_gbps={min_rate_gbps:g}: check the cable/transceiver "
                "(or lower that variable if this link is meant to be slower)"
            )
        dev.gid_index, dev.gid = find_gid_index(pdir, dev.address, dev.netdev)
        if dev.gid_index is None:
            dev.problems.append(
                f"{dev.hca}: no RoCE v2 GID for ::ffff:{dev.address} in {pdir}/gids: the address is not on "
                f"{dev.netdev} yet, or RoCE v2 is off on this device"
            )
    out["gid_indexes"] = sorted({d.gid_index for d in out["devices"] if d.gid_index is not None})
    out["problems"] = [p for d in out["devices"] for p in d.problems]
    out["devices"] = [asdict(d) for d in out["devices"]]
    return out


def facts(
    sysfs_root: str,
    links: list[dict],
    *,
    min_rate_gbps: float = 200,
    port: int = 1,
    real_sysfs_root: str = "/sys",
    which=None,
) -> dict:
    """rdma_facts' result: the rails' devices under `sysfs_root` (inspect), the RDMA devices under the real
    sysfs, and where ib_write_bw is (`which`: the module's get_bin_path)."""
    out = inspect(sysfs_root, links, min_rate_gbps, port)
    out["real_hcas"] = list_hcas(real_sysfs_root)
    out["perftest"] = which("ib_write_bw") if which else None
    return out

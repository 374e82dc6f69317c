#!/usr/bin/env python3
"""Lab stand-in for the RDMA part of sysfs: a tree shaped like /sys/class/infiniband.

A lab node has no ConnectX-7, so nothing fills /sys/class/infiniband. This daemon keeps a tree of
the same shape under its own root (default /run/sparkfleet-lab/sysfs) from the node's live fabric
netdevs, so that sparkfleet's RDMA/GID discovery runs its real code path against it:

  <root>/class/infiniband/<hca>/node_type                       "1: CA"
  <root>/class/infiniband/<hca>/fw_ver                          "28.45.4028" (the ConnectX-7 firmware of the
                                                                 three-Spark receipts; --fw-ver sets another)
  <root>/class/infiniband/<hca>/device/net/<netdev>/            (the HCA's netdev, as on a real PCI device)
  <root>/class/infiniband/<hca>/ports/1/state                    "4: ACTIVE" | "1: DOWN"
  <root>/class/infiniband/<hca>/ports/1/phys_state               "5: LinkUp" | "3: Disabled"
  <root>/class/infiniband/<hca>/ports/1/rate                     "200 Gb/sec (2X NDR)"
  <root>/class/infiniband/<hca>/ports/1/link_layer               "Ethernet"
  <root>/class/infiniband/<hca>/ports/1/gids/<i>                 "fe80:0000:...:0000" (8 groups, uncompressed)
  <root>/class/infiniband/<hca>/ports/1/gid_attrs/types/<i>      "IB/RoCE v1" | "RoCE v2"
  <root>/class/infiniband/<hca>/ports/1/gid_attrs/ndevs/<i>      "<netdev>"

The GID table is filled the way mlx5 fills it: entries 0/1 are the default GID (fe80::/64 with the
MAC's EUI-64) as RoCE v1/v2, then every other IPv6 address of the netdev (v1, v2), then every IPv4
address as ::ffff:a.b.c.d (v1, v2). So with IPv6 off on a rail the IPv4 RoCE v2 entry is index 3,
and an extra IPv6 address moves it, which is the drift discovery must cope with. Unused entries
read as all zeros and have no type/ndev file (the real kernel answers EINVAL for those).

netdev -> HCA uses the kernel's naming of ConnectX RDMA devices: `en<pci>np<port>` ->
`roce<pci>` (enp1s0f0np0 -> rocep1s0f0, enP2p1s0f0np0 -> roceP2p1s0f0), the same names as the
ConnectX-7 table in roles/cluster_plan/defaults/main.yml (a unit test keeps them in step).

It cannot carry RDMA traffic; the real /sys/class/infiniband stays empty, so anything that needs
real devices (ib_write_bw) sees that and says it was skipped. Standard library only (node Python
3.11-3.13). It refreshes when the kernel announces a change of a link or an address (`ip monitor link
address`, netlink: the refresh follows within about 0.1 s, as the real tree changes with the netdev) and
otherwise every --interval seconds (10); it writes only what changed. Without the monitor (ip gone, or it
exits) it polls every second. An idle node's refresh once a second cost 0.47 s of CPU a minute per node
(`ip -j addr` and the walk of the tree): most of an idle lab's CPU after the engine watch's SSH.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_ROOT = "/run/sparkfleet-lab/sysfs"
DEFAULT_RATE = "200 Gb/sec (2X NDR)"
# christopherowen/dgx-spark-networking docs/host-prerequisites.md; Bizuayeu docs/hosts.md (the same version)
DEFAULT_FW_VER = "28.45.4028"
DEFAULT_TABLE_SIZE = 32
ZERO_GID = ":".join(["0000"] * 8)
NETDEV_RE = re.compile(r"^en(?P<pci>P?\d*p\d+s\d+f\d+)np\d+$")


@dataclass(frozen=True)
class Netdev:
    name: str
    mac: str
    up: bool  # administratively up with carrier (operstate UP / LOWER_UP)
    ipv4: tuple[str, ...] = ()
    ipv6: tuple[str, ...] = ()


@dataclass
class Tree:
    """Desired file contents under <root>/class/infiniband (relative path -> text); dirs too."""

    files: dict[str, str] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)


def hca_name(netdev: str) -> str | None:
    """The RDMA device name the kernel gives a ConnectX netdev's function; None for other netdevs."""
    m = NETDEV_RE.match(netdev)
    return f"roce{m.group('pci')}" if m else None


def gid_text(addr: ipaddress.IPv6Address) -> str:
    """sysfs prints a GID as 8 groups of 4 hex digits, never compressed, also for IPv4-mapped ones
    (which `exploded` shows in dotted form on Python 3.13)."""
    b = addr.packed
    return ":".join(f"{b[i]:02x}{b[i + 1]:02x}" for i in range(0, 16, 2))


def default_gid(mac: str) -> ipaddress.IPv6Address:
    """fe80::/64 + modified EUI-64 of the MAC (universal/local bit flipped, ff:fe in the middle)."""
    octets = [int(x, 16) for x in mac.split(":")]
    if len(octets) != 6:
        raise ValueError(f"not a MAC address: {mac!r}")
    octets[0] ^= 0x02
    eui = [*octets[:3], 0xFF, 0xFE, *octets[3:]]
    return ipaddress.IPv6Address(bytes([0xFE, 0x80, 0, 0, 0, 0, 0, 0, *eui]))


def gid_table(dev: Netdev) -> list[tuple[ipaddress.IPv6Address, str]]:
    """(GID, type) in table order."""
    default = default_gid(dev.mac)
    addrs: list[ipaddress.IPv6Address] = [default]
    for a in dev.ipv6:
        ip = ipaddress.IPv6Address(a.split("%")[0])
        if ip not in addrs:
            addrs.append(ip)
    for a in dev.ipv4:
        ip = ipaddress.IPv6Address(f"::ffff:{a}")
        if ip not in addrs:
            addrs.append(ip)
    out = []
    for ip in addrs:
        out += [(ip, "IB/RoCE v1"), (ip, "RoCE v2")]
    return out


def render(
    devs: list[Netdev],
    rate: str = DEFAULT_RATE,
    table_size: int = DEFAULT_TABLE_SIZE,
    fw_ver: str = DEFAULT_FW_VER,
) -> Tree:
    tree = Tree()
    for dev in devs:
        hca = hca_name(dev.name)
        if hca is None:
            continue
        base = f"{hca}"
        port = f"{base}/ports/1"
        tree.dirs |= {
            base,
            f"{base}/device",
            f"{base}/device/net",
            f"{base}/device/net/{dev.name}",
            port,
            f"{port}/gids",
            f"{port}/gid_attrs",
            f"{port}/gid_attrs/types",
            f"{port}/gid_attrs/ndevs",
        }
        tree.files[f"{base}/node_type"] = "1: CA\n"
        tree.files[f"{base}/fw_ver"] = f"{fw_ver}\n"
        tree.files[f"{port}/state"] = "4: ACTIVE\n" if dev.up else "1: DOWN\n"
        tree.files[f"{port}/phys_state"] = "5: LinkUp\n" if dev.up else "3: Disabled\n"
        tree.files[f"{port}/rate"] = f"{rate}\n"
        tree.files[f"{port}/link_layer"] = "Ethernet\n"
        entries = gid_table(dev)[:table_size]
        for i in range(table_size):
            if i < len(entries):
                gid, kind = entries[i]
                tree.files[f"{port}/gids/{i}"] = gid_text(gid) + "\n"
                tree.files[f"{port}/gid_attrs/types/{i}"] = kind + "\n"
                tree.files[f"{port}/gid_attrs/ndevs/{i}"] = dev.name + "\n"
            else:
                tree.files[f"{port}/gids/{i}"] = ZERO_GID + "\n"
    return tree


def parse_ip_json(text: str) -> list[Netdev]:
    """Netdevs from `ip -j addr show`."""
    out = []
    for link in json.loads(text or "[]"):
        flags = set(link.get("flags", []))
        up = "UP" in flags and "LOWER_UP" in flags
        v4 = tuple(a["local"] for a in link.get("addr_info", []) if a.get("family") == "inet")
        v6 = tuple(a["local"] for a in link.get("addr_info", []) if a.get("family") == "inet6")
        mac = link.get("address", "")
        if len(mac.split(":")) != 6:
            continue
        out.append(Netdev(name=link["ifname"], mac=mac, up=up, ipv4=v4, ipv6=v6))
    return out


def live_netdevs() -> list[Netdev]:
    proc = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return []
    return parse_ip_json(proc.stdout)


class Writer:
    """Keeps <root>/class/infiniband equal to a Tree, touching only what differs."""

    def __init__(self, root: Path) -> None:
        self.base = root / "class" / "infiniband"
        self.written: dict[str, str] = {}

    def _write(self, rel: str, text: str) -> None:
        path = self.base / rel
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)  # readers never see a half-written file

    def sync(self, tree: Tree) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        for d in sorted(tree.dirs):
            (self.base / d).mkdir(parents=True, exist_ok=True)
        for rel, text in tree.files.items():
            if self.written.get(rel) != text or not (self.base / rel).exists():
                self._write(rel, text)
                self.written[rel] = text
        for rel in [r for r in self.written if r not in tree.files]:
            (self.base / rel).unlink(missing_ok=True)
            del self.written[rel]
        wanted_hcas = {d.split("/", 1)[0] for d in tree.dirs}
        for entry in self.base.iterdir():
            if entry.is_dir() and entry.name not in wanted_hcas:
                shutil.rmtree(entry, ignore_errors=True)
                self.written = {k: v for k, v in self.written.items() if not k.startswith(entry.name + "/")}
        # a netdev that moved to another HCA (never on real hardware) leaves no stale link behind
        for hca in wanted_hcas:
            net = self.base / hca / "device" / "net"
            for entry in net.iterdir() if net.is_dir() else []:
                if f"{hca}/device/net/{entry.name}" not in tree.dirs:
                    shutil.rmtree(entry, ignore_errors=True)


def start_monitor() -> subprocess.Popen[bytes] | None:
    """`ip monitor link address`: a line for every change of a link or an address; None without ip."""
    try:
        return subprocess.Popen(
            ["ip", "monitor", "link", "address"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
    except OSError:
        return None


def wait_for_change(monitor: subprocess.Popen[bytes] | None, timeout: float, settle: float = 0.1) -> bool:
    """Until the monitor reports a change (then a short settle, so that a burst of changes, an address and
    its route, gives one refresh) or timeout seconds pass. False when the monitor is gone (EOF): the caller
    polls from then on (a second's sleep here)."""
    if monitor is None or monitor.stdout is None:
        time.sleep(min(timeout, 1.0))
        return False
    fd = monitor.stdout.fileno()
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        return True
    deadline = time.monotonic() + settle
    while True:
        if not os.read(fd, 65536):
            return False
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--root", default=os.environ.get("SPARKFLEET_LAB_SYSFS_ROOT", DEFAULT_ROOT))
    p.add_argument("--rate", default=DEFAULT_RATE, help="text of ports/1/rate")
    p.add_argument("--fw-ver", default=DEFAULT_FW_VER, help="text of fw_ver (the ConnectX-7 firmware)")
    p.add_argument("--table-size", type=int, default=DEFAULT_TABLE_SIZE, help="GID table entries per port")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between refreshes without a change")
    p.add_argument("--once", action="store_true", help="refresh once and exit")
    args = p.parse_args(argv)

    writer = Writer(Path(args.root))
    stop = False
    waiting = False

    class Stopped(Exception):
        pass

    def _stop(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True
        if waiting:  # out of the wait now (Python would resume the select), never in the middle of a write
            raise Stopped

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    # the monitor first, then the first read: a change between the two is still announced
    monitor = None if args.once else start_monitor()
    try:
        while True:
            tree = render(live_netdevs(), rate=args.rate, table_size=args.table_size, fw_ver=args.fw_ver)
            writer.sync(tree)
            if args.once or stop:
                return 0
            waiting = True
            try:
                alive = wait_for_change(monitor, args.interval)
            except Stopped:
                return 0
            finally:
                waiting = False
            if not alive and monitor is not None:  # the monitor is gone: poll every second from now on
                monitor.kill()
                monitor.wait()
                monitor = None
    finally:
        if monitor is not None:
            monitor.kill()
            monitor.wait()


if __name__ == "__main__":
    sys.exit(main())

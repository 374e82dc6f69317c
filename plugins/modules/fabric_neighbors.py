#!/usr/bin/python3
# sparkfleet: which neighbour is really at the other end of each fabric port (ARP probes; read-only).
from __future__ import annotations

DOCUMENTATION = r"""
module: fabric_neighbors
short_description: Find what each fabric port is really cabled to, by ARP probes for every planned address
description:
  - Read-only. On each of I(netdevs) that exists and is up, sends ARP requests for every address in
    I(addresses) with sender address 0.0.0.0 (an RFC 5227 probe), and collects the replies with the MAC
    address that sent them.
  - A probe needs no address of its own on the port and no route back, so it works on a rail whose address
    belongs to another subnet than its peer's (a swapped cable); with sender 0.0.0.0 no neighbour learns or
    caches anything from it.
  - Linux answers a probe for any of its own addresses on any of its ports (arp_ignore 0, the default), so the
    replying MAC, not the address, says which port is at the other end; the controller matches MACs with every
    node's I(netdevs) (RETURN C(ports)).
  - A port that is down (not configured) is reported, not brought up.
options:
  netdevs:
    type: list
    elements: str
    required: true
    description: >-
      The ports to probe from (every ConnectX-7 netdev of cluster_plan_port_netdevs); absent ones are
      skipped.
  addresses:
    type: list
    elements: str
    required: true
    description: The IPv4 addresses to ask for (every fabric address of the cluster plan).
  wait_s:
    type: float
    default: 1.0
    description: Seconds to listen for replies after the last request.
  rounds:
    type: int
    default: 2
    description: How many times each request is sent (a frame may be lost while a link settles).
  sysfs_net:
    type: path
    default: /sys/class/net
    description: Where the netdevs are listed.
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: Find what every fabric port is cabled to
  sparkfleet.cluster.fabric_neighbors:
    netdevs: [enp1s0f0np0, enP2p1s0f0np0, enp1s0f1np1, enP2p1s0f1np1]
    addresses: [10.12.1.1, 10.12.1.2, 10.12.2.1, 10.12.2.2]
  register: neighbors
"""

RETURN = r"""
ports:
  description: >-
    Per netdev: mac, state (up, down, absent, no-carrier), answers ([{address, mac}], in the order they came),
    error (why it could not probe).
  type: dict
  returned: always
"""

import contextlib
import ipaddress
import os
import select
import socket
import struct
import time

from ansible.module_utils.basic import AnsibleModule

ETH_P_ARP = 0x0806
ETH_P_IP = 0x0800
BROADCAST = b"\xff" * 6
IFF_UP = 0x1


def mac_bytes(mac: str) -> bytes:
    return bytes(int(part, 16) for part in mac.split(":"))


def mac_text(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def arp_probe(src_mac: str, target: str) -> bytes:
    """An Ethernet frame with an ARP request for `target`, sender address 0.0.0.0 (RFC 5227 probe)."""
    src = mac_bytes(src_mac)
    eth = BROADCAST + src + struct.pack("!H", ETH_P_ARP)
    arp = struct.pack("!HHBBH", 1, ETH_P_IP, 6, 4, 1)  # Ethernet, IPv4, request
    arp += src + b"\0\0\0\0" + b"\0" * 6 + ipaddress.IPv4Address(target).packed
    return eth + arp


def parse_reply(frame: bytes) -> tuple[str, str] | None:
    """(address, mac) of an ARP reply frame, else None."""
    if len(frame) < 42 or struct.unpack("!H", frame[12:14])[0] != ETH_P_ARP:
        return None
    htype, ptype, hlen, plen, op = struct.unpack("!HHBBH", frame[14:22])
    if (htype, ptype, hlen, plen, op) != (1, ETH_P_IP, 6, 4, 2):
        return None
    sha, spa = frame[22:28], frame[28:32]
    return str(ipaddress.IPv4Address(spa)), mac_text(sha)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:  # e.g. carrier of a link that is down: EINVAL
        return None


def port_state(sysfs_net: str, netdev: str) -> dict:
    base = os.path.join(sysfs_net, netdev)
    if not os.path.isdir(base):
        return {"mac": "", "state": "absent", "answers": [], "error": f"{netdev} does not exist on this node"}
    mac = _read(os.path.join(base, "address")) or ""
    flags = int(_read(os.path.join(base, "flags")) or "0", 16)
    out = {"mac": mac, "state": "up", "answers": [], "error": ""}
    if not flags & IFF_UP:
        out.update(state="down", error=f"{netdev} is down (not configured): not probed, nothing brought up")
    elif _read(os.path.join(base, "carrier")) != "1":
        out.update(state="no-carrier", error=f"{netdev} has no carrier: no cable, or the far end is down")
    return out


def probe(ports: dict[str, dict], addresses: list[str], wait_s: float, rounds: int) -> None:
    socks: dict[socket.socket, str] = {}
    try:
        for netdev, port in ports.items():
            if port["state"] != "up":
                continue
            try:
                s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ARP))
                s.bind((netdev, ETH_P_ARP))
                s.setblocking(False)
            except OSError as exc:
                port["error"] = f"{netdev}: cannot open a raw socket ({exc}): run as root"
                continue
            socks[s] = netdev
        frames = {s: [arp_probe(ports[n]["mac"], a) for a in addresses] for s, n in socks.items()}
        rounds = max(1, rounds)
        for i in range(rounds):
            for s, batch in frames.items():
                for frame in batch:
                    with contextlib.suppress(OSError):  # a send that fails is a missing answer
                        s.send(frame)
            listen = wait_s if i == rounds - 1 else min(0.2, wait_s)
            _collect(socks, ports, set(addresses), time.monotonic() + listen)
    finally:
        for s in socks:
            s.close()


def _collect(socks: dict, ports: dict, wanted: set[str], until: float) -> None:
    while socks:
        left = until - time.monotonic()
        if left <= 0:
            return
        ready, _, _ = select.select(list(socks), [], [], left)
        for s in ready:
            with contextlib.suppress(BlockingIOError, InterruptedError):
                while True:
                    got = parse_reply(s.recv(2048))
                    port = ports[socks[s]]
                    if got and got[0] in wanted and got[1] != port["mac"]:
                        answer = {"address": got[0], "mac": got[1]}
                        if answer not in port["answers"]:
                            port["answers"].append(answer)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "netdevs": {"type": "list", "elements": "str", "required": True},
            "addresses": {"type": "list", "elements": "str", "required": True},
            "wait_s": {"type": "float", "default": 1.0},
            "rounds": {"type": "int", "default": 2},
            "sysfs_net": {"type": "path", "default": "/sys/class/net"},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        addresses = [str(ipaddress.IPv4Address(a)) for a in p["addresses"]]
    except ValueError as exc:
        module.fail_json(msg=f"addresses: {exc}")
    ports = {n: port_state(p["sysfs_net"], n) for n in dict.fromkeys(p["netdevs"])}
    probe(ports, addresses, p["wait_s"], p["rounds"])
    module.exit_json(changed=False, ports=ports)


if __name__ == "__main__":
    main()

#!/usr/bin/python
"""Ansible module: bring the fabric rails to their netplan state, touching only those rails."""

from __future__ import annotations

DOCUMENTATION = r"""
module: fabric_links
short_description: Apply the fabric netplan to the fabric rails only, when they differ from it
description:
  - Compares every fabric rail (address/prefix, MTU, link up) with the plan. When a rail differs, or
    O(force) is set (the netplan file just changed), runs C(netplan generate) and reconfigures only
    the fabric rails through the renderer (C(networkctl reload) + C(networkctl reconfigure <rails>), or
    C(nmcli connection reload) + C(nmcli connection up netplan-<rail>)); the management link and every
    other interface are left alone. Then waits until every rail matches the plan.
  - Check mode reports what would change and changes nothing.
options:
  links:
    description: The rails, each C({netdev, address, prefix}).
    type: list
    elements: dict
    required: true
  mtu:
    description: MTU every rail must have.
    type: int
    default: 9000
  renderer:
    description: The netplan renderer of the rails.
    type: str
    choices: [networkd, NetworkManager]
    default: networkd
  force:
    description: Apply even when the rails already match (the netplan file changed).
    type: bool
    default: false
  wait_s:
    description: Seconds to wait for the rails to match after applying.
    type: int
    default: 30
  protect:
    description: >-
      Interfaces that must never be reconfigured (the management link); listing one in O(links) fails.
    type: list
    elements: str
    default: []
  rdma:
    description: >-
      When set and the rails already match (nothing applied), also read the rails' RDMA devices as
      C(sparkfleet.cluster.rdma_facts) does, with these of its options - C(sysfs_root), C(min_rate_gbps),
      C(port), C(real_sysfs_root) - and return its result as C(rdma): one round trip for both. After an apply
      nothing is read (a new address's RoCE GID appears a moment later): C(rdma) is then null.
    type: dict
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: Bring the fabric rails to the plan (only these rails are touched)
  sparkfleet.cluster.fabric_links:
    links:
      - {netdev: enp1s0f1np1, address: 10.12.1.1, prefix: 24}
      - {netdev: enP2p1s0f1np1, address: 10.12.2.1, prefix: 24}
    protect: [enP7s7]
"""

RETURN = r"""
drift:
  description: How the rails differed from the plan before this run (empty when they matched).
  type: list
  returned: always
commands:
  description: The commands run (or that would run in check mode).
  type: list
  returned: always
rails:
  description: Per rail after the run, C({netdev, exists, up, carrier, mtu, ipv4, ipv6}).
  type: list
  returned: always
rdma:
  description: What rdma_facts would return, when O(rdma) was set and nothing was applied; else null.
  type: dict
  returned: always
"""

import json
import time

from ansible_collections.sparkfleet.cluster.plugins.module_utils.rdma import facts as rdma_facts


def parse_ip(text: str) -> dict[str, dict]:
    """`ip -j addr show` -> {ifname: {exists, up, mtu, ipv4: ["a/p"], ipv6: [...]}}."""
    out = {}
    for link in json.loads(text or "[]"):
        flags = set(link.get("flags", []))
        info = link.get("addr_info", [])
        out[link["ifname"]] = {
            "netdev": link["ifname"],
            "exists": True,
            "up": "UP" in flags,
            "carrier": "LOWER_UP" in flags,
            "mtu": link.get("mtu"),
            "ipv4": sorted(f"{a['local']}/{a['prefixlen']}" for a in info if a.get("family") == "inet"),
            "ipv6": sorted(f"{a['local']}/{a['prefixlen']}" for a in info if a.get("family") == "inet6"),
        }
    return out


def drift(links: list[dict], live: dict[str, dict], mtu: int, carrier: bool = False) -> list[str]:
    """How the rails differ from the plan. Address, MTU and admin state are what applying fixes;
    with `carrier`, a rail without carrier (cable, or the peer is down) counts too."""
    problems = []
    for link in links:
        dev = link["netdev"]
        want = f"{link['address']}/{link['prefix']}"
        state = live.get(dev)
        if not state:
            problems.append(f"{dev}: missing")
            continue
        if state["ipv4"] != [want]:
            problems.append(f"{dev}: IPv4 {', '.join(state['ipv4']) or 'none'}, plan {want}")
        if state["mtu"] != mtu:
            problems.append(f"{dev}: MTU {state['mtu']}, plan {mtu}")
        if not state["up"]:
            problems.append(f"{dev}: administratively down")
        elif carrier and not state["carrier"]:
            problems.append(f"{dev}: no carrier (check the cable and that the peer Spark is up)")
    return problems


def apply_commands(renderer: str, netdevs: list[str]) -> list[list[str]]:
    cmds = [["netplan", "generate"]]
    if renderer == "NetworkManager":
        cmds.append(["nmcli", "connection", "reload"])
        cmds += [["nmcli", "connection", "up", f"netplan-{d}"] for d in netdevs]
    else:
        cmds.append(["networkctl", "reload"])
        cmds.append(["networkctl", "reconfigure", *netdevs])
    return cmds


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={
            "links": {"type": "list", "elements": "dict", "required": True},
            "mtu": {"type": "int", "default": 9000},
            "renderer": {"type": "str", "default": "networkd", "choices": ["networkd", "NetworkManager"]},
            "force": {"type": "bool", "default": False},
            "wait_s": {"type": "int", "default": 30},
            "protect": {"type": "list", "elements": "str", "default": []},
            "rdma": {"type": "dict"},
        },
        supports_check_mode=True,
    )
    p = module.params
    links = p["links"]
    netdevs = [str(link["netdev"]) for link in links]
    clash = sorted(set(netdevs) & set(p["protect"]))
    if clash:
        module.fail_json(msg=f"refusing to reconfigure {', '.join(clash)}: it is the management link")

    def live() -> dict[str, dict]:
        rc, out, err = module.run_command(["ip", "-j", "addr", "show"])
        if rc != 0:
            module.fail_json(msg=f"ip -j addr show failed: {err.strip()}")
        return parse_ip(out)

    before = drift(links, live(), p["mtu"])
    missing = [d for d in before if d.endswith(": missing")]
    if missing:
        module.fail_json(msg=f"fabric interfaces missing: {'; '.join(missing)}", drift=before)
    cmds = apply_commands(p["renderer"], netdevs)
    if not before and not p["force"]:
        rdma = None
        if p["rdma"] is not None:
            o = p["rdma"]
            rdma = rdma_facts(
                str(o.get("sysfs_root") or "/sys"),
                links,
                min_rate_gbps=float(o.get("min_rate_gbps", 200)),
                port=int(o.get("port", 1)),
                real_sysfs_root=str(o.get("real_sysfs_root") or "/sys"),
                which=module.get_bin_path,
            )
        module.exit_json(changed=False, drift=[], commands=[], rails=[live()[d] for d in netdevs], rdma=rdma)
    if module.check_mode:
        module.exit_json(
            changed=True, drift=before, commands=[" ".join(c) for c in cmds], rails=[], rdma=None
        )
    for cmd in cmds:
        rc, out, err = module.run_command(cmd)
        if rc != 0:
            module.fail_json(
                msg=f"{' '.join(cmd)} failed (rc {rc}): {(err or out).strip()}",
                drift=before,
                commands=[" ".join(c) for c in cmds],
            )
    deadline = time.monotonic() + p["wait_s"]
    now = drift(links, live(), p["mtu"], carrier=True)
    while now and time.monotonic() < deadline:
        time.sleep(0.5)
        now = drift(links, live(), p["mtu"], carrier=True)
    state = live()
    if now:
        module.fail_json(
            msg=f"fabric rails do not match the plan {p['wait_s']} s after applying: {'; '.join(now)}",
            drift=before,
            commands=[" ".join(c) for c in cmds],
            rails=[state.get(d, {"netdev": d, "exists": False}) for d in netdevs],
        )
    module.exit_json(
        changed=True,
        drift=before,
        commands=[" ".join(c) for c in cmds],
        rails=[state[d] for d in netdevs],
        rdma=None,
    )


if __name__ == "__main__":
    main()

#!/usr/bin/python
"""Ansible module: RDMA port state, rate and RoCE v2 GID index of a node's fabric rails (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: rdma_facts
short_description: Read the RDMA port state, rate and RoCE v2 GID index of each fabric rail
description:
  - Reads C(<sysfs_root>/class/infiniband/<hca>/ports/1/) for every rail given in O(links) and
    discovers the GID index whose GID is C(::ffff:<ipv4>) of the rail's address and whose type is
    C(RoCE v2). The index is discovered, never assumed (it drifts, e.g. 3 -> 4, when IPv6 entries
    come and go).
  - Changes nothing; supports check mode.
options:
  sysfs_root:
    description: Root of the sysfs tree (C(/sys) on a real Spark; the lab's stand-in elsewhere).
    type: path
    default: /sys
  links:
    description: The rails of this node, each C({netdev, hca, address}) (from sparkfleet_plan.interfaces).
    type: list
    elements: dict
    required: true
  min_rate_gbps:
    description: Smallest acceptable port rate in Gb/s; a slower port is a problem.
    type: int
    default: 200
  port:
    description: The HCA port to read.
    type: int
    default: 1
  real_sysfs_root:
    description: The kernel's sysfs, where real RDMA devices (that can carry traffic) are listed.
    type: path
    default: /sys
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: Read the RDMA state and GID index of each rail
  sparkfleet.cluster.rdma_facts:
    links:
      - {netdev: enp1s0f1np1, hca: rocep1s0f1, address: 10.12.1.1}
      - {netdev: enP2p1s0f1np1, hca: roceP2p1s0f1, address: 10.12.2.1}
  register: rdma
"""

RETURN = r"""
present:
  description: Whether C(<sysfs_root>/class/infiniband) lists any RDMA device.
  type: bool
  returned: always
devices:
  description: Per rail, C({hca, netdev, address, found, state, active, phys_state, rate, rate_gbps,
    gid_index, gid, netdevs, problems}).
  type: list
  returned: always
problems:
  description: Everything that is wrong, one sentence each (empty when all rails are fine).
  type: list
  returned: always
gid_indexes:
  description: The distinct GID indexes found, sorted.
  type: list
  returned: always
real_hcas:
  description: >-
    RDMA devices under O(real_sysfs_root)/class/infiniband (empty in the lab, whose tree is a stand-in).
  type: list
  returned: always
perftest:
  description: Path of ib_write_bw (perftest), or null when it is not installed.
  type: str
  returned: always
"""


# inspect, parse_rate and parse_state: the unit tests load this file and call them from here
from ansible_collections.sparkfleet.cluster.plugins.module_utils.rdma import (  # noqa: F401
    facts,
    inspect,
    parse_rate,
    parse_state,
)


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={
            "sysfs_root": {"type": "path", "default": "/sys"},
            "links": {"type": "list", "elements": "dict", "required": True},
            "min_rate_gbps": {"type": "int", "default": 200},
            "port": {"type": "int", "default": 1},
            "real_sysfs_root": {"type": "path", "default": "/sys"},
        },
        supports_check_mode=True,
    )
    p = module.params
    for link in p["links"]:
        missing = [k for k in ("netdev", "hca", "address") if not link.get(k)]
        if missing:
            module.fail_json(msg=f"links entry {link!r} lacks {', '.join(missing)}")
    result = facts(
        p["sysfs_root"],
        p["links"],
        min_rate_gbps=p["min_rate_gbps"],
        port=p["port"],
        real_sysfs_root=p["real_sysfs_root"],
        which=module.get_bin_path,
    )
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()

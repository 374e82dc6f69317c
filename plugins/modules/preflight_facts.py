#!/usr/bin/python
"""Ansible module: read what preflight layer 2 needs from a node, changing nothing."""

from __future__ import annotations

DOCUMENTATION = r"""
module: preflight_facts
short_description: Read free disk and memory, kernel settings, docker, nvidia-smi and listening ports
description:
  - Read-only probe for preflight layer 2. Supports check mode; never changes the node.
  - Why not C(community.docker.docker_host_info) and facts modules - one round trip reads it all, and it runs
    before any role has installed anything (C(docker version) reports a missing or stopped Docker; the
    community.docker modules need python3-requests, which role engine_image installs later).
  - The node's network interfaces are listed from /sys/class/net, as Ansible's Linux network facts list them
    (C(ansible_interfaces)), and the facts of the C(platform) and C(distribution) subsets (OS, version,
    architecture, the running kernel) are gathered by Ansible's own fact collector, as
    C(ansible.builtin.setup) gathers them, and returned as C(ansible_facts) (so they reach the fact cache
    too), where a setup task before this one was a round trip of its own on every run.
  - Free disk is measured on the filesystem that holds O(weights_path) (its nearest existing parent
    when it does not exist yet); what the weights directory already holds is reported separately, so
    a re-run after the download is not refused for the space the weights themselves use.
options:
  weights_path:
    description: Where the model weights go.
    type: path
    required: true
  gpu_clock_state_file:
    description: The GPU clock cap sparkfleet recorded (role gpu_clocks); missing = none configured.
    type: path
    default: /var/lib/sparkfleet/clocks/gpu.conf
  engine_container:
    description: Name of sparkfleet's engine container (its memory and ports are not "in use by others").
    type: str
    default: sparkfleet-engine
  ports:
    description: TCP ports to report as listening or not.
    type: list
    elements: int
    default: []
  docker:
    description: The docker executable.
    type: str
    default: docker
  nvidia_smi:
    description: The nvidia-smi executable.
    type: str
    default: nvidia-smi
  phase_dir:
    description: >-
      The directory of the roles' phase records (C(<sparkfleet_state_dir>/phases)). Every record there is
      re-read against its own digest in this round trip, read-only, and returned as O(phases); a later gate of
      the same run may take it instead of a round trip of its own (plugins/action/phase_state.py). Unset: no
      survey.
    type: path
  passwd_of:
    description: >-
      With O(phase_dir): a user whose passwd entry to return with the survey (as RV(passwd)), for the gate of
      role ssh_trust, whose own read returns it (C(getent_passwd)).
    type: str
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: Read the OS, disk, memory, kernel settings, docker and nvidia-smi
  sparkfleet.cluster.preflight_facts:
    weights_path: /srv/sparkfleet/models
    ports: [18002, 29500]
  check_mode: false
  register: node
"""

RETURN = r"""
disk:
  description: C({path, measured_at, free_bytes, weights_bytes}).
  type: dict
  returned: always
memory:
  description: C({total_bytes, available_bytes}) from /proc/meminfo.
  type: dict
  returned: always
settings:
  description: Kernel settings to compare across nodes (kernel, nvidia_driver, page_size,
    transparent_hugepage, vm.min_free_kbytes, vm.swappiness, vm.watermark_boost_factor, gpu_clock_cap).
  type: dict
  returned: always
docker:
  description: C({ok, version, error, engine_running}).
  type: dict
  returned: always
gpu:
  description: C({ok, gpus, error, compute_processes}).
  type: dict
  returned: always
listening:
  description: The ports of O(ports) that something listens on.
  type: list
  returned: always
interfaces:
  description: The names of the node's network interfaces (the directories under /sys/class/net), sorted.
  type: list
  returned: always
phases:
  description: >-
    With O(phase_dir): record path -> C({digest, drift, data}), the recorded digest, why the state its
    manifest lists differs now (empty: unchanged) and its recorded data. Nothing is removed.
  type: dict
  returned: always
passwd:
  description: >-
    With O(phase_dir) and O(passwd_of): C({user: [password, uid, gid, gecos, home, shell]}), C({user: null})
    when the user does not exist (the value module phase_state returns as C(getent_passwd)).
  type: dict
  returned: always
ansible_facts:
  description: What C(ansible.builtin.setup) gathers with C(gather_subset=!all,!min,platform,distribution).
  type: dict
  returned: always
"""

import os

from ansible_collections.sparkfleet.cluster.plugins.module_utils.clock_state import STATE_DIR, read_cap
from ansible_collections.sparkfleet.cluster.plugins.module_utils.disk import free_bytes, tree_bytes
from ansible_collections.sparkfleet.cluster.plugins.module_utils.node import NodeProbe
from ansible_collections.sparkfleet.cluster.plugins.module_utils.phase_record import passwd_entry, survey

# Kernel parameters preflight compares across nodes (every rank needs the same).
VM_SETTINGS = ("min_free_kbytes", "swappiness", "watermark_boost_factor")


# what ansible.builtin.setup gathers with gather_subset=!all,!min,platform,distribution; its minimal subset
FACT_SUBSET = ["!all", "!min", "platform", "distribution"]
SETUP_MINIMAL = frozenset(
    [
        "apparmor",
        "caps",
        "cmdline",
        "date_time",
        "distribution",
        "dns",
        "env",
        "fips",
        "local",
        "lsb",
        "pkg_mgr",
        "platform",
        "python",
        "selinux",
        "service_mgr",
        "ssh_pub_keys",
        "user",
    ]
)


def setup_facts(module, gather_subset: list[str] = FACT_SUBSET) -> dict:
    """The facts ansible.builtin.setup would return for `gather_subset`, by the same code path (its collector,
    its default collectors and namespace): OS, version, architecture, the running kernel."""
    from ansible.module_utils.facts import ansible_collector, default_collectors
    from ansible.module_utils.facts.namespace import PrefixFactNamespace

    collector = ansible_collector.get_ansible_collector(
        all_collector_classes=default_collectors.collectors,
        namespace=PrefixFactNamespace(namespace_name="ansible", prefix="ansible_"),
        filter_spec=[],
        gather_subset=gather_subset,
        gather_timeout=10,
        minimal_gather_subset=SETUP_MINIMAL,
    )
    return collector.collect(module=module)


def interfaces(sys_class_net: str = "/sys/class/net") -> list[str]:
    """The node's interface names, as Ansible's Linux network facts list them: each directory (or link to
    one) under /sys/class/net."""
    try:
        names = os.listdir(sys_class_net)
    except OSError:
        return []
    return sorted(n for n in names if os.path.isdir(os.path.join(sys_class_net, n)))


def settings(
    node: NodeProbe, gpu_clock_state_file: str, module=None, nvidia_smi: str = "nvidia-smi"
) -> dict[str, str]:
    """What must be identical on every node, as text ("unknown" where the node cannot tell)."""
    out = {
        "kernel": node.kernel_release(),
        "nvidia_driver": (node.driver(module, nvidia_smi)["version"] if module else None) or "unknown",
        "page_size": str(node.page_size()),
        "transparent_hugepage": node.thp() or "unknown",
    }
    for key in VM_SETTINGS:
        out[f"vm.{key}"] = node.sysctl(f"vm.{key}") or "unknown"
    cap = read_cap(gpu_clock_state_file)
    out["gpu_clock_cap"] = "none recorded" if cap is None else str(cap)
    return out


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={
            "weights_path": {"type": "path", "required": True},
            "gpu_clock_state_file": {"type": "path", "default": f"{STATE_DIR}/clocks/gpu.conf"},
            "engine_container": {"type": "str", "default": "sparkfleet-engine"},
            "ports": {"type": "list", "elements": "int", "default": []},
            "docker": {"type": "str", "default": "docker"},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "phase_dir": {"type": "path"},
            # a user name, not a secret: no_log False says so (Ansible warns of any option named like "pass")
            "passwd_of": {"type": "str", "no_log": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    node = NodeProbe()
    free, measured_at = free_bytes(p["weights_path"])
    module.exit_json(
        changed=False,
        disk={
            "path": p["weights_path"],
            "measured_at": measured_at,
            "free_bytes": free,
            "weights_bytes": tree_bytes(p["weights_path"]),
        },
        memory=node.meminfo(),
        settings=settings(node, p["gpu_clock_state_file"], module, p["nvidia_smi"]),
        docker=node.docker(module, p["docker"], p["engine_container"]),
        gpu=node.gpus(module, p["nvidia_smi"]),
        listening=node.listening(p["ports"]),
        interfaces=interfaces(),
        phases=survey(p["phase_dir"], "systemctl") if p["phase_dir"] else {},
        passwd={p["passwd_of"]: passwd_entry(p["passwd_of"])} if p["phase_dir"] and p["passwd_of"] else {},
        ansible_facts=setup_facts(module),
    )


if __name__ == "__main__":
    main()

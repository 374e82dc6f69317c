"""Preflight refuses bad inventories before any host is touched (table-driven, >= 40 cases).

Each case writes a complete inventory (hosts on loopback addresses with a closed SSH port) and breaks
one thing. In-process (tests/unit/layer1.py): Ansible's own InventoryManager and VariableManager give
each host its variables, and the first play of playbooks/preflight.yml (the validate action over every
role's rules) runs for every host with a connection that fails the test if anything uses it; the
verdict filter then must list exactly one problem, the case's (naming the variable and the value).
Two real `ansible-playbook playbooks/preflight.yml` runs prove the playbook does the same: a bad case
fails in layer 1 on localhost and no cluster host shows a change or even a connection attempt (an
attempt would be `unreachable`: nothing listens on that port); a good TP3 inventory passes layer 1, warning
about its short model revision (accepted), and does try to connect, which shows the check above can tell
the difference.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import layer1
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "playbooks/preflight.yml"
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
CLOSED_PORT = 9  # discard: nothing listens on loopback there
HEX40 = "0123456789abcdef0123456789abcdef01234567"


def good(topology: str = "tp2") -> dict:
    n = 2 if topology == "tp2" else 3
    host = {f"spark{i}": {"ansible_host": f"127.0.0.{10 + i}", "sparkfleet_node": i} for i in range(1, n + 1)}
    return {
        "hosts": {
            "all": {
                "children": {
                    "cluster": {
                        "children": {
                            "head": {"hosts": {"spark1": host["spark1"]}},
                            "workers": {"hosts": {h: v for h, v in host.items() if h != "spark1"}},
                        }
                    }
                }
            }
        },
        "cluster": {
            "sparkfleet_topology": topology,
            "sparkfleet_mgmt_iface": "enP7s7",
            "sparkfleet_state_dir": "/var/lib/sparkfleet",
            "sparkfleet_lab": False,
            "ansible_user": "admin",
            "ansible_port": CLOSED_PORT,
            "ansible_ssh_common_args": "-o ConnectTimeout=2",
        },
        "pins": {
            "sparkfleet_pins": {
                "model": {"repo": "LibertAIDAI/DeepSeek-V4.1-Flash-1017-EXL3-2.9bpw", "revision": HEX40},
                "engram": {"repo": "deepseek-ai/DeepSeek-V4.1-Flash-1017", "revision": HEX40},
                "engine": {"repo": "https://github.com/Elevatormusic/TensorFold.git", "commit": HEX40},
                "base_image": {"name": "nvcr.io/nvidia/pytorch", "digest": "sha256:" + "a" * 64},
                "hf_client": {"huggingface_hub": "2.4.0"},
            }
        },
        "other": {"model_weights_release_manifest": "SHA256SUMS"},
    }


def hosts_of(inv: dict) -> dict:
    groups = inv["hosts"]["all"]["children"]["cluster"]["children"]
    return {**groups["head"]["hosts"], **groups["workers"]["hosts"]}


def all_hosts_of(inv: dict) -> list[str]:
    """Every host of group cluster, also one listed directly under it."""
    return sorted({*hosts_of(inv), *inv["hosts"]["all"]["children"]["cluster"].get("hosts", {})})


def set_host(name: str, **values) -> Callable[[dict], None]:
    def f(inv: dict) -> None:
        hosts_of(inv)[name].update(values)
        for k, v in values.items():
            if v is None:
                del hosts_of(inv)[name][k]

    return f


def set_var(file: str, **values) -> Callable[[dict], None]:
    def f(inv: dict) -> None:
        inv[file].update(values)

    return f


def set_pin(path: str, value) -> Callable[[dict], None]:
    def f(inv: dict) -> None:
        key, field = path.split(".")
        inv["pins"]["sparkfleet_pins"][key][field] = value

    return f


def add_host(group: str, name: str, **values) -> Callable[[dict], None]:
    def f(inv: dict) -> None:
        inv["hosts"]["all"]["children"]["cluster"]["children"][group]["hosts"][name] = values

    return f


def move_head_to_workers(inv: dict) -> None:
    groups = inv["hosts"]["all"]["children"]["cluster"]["children"]
    groups["workers"]["hosts"].update(groups["head"]["hosts"])
    groups["head"]["hosts"] = {}


def stray_host(inv: dict) -> None:
    """spark3 directly under cluster, in neither head nor workers (the host count stays right)."""
    groups = inv["hosts"]["all"]["children"]["cluster"]["children"]
    inv["hosts"]["all"]["children"]["cluster"]["hosts"] = {"spark3": groups["workers"]["hosts"].pop("spark3")}


def worker_also_in_head(inv: dict) -> None:
    """spark2 listed under head as well as under workers (a copy-paste slip in hosts.yml)."""
    groups = inv["hosts"]["all"]["children"]["cluster"]["children"]
    groups["head"]["hosts"]["spark2"] = dict(groups["workers"]["hosts"]["spark2"])


def two_heads(inv: dict) -> None:
    groups = inv["hosts"]["all"]["children"]["cluster"]["children"]
    groups["head"]["hosts"].update(groups["workers"]["hosts"])
    groups["workers"]["hosts"] = {}


def host_var(name: str, **values) -> Callable[[dict], None]:
    """A host_vars override of one node (what `uniform` variables refuse)."""

    def f(inv: dict) -> None:
        hosts_of(inv)[name].update(values)

    return f


# (id, topology, mutation, expected message fragment): each case breaks exactly one rule, so preflight's
# verdict must list exactly one problem, this one.
CASES = [
    # inventory shape (role cluster_plan's rule over the groups and hosts)
    ("placeholder-address", "tp2", set_host("spark2", ansible_host="CHANGE-ME"),
     "spark2: ansible_host='CHANGE-ME' is the sample inventory's placeholder"),
    ("tp3-with-2-hosts", "tp2", set_var("cluster", sparkfleet_topology="tp3"),
     "sparkfleet_topology='tp3' needs exactly 3"),
    ("tp2-with-3-hosts", "tp2", add_host("workers", "spark3", ansible_host="127.0.0.13", sparkfleet_node=3),
     "sparkfleet_topology='tp2' needs exactly 2"),
    ("two-heads", "tp2", two_heads, "group head=['spark1', 'spark2']: expected exactly one host"),
    ("no-head", "tp2", move_head_to_workers, "group head=[]: expected exactly one host"),
    ("host-in-head-and-workers", "tp2", worker_also_in_head,
     "spark2 is in both head and workers: a Spark is either the head or a worker"),
    ("host-outside-head-and-workers", "tp3", stray_host,
     "spark3 is in cluster but neither in head nor in workers"),
    ("duplicate-node", "tp2", set_host("spark2", sparkfleet_node=1),
     "spark2: sparkfleet_node=1 is already spark1's"),
    ("duplicate-address", "tp2", set_host("spark2", ansible_host="127.0.0.11"),
     "spark2: ansible_host='127.0.0.11' is also spark1's"),
    ("bad-address", "tp2", set_host("spark2", ansible_host="10.0.0.300/24"),
     "spark2: ansible_host='10.0.0.300/24': expected an IP address or a host name"),
    # role sparkfleet: the cluster-wide settings
    ("node-not-a-number", "tp2", set_host("spark2", sparkfleet_node="two"),
     "spark2: sparkfleet: sparkfleet_node='two': expected a whole number"),
    ("node-out-of-range", "tp2", set_host("spark2", sparkfleet_node=10),
     "spark2: sparkfleet: sparkfleet_node=10: expected a whole number between 1 and 9"),
    ("node-missing", "tp2", set_host("spark2", sparkfleet_node=None),
     "spark2: sparkfleet: sparkfleet_node is not set"),
    ("bad-topology", "tp2", set_var("cluster", sparkfleet_topology="tp4"),
     "sparkfleet_topology='tp4': expected one of tp2, tp3"),
    ("revision-is-a-branch", "tp2", set_pin("model.revision", "main"),
     "sparkfleet_pins.model.revision='main': expected a commit, 40 lowercase hex digits"),
    ("repo-not-owner-name", "tp2", set_pin("engram.repo", "DeepSeek V4"),
     "sparkfleet_pins.engram.repo='DeepSeek V4': expected a Hugging Face repository owner/name"),
    ("engine-commit-placeholder", "tp3", set_pin("engine.commit", "CHANGE-ME"),
     "sparkfleet_pins.engine.commit='CHANGE-ME' is the sample inventory's placeholder"),
    ("engine-commit-short", "tp2", set_pin("engine.commit", "30a9647"),
     "sparkfleet_pins.engine.commit='30a9647': expected the full commit, 40 lowercase hex digits"),
    ("digest-too-short", "tp2", set_pin("base_image.digest", "sha256:abc123"),
     "sparkfleet_pins.base_image.digest='sha256:abc123': expected sha256:<64 lowercase hex>"),
    ("image-name-with-spaces", "tp2", set_pin("base_image.name", "My Image"),
     "sparkfleet_pins.base_image.name='My Image': expected an image name"),
    ("hf-client-unquoted-float", "tp2", set_pin("hf_client.huggingface_hub", 2.4),
     "sparkfleet_pins.hf_client.huggingface_hub=2.4: expected an exact version in quotes"),
    ("lab-flag-as-string", "tp2", set_var("cluster", sparkfleet_lab="yes"),
     "sparkfleet_lab='yes': expected true or false (a YAML boolean, no quotes)"),
    ("bad-mgmt-iface", "tp2", set_var("cluster", sparkfleet_mgmt_iface="eth 0"),
     "sparkfleet_mgmt_iface='eth 0': expected a network interface name"),
    ("state-dir-relative", "tp2", set_var("cluster", sparkfleet_state_dir="var/lib/sparkfleet"),
     "sparkfleet_state_dir='var/lib/sparkfleet': expected an absolute path"),
    ("mgmt-address-not-ip", "tp2", set_host("spark1", sparkfleet_mgmt_address="spark1.lan"),
     "spark1: sparkfleet: sparkfleet_mgmt_address='spark1.lan': expected an IP address"),
    ("topology-differs-on-one-node", "tp2", host_var("spark2", sparkfleet_lab=True),
     "spark2: sparkfleet: sparkfleet_lab=True on spark2 differs from spark1's False"),
    # role cluster_plan
    ("cabling-port-used-twice", "tp3", set_var("other", cluster_plan_cabling=[
        {"a": {"node": 1, "port": 0}, "b": {"node": 2, "port": 1}},
        {"a": {"node": 2, "port": 1}, "b": {"node": 3, "port": 1}},
        {"a": {"node": 3, "port": 0}, "b": {"node": 1, "port": 1}}]),
     "cluster_plan_cabling[1].a=node 2 port 1 is already used by cluster_plan_cabling[0]"),
    ("tp3-pair-not-cabled", "tp3", set_var("other", cluster_plan_cabling=[
        {"a": {"node": 1, "port": 0}, "b": {"node": 2, "port": 1}},
        {"a": {"node": 2, "port": 0}, "b": {"node": 3, "port": 1}}]),
     "cluster_plan_cabling: no cable between nodes 1-3"),
    ("subnet-template-without-rail", "tp2",
     set_var("other", cluster_plan_subnet_template="10.{lo}{hi}.0.0/24"),
     "cluster_plan_subnet_template='10.{lo}{hi}.0.0/24': placeholders ['hi', 'lo']"),
    # role network_links
    ("mtu-too-small", "tp2", set_var("other", network_links_mtu=1400),
     "network_links_mtu=1400: expected a whole number between 1500 and 9216"),
    ("netplan-file-elsewhere", "tp2", set_var("other", network_links_netplan_file="/etc/fabric.yaml"),
     "network_links_netplan_file='/etc/fabric.yaml': expected an absolute path matching"),
    ("renderer-unknown", "tp2", set_var("other", network_links_renderer="ifupdown"),
     "network_links_renderer='ifupdown': expected one of auto, networkd, NetworkManager"),
    ("mgmt-iface-is-a-rail", "tp2", set_var("cluster", sparkfleet_mgmt_iface="enp1s0f1np1"),
     "network_links_mgmt_iface=enp1s0f1np1 (the management link) is a fabric rail"),
    # role host_tuning
    ("swappiness-zero", "tp2", set_var("other", host_tuning_vm_swappiness=0),
     "host_tuning_vm_swappiness=0: expected a whole number between 1 and 200; keep it >= 1"),
    ("min-free-differs-on-one-node", "tp2", host_var("spark2", host_tuning_vm_min_free_kbytes=262144),
     "spark2: host_tuning: host_tuning_vm_min_free_kbytes=262144 on spark2 differs from spark1's 45166"),
    ("64k-kernel-version-placeholder", "tp3",
     set_var("other", host_tuning_kernel_profile="64k", host_tuning_kernel_64k_version="CHANGE-ME",
             host_tuning_kernel_64k_package_version="7.0.0-1019.19~24.04.2"),
     "host_tuning_kernel_64k_version='CHANGE-ME' is the sample inventory's placeholder"),
    ("kernel-profile-unknown", "tp2", set_var("other", host_tuning_kernel_profile="16k"),
     "host_tuning_kernel_profile='16k': expected one of stock, 64k"),
    ("thp-unknown", "tp2", set_var("other", host_tuning_thp="sometimes"),
     "host_tuning_thp='sometimes': expected one of always, madvise, never"),
    ("kho-off-maybe", "tp2", set_var("other", host_tuning_kho_off="maybe"),
     "host_tuning_kho_off=maybe: expected auto, true or false"),
    ("sysctl-extra-bad-key", "tp2", set_var("other", host_tuning_sysctl_extra={"swappiness": 10}),
     "host_tuning_sysctl_extra has keys that are not sysctl names"),
    ("kernel-arg-with-quote", "tp2", set_var("other", host_tuning_kernel_args_extra=['quiet"']),
     "kernel arguments ['quiet\"']: each a single word"),
    ("swap-size-zero", "tp2", set_var("other", host_tuning_swap_size_mib=0),
     "host_tuning_swap_size_mib=0: expected a whole number >= 1"),
    ("min-free-too-small", "tp2", set_var("other", host_tuning_vm_min_free_kbytes=512),
     "host_tuning_vm_min_free_kbytes=512: expected a whole number between 1024 and 4194304"),
    ("kernel-64k-package-version-bad", "tp2",
     set_var("other", host_tuning_kernel_profile="64k", host_tuning_kernel_64k_version="7.0.0-1019",
             host_tuning_kernel_64k_package_version="latest please"),
     "host_tuning_kernel_64k_package_version='latest please': expected a string matching"),
    ("kernel-64k-package-without-version", "tp2",
     set_var("other", host_tuning_kernel_profile="64k", host_tuning_kernel_64k_version="7.0.0-1019",
             host_tuning_kernel_64k_package_version="7.0.0-1019.19~24.04.2",
             host_tuning_kernel_64k_packages=[{"name": "linux-image-7.0.0-1019-nvidia-64k", "version": ""}]),
     "each entry needs a Debian package name and an exact version"),
    ("memory-saver-install-on-stock-kernel", "tp2",
     set_var("other", host_tuning_memory_saver_install=True, host_tuning_memory_saver_commit=HEX40),
     "host_tuning_memory_saver_install=true with host_tuning_kernel_profile=stock"),
    ("memory-saver-commit-short", "tp2",
     set_var("other", host_tuning_kernel_profile="64k", host_tuning_kernel_64k_version="7.0.0-1019",
             host_tuning_kernel_64k_package_version="7.0.0-1019.19~24.04.2",
             host_tuning_memory_saver_install=True, host_tuning_memory_saver_commit="531be47"),
     "host_tuning_memory_saver_commit='531be47': expected a commit, 40 lowercase hex digits"),
    ("memory-saver-repo-not-a-url", "tp2",
     set_var("other", host_tuning_kernel_profile="64k", host_tuning_kernel_64k_version="7.0.0-1019",
             host_tuning_kernel_64k_package_version="7.0.0-1019.19~24.04.2",
             host_tuning_memory_saver_install=True, host_tuning_memory_saver_commit=HEX40,
             host_tuning_memory_saver_repo="dgx-spark-memory-saver"),
     "host_tuning_memory_saver_repo='dgx-spark-memory-saver': expected a string matching"),
    ("kernel-pair-without-driver", "tp2",
     set_var("other", host_tuning_kernel_pairs=[{"kernel": "7.0.0-1019-nvidia-64k"}]),
     "each validated pair is {kernel: <uname -r>, driver: <NVIDIA driver version>}"),
    ("firmware-unknown-component", "tp2", set_var("other", host_tuning_firmware_min={"gpu": "1.0"}),
     "host_tuning_firmware_min={'gpu': '1.0'}: a mapping of bios, soc, ec, pd, connectx7"),
    ("firmware-version-with-a-space", "tp2", set_var("other", host_tuning_firmware_min={"ec": "0x0300 0508"}),
     "host_tuning_firmware_min={'ec': '0x0300 0508'}: a mapping of bios, soc, ec, pd, connectx7"),
    ("ready-check-unknown", "tp2", set_var("other", host_tuning_ready_checks=["disk"]),
     "host_tuning_ready_checks=['disk']: expected one of page size, memory saver, firmware, kernel pair"),
    ("ready-firmware-without-minimums", "tp2", set_var("other", host_tuning_ready_checks=["firmware"]),
     "host_tuning_ready_checks has firmware but host_tuning_firmware_min is empty"),
    ("ready-kernel-pair-without-pairs", "tp2", set_var("other", host_tuning_ready_checks=["kernel pair"]),
     "host_tuning_ready_checks has kernel pair but host_tuning_kernel_pairs is empty"),
    ("headless-as-string", "tp2", set_var("other", host_tuning_headless="yes"),
     "host_tuning_headless='yes': expected true or false"),
    ("ready-override-on-one-node", "tp2", host_var("spark2", host_tuning_ready_override=True),
     "spark2: host_tuning: host_tuning_ready_override=True on spark2 differs from spark1's"),
    # role earlyoom
    ("earlyoom-threshold-zero", "tp2", set_var("other", earlyoom_mem_kill_percent=0),
     "earlyoom_mem_kill_percent=0: expected a whole number between 1 and 100"),
    ("earlyoom-argument-with-a-space", "tp2", set_var("other", earlyoom_extra_args=["--sort-by-rss now"]),
     "earlyoom arguments ['--sort-by-rss now'] contain whitespace or quotes"),
    ("earlyoom-kill-above-term", "tp2", set_var("other", earlyoom_mem_kill_percent=10),
     "earlyoom_mem_kill_percent=10 is above earlyoom_mem_term_percent=4"),
    # role gpu_clocks
    ("clock-cap-too-low", "tp3", set_var("other", gpu_clocks_cap_mhz=500),
     "gpu_clocks_cap_mhz=500: expected a clock in whole MHz: 0 (stock) or 1000..3003"),
    ("cpu-cap-not-a-number", "tp2", set_var("other", gpu_clocks_cpu_cap_mhz="fast"),
     "gpu_clocks_cpu_cap_mhz='fast': expected a whole number"),
    ("clock-persistence-as-string", "tp2", set_var("other", gpu_clocks_persistence_mode="on"),
     "gpu_clocks_persistence_mode='on': expected true or false"),
    ("clock-min-negative", "tp2", set_var("other", gpu_clocks_min_mhz=-1),
     "gpu_clocks_min_mhz=-1: expected a whole number between 0 and 3003"),
    ("clock-min-at-the-cap", "tp2", set_var("other", gpu_clocks_cap_mhz=2300, gpu_clocks_min_mhz=2300),
     "gpu_clocks_min_mhz=2300 is not under gpu_clocks_cap_mhz=2300"),
    ("clock-verify-samples-zero", "tp2", set_var("other", gpu_clocks_verify_samples=0),
     "gpu_clocks_verify_samples=0: expected a whole number between 1 and 50"),
    ("clock-verify-interval-too-long", "tp2", set_var("other", gpu_clocks_verify_interval_ms=6000),
     "gpu_clocks_verify_interval_ms=6000: expected a whole number between 0 and 5000"),
    ("clock-boot-before-not-a-unit", "tp2", set_var("other", gpu_clocks_boot_before=["docker"]),
     "gpu_clocks_boot_after / gpu_clocks_boot_before name units that are not systemd unit names"),
    # role model_weights
    ("weights-path-relative", "tp2", set_var("other", model_weights_path="models"),
     "model_weights_path='models': expected an absolute path"),
    ("copy-transport-unknown", "tp2", set_var("other", model_weights_copy_transport="ftp"),
     "model_weights_copy_transport='ftp': expected one of rsyncd, ssh"),
    ("download-workers-zero", "tp2", set_var("other", model_weights_download_workers=0),
     "model_weights_download_workers=0: expected a whole number between 1 and 64"),
    ("rank-keys-without-rank", "tp3", set_var("other", model_weights_rank_keys="tp3/rank.keys"),
     "model_weights_rank_keys=tp3/rank.keys: the keys file of each rank needs {rank}"),
    # role engine_image
    ("engine-poll-zero", "tp2", set_var("other", engine_image_poll_interval=0),
     "engine_image_poll_interval=0: expected a whole number between 1 and 300"),
    ("engine-poll-beyond-timeout", "tp2",
     set_var("other", engine_image_poll_interval=200, engine_image_pull_timeout=100),
     "engine_image_poll_interval=200 is longer than a timeout"),
    # role engine_service
    ("port-out-of-range", "tp2", set_var("other", engine_service_port=70000),
     "engine_service_port=70000: expected a TCP port, a whole number 1..65535"),
    ("api-port-is-rendezvous-port", "tp2", set_var("other", engine_service_port=29571),
     "engine_service_port=29571 equals engine_service_master_port=29571: the API and the rendezvous"),
    ("api-off-loopback-without-key", "tp2", set_var("other", engine_service_host="0.0.0.0"),  # noqa: S104 - an inventory value, not a bind
     "engine_service_host=0.0.0.0 exposes the API beyond loopback without a key: set engine_service_api_"),
    ("bind-host-with-a-port", "tp2", set_var("other", engine_service_host="127.0.0.1:8000"),
     "engine_service_host='127.0.0.1:8000': expected an IP address or a host name; the address the API"),
    ("bind-host-not-an-address", "tp2", set_var("other", engine_service_host="my server"),
     "engine_service_host='my server': expected an IP address or a host name"),
    ("model-name-with-a-space", "tp2", set_var("other", engine_service_served_model_name="deep seek"),
     "engine_service_served_model_name='deep seek': expected a string matching"),
    ("port-not-a-number", "tp2", set_var("other", engine_service_port="eighty"),
     "engine_service_port='eighty': expected a whole number"),
    ("context-not-whole", "tp2", set_var("other", engine_service_context=1.5),
     "engine_service_context=1.5: expected a whole number"),
    ("cable-to-a-node-that-does-not-exist", "tp3", set_var("other", cluster_plan_cabling=[
        {"a": {"node": 1, "port": 0}, "b": {"node": 2, "port": 1}},
        {"a": {"node": 2, "port": 0}, "b": {"node": 3, "port": 1}},
        {"a": {"node": 3, "port": 0}, "b": {"node": 4, "port": 1}}]),
     "cluster_plan_cabling[2].b.node=4: no host has that sparkfleet_node"),
    ("gpus-maybe", "tp2", set_var("other", engine_service_gpus="maybe"),
     "engine_service_gpus='maybe': expected one of auto, True, False"),
    ("model-name-differs-on-one-node", "tp2", host_var("spark2", engine_service_served_model_name="other"),
     "spark2: engine_service: engine_service_served_model_name='other' on spark2 differs from spark1's"),
    # role engine_service: the engine profile decides what the engine takes
    ("tp3-with-the-public-fork", "tp3", set_var("other", engine_service_profile="dsv41-fork-0.6.6"),
     "engine_service_profile=dsv41-fork-0.6.6 (tensorfold serve of sfxnz/TensorFold's deepseek_v41 fork"),
    ("profile-unknown", "tp2", set_var("other", engine_service_profile="vllm"),
     "engine_service_profile='vllm' is not a profile: the built-in ones and those of engine_service_prof"),
    ("profile-of-my-own-incomplete", "tp2",
     set_var("other", engine_service_profile="mine", engine_service_profiles={"mine": {"summary": "mine"}}),
     "engine_service_profiles.mine lacks engine_version, tp_sizes"),
    ("key-on-an-engine-without-keys", "tp2",
     set_var("other", engine_service_profile="dsv41-fork-0.6.4", engine_service_api_key_required=True),
     "engine_service_api_key_required=true, but the engine of profile dsv41-fork-0.6.4 (0.6.4) reads no API"),
    ("open-api-off-loopback-on-an-engine-without-keys", "tp2",
     set_var("other", engine_service_profile="dsv41-fork-0.6.4", engine_service_host="0.0.0.0"),  # noqa: S104
     "the engine of profile dsv41-fork-0.6.4 (0.6.4) has no API keys, so anyone on the network could use it"),
    ("kv-pool-on-the-fork", "tp2", set_var("other", engine_service_kv_pool_tokens=8388608),
     "engine_service_kv_pool_tokens=8388608: the engine of profile dsv41-fork-0.6.6 has no flag or variable"),
    ("extra-arg-prefix-of-a-passed-flag", "tp2", set_var("other", engine_service_extra_args=["--cont", "5"]),
     "engine_service_extra_args has --cont (the engine reads it as --context), which sparkfleet passes"),
    # each rank's command line through the profile's engine parser (argparse's own words)
    ("extra-arg-value-the-engine-refuses", "tp2",
     set_var("other", engine_service_extra_args=["--kv-dtype", "fp3"]),
     "engine_service_extra_args: the engine of this profile (tensorfold 0.6.6) would refuse the command line"
     " of every rank and exit at once: tensorfold serve: error: argument --kv-dtype: invalid choice: 'fp3'"),
    ("extra-arg-flag-the-engine-lacks", "tp3",
     set_var("other", engine_service_extra_args=["--max-num-seqs", "4"]),
     "(tensorfold tp3-recipe) would refuse the command line of every rank and exit at once: tensorfold:"
     " error: unrecognized arguments: --max-num-seqs 4"),
    ("extra-arg-without-its-value", "tp2", set_var("other", engine_service_extra_args=["--drafter"]),
     "engine_service_extra_args: the engine of this profile (tensorfold 0.6.6) would refuse the command line"
     " of every rank and exit at once: tensorfold serve: error: argument --drafter: expected one argument"),
    ("template-fix-for-an-engine-without-templates", "tp2",
     set_var("other", model_weights_chat_template_patch="chat_template-thinking-off.patch"),
     "model_weights_chat_template_patch=chat_template-thinking-off.patch: the engine of profile dsv41-fork"),
    ("a-subset-for-a-whole-revision-engine", "tp2", set_var("other", model_weights_allow_patterns=["*.json"]),
     "model_weights_allow_patterns=['*.json']: the engine of profile dsv41-fork-0.6.6 reads the whole"),
    ("effort-the-parser-lacks", "tp2",
     set_var("other", engine_service_thinking={"enabled": True, "effort": "max"}),
     "effort null or one of low, medium, high, xhigh (the engine's --reasoning-effort choices)"),
    ("context-beyond-the-window", "tp2", set_var("other", engine_service_context=2097152),
     "engine_service_context=2097152: expected a whole number between 1 and 1048576"),
    ("drafts-beyond-dspark", "tp2", set_var("other", engine_service_mtp_drafts=9),
     "engine_service_mtp_drafts=9: expected a whole number between 0 and 5"),
    ("cache-the-engine-cannot-find", "tp2", set_var("other", engine_service_caches=[
        {"name": "disk", "nodes": "all", "size_gib": 10, "path": "/var/d", "mount": "/cache/d"}]),
     "engine_service_caches[0] (disk): set dir_arg (the engine's flag) or dir_env (its variable)"),
    # role engine_image
    ("dockerfile-missing", "tp2", set_var("other", engine_image_dockerfile="/nonexistent/Dockerfile"),
     "engine_image_dockerfile=/nonexistent/Dockerfile: no such file on the controller"),
    ("build-arg-owned-by-the-pins", "tp2", set_var("other", engine_image_build_args={"TF_SHA": "abc"}),
     "engine_image_build_args={'TF_SHA': 'abc'} sets TF_SHA, which come from the pins"),
    # role preflight
    ("free-memory-beyond-a-spark", "tp2", set_var("other", preflight_min_free_memory_gib=200),
     "preflight_min_free_memory_gib=200: expected a whole number between 0 and 128"),
    # issue 21: paths an admin sets (module_utils/input_kinds.py data_dir / data_file / abs_path)
    ("weights-path-etc", "tp2", set_var("other", model_weights_path="/etc"),
     "model_weights_path='/etc': expected a directory of sparkfleet's own, not the system directory /etc"),
    ("weights-path-root", "tp2", set_var("other", model_weights_path="/"),
     "model_weights_path='/': expected a directory of sparkfleet's own, not the system directory /"),
    ("weights-path-root-snapshot-written-as-a-template", "tp2",
     set_var("other", model_weights_path="/", model_weights_snapshot_dir="{{model_weights_path}}/snapshot"),
     "model_weights_path='/': expected a directory of sparkfleet's own, not the system directory /"),
    ("weights-path-usr-local", "tp2", set_var("other", model_weights_path="/usr/local"),
     "model_weights_path='/usr/local': expected a directory of sparkfleet's own, not the system directory "
     "/usr/local"),
    ("weights-path-home", "tp2", set_var("other", model_weights_path="/home"),
     "model_weights_path='/home': expected a directory of sparkfleet's own, not the system directory /home"),
    ("weights-path-dotdot", "tp2", set_var("other", model_weights_path="/srv/sparkfleet/../models"),
     "model_weights_path='/srv/sparkfleet/../models': expected the path written plainly: '/srv/models'"),
    ("weights-path-dotdot-into-etc", "tp2", set_var("other", model_weights_path="/srv/../etc/models"),
     "model_weights_path='/srv/../etc/models': expected a directory outside /etc"),
    ("weights-path-trailing-slash", "tp2", set_var("other", model_weights_path="/srv/sparkfleet/models/"),
     "model_weights_path='/srv/sparkfleet/models/': expected the path written plainly: "
     "'/srv/sparkfleet/models'"),
    ("weights-path-under-boot", "tp2", set_var("other", model_weights_path="/boot/models"),
     "model_weights_path='/boot/models': expected a directory outside /boot (a system tree"),
    ("snapshot-dir-is-the-weights-path", "tp2",
     set_var("other", model_weights_snapshot_dir="/srv/sparkfleet/models"),
     "model_weights_snapshot_dir=/srv/sparkfleet/models holds model_weights_path=/srv/sparkfleet/models"),
    ("weights-venv-under-usr", "tp2", set_var("other", model_weights_venv="/usr/local/hf-client"),
     "model_weights_venv='/usr/local/hf-client': expected a directory outside /usr"),
    ("weights-record-in-etc", "tp2", set_var("other", model_weights_record="/etc/weights.json"),
     "model_weights_record='/etc/weights.json': expected a file outside /etc"),
    ("state-dir-var", "tp2", set_var("cluster", sparkfleet_state_dir="/var"),
     "sparkfleet_state_dir='/var': expected a directory of sparkfleet's own, not the system directory /var"),
    ("state-dir-var-lib-dpkg", "tp2", set_var("cluster", sparkfleet_state_dir="/var/lib/dpkg/sparkfleet"),
     "sparkfleet_state_dir='/var/lib/dpkg/sparkfleet': expected a directory outside /var/lib/dpkg"),
    ("state-dir-trailing-slash", "tp2", set_var("cluster", sparkfleet_state_dir="/var/lib/sparkfleet/"),
     "sparkfleet_state_dir='/var/lib/sparkfleet/': expected the path written plainly: '/var/lib/sparkfleet'"),
    ("cache-under-boot", "tp2", set_var("other", engine_service_caches=[
        {"name": "prompt-disk", "nodes": "all", "size_gib": 100, "path": "/boot/sparkfleet/prompt-disk",
         "mount": "/cache/prompt-disk", "dir_env": "TF_DSV41_DISK", "size_env": "TF_DSV41_DISK_GIB"}]),
     "engine_service_caches[0] (prompt-disk): path='/boot/sparkfleet/prompt-disk': expected a directory "
     "outside /boot"),
    ("spill-cache-is-var-lib", "tp2", set_var("other", engine_service_caches=[
        {"name": "spill", "nodes": "head", "size_gib": 256, "path": "/var/lib", "mount": "/cache/spill",
         "dir_env": "TF_DSV41_DISK", "size_env": "TF_DSV41_DISK_GIB"}]),
     "engine_service_caches[0] (spill): path='/var/lib': expected a directory of sparkfleet's own, "
     "not the system directory /var/lib"),
    ("kernel-cache-under-proc", "tp2", set_var("other", engine_service_kernel_cache_dir="/proc/kernels"),
     "engine_service_kernel_cache_dir='/proc/kernels': expected a directory outside /proc"),
    ("engine-data-dir-var-lib", "tp2", set_var("other", engine_service_data_dir="/var/lib"),
     "engine_service_data_dir='/var/lib': expected a directory of sparkfleet's own, not the system "
     "directory /var/lib"),
    ("api-key-file-in-etc", "tp2", set_var("other", engine_service_api_key_file="/etc/sparkfleet-keys"),
     "engine_service_api_key_file='/etc/sparkfleet-keys': expected a file outside /etc"),
    ("credentials-file-in-profile-d", "tp2",
     set_var("other", engine_service_credentials_file="/etc/profile.d/spark.sh"),
     "engine_service_credentials_file='/etc/profile.d/spark.sh': expected a file outside /etc"),
    ("credentials-file-dotdot-in-home", "tp2",
     set_var("other", engine_service_credentials_file="~admin/../root/.bashrc"),
     "engine_service_credentials_file='~admin/../root/.bashrc': expected a string matching"),
    ("env-file-over-a-system-file", "tp2", set_var("other", engine_service_env_file="/etc/default/docker"),
     "engine_service_env_file='/etc/default/docker': expected a file outside /etc"),
    ("served-weights-dir-etc", "tp2", set_var("other", engine_service_weights_dir="/etc"),
     "engine_service_weights_dir='/etc': expected a directory of sparkfleet's own, not the system "
     "directory /etc"),
    ("image-build-dir-under-tmp", "tp2", set_var("other", engine_image_build_dir="/tmp/build"),
     "engine_image_build_dir='/tmp/build': expected a directory outside /tmp"),
    ("clock-state-dir-under-sys", "tp2", set_var("other", gpu_clocks_state_dir="/sys/clocks"),
     "gpu_clocks_state_dir='/sys/clocks': expected a directory outside /sys"),
    ("clock-run-dir-in-systemds", "tp2", set_var("other", gpu_clocks_run_dir="/run/systemd"),
     "gpu_clocks_run_dir='/run/systemd': expected a directory outside /run"),
    ("swapfile-in-etc", "tp2", set_var("other", host_tuning_swapfile="/etc/swap"),
     "host_tuning_swapfile='/etc/swap': expected a file outside /etc"),
    ("swapfile-is-boot", "tp2", set_var("other", host_tuning_swapfile="/boot"),
     "host_tuning_swapfile='/boot': expected a file of sparkfleet's own, not the system directory /boot"),
    ("sysctl-file-over-sysctl-conf", "tp2", set_var("other", host_tuning_sysctl_file="/etc/sysctl.conf"),
     "host_tuning_sysctl_file='/etc/sysctl.conf': expected a file outside /etc"),
    ("grub-dropin-over-default-grub", "tp2", set_var("other", host_tuning_grub_dropin="/etc/default/grub"),
     "host_tuning_grub_dropin='/etc/default/grub': expected a file outside /etc"),
    ("grub-dropin-elsewhere", "tp2", set_var("other", host_tuning_grub_dropin="/srv/99-sparkfleet.cfg"),
     "host_tuning_grub_dropin='/srv/99-sparkfleet.cfg': expected an absolute path matching"),
    ("memory-saver-cache-usr-src", "tp2", set_var("other", host_tuning_memory_saver_cache="/usr/src"),
     "host_tuning_memory_saver_cache='/usr/src': expected a directory outside /usr"),
    ("preflight-weights-path-etc", "tp2", set_var("other", preflight_weights_path="/etc"),
     "preflight_weights_path='/etc': expected a directory of sparkfleet's own, not the system "
     "directory /etc"),
    ("sysfs-root-trailing-slash", "tp2", set_var("other", network_links_sysfs_root="/sys/"),
     "network_links_sysfs_root='/sys/': expected the path written plainly: '/sys'"),
]  # fmt: skip


def write_inventory(root: Path, inv: dict) -> Path:
    (root / "group_vars/all").mkdir(parents=True)
    (root / "hosts.yml").write_text(yaml.safe_dump(inv["hosts"], sort_keys=False))
    for name in ("cluster", "pins", "other"):
        (root / f"group_vars/all/{name}.yml").write_text(yaml.safe_dump(inv[name], sort_keys=False))
    return root


def run_preflight(inventory: Path) -> dict:
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(inventory.parent / "facts"),
        "ANSIBLE_LOCAL_TEMP": str(inventory.parent / "tmp"),
        "ANSIBLE_NOCOLOR": "1",
    }
    proc = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", str(inventory), str(PLAYBOOK)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
        timeout=300,
    )
    try:  # the JSON document, then whatever the enabled callbacks (timer) print after it
        out, _end = json.JSONDecoder().raw_decode(proc.stdout[proc.stdout.index("{") :])
    except ValueError:
        out = {"plays": [], "stats": {}}
    out["rc"] = proc.returncode
    out["stderr"] = proc.stderr
    return out


def messages(result: dict, host: str) -> list[str]:
    """Every message of a failed task result of `host`."""
    out = []
    for play in result.get("plays", []):
        for task in play.get("tasks", []):
            r = task.get("hosts", {}).get(host)
            if r and r.get("failed"):
                msg = r.get("msg", "")
                out += [str(m) for m in msg] if isinstance(msg, list) else [str(msg)]
    return out


def inventory_of(tmp_path: Path, case: tuple) -> Path:
    _case_id, topology, mutate, _expected = case
    inv = good(topology)
    mutate(inv)
    return write_inventory(tmp_path / "inventory", inv)


def test_there_are_at_least_40_cases():
    assert len(CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES)


HEADER = "preflight: the inventory has "
BY_ID = {c[0]: c for c in CASES}


@pytest.mark.parametrize(("case_id", "expected"), [(c[0], c[3]) for c in CASES], ids=[c[0] for c in CASES])
def test_bad_inventory_is_refused_by_layer_1_naming_only_its_rule(tmp_path, case_id, expected):
    verdict = layer1.verdict(inventory_of(tmp_path, BY_ID[case_id]))
    problems = verdict["problems"]
    assert len(problems) == 1, f"{case_id}: expected exactly one problem, got:\n" + "\n".join(problems)
    assert expected in problems[0], f"{case_id}: expected {expected!r} in\n{problems[0]}"


def test_good_inventories_pass_layer_1_in_process(tmp_path):
    for topology in ("tp2", "tp3"):
        inv = write_inventory(tmp_path / topology / "inventory", good(topology))
        assert layer1.verdict(inv)["problems"] == [], topology  # warnings (the table's engine commit) allowed


def test_layer_1_checks_every_role_once_through_its_own_validate_tasks():
    """Layer 1 is each role's own tasks/validate.yml, imported (Ansible's own variable precedence): every role
    that has one, each once, sparkfleet's cluster-wide settings first (cluster_plan's validate.yml imports
    them)."""
    _loader, _play, tasks = layer1._play()
    roles = [t._role.get_name() for t in tasks if t._role]  # each role task's role (the reset task has none)
    every = sorted(p.parent.parent.name for p in (ROOT / "roles").glob("*/tasks/validate.yml"))
    assert sorted(roles) == every, roles
    assert roles[:2] == ["sparkfleet", "cluster_plan"], roles


def test_a_role_skips_its_own_input_checks_only_after_layer_1_of_the_same_run():
    """docs/design.md "Inputs checked once per run": every role's import of its validate.yml is skipped only
    when preflight layer 1 passed in this run (the fact sparkfleet_inputs_checked, set by its verdict, never
    cached), and the rules read no node's state (no gathered fact, no registered result), so layer 1's
    verdict is theirs."""
    skip = (
        "not ((hostvars['localhost']['sparkfleet_inputs_checked'] | default(false))"
        " or (sparkfleet_inputs_checked | default(false)))"
    )
    importers = sorted(
        f for f in (ROOT / "roles").glob("*/tasks/*.yml") if "import_tasks: validate.yml" in f.read_text()
    )
    # preflight's own validate.yml runs inside layer 1 only; every other role imports it from its entry point
    assert {f.parent.parent.name for f in importers} == {
        p.parent.parent.name for p in (ROOT / "roles").glob("*/tasks/validate.yml")
    } - {"preflight"}
    for f in importers:
        text = f.read_text()
        block = text[text.index("import_tasks: validate.yml") :].split("\n- ", 1)[0]
        assert skip in block, f"{f.relative_to(ROOT)}: its validate.yml import is not skipped after layer 1"
    inventory_only = {"ansible_host"}  # an inventory variable
    for v in (ROOT / "roles").glob("*/tasks/validate.yml"):
        names = set(re.findall(r"\bansible_\w+", v.read_text())) - inventory_only
        assert not names, f"{v.relative_to(ROOT)} reads node state {sorted(names)}: layer 1 did not judge it"
        assert "register:" not in v.read_text(), v


def test_reused_compiles_give_the_verdict_that_fresh_compiles_give(tmp_path):
    """layer1 reuses compiled templates across cases (its docstring): the whole verdict, every problem and
    warning in order, is the one Ansible's own compile-every-time gives, and the second reusing run compiles
    nothing new. The inventory has a problem written as a template and a warning (a short revision)."""
    inv = good("tp2")
    BY_ID["weights-path-root-snapshot-written-as-a-template"][2](inv)
    inv["pins"]["sparkfleet_pins"]["model"]["revision"] = "afc7aa0a"
    path = write_inventory(tmp_path / "inventory", inv)
    fresh = layer1.verdict(path, reuse_compiled=False)
    first = layer1.verdict(path)
    kept = len(layer1._COMPILED)
    again = layer1.verdict(path)
    assert fresh == first == again
    assert kept and len(layer1._COMPILED) == kept
    assert len(fresh["problems"]) == 1 and "model_weights_path='/'" in fresh["problems"][0], fresh
    assert any("sparkfleet_pins.model.revision='afc7aa0a' is a short commit" in w for w in fresh["warnings"])


def _validate_action():
    layer1._load_plugins()
    import importlib

    return importlib.import_module("ansible_collections.sparkfleet.cluster.plugins.action.validate")


def test_variables_in_scope_give_the_verdict_that_every_variable_gives(tmp_path, monkeypatch):
    """The validate action renders with the variables a role's checks can reach (plugins/action/validate.py's
    docstring): for the good inventory of each topology and every 16th case of the table, the whole verdict,
    every problem and warning in order, is the one rendering with every variable of the host gives."""
    action = _validate_action()
    cases = [
        ("good-tp2", "tp2", lambda inv: None, None),
        ("good-tp3", "tp3", lambda inv: None, None),
        *CASES[::16],
    ]
    paths = [inventory_of(tmp_path / case[0], case) for case in cases]
    scoped = [layer1.verdict(path) for path in paths]
    monkeypatch.setattr(action.ActionModule, "SCOPE_VARIABLES", False)
    every = [layer1.verdict(path) for path in paths]
    for case, a, b in zip(cases, scoped, every, strict=True):
        assert a == b, case[0]
    assert sum(bool(v["problems"]) for v in scoped) == len(cases) - 2


def test_a_variable_reaches_what_its_value_names_and_a_dynamic_name_keeps_them_all():
    action = _validate_action()
    variables = {"a": "{{ b | default(0) }}/x", "b": ["{{ c }}"], "c": 1, "d": "{{ a }}", "e": 2}
    assert action.reachable({"a", "unset"}, variables) == {
        "a",
        "b",
        "c",
    }  # not d (names a), not e, not default
    assert action.reachable({"e"}, variables) == {"e"}
    assert action.reachable({"a"}, {**variables, "c": "{{ vars['e'] }}"}) is None
    assert action.reachable({"varnames", "e"}, variables) is None  # in a rule: lookup('varnames', ...)
    # the file lookup reads ansible_search_path, which no word of the rule names
    assert action.reachable({"lookup", "a"}, variables) is None


def test_layer_1_in_process_never_uses_a_connection(tmp_path):
    """The double connection raises on any use: a validate action that reached for a node would fail."""
    from ansible.playbook.play_context import PlayContext

    conn = layer1.NoConnection(PlayContext())
    with pytest.raises(AssertionError, match="touched a node"):
        conn.exec_command("true")


# Two real runs of the playbook (ansible-playbook, its callbacks and its exit code), side by side. The control
# is good with one warning: a short model revision is accepted, so the same run shows the warning too.
REAL = {
    "placeholder-address": None,  # a bad case: refused in layer 1, nothing contacted
    "control-good-tp3": good("tp3"),
}
REAL["control-good-tp3"]["pins"]["sparkfleet_pins"]["model"]["revision"] = "afc7aa0a"


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory) -> dict[str, dict]:
    def one(case_id: str) -> tuple[str, dict]:
        root = tmp_path_factory.mktemp(case_id)
        inv = REAL[case_id]
        if inv is None:
            path = inventory_of(root, BY_ID[case_id])
            inv = good(BY_ID[case_id][1])
            BY_ID[case_id][2](inv)
        else:
            path = write_inventory(root / "inventory", copy.deepcopy(inv))
        out = run_preflight(path)
        out["cluster_hosts"] = all_hosts_of(inv)
        return case_id, out

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, REAL))


def test_real_run_refuses_a_bad_inventory_in_layer_1_contacting_no_host(real_runs):
    case_id = "placeholder-address"
    r = real_runs[case_id]
    assert r["rc"] == 2, f"{case_id}: exit {r['rc']}, not 2; stderr:\n{r['stderr'][-2000:]}"
    msgs = messages(r, "localhost")
    assert msgs and msgs[0].startswith(HEADER) and "no host was contacted or changed" in msgs[0], msgs
    assert len(msgs[1:]) == 1 and BY_ID[case_id][3] in msgs[1], msgs
    stats = r["stats"]
    assert stats["localhost"]["failures"] >= 1
    for host in r["cluster_hosts"]:
        s = stats.get(host, {"changed": 0, "unreachable": 0, "failures": 0})
        assert s.get("changed", 0) == 0, f"{case_id}: {host} changed"
        assert s.get("unreachable", 0) == 0, f"{case_id}: something tried to connect to {host}"
        assert s.get("failures", 0) == 0, f"{case_id}: a task failed on {host} (not in the verdict)"
    # layer 2 never started: no play after the verdict ran
    assert [p["play"]["name"] for p in r["plays"]][-1].startswith("Preflight layer 1, the verdict")


def test_control_good_inventory_passes_layer_1_and_only_then_connects(real_runs):
    r = real_runs["control-good-tp3"]
    assert messages(r, "localhost") == []
    assert r["stats"]["localhost"]["failures"] == 0
    # layer 2 tries to gather facts: the closed port makes every host unreachable, so the
    # zero-unreachable check of the bad case means something
    assert all(r["stats"][h]["unreachable"] == 1 for h in r["cluster_hosts"]), r["stats"]
    assert all(r["stats"][h].get("changed", 0) == 0 for h in r["cluster_hosts"])


def test_short_revision_is_accepted_with_a_warning(real_runs, tmp_path):
    r = real_runs["control-good-tp3"]
    assert r["stats"]["localhost"]["failures"] == 0
    assert "sparkfleet_pins.model.revision='afc7aa0a' is a short commit (8 hex" in r["stderr"] + json.dumps(r)
    assert "pin the full 40-hex commit" in r["stderr"] + json.dumps(r)
    # in-process the same warning, and no problem
    inv = write_inventory(tmp_path / "inventory", copy.deepcopy(REAL["control-good-tp3"]))
    verdict = layer1.verdict(inv)
    assert verdict["problems"] == []
    assert any(
        "sparkfleet_pins.model.revision='afc7aa0a' is a short commit" in w for w in verdict["warnings"]
    )

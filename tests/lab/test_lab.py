"""The lab itself: every node is a plausible DGX Spark as far as the playbooks can tell."""

from __future__ import annotations

import json

import pytest
from sparkfleet_lab import topology


def _expected_netdevs(lab, node_number: int) -> set[str]:
    out = set()
    for rail in topology.rails(lab.project_dir, lab.topology):
        for end in (rail.a, rail.b):
            if end.node == node_number:
                out.add(end.netdev)
    return out


def test_every_node_has_its_fabric_interfaces_at_mtu_9000(lab, node):
    for n, host in enumerate(lab.hosts, start=1):
        expected = _expected_netdevs(lab, n)
        assert len(expected) == (2 if lab.topology == "tp2" else 4)
        for netdev in expected:
            iface = node(host).interface(netdev)
            assert iface.exists, f"{host}: {netdev} missing"
            assert node(host).file(f"/sys/class/net/{netdev}/mtu").content_string.strip() == "9000"


def test_management_interface_is_named_like_a_spark(lab, node):
    for n, host in enumerate(lab.hosts, start=1):
        assert lab.mgmt_ip(n) in node(host).interface("enP7s7").addresses


def test_sshd_and_dockerd_run_and_docker_uses_overlay2_on_the_nodes_volume(lab, node):
    for host in lab.hosts:
        h = node(host)
        assert h.service("ssh").is_running
        assert h.service("docker").is_running
        info = json.loads(h.check_output("sudo docker info --format '{{json .Driver}}'"))
        assert info == "overlay2"
        # the node's own volume, not the container's overlayfs root (overlay2 cannot stack on overlayfs)
        assert h.check_output("stat -f -c %T /var/lib/docker") != "overlayfs"


def test_gpu_simulator_answers_like_nvidia_smi(lab, node):
    for host in lab.hosts:
        out = node(host).check_output("nvidia-smi -L")
        assert out.startswith("GPU 0: NVIDIA GB10 (UUID: GPU-"), out
        query = "nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader,nounits"
        csv = node(host).check_output(query)
        name, max_sm = (part.strip() for part in csv.split(","))
        assert name == "NVIDIA GB10"
        assert int(max_sm) > 1000


def test_nodes_have_no_internet_but_reach_the_hub(lab, node):
    h = node(lab.hosts[0])
    assert h.run("ip route show default").stdout.strip() == ""
    assert h.run(f"curl -sf -o /dev/null http://{lab.hub_ip}:5000/v2/").rc == 0


@pytest.mark.topology("tp3")
def test_tp3_ring_cabling_connects_every_pair(lab):
    pairs = {frozenset((r.a.node, r.b.node)) for r in topology.rails(lab.project_dir, lab.topology)}
    assert pairs == {frozenset(p) for p in ((1, 2), (2, 3), (1, 3))}

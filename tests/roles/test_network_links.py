"""Role network_links on a two-node lab (molecule/network_links): every planned rail carries its address
at MTU 9000 and passes jumbo frames to its peer; the management link is left as it was."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("lab")


def rails(plan):
    return [(host, rail) for host, rs in plan["interfaces"].items() for rail in rs]


def test_rails_carry_their_planned_address_at_mtu_9000(plan, node):
    for host, rail in rails(plan):
        iface = node(host).interface(rail["netdev"])
        assert f"{rail['address']}/{rail['prefix']}" in node(host).check_output(
            f"ip -4 -o addr show dev {rail['netdev']}"
        ), (host, rail["netdev"])
        assert (
            iface.exists
            and node(host).file(f"/sys/class/net/{rail['netdev']}/mtu").content_string.strip() == "9000"
        )


def test_jumbo_frames_reach_the_peer_on_every_rail(plan, node):
    for host, rail in rails(plan):
        cmd = f"ping -n -q -M do -s 8972 -c 1 -W 3 -I {rail['netdev']} {rail['peer_address']}"
        assert node(host).run(cmd).rc == 0, (host, cmd)


def test_netplan_file_is_private_and_management_link_untouched(plan, lab, node):
    for n, host in enumerate(lab.hosts, start=1):
        netplan = node(host).file("/etc/netplan/40-sparkfleet-fabric.yaml")
        with node(host).sudo():
            assert netplan.is_file and netplan.mode == 0o600
        assert lab.mgmt_ip(n) in node(host).interface("enP7s7").addresses

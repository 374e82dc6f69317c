"""The VM lab's fabric is real: each rail a link between two guests that carries 9000-byte frames, each
end a soft-RoCE device named as the ConnectX-7 HCA, and RDMA traffic (ib_write_bw) across it. The network
roles do not run in this scenario yet: the test gives both ends of a rail a temporary address, then takes
it away."""

from __future__ import annotations

import shlex
import subprocess
import time

import pytest

pytestmark = pytest.mark.usefixtures("lab")


def _ends(lab):
    out = []
    for rail in lab.rails():
        out.append((rail, f"spark{rail.a.node}", rail.a, f"spark{rail.b.node}", rail.b))
    return out


def test_every_rail_has_its_spark_name_mtu_9000_and_an_active_rxe_device(lab, node):
    for n, host in enumerate(lab.hosts, start=1):
        h = node(host)
        for _rail, _side, end in lab._node_rails(n):
            assert h.check_output(f"cat /sys/class/net/{end.netdev}/mtu") == "9000"
            ib = f"/sys/class/infiniband/{end.hca}"
            assert h.check_output(f"cat {ib}/ports/1/state") == "4: ACTIVE"
            assert h.check_output(f"cat {ib}/ports/1/gid_attrs/ndevs/0") == end.netdev
            gid0 = h.check_output(f"cat {ib}/ports/1/gids/0")
            assert gid0.startswith("fe80:") and gid0 != "fe80:0000:0000:0000:0000:0000:0000:0000"


@pytest.fixture
def addressed_rail(lab, node):
    """The first rail with 10.99.0.1/30 and 10.99.0.2/30 on its two ends, removed afterwards."""
    _rail, ha, a, hb, b = _ends(lab)[0]
    ends = [(ha, a, "10.99.0.1"), (hb, b, "10.99.0.2")]
    for host, end, ip in ends:
        node(host).check_output(f"sudo ip addr add {ip}/30 dev {end.netdev}")
    yield ends
    for host, end, ip in ends:
        node(host).run(f"sudo ip addr del {ip}/30 dev {end.netdev}")


def test_a_rail_carries_jumbo_frames_between_the_two_guests(node, addressed_rail):
    (ha, _a, _ipa), (_hb, _b, ipb) = addressed_rail
    # 8972 bytes of ICMP payload + 28 of headers = 9000, never fragmented (-M do). A reply of that size proves
    # the link; not every one comes back: the rail is UDP between two emulated guests on a loaded machine, and
    # 1 of 3 was lost in a measured run (a real cable loses none: the container lab's and the roles' tests)
    out = node(ha).run(f"sudo ping -c 5 -W 10 -M do -s 8972 {ipb}")  # root: a raw ICMP socket
    assert out.rc == 0, out.stdout + out.stderr  # ping's 0: at least one reply
    assert "8980 bytes from " + ipb in out.stdout  # 8972 + the 8-byte ICMP header, in one frame


BW_ARGS = "-s 65536 -n 50 -u 20 -F"  # 50 writes of 64 KiB; -F: no CPU-frequency warning as failure


def test_rdma_writes_cross_a_rail(lab, node, addressed_rail):
    (ha, a, _ipa), (hb, b, ipb) = addressed_rail
    # the server in the background on one guest (rdma_cm connection over the rail's address), the client on
    # the other; small, and a long ACK timeout (-u 20: 4 s, not 67 ms): soft-RoCE under TCG on a busy machine
    # answers late, and perftest's default gave up with "retry exceeded" (status 9)
    server = subprocess.Popen(
        ["ssh", "-F", str(lab.ssh_config), hb, f"timeout 240 ib_write_bw -R -d {b.hca} {BW_ARGS}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        time.sleep(10)  # the server's listen
        cmd = f"timeout 240 ib_write_bw -R -d {a.hca} {BW_ARGS} {shlex.quote(ipb)}"
        client = node(ha).run(cmd)
        assert client.rc == 0, client.stdout + client.stderr
        rows = [line.split() for line in client.stdout.splitlines() if line.strip().startswith("65536")]
        # all 50 writes completed on both sides (exit 0); the bandwidth perftest prints is not asserted: from
        # the emulated CPU's cycle counter it read 0.00 MiB/s in a run where every write completed
        assert rows and int(rows[0][1]) == 50, client.stdout  # bytes, iterations
    finally:
        out, _ = server.communicate(timeout=300)
    assert server.returncode == 0, out

"""Fabric network, SSH trust and preflight on a live lab (TP2 or TP3).

Read-only checks first: every rail has the plan's address at MTU 9000, a jumbo ping reaches the
right peer (its MAC answers) and nothing off the cable answers, the management link is untouched,
RDMA/GID discovery through the lab's sysfs stand-in, the NCCL environment, key-based SSH with
pinned host keys, preflight changing nothing (network.yml's idempotence and --check are molecule's
steps: tp3's for site.yml, the network_links and ssh_trust scenarios' for the roles alone).
Destructive ones last: a drifted rail is repaired by a re-run; a restarted node gets its addresses
and MTU back by itself.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SYSFS = "/run/sparkfleet-lab/sysfs/class/infiniband"
MGMT = "enP7s7"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def plan(lab) -> dict:
    """The plan the roles compute, from the lab's own inventory data."""
    mod = _load("sparkfleet_plan", ROOT / "plugins/filter/plan.py")
    d = yaml.safe_load((ROOT / "roles/cluster_plan/defaults/main.yml").read_text())
    hosts = {
        h: {"node": n, "mgmt_address": lab.mgmt_ip(n), "group": "head" if n == 1 else "workers"}
        for n, h in enumerate(lab.hosts, start=1)
    }
    return mod.cluster_plan(
        hosts,
        lab.topology,
        d["cluster_plan_default_cabling"][lab.topology],
        d["cluster_plan_port_netdevs"],
        d["cluster_plan_subnet_template"],
    )


def rails(plan: dict):
    for host, items in plan["interfaces"].items():
        for rail in items:
            yield host, rail


def ip_json(node, host: str) -> dict:
    return {link["ifname"]: link for link in json.loads(node(host).check_output("ip -j addr show"))}


def changed(result) -> dict[str, int]:
    return {h: s.changed for h, s in result.hosts.items()}


def test_every_rail_has_its_planned_address_at_mtu_9000(lab, node, plan):
    for host in lab.hosts:
        live = ip_json(node, host)
        for rail in plan["interfaces"][host]:
            link = live[rail["netdev"]]
            v4 = [f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a["family"] == "inet"]
            assert v4 == [f"{rail['address']}/{rail['prefix']}"], (host, rail["netdev"], v4)
            assert link["mtu"] == 9000, (host, rail["netdev"])
            assert "LOWER_UP" in link["flags"], (host, rail["netdev"])
            assert not [a for a in link["addr_info"] if a["family"] == "inet6"], (host, rail["netdev"])


def test_netplan_file_is_static_0600_and_never_routes(lab, node, plan):
    for host in lab.hosts:
        f = node(host).file("/etc/netplan/40-sparkfleet-fabric.yaml")
        assert f.exists and f.mode == 0o600 and f.user == "root"
        doc = yaml.safe_load(node(host).check_output("sudo cat /etc/netplan/40-sparkfleet-fabric.yaml"))
        eths = doc["network"]["ethernets"]
        assert set(eths) == {r["netdev"] for r in plan["interfaces"][host]}
        assert MGMT not in eths
        for dev in eths.values():
            assert dev["dhcp4"] is False and dev["mtu"] == 9000
            assert dev["link-local"] == [] and dev["accept-ra"] is False
            assert not {"routes", "gateway4", "gateway6", "nameservers"} & set(dev)
        assert node(host).service("systemd-networkd").is_enabled
        assert node(host).service("systemd-networkd").is_running


def test_management_link_is_untouched(lab, node):
    for n, host in enumerate(lab.hosts, start=1):
        h = node(host)
        assert lab.mgmt_ip(n) in h.interface(MGMT).addresses
        line = [
            ln for ln in h.check_output("networkctl list --no-legend --no-pager").splitlines() if MGMT in ln
        ]
        assert line and line[0].split()[-1] == "unmanaged", line
        assert h.run("ip route show default").stdout.strip() == ""  # no gateway appeared


def test_jumbo_ping_reaches_the_right_peer_on_every_rail(lab, node, plan):
    for host, rail in rails(plan):
        cmd = f"ping -n -q -M do -s 8972 -c 3 -i 0.2 -w 10 -I {rail['netdev']} {rail['peer_address']}"
        r = node(host).run(cmd)
        assert r.rc == 0, f"{host} {rail['netdev']} -> {rail['peer_address']}: {r.stdout}{r.stderr}"
        # the answer came from the peer's netdev on this cable: its MAC is the neighbour entry
        peer_mac = (
            node(rail["peer_host"]).file(f"/sys/class/net/{rail['peer_netdev']}/address").content_string
        )
        neigh = node(host).check_output(f"ip -j neigh show dev {rail['netdev']} to {rail['peer_address']}")
        assert json.loads(neigh)[0]["lladdr"] == peer_mac.strip(), (host, rail["netdev"])


def test_frames_over_the_mtu_are_refused_not_fragmented(lab, node, plan):
    host, rail = next(rails(plan))
    r = node(host).run(f"ping -n -M do -s 8973 -c 1 -w 3 -I {rail['netdev']} {rail['peer_address']}")
    assert r.rc != 0
    assert "message too long" in (r.stdout + r.stderr).lower(), r.stdout + r.stderr


def test_nothing_off_the_cable_answers(lab, node, plan):
    """From every rail, no address of the third node (nor an unused one) answers: each cable is a
    point-to-point link. The probes of one node run side by side (each waits out its 2 s deadline);
    the peer on the cable is probed the same way and must answer, so a probe that cannot work fails."""
    everyone = {h: [r["address"] for r in items] for h, items in plan["interfaces"].items()}
    probes: dict[str, list[tuple[str, str, str]]] = {}
    peers: dict[str, list[tuple[str, str]]] = {}
    for host, rail in rails(plan):
        others = [a for h, addrs in everyone.items() if h not in (host, rail["peer_host"]) for a in addrs]
        net = rail["subnet"].rsplit(".", 1)[0]
        unused = f"{net}.9"  # no Spark has node number 9 in the lab
        probes.setdefault(host, []).extend((rail["netdev"], rail["cable"], t) for t in [*others, unused])
        peers.setdefault(host, []).append((rail["netdev"], rail["peer_address"]))
    for host, items in probes.items():
        pairs = [(dev, target) for dev, _, target in items] + peers[host]
        script = " ".join(
            f"(ping -n -q -c 2 -i 0.2 -w 2 -I {dev} {target} >/dev/null 2>&1; echo {dev} {target} $?) &"
            for dev, target in pairs
        )
        out = node(host).check_output(f"sh -c '{script} wait'")
        rcs = {(dev, target): rc for dev, target, rc in (line.split() for line in out.splitlines())}
        assert len(rcs) == len(pairs), out  # every probe reported
        for dev, peer in peers[host]:
            assert rcs[(dev, peer)] == "0", f"{host} {dev}: the peer {peer} did not answer the same probe"
        for dev, cable, target in items:
            assert rcs[(dev, target)] != "0", f"{host} {dev} (cable {cable}) answered by {target}"


def test_rdma_stand_in_shows_active_ports_with_the_ipv4_roce_v2_gid(lab, node, plan):
    for host, rail in rails(plan):
        port = f"{SYSFS}/{rail['hca']}/ports/1"
        h = node(host)
        assert h.file(f"{port}/state").content_string.strip() == "4: ACTIVE"
        assert h.file(f"{SYSFS}/{rail['hca']}/device/net/{rail['netdev']}").is_directory
        gids = h.check_output(f"grep -H . {port}/gids/* {port}/gid_attrs/types/* 2>/dev/null || true")
        want = "0000:0000:0000:0000:0000:ffff:" + "".join(f"{int(x):02x}" for x in rail["address"].split("."))
        want = want[:-4] + ":" + want[-4:]
        assert f"gids/3:{want}" in gids, (host, rail["hca"], gids[:400])
        assert "types/3:RoCE v2" in gids
    # the real sysfs has none: the bandwidth test must say it skipped
    assert not node(lab.hosts[0]).file("/sys/class/infiniband").exists


def _nccl_facts(play, tmp_path: Path, **extravars) -> tuple[object, Path]:
    """Run network_links tasks_from facts (read-only) and save each host's facts on the controller."""
    out = tmp_path / "env"
    out.mkdir()
    pb = tmp_path / "nccl.yml"
    pb.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "NCCL environment (network_links tasks_from facts, read-only)",
                    "hosts": "cluster",
                    "gather_facts": False,
                    "become": True,
                    "roles": ["cluster_plan"],
                    "tasks": [
                        {"ansible.builtin.include_role": {"name": "network_links", "tasks_from": "facts"}},
                        {
                            "ansible.builtin.copy": {
                                "content": (
                                    "{{ {'env': network_links_nccl_env, "
                                    "'peers': network_links_fabric_peers} | to_json }}"
                                ),
                                "dest": f"{out}/{{{{ inventory_hostname }}}}.json",
                                "mode": "0644",
                            },
                            "delegate_to": "localhost",
                            "become": False,
                            "changed_when": False,
                        },
                    ],
                }
            ],
            sort_keys=False,
        )
    )
    return play(str(pb), extravars=extravars or None), out


def _rendezvous(lab, plan: dict, host: str) -> tuple[str, str]:
    """(MASTER_ADDR, NCCL_SOCKET_IFNAME) of a rank: TP2 on the cable, TP3 on the management network."""
    if lab.topology == "tp2":
        spark1 = next(i for i in plan["interfaces"][lab.hosts[0]] if i["rail"] == 1)
        mine = next(i for i in plan["interfaces"][host] if i["subnet"] == spark1["subnet"])
        return spark1["address"], mine["netdev"]
    return lab.mgmt_ip(1), MGMT


def test_without_rdma_devices_the_role_says_so_and_nccl_uses_sockets(lab, play, plan, tmp_path):
    r, out = _nccl_facts(play, tmp_path, network_links_sysfs_root="/nonexistent-sysfs")
    assert r.exit_code == 0, r.failures
    for host in lab.hosts:
        env = json.loads((out / f"{host}.json").read_text())["env"]
        master, ifname = _rendezvous(lab, plan, host)
        assert env == {"NCCL_SOCKET_IFNAME": ifname, "MASTER_ADDR": master, "NCCL_IB_DISABLE": "1"}


def test_nccl_environment_per_rank(lab, play, plan, tmp_path):
    r, out = _nccl_facts(play, tmp_path)
    assert r.exit_code == 0, r.failures
    assert all(s.changed == 0 for h, s in r.hosts.items() if h != "localhost"), changed(r)
    for host in lab.hosts:
        data = json.loads((out / f"{host}.json").read_text())
        env = data["env"]
        master, ifname = _rendezvous(lab, plan, host)
        assert env["MASTER_ADDR"] == master == plan["master_addr"]
        assert env["NCCL_SOCKET_IFNAME"] == ifname
        hcas = []
        for rail in sorted(
            plan["interfaces"][host], key=lambda i: (plan["ranks"][i["peer_host"]], i["rail"])
        ):
            hcas.append(rail["hca"])
        assert env["NCCL_IB_HCA"] == ",".join(hcas)
        assert env["NCCL_IB_GID_INDEX"] == "3"  # discovered from the stand-in, the same everywhere
        tp3 = {
            "NCCL_NET": "IB",
            "NCCL_NET_PLUGIN": "none",
            "NCCL_IB_SUBNET_AWARE_ROUTING": "1",
            "NCCL_CROSS_NIC": "1",
            "NCCL_P2P_DISABLE": "1",
            "NCCL_SHM_DISABLE": "1",
            "NCCL_IB_SUBNET_PREFIX_LEN": "24",
        }
        if lab.topology == "tp3":
            assert tp3.items() <= env.items()
        else:
            assert not set(tp3) & set(env)
        peers = data["peers"]
        assert set(peers) == {h for h in lab.hosts if h != host}
        for peer, info in peers.items():
            assert info["rank"] == plan["ranks"][peer]
            assert info["peer_addresses"] == [
                r["peer_address"] for r in plan["interfaces"][host] if r["peer_host"] == peer
            ]


def test_head_reaches_every_worker_by_key_with_pinned_host_keys(lab, node, plan):
    head = node(plan["head"])
    opts = (
        "-F /dev/null -i /home/spark/.ssh/sparkfleet_ed25519 -o IdentitiesOnly=yes "
        "-o UserKnownHostsFile=/home/spark/.ssh/sparkfleet_known_hosts -o StrictHostKeyChecking=yes "
        "-o BatchMode=yes -o ConnectTimeout=5"
    )
    for worker in plan["workers"]:
        addrs = [plan["mgmt_addresses"][worker]] + [
            r["peer_address"] for r in plan["interfaces"][plan["head"]] if r["peer_host"] == worker
        ]
        for addr in addrs:
            r = head.run(f"ssh {opts} spark@{addr} hostname")
            assert r.rc == 0 and r.stdout.strip() == worker, f"{addr}: {r.stderr}"
        # by name, through the managed ~/.ssh/config
        r = head.run(f"ssh -o ConnectTimeout=5 {worker} hostname")
        assert r.rc == 0 and r.stdout.strip() == worker, r.stderr
        # the pinned file is what makes it work: without it, BatchMode refuses the unknown host
        bare = opts.replace("/home/spark/.ssh/sparkfleet_known_hosts", "/dev/null")
        r = head.run(f"ssh {bare} spark@{addrs[0]} true; echo rc=$?")  # testinfra raises on a bare 255
        assert "rc=255" in r.stdout and "Host key verification failed" in r.stderr, (r.stdout, r.stderr)
    mode = head.file("/home/spark/.ssh/sparkfleet_ed25519")
    assert mode.mode == 0o600 and mode.user == "spark"


FIND_CHANGES = (
    "sudo find / -xdev \\( -path /proc -o -path /sys -o -path /run -o -path /tmp -o -path /dev "
    "-o -path /var/log -o -path /home/spark/.ansible -o -path /root/.ansible \\) -prune -o "
    "\\( -newer /tmp/.sparkfleet-preflight-mark -o -cnewer /tmp/.sparkfleet-preflight-mark \\) -print"
)


def test_preflight_changes_nothing(lab, node, play):
    before = {}
    for host in lab.hosts:
        node(host).check_output("touch /tmp/.sparkfleet-preflight-mark")
        before[host] = (
            node(host).check_output("ip -j addr show"),
            node(host).check_output("systemctl list-units --no-legend --plain --state=active"),
        )
    time.sleep(1.1)  # mtime granularity
    r = play("playbooks/preflight.yml")
    assert r.exit_code == 0, r.failures
    assert all(v == 0 for v in changed(r).values()), changed(r)
    for host in lab.hosts:
        touched = node(host).check_output(FIND_CHANGES).strip()
        assert touched == "", f"{host}: preflight touched\n{touched}"
        after = (
            node(host).check_output("ip -j addr show"),
            node(host).check_output("systemctl list-units --no-legend --plain --state=active"),
        )
        assert after == before[host], f"{host}: addresses or active units changed"


# ---- destructive: run last -----------------------------------------------------------------


def _engine_running(node, host: str) -> bool:
    return (
        node(host).run("sudo docker inspect -f '{{.State.Running}}' sparkfleet-engine").stdout.strip()
        == "true"
    )


@pytest.mark.destructive
def test_a_drifted_rail_is_repaired_by_a_rerun(lab, node, play, plan):
    host = plan["workers"][-1]
    first, second = plan["interfaces"][host][:2]
    node(host).check_output(f"sudo ip link set dev {first['netdev']} mtu 1500")
    node(host).check_output(f"sudo ip -4 addr flush dev {second['netdev']}")
    r = play("playbooks/network.yml")
    assert r.exit_code == 0, r.failures
    assert r.hosts[host].changed >= 1
    live = ip_json(node, host)
    assert live[first["netdev"]]["mtu"] == 9000
    assert [a["local"] for a in live[second["netdev"]]["addr_info"] if a["family"] == "inet"] == [
        second["address"]
    ]
    again = play("playbooks/network.yml")
    assert all(v == 0 for v in changed(again).values()), changed(again)


@pytest.mark.destructive
def test_a_restarted_node_gets_its_addresses_and_mtu_back_by_itself(lab, node, play, plan):
    host = plan["workers"][-1]
    engine = any(_engine_running(node, h) for h in lab.hosts)
    subprocess.run(["docker", "restart", lab.container(host)], check=True, capture_output=True)
    lab._wait_booted(host)
    lab._wait_ssh(host)
    deadline = time.monotonic() + 60
    while True:
        live = ip_json(node, host)
        got = {r["netdev"]: live.get(r["netdev"], {}) for r in plan["interfaces"][host]}
        ok = all(
            [a["local"] for a in got[r["netdev"]].get("addr_info", []) if a["family"] == "inet"]
            == [r["address"]]
            and got[r["netdev"]].get("mtu") == 9000
            for r in plan["interfaces"][host]
        )
        if ok or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert ok, f"{host} after restart: {json.dumps(got)[:1500]}"
    assert node(host).service("systemd-networkd").is_running
    for rail in plan["interfaces"][host]:
        cmd = f"ping -n -q -M do -s 8972 -c 3 -i 0.2 -w 15 -I {rail['netdev']} {rail['peer_address']}"
        assert node(host).run(cmd).rc == 0, (host, rail["netdev"])
        state = node(host).run(f"cat {SYSFS}/{rail['hca']}/ports/1/state").stdout.strip()
        assert state == "4: ACTIVE", (host, rail["hca"], state)
    # nothing to converge for the network afterwards
    r = play("playbooks/network.yml", tags="network")
    assert r.exit_code == 0 and r.hosts[host].changed == 0, changed(r)
    if engine and (ROOT / "playbooks/start.yml").exists():
        r = play("playbooks/start.yml")  # the restarted node lost its rank: leave the cluster converged
        assert r.exit_code == 0, r.failures

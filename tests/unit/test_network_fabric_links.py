"""sparkfleet_fabric_links: live state of the rails vs the plan, and what applying runs."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


fl = _load("sparkfleet_fabric_links", ROOT / "plugins/modules/fabric_links.py")

LINKS = [
    {"netdev": "enp1s0f1np1", "address": "10.12.1.1", "prefix": 24},
    {"netdev": "enP2p1s0f1np1", "address": "10.12.2.1", "prefix": 24},
]


def ip_json(*links: dict) -> str:
    return json.dumps(list(links))


def link(name, flags=("BROADCAST", "UP", "LOWER_UP"), mtu=9000, v4=(), v6=()):
    info = [{"family": "inet", "local": a.split("/")[0], "prefixlen": int(a.split("/")[1])} for a in v4]
    info += [{"family": "inet6", "local": a.split("/")[0], "prefixlen": int(a.split("/")[1])} for a in v6]
    return {"ifname": name, "flags": list(flags), "mtu": mtu, "addr_info": info}


def test_converged_rails_have_no_drift():
    live = fl.parse_ip(
        ip_json(link("enp1s0f1np1", v4=["10.12.1.1/24"]), link("enP2p1s0f1np1", v4=["10.12.2.1/24"]))
    )
    assert fl.drift(LINKS, live, 9000) == []
    assert fl.drift(LINKS, live, 9000, carrier=True) == []


def test_drift_names_each_difference():
    live = fl.parse_ip(
        ip_json(
            link("enp1s0f1np1", mtu=1500, v4=["10.12.1.1/24", "192.168.5.5/24"]),
            link("enP2p1s0f1np1", flags=("BROADCAST",), v4=[]),
        )
    )
    assert fl.drift(LINKS, live, 9000) == [
        "enp1s0f1np1: IPv4 10.12.1.1/24, 192.168.5.5/24, plan 10.12.1.1/24",
        "enp1s0f1np1: MTU 1500, plan 9000",
        "enP2p1s0f1np1: IPv4 none, plan 10.12.2.1/24",
        "enP2p1s0f1np1: administratively down",
    ]
    assert fl.drift(LINKS, {}, 9000) == ["enp1s0f1np1: missing", "enP2p1s0f1np1: missing"]


def test_no_carrier_counts_only_after_applying():
    live = fl.parse_ip(
        ip_json(
            link("enp1s0f1np1", flags=("BROADCAST", "UP"), v4=["10.12.1.1/24"]),
            link("enP2p1s0f1np1", v4=["10.12.2.1/24"]),
        )
    )
    assert fl.drift(LINKS, live, 9000) == []
    assert fl.drift(LINKS, live, 9000, carrier=True) == [
        "enp1s0f1np1: no carrier (check the cable and that the peer Spark is up)"
    ]


def test_apply_touches_only_the_rails():
    assert fl.apply_commands("networkd", ["a", "b"]) == [
        ["netplan", "generate"],
        ["networkctl", "reload"],
        ["networkctl", "reconfigure", "a", "b"],
    ]
    assert fl.apply_commands("NetworkManager", ["a"]) == [
        ["netplan", "generate"],
        ["nmcli", "connection", "reload"],
        ["nmcli", "connection", "up", "netplan-a"],
    ]


def render_netplan(renderer: str) -> dict:
    import jinja2
    import yaml

    env = jinja2.Environment(  # noqa: S701 - Ansible's template module: YAML text, no autoescape
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True
    )
    rails = [
        {**link, "cable": "n1p1-n2p1", "rail": n, "peer_host": "spark2", "peer_netdev": link["netdev"]}
        | {"peer_address": link["address"].rsplit(".", 1)[0] + ".2"}
        for n, link in enumerate(LINKS, start=1)
    ]
    text = env.from_string((ROOT / "roles/network_links/templates/fabric.yaml.j2").read_text()).render(
        ansible_managed="Ansible managed",
        inventory_hostname="spark1",
        sparkfleet_plan={"nodes": {"spark1": 1}},
        network_links_mtu=9000,
        __network_links_rails=rails,
        __network_links_renderer=renderer,
    )
    return yaml.safe_load(text)["network"]["ethernets"]


def test_netplan_takes_ipv6_off_the_rails_under_networkmanager_too():
    # netplan renders `link-local: []` for NetworkManager as ipv6.method=ignore: on the VM lab's real kernel
    # the rails kept the kernel's fe80:: address (molecule/vm); the passthrough makes it disabled
    nm = render_netplan("NetworkManager")
    networkd = render_netplan("networkd")
    assert set(nm) == set(networkd) == {link["netdev"] for link in LINKS}
    for dev in nm.values():
        assert dev["renderer"] == "NetworkManager" and dev["link-local"] == []
        assert dev["networkmanager"] == {"passthrough": {"ipv6.method": "disabled"}}
    for dev in networkd.values():
        # networkd's LinkLocalAddressing=no already keeps IPv6 off; the networkmanager key is for NM only
        assert dev["renderer"] == "networkd" and dev["link-local"] == [] and "networkmanager" not in dev


# ---- the RDMA read in fabric_links' round trip (role network_links' no-op: one round trip for both) -------
SYSFS = Path(__file__).resolve().parent / "fixtures" / "sysfs" / "normal"
RDMA_LINKS = [
    {"netdev": "enp1s0f1np1", "hca": "rocep1s0f1", "address": "10.12.1.1", "prefix": 24},
    {"netdev": "enP2p1s0f1np1", "hca": "roceP2p1s0f1", "address": "10.12.2.1", "prefix": 24},
]


def stand_in_ip(tmp_path: Path, *rails: dict) -> dict:
    """PATH with an `ip` that prints these rails as `ip -j addr show` does, and a `netplan`, `networkctl` that
    record their calls (the apply's commands)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "ip.json").write_text(ip_json(*rails))
    (bindir / "ip").write_text(f"#!/bin/sh\ncat {tmp_path / 'ip.json'}\n")
    for tool in ("netplan", "networkctl"):
        (bindir / tool).write_text(f'#!/bin/sh\necho {tool} "$@" >> {tmp_path / "calls"}\n')
    for f in bindir.iterdir():
        f.chmod(0o755)
    return {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}


def test_fabric_links_reads_rdma_as_rdma_facts_does_when_it_applies_nothing(tmp_path):
    import module_runner

    matching = [link(r["netdev"], v4=[f"{r['address']}/24"]) for r in RDMA_LINKS]
    env = stand_in_ip(tmp_path, *matching)
    options = {"sysfs_root": str(SYSFS), "min_rate_gbps": 200, "real_sysfs_root": str(tmp_path / "no-sys")}
    got = module_runner.run("fabric_links", {"links": RDMA_LINKS, "rdma": options}, env)
    assert not got["changed"] and got["drift"] == [] and not (tmp_path / "calls").exists()
    want = module_runner.run("rdma_facts", {"links": RDMA_LINKS, **options}, env)
    want = {k: v for k, v in want.items() if k not in ("changed", "invocation")}
    assert got["rdma"] == want and [d["gid_index"] for d in want["devices"]] == [3, 3]
    # without the option: nothing read
    assert module_runner.run("fabric_links", {"links": RDMA_LINKS}, env)["rdma"] is None


def test_fabric_links_reads_no_rdma_after_it_applied(tmp_path):
    import module_runner

    drifted = [link(r["netdev"], mtu=1500, v4=[f"{r['address']}/24"]) for r in RDMA_LINKS]
    env = stand_in_ip(tmp_path, *drifted)
    args = {"links": RDMA_LINKS, "rdma": {"sysfs_root": str(SYSFS)}, "wait_s": 0}
    got = module_runner.run("fabric_links", args, env)  # the stand-in never converges: the apply fails
    assert "MTU 1500, plan 9000" in " ".join(got["drift"]) and got.get("rdma") is None
    assert module_runner.run("fabric_links", args | {"_ansible_check_mode": True}, env)["rdma"] is None

"""The lab's networks (part of sparkfleet_lab.core.Lab): its slot and addresses, the management network, one
internal network per cable rail (MTU 9000), and the forwarding rule each rail bridge needs in DOCKER-USER."""

from __future__ import annotations

import shutil
import subprocess

from sparkfleet_lab import docker as d
from sparkfleet_lab import topology
from sparkfleet_lab.lab_base import LABEL, LabError


class LabNetwork:
    # ---- addressing ----------------------------------------------------------------------
    @property
    def slot(self) -> int:
        return int(self.state["slot"])

    def mgmt_subnet(self, slot: int | None = None) -> str:
        return f"10.250.{slot if slot is not None else self.slot}.0/24"

    def mgmt_ip(self, node: int) -> str:
        return f"10.250.{self.slot}.{10 + node}"

    @property
    def hub_ip(self) -> str:
        return f"10.250.{self.slot}.2"

    def rail_subnet(self, index: int) -> str:
        return f"10.251.{self.slot}.{8 * index}/29"

    def rail_ip(self, index: int, side: str) -> str:
        return f"10.251.{self.slot}.{8 * index + (2 if side == 'a' else 3)}"

    def rail_network(self, rail: topology.Rail) -> str:
        return f"{self.prefix}-{rail.cable}-r{rail.rail}"

    @property
    def mgmt_network(self) -> str:
        return f"{self.prefix}-mgmt"

    # ---- networks --------------------------------------------------------------------------
    def _labels(self, role: str, **extra: str) -> list[str]:
        out = ["--label", f"{LABEL}={self.name}", "--label", f"{LABEL}.role={role}"]
        for k, v in extra.items():
            out += ["--label", f"{LABEL}.{k}={v}"]
        return out

    def _ensure_networks(self) -> None:
        if "slot" not in self.state:
            self.state["slot"] = self._create_mgmt_network()
            self._save_state()
        elif d.inspect("network", self.mgmt_network) is None:
            self._create_network(self.mgmt_network, self.mgmt_subnet(), mtu=1500, role="mgmt")
        for rail in self.rails():
            if d.inspect("network", self.rail_network(rail)) is None:
                self._create_network(
                    self.rail_network(rail),
                    self.rail_subnet(rail.index),
                    mtu=9000,
                    role="rail",
                    cable=rail.cable,
                )
        self._ensure_fabric_forwarding()

    # Docker drops traffic on an --internal network whose addresses are not the network's own
    # subnet (its isolation rules see bridged frames through br_netfilter). The fabric carries the
    # addressing plan's subnets (10.12.1.0/24, ...), not Docker's placeholders, so the lab lets
    # each rail bridge forward to itself, in DOCKER-USER (evaluated first), tagged with the lab's
    # name so `down` removes exactly these rules. Nothing is routed between bridges.
    def _rail_bridges(self) -> list[str]:
        out = []
        for rail in self.rails():
            info = d.inspect("network", self.rail_network(rail))
            if info:
                name = (info.get("Options") or {}).get("com.docker.network.bridge.name")
                out.append(name or f"br-{info['Id'][:12]}")
        return out

    def _fabric_rule(self, bridge: str) -> list[str]:
        return [
            "DOCKER-USER",
            "-i",
            bridge,
            "-o",
            bridge,
            "-m",
            "comment",
            "--comment",
            self.prefix,
            "-j",
            "ACCEPT",
        ]

    def _ensure_fabric_forwarding(self) -> None:
        if shutil.which("iptables") is None or not _iptables("-n", "-L", "DOCKER-USER"):
            return  # no Docker firewall chain: nothing drops the fabric's traffic
        for bridge in self._rail_bridges():
            if not _iptables("-C", *self._fabric_rule(bridge)):
                _iptables("-I", *self._fabric_rule(bridge), check=True)

    def _remove_fabric_forwarding(self) -> None:
        if shutil.which("iptables") is None:
            return
        proc = subprocess.run(["iptables", "-S", "DOCKER-USER"], capture_output=True, text=True, check=False)
        for line in proc.stdout.splitlines():
            if f"--comment {self.prefix} " in line or f'--comment "{self.prefix}" ' in line:
                rule = line.split()[1:]  # drop "-A"
                _iptables("-D", *[part.strip('"') for part in rule])

    def _create_network(self, name: str, subnet: str, mtu: int, role: str, **labels: str) -> None:
        d.docker(
            "network",
            "create",
            "--driver",
            "bridge",
            "--internal",  # no route to the internet: the hub is the lab's only "internet"
            "--subnet",
            subnet,
            "-o",
            f"com.docker.network.driver.mtu={mtu}",
            *self._labels(role, **labels),
            name,
        )

    def _create_mgmt_network(self) -> int:
        used = set()
        for net in d.ls("network", LABEL):
            info = d.inspect("network", net) or {}
            slot = (info.get("Labels") or {}).get(f"{LABEL}.slot")
            if slot:
                used.add(int(slot))
        for slot in range(1, 250):
            if slot in used:
                continue
            try:
                self._create_network(
                    self.mgmt_network, self.mgmt_subnet(slot), mtu=1500, role="mgmt", slot=str(slot)
                )
                return slot
            except d.DockerError as exc:
                if "overlap" in str(exc).lower() or "already exists" in str(exc).lower():
                    continue
                raise
        raise LabError("no free lab slot (10.250.1-249.0/24 all in use)")


def _iptables(*args: str, check: bool = False) -> bool:
    proc = subprocess.run(["iptables", "-w", "5", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise LabError(f"iptables {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.returncode == 0

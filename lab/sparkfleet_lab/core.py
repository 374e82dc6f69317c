"""The lab: simulated DGX Sparks as systemd containers, cabled like real ones.

`Lab(name, topology).up()` makes (or finds) everything, idempotently:
  images → management network + one network per cable rail (MTU 9000) → hub (the stand-in for
  the internet) → nodes (interfaces renamed to ConnectX-7 names at every boot) → SSH key and
  pinned host keys → an inventory layered on inventory/<topology> → optionally site.yml + verify.
`down()` removes exactly what `up()` made (containers, networks, volumes, the state directory).
Everything the lab creates carries the label io.sparkfleet_lab=<name>.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from sparkfleet_lab import docker as d
from sparkfleet_lab import image, topology
from sparkfleet_lab.lab_base import (
    LABEL,
    MGMT_IFACE,
    NAME_RE,
    NODE_USER,
    LabError,
    LabPaths,
    NodeInfo,
    default_project_dir,
)
from sparkfleet_lab.lab_base import say as _say
from sparkfleet_lab.lab_hub import LabHub
from sparkfleet_lab.lab_network import LabNetwork
from sparkfleet_lab.lab_nodes import LabNodes

# What the lab shares is sparkfleet_lab.lab_base; its networks, hub and nodes are the three parts Lab is built
# from. Other modules and tests import these names from here.
__all__ = ["LABEL", "NAME_RE", "Lab", "LabError", "NodeInfo", "default_project_dir"]


class Lab(LabPaths, LabNetwork, LabHub, LabNodes):
    def __init__(
        self,
        name: str | None = None,
        topology_name: str | None = None,
        project_dir: Path | None = None,
        say: Callable[[str], None] = _say,
        require_topology: bool = True,
        *,
        nodes: int | None = None,
        hub: bool | None = None,
    ) -> None:
        self.project_dir = (project_dir or default_project_dir()).resolve()
        self.name = name or topology_name or "tp3"
        if not NAME_RE.match(self.name):
            raise LabError(f"lab name {self.name!r}: use 1-24 lowercase letters, digits, '-' or '_'")
        saved = self._load_state(self.name)
        known = saved.get("topology")
        self.topology = topology_name or known or (self.name if self.name in topology.NODE_COUNT else "")
        if self.topology not in topology.NODE_COUNT and (require_topology or saved):
            raise LabError(f"lab {self.name!r}: say which topology with --topology tp2|tp3")
        if known and known != self.topology:
            raise LabError(
                f"lab {self.name!r} exists as {known}; "
                f"`sparkfleet lab down --name {self.name}` first, or pick another --name"
            )
        self.say = say
        self.prefix = f"sparkfleet-lab-{self.name}"
        self.state = saved
        # A lab of fewer nodes than the topology (a role scenario's: the first N Sparks, cabled where both
        # ends exist) and one without the hub (roles that download and build nothing): as created, or
        # as asked for a new lab.
        full = topology.NODE_COUNT.get(self.topology, 0)
        self.node_count = int(saved.get("nodes") or nodes or full)
        self.with_hub = bool(saved.get("hub", True if hub is None else hub))
        if nodes and saved and nodes != self.node_count:
            raise LabError(
                f"lab {self.name!r} exists with {self.node_count} node(s): "
                f"`sparkfleet lab down --name {self.name}` first"
            )
        if full and not 1 <= self.node_count <= full:
            raise LabError(
                f"lab {self.name!r}: --nodes {self.node_count}: a {self.topology} lab has 1..{full}"
            )

    # ---- paths and names ---------------------------------------------------------------
    @property
    def hosts(self) -> list[str]:
        if self.topology not in topology.NODE_COUNT:
            return []  # a lab never created under a name that is not a topology: no nodes
        return [f"spark{n}" for n in range(1, self.node_count + 1)]

    def hosts_of_topology(self) -> list[str]:
        return [f"spark{n}" for n in range(1, topology.NODE_COUNT.get(self.topology, 0) + 1)]

    def rails(self) -> list[topology.Rail]:
        """The rails of the topology's cables whose both ends are nodes of this lab."""
        return [
            r
            for r in topology.rails(self.project_dir, self.topology)
            if r.a.node <= self.node_count and r.b.node <= self.node_count
        ]

    def container(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    @property
    def hub_container(self) -> str:
        return f"{self.prefix}-hub"

    def _load_state(self, name: str) -> dict:
        path = self.project_dir / ".lab" / name / "state.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def _save_state(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_dir / "state.json.partial"
        tmp.write_text(json.dumps(self.state, indent=2, sort_keys=True))
        tmp.replace(self.state_dir / "state.json")

    # ---- up ------------------------------------------------------------------------------
    def up(self, converge: bool = True, verify: bool = True) -> int:
        images = image.ensure_images()
        self.state.setdefault("topology", self.topology)
        self.state["name"] = self.name
        self.state["nodes"] = self.node_count
        self.state["hub"] = self.with_hub
        self._ensure_networks()
        self._ensure_ssh_key()
        if self.with_hub:
            self._ensure_hub(images)
        self._ensure_nodes(images.node)
        self._write_inventory()
        self.say(self.describe())
        if not converge:
            return 0
        rc = self.run_playbook("site.yml")
        if rc == 0 and verify and (self.project_dir / "playbooks" / "verify.yml").exists():
            rc = self.run_playbook("playbooks/verify.yml")
        return rc

    # ---- inventory -----------------------------------------------------------------------
    def _write_inventory(self) -> None:
        gv = self.inventory_dir / "group_vars" / "all"
        gv.mkdir(parents=True, exist_ok=True)
        head, *workers = self.hosts
        hosts = {
            "all": {
                "children": {
                    "cluster": {
                        "children": {
                            "head": {"hosts": {head: {"ansible_host": self.mgmt_ip(1)}}},
                            "workers": {
                                "hosts": {
                                    h: {"ansible_host": self.mgmt_ip(i)}
                                    for i, h in enumerate(workers, start=2)
                                }
                            },
                        }
                    }
                }
            }
        }
        header = (
            f"# Written by `sparkfleet lab up --name {self.name}`; layered on inventory/{self.topology}.\n"
        )
        (self.inventory_dir / "hosts.yml").write_text(
            header + "---\n" + yaml.safe_dump(hosts, sort_keys=False, width=1000)
        )
        base_pins = yaml.safe_load(
            (self.project_dir / "inventory" / self.topology / "group_vars" / "all" / "pins.yml").read_text()
        )["sparkfleet_pins"]
        pins = {**base_pins, **self.state.get("pins", {})}
        lab_vars = {
            "sparkfleet_lab": True,
            "sparkfleet_lab_name": self.name,
            "sparkfleet_lab_hub_address": self.hub_ip,
            "ansible_user": NODE_USER,
            "ansible_ssh_private_key_file": str(self.key_file),
            "ansible_ssh_common_args": (
                f"-o UserKnownHostsFile={self.known_hosts} -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes"
            ),
            "sparkfleet_pins": pins,
        }
        (gv / "00-lab.yml").write_text(
            header + "---\n" + yaml.safe_dump(lab_vars, sort_keys=False, width=1000)
        )
        static = Path(__file__).resolve().parent / "group_vars"
        for old in gv.glob("10-*.yml"):
            old.unlink()
        for src in sorted(static.glob("*.yml")):
            shutil.copyfile(src, gv / f"10-{src.name}")

    # ---- running playbooks -----------------------------------------------------------------
    def run_playbook(self, playbook: str, *extra_args: str, extravars: dict | None = None) -> int:
        from sparkfleet import runner

        result = runner.run_playbook(
            self.project_dir / playbook,
            [str(p) for p in self.inventories],
            extravars=extravars,
            project_dir=self.project_dir,
        )
        return result.exit_code

    def ansible_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["ANSIBLE_CONFIG"] = str(self.project_dir / "ansible.cfg")
        # the ansible-* commands of the Python running sparkfleet (the project's virtualenv)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        return env

    # ---- inspection ------------------------------------------------------------------------

    def describe(self) -> str:
        lines = [f"lab {self.name} ({self.topology}), hub {self.hub_ip if 'slot' in self.state else '-'}"]
        for node in self.nodes():
            lines.append(
                f"  {node.host:<7} {node.container:<32} {node.state:<8} mgmt {MGMT_IFACE} {node.mgmt_ip}"
            )
            for r in node.rails:
                addrs = ",".join(r["addresses"]) or "(no address yet)"
                where = f"cable {r['cable']} rail {r['rail']} mtu {r['mtu']:<5}"
                lines.append(f"          {r['netdev']:<14} {where} {addrs}")
        if self.ssh_config.exists():
            lines.append(f"  reach a node:  ssh -F {self.ssh_config} spark1")
            inv = " ".join(f"-i {p}" for p in self.inventories)
            lines.append(f"  run playbooks: ansible-playbook {inv} site.yml   (or sparkfleet up {inv})")
        return "\n".join(lines)

    def status(self) -> dict:
        nets = d.ls("network", f"{LABEL}={self.name}")
        return {
            "name": self.name,
            "topology": self.topology,
            "exists": bool(self.state) or bool(nets),
            "hub": {
                "container": self.hub_container,
                "address": self.hub_ip if "slot" in self.state else None,
            },
            "nodes": [n.__dict__ for n in self.nodes()],
            "networks": nets,
        }

    # ---- down ----------------------------------------------------------------------------
    def down(self) -> None:
        label = f"{LABEL}={self.name}"
        self._remove_fabric_forwarding()
        for name in d.ls("container", label):
            self.say(f"removing container {name}")
            d.docker("rm", "-f", "-v", name)
        for name in d.ls("network", label):
            self.say(f"removing network {name}")
            d.docker("network", "rm", name)
        for name in d.ls("volume", label):
            self.say(f"removing volume {name}")
            d.docker("volume", "rm", "-f", name)
        if self.state.get("topology"):
            from sparkfleet import runner

            facts = runner.fact_cache_env(self.inventories).get("ANSIBLE_CACHE_PLUGIN_CONNECTION")
            if facts and Path(facts).is_dir():
                self.say(f"removing {facts} (the facts Ansible cached of this lab's nodes)")
                shutil.rmtree(facts)
        if self.state_dir.exists():
            self.say(f"removing {self.state_dir} (keys, inventory, hub data)")
            # The hub's data was written by root inside the container; the controller may not be root.
            shutil.rmtree(self.state_dir)
        self.state = {}


def port_open(host: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False

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
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sparkfleet_lab import docker as d
from sparkfleet_lab import image, registry, topology

LABEL = "io.sparkfleet_lab"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,23}$")
MGMT_IFACE = "enP7s7"
NODE_USER = "spark"
HUB_PORTS = {"hf": 8080, "registry": 5000, "git": 9418}
ENGINE_BASE_REPO = "sparkfleet-lab/engine-base"


def default_project_dir() -> Path:
    env = os.environ.get("SPARKFLEET_PROJECT")
    if env:
        return Path(env).resolve()
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "site.yml").is_file() and (parent / "ansible.cfg").is_file():
            return parent
    raise RuntimeError("cannot find the sparkfleet checkout (site.yml + ansible.cfg); set SPARKFLEET_PROJECT")


class LabError(RuntimeError):
    pass


@dataclass
class NodeInfo:
    host: str
    node: int
    container: str
    mgmt_ip: str
    state: str = "absent"
    rails: list[dict] = field(default_factory=list)


def _say(msg: str) -> None:
    print(f"lab: {msg}", file=sys.stderr, flush=True)


class Lab:
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
    def state_dir(self) -> Path:
        return self.project_dir / ".lab" / self.name

    @property
    def inventory_dir(self) -> Path:
        return self.state_dir / "inventory"

    @property
    def inventories(self) -> list[Path]:
        return [self.project_dir / "inventory" / self.topology, self.inventory_dir]

    @property
    def key_file(self) -> Path:
        return self.state_dir / "ssh" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / "ssh" / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        return self.state_dir / "ssh" / "config"

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

    def _ensure_ssh_key(self) -> None:
        if self.key_file.exists():
            return
        self.key_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        subprocess.run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                f"sparkfleet-lab-{self.name}",
                "-f",
                str(self.key_file),
            ],
            check=True,
        )

    # ---- hub -----------------------------------------------------------------------------
    def _prepare_hub_data(self) -> dict:
        """Fill the hub's data directory; return the stand-in pins."""
        hub = self.state_dir / "hub"
        pins: dict = {}
        for sub in ("hf", "wheels", "git", "registry"):
            (hub / sub).mkdir(parents=True, exist_ok=True)
        from sparkfleet_lab import engine
        from sparkfleet_lab.hub import models, wheels

        size_mb = int(os.environ.get("SPARKFLEET_LAB_MODEL_MB", "48"))
        pins.update(models.generate(hub, self.topology, size_mb))
        wheels.prepare(hub)
        eng = engine.make_repo(hub / "git")
        version = engine.VERSION_BY_TOPOLOGY[self.topology]  # the engine version the topology's profile runs
        pins["engine"] = {
            "repo": f"git://{self.hub_ip}/{eng['repo'].lstrip('/')}",
            "commit": eng["commits"][version],
        }
        return pins

    def _ensure_hub(self, images: image.Images) -> None:
        if "pins" not in self.state:
            self.state["pins"] = self._prepare_hub_data()
            self._save_state()
        info = d.inspect("container", self.hub_container)
        if info is None:
            self.say(f"starting hub {self.hub_container} at {self.hub_ip}")
            d.docker(
                "run",
                "-d",
                "--name",
                self.hub_container,
                "--hostname",
                "hub",
                *self._labels("hub"),
                "--network",
                self.mgmt_network,
                "--ip",
                self.hub_ip,
                "--init",
                "-e",
                "PYTHONPATH=/opt/sparkfleet-lab/pkg",
                "-v",
                f"{self.project_dir / 'lab' / 'sparkfleet_lab'}:/opt/sparkfleet-lab/pkg/sparkfleet_lab:ro",
                "-v",
                f"{self.state_dir / 'hub'}:/srv/hub",
                images.node,
                "python3",
                "-m",
                "sparkfleet_lab.hub.main",
                "--data",
                "/srv/hub",
            )
        elif not info["State"]["Running"]:
            d.docker("start", self.hub_container)
        self._wait_http(f"http://{self.hub_ip}:{HUB_PORTS['registry']}/v2/", "hub registry")
        self._wait_http(f"http://{self.hub_ip}:{HUB_PORTS['hf']}/", "hub web server")
        if "base_image" not in self.state["pins"]:
            tag = images.engine_base.split(":")[-1]
            self.say(f"pushing {images.engine_base} to the hub registry")
            digest = registry.push(
                images.engine_base, f"{self.hub_ip}:{HUB_PORTS['registry']}", ENGINE_BASE_REPO, tag
            )
            self.state["pins"]["base_image"] = {
                "name": f"{self.hub_ip}:{HUB_PORTS['registry']}/{ENGINE_BASE_REPO}",
                "digest": digest,
            }
            self._save_state()

    def _wait_http(self, url: str, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=3):  # noqa: S310 - the lab's own hub
                    return
            except urllib.error.HTTPError:
                return  # it answered
            except OSError as exc:
                last = exc
                time.sleep(0.5)
        logs = d.docker("logs", "--tail", "30", self.hub_container, check=False)
        raise LabError(f"{what} at {url} did not answer within {timeout:.0f} s ({last}); hub log:\n{logs}")

    # ---- nodes ---------------------------------------------------------------------------
    def _node_rails(self, node: int) -> list[tuple[topology.Rail, str, topology.End]]:
        out = []
        for rail in self.rails():
            if rail.a.node == node:
                out.append((rail, "a", rail.a))
            if rail.b.node == node:
                out.append((rail, "b", rail.b))
        return out

    def _ensure_nodes(self, node_image: str) -> None:
        created = []
        for n, host in enumerate(self.hosts, start=1):
            name = self.container(host)
            info = d.inspect("container", name)
            if info is None:
                self._create_node(n, host, node_image)
                created.append(host)
            elif not info["State"]["Running"]:
                self.say(f"starting stopped node {name}")
                d.docker("start", name)
            elif info["Config"]["Image"] != node_image:
                self.say(
                    f"{name} runs {info['Config']['Image']}, the current node image is {node_image}: "
                    f"`sparkfleet lab down --name {self.name}` and up again to use it"
                )
        for host in self.hosts:
            self._wait_booted(host)
        self._write_known_hosts()
        for host in self.hosts:
            self._wait_ssh(host)

    def _create_node(self, n: int, host: str, node_image: str) -> None:
        name = self.container(host)
        self.say(f"creating node {name} ({self.mgmt_ip(n)})")
        volume = f"{name}-docker"
        d.docker("volume", "create", *self._labels("volume"), volume)
        d.docker(
            "create",
            "--name",
            name,
            "--hostname",
            host,
            *self._labels("node", node=str(n)),
            # A reboot inside a node ends its systemd (PID 1); Docker starts the container again,
            # as a real Spark powers back on. `lab down` removes it whatever the policy.
            "--restart",
            "unless-stopped",
            # systemd and a nested Docker engine without --privileged (docs/design.md "The lab")
            "--cap-add",
            "SYS_ADMIN",
            "--cap-add",
            "NET_ADMIN",
            "--security-opt",
            "seccomp=unconfined",
            "--security-opt",
            "apparmor=unconfined",
            "--cgroupns",
            "host",
            "-v",
            "/sys/fs/cgroup:/sys/fs/cgroup:rw",
            "--tmpfs",
            "/run:exec,mode=0755",
            "--tmpfs",
            "/run/lock",
            "--tmpfs",
            "/tmp:exec,mode=1777",
            "-v",
            f"{volume}:/var/lib/docker",
            "--network",
            self.mgmt_network,
            "--ip",
            self.mgmt_ip(n),
            "--add-host",
            f"hub:{self.hub_ip}",
            node_image,
        )
        lines = [f"{self.mgmt_ip(n)} {MGMT_IFACE} keep"]
        for rail, side, end in self._node_rails(n):
            ip = self.rail_ip(rail.index, side)
            d.docker("network", "connect", "--ip", ip, self.rail_network(rail), name)
            lines.append(f"{ip} {end.netdev} flush")
        d.put_file(name, "/etc/sparkfleet-lab/ifnames.conf", ("\n".join(lines) + "\n").encode())
        pub = self.key_file.with_suffix(".pub").read_bytes()
        d.put_file(name, f"/home/{NODE_USER}/.ssh/authorized_keys", pub, mode=0o600, uid=1000)
        d.docker("start", name)

    def _wait_booted(self, host: str, timeout: float = 120) -> None:
        name = self.container(host)
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            # Right after a (re)start the container may not accept exec yet, or systemd's bus
            # is not up: both give an empty answer, so ask again until the deadline.
            left = max(1, int(deadline - time.monotonic()))
            proc = subprocess.run(
                ["docker", "exec", name, "timeout", str(left), "systemctl", "is-system-running", "--wait"],
                capture_output=True,
                text=True,
                check=False,
            )
            state = proc.stdout.strip()
            if state in ("running", "degraded"):
                break
            time.sleep(0.5)
        if state == "running":
            return
        failed = d.exec_(name, ["systemctl", "--failed", "--no-legend", "--plain"], check=False).strip()
        if state == "degraded":
            self.say(f"{host}: systemd is degraded; failed units: {failed or '?'}")
            if "docker.service" in failed:  # the nested Docker stores on overlay2 over the node's volume
                self.say(
                    f"{host}: its Docker did not start: the nodes' Docker uses overlay2 on a volume of the "
                    "host's Docker, which needs the host's Docker root dir on a filesystem overlayfs can "
                    f"stack on (ext4, xfs); see `docker exec {name} journalctl -u docker`"
                )
            return
        raise LabError(
            f"{host} did not finish booting within {timeout:.0f} s (state {state!r}); failed: {failed!r}"
        )

    def host_key(self, host: str) -> str:
        return d.exec_(self.container(host), ["cat", "/etc/ssh/ssh_host_ed25519_key.pub"]).split()[1]

    def _write_known_hosts(self) -> None:
        lines = []
        for n, host in enumerate(self.hosts, start=1):
            lines.append(f"{self.mgmt_ip(n)} ssh-ed25519 {self.host_key(host)}")
        self.known_hosts.write_text("\n".join(lines) + "\n")
        cfg = []
        for n, host in enumerate(self.hosts, start=1):
            cfg += [
                f"Host {host} {self.container(host)}",
                f"  HostName {self.mgmt_ip(n)}",
                f"  User {NODE_USER}",
                f"  IdentityFile {self.key_file}",
                "  IdentitiesOnly yes",
                f"  UserKnownHostsFile {self.known_hosts}",
                "  StrictHostKeyChecking yes",
                "  BatchMode yes",
                "",
            ]
        self.ssh_config.write_text("\n".join(cfg))

    def _wait_ssh(self, host: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            proc = subprocess.run(
                ["ssh", "-F", str(self.ssh_config), "-o", "ConnectTimeout=5", host, "true"],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise LabError(f"ssh to {host} failed: {proc.stderr.strip()}")
            time.sleep(1)

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
    def exec(self, host: str, *cmd: str, check: bool = True, user: str | None = None) -> str:
        return d.exec_(self.container(host), list(cmd), check=check, user=user)

    def nodes(self) -> list[NodeInfo]:
        out = []
        for n, host in enumerate(self.hosts, start=1):
            name = self.container(host)
            info = d.inspect("container", name)
            node = NodeInfo(
                host=host, node=n, container=name, mgmt_ip=self.mgmt_ip(n) if "slot" in self.state else "-"
            )
            if info:
                node.state = info["State"]["Status"]
            if info and info["State"]["Running"]:
                out_addr = d.exec_(name, ["ip", "-o", "-4", "addr", "show"], check=False)
                addrs = {}
                for line in out_addr.splitlines():
                    parts = line.split()
                    addrs.setdefault(parts[1], []).append(parts[3])
                for rail, _side, end in self._node_rails(n):
                    mtu = (
                        d.exec_(name, ["cat", f"/sys/class/net/{end.netdev}/mtu"], check=False).strip() or "?"
                    )
                    node.rails.append(
                        {
                            "netdev": end.netdev,
                            "cable": rail.cable,
                            "rail": rail.rail,
                            "mtu": mtu,
                            "addresses": addrs.get(end.netdev, []),
                        }
                    )
            out.append(node)
        return out

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


def _iptables(*args: str, check: bool = False) -> bool:
    proc = subprocess.run(["iptables", "-w", "5", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise LabError(f"iptables {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.returncode == 0


def port_open(host: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False

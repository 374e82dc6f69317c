"""The lab's nodes (part of sparkfleet_lab.core.Lab): the simulated Sparks as systemd containers with their
rails connected under ConnectX-7 names, booted, reached by SSH with pinned host keys; a command on one, and
what each one looks like now."""

from __future__ import annotations

import subprocess
import time

from sparkfleet_lab import docker as d
from sparkfleet_lab import topology
from sparkfleet_lab.lab_base import MGMT_IFACE, NODE_USER, LabError, NodeInfo


class LabNodes:
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

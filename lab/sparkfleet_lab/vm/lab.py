"""The VM lab: DGX Sparks as Debian guests under qemu (TCG; no KVM needed), cabled like real ones.

`VmLab(name, topology).up()` makes (or finds) everything, idempotently:
  the cached guest disk (vm/image.py) → per node a copy-on-write overlay, an SSH host key and the lab's key
  (handed to the guest by qemu fw_cfg) → one qemu per node: the controller's NIC `labssh0` (qemu user-mode
  network, restricted: no route out; SSH forwarded from 127.0.23.<10+node>:<port>), the management LAN NIC
  `enP7s7` (10.99.0.<10+node>/24 on a hub of the lab's own: qemu's multicast socket on 127.0.0.1, a UDP port
  per lab, so the nodes reach each other as Sparks do on their LAN) and one NIC per rail of each cable (a UDP
  point-to-point link between the two qemus on 127.0.0.1, MTU 9000) → SSH and known_hosts → an inventory
  layered on inventory/<topology>, with each node's LAN address as its `sparkfleet_mgmt_address`.
Inside, each node has its own kernel, GRUB, systemd, swap and sysctls; its interfaces get a Spark's names and
every rail a soft-RoCE device (rdma_rxe) named as the ConnectX-7 HCA (vm/overlay). A reboot is a real one: the
guest resets inside the same qemu process.
`down()` stops the lab's qemus (by their pid files) and removes the state directory: nothing else was made.

`VmLab(name, arch="arm64")` is the one-node arm64 lab (README "The 64K kernel"): spark1 alone, no rails and
no LAN (its one NIC, the controller's, is named enP7s7), under qemu-system-aarch64 (virt, TCG, `-cpu max`:
every page size) with UEFI firmware (AAVMF; a copy of its variable store per node), on the arm64 disk of
vm/image.py; its inventory takes the TP2 example's group_vars (copied: the TP2 inventory's hosts.yml names a
second node) and aims the 64k profile at the image's 16K-page Debian kernel.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from sparkfleet.text import ANSI_RE

from sparkfleet_lab import ports, topology
from sparkfleet_lab.core import NAME_RE, LabError, default_project_dir
from sparkfleet_lab.lab_base import LabPaths
from sparkfleet_lab.vm import image

MGMT_IFACE = "enP7s7"  # the management LAN, as on a Spark: SSH between the nodes, NCCL_SOCKET_IFNAME
CTL_IFACE = "labssh0"  # the controller's way in (qemu user network): the lab's, not a Spark's
LAN_GROUP = "230.0.23.1"  # the LAN hub: a multicast group on loopback (a UDP port of its own per lab)
LAN_PREFIX = "10.99.0"  # the LAN's /24; no rail subnet (10.<lo><hi>.<rail>.0/24) can be 10.99
LAN_NIC = 0x10  # the LAN NIC's index in the node's MACs (0: the controller's, 1..: the rails)
NODE_USER = "spark"
MEMORY_MIB = int(os.environ.get("SPARKFLEET_VM_MEMORY_MIB", "1280"))
ARM64_MEMORY_MIB = int(os.environ.get("SPARKFLEET_VM_ARM64_MEMORY_MIB", "1536"))
ARM64_CPUS = 2  # MTTCG: one host thread per vCPU (the machine has 2 cores)
AAVMF_CODE = Path("/usr/share/AAVMF/AAVMF_CODE.fd")
AAVMF_VARS = Path("/usr/share/AAVMF/AAVMF_VARS.fd")
ARM64_PAGE_SIZE = 16384  # Debian's arm64-16k flavour (Debian has no 64K one)
# How long a guest may take to answer SSH, and then to finish booting (each). An idle machine boots both
# guests in 3-4 min (first boot); a CI run boots them while the container labs load both cores, and one first
# boot there took over 10 min (600 s was the limit then, and CI failed on it). A reboot in reboot.yml has
# host_tuning's own limit (host_tuning_reboot_timeout_s, 1800 s).
BOOT_TIMEOUT_S = float(os.environ.get("SPARKFLEET_VM_BOOT_TIMEOUT", "1800"))
RAIL_MTU = 9000
# The link speed each rail NIC announces (virtio's speed feature), as a ConnectX-7 half-port: the kernel
# derives the soft-RoCE port's rate from it (ib_get_eth_speed: "200 Gb/sec (4X HDR)"; without it 2.5 Gb/sec
# (1X SDR)), so network_links' rate check reads a real sysfs value. It is what the guest is told, not what the
# UDP link carries.
RAIL_SPEED_MBPS = 200000


def _say(msg: str) -> None:
    print(f"lab: {msg}", file=sys.stderr, flush=True)


def is_vm_lab(name: str, project_dir: Path | None = None) -> bool:
    path = (project_dir or default_project_dir()) / ".lab" / name / "state.json"
    return path.exists() and json.loads(path.read_text()).get("kind") == "vm"


class VmLab(LabPaths):
    def __init__(
        self,
        name: str | None = None,
        topology_name: str | None = None,
        project_dir: Path | None = None,
        say: Callable[[str], None] = _say,
        arch: str | None = None,
    ) -> None:
        self.project_dir = (project_dir or default_project_dir()).resolve()
        if arch not in (None, *image.ARCHES):
            raise LabError(f"--arch {arch!r}: expected one of {', '.join(image.ARCHES)}")
        default_name = (
            "vm-arm64" if arch == "arm64" else (f"vm-{topology_name}" if topology_name else "vm-tp2")
        )
        self.name = name or default_name
        if not NAME_RE.match(self.name):
            raise LabError(f"lab name {self.name!r}: use 1-24 lowercase letters, digits, '-' or '_'")
        path = self.state_dir / "state.json"
        self.state: dict = json.loads(path.read_text()) if path.exists() else {}
        if self.state and self.state.get("kind") != "vm":
            raise LabError(
                f"lab {self.name!r} is a container lab: `sparkfleet lab down --name {self.name}` first"
            )
        known = self.state.get("topology")
        self.topology = topology_name or known or "tp2"
        if self.topology not in topology.NODE_COUNT:
            raise LabError(f"lab {self.name!r}: --topology {self.topology!r}: expected tp2 or tp3")
        if known and known != self.topology:
            raise LabError(
                f"lab {self.name!r} exists as {known}; `sparkfleet lab down --name {self.name}` first"
            )
        known_arch = self.state.get("arch", "amd64") if self.state else None
        self.arch = arch or known_arch or "amd64"
        if known_arch and known_arch != self.arch:
            raise LabError(
                f"lab {self.name!r} exists as {known_arch}; `sparkfleet lab down --name {self.name}` first"
            )
        self.say = say

    # ---- paths and names ---------------------------------------------------------------
    @property
    def hosts(self) -> list[str]:
        if self.arch == "arm64":
            return ["spark1"]  # one node: the page-size switch and its reboot, no fabric
        return [f"spark{n}" for n in range(1, topology.NODE_COUNT[self.topology] + 1)]

    @property
    def inventories(self) -> list[Path]:
        # arm64: the lab's inventory alone (it has the TP2 example's group_vars; its hosts.yml names spark2)
        return [self.inventory_dir] if self.arch == "arm64" else super().inventories

    def node_dir(self, host: str) -> Path:
        return self.state_dir / "vm" / host

    def console_log(self, host: str) -> Path:
        return self.node_dir(host) / "console.log"

    def rails(self) -> list[topology.Rail]:
        if self.arch == "arm64":
            return []
        return topology.rails(self.project_dir, self.topology)

    def _node_rails(self, node: int) -> list[tuple[topology.Rail, str, topology.End]]:
        out = []
        for rail in self.rails():
            if rail.a.node == node:
                out.append((rail, "a", rail.a))
            if rail.b.node == node:
                out.append((rail, "b", rail.b))
        return out

    def ssh_address(self, host: str) -> str:
        """Where the controller reaches a node's SSH: a loopback address of its own (cluster_plan wants
        every Spark at its own address), forwarded by qemu to the guest's port 22."""
        return f"127.0.23.{10 + self.hosts.index(host) + 1}"

    def ssh_port(self, host: str) -> int:
        return int(self.state["ports"][host])

    @property
    def has_lan(self) -> bool:
        """Every amd64 lab has the management LAN; the one-node arm64 lab has no peer to reach."""
        return self.arch != "arm64"

    def mgmt_address(self, host: str) -> str:
        """A node's address on the management LAN (enP7s7): its peers reach it there, as on real Sparks."""
        return f"{LAN_PREFIX}.{10 + self.hosts.index(host) + 1}" if self.has_lan else self.ssh_address(host)

    def _save_state(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_dir / "state.json.partial"
        tmp.write_text(json.dumps(self.state, indent=2, sort_keys=True))
        tmp.replace(self.state_dir / "state.json")

    # ---- up ------------------------------------------------------------------------------
    def up(self) -> int:
        base = image.ensure_image(say=self.say, arch=self.arch)
        self.state.update(kind="vm", name=self.name, topology=self.topology, arch=self.arch, image=str(base))
        self.state.setdefault(
            "ports", {h: ports.free_port(socket.SOCK_STREAM, self.ssh_address(h)) for h in self.hosts}
        )
        # one UDP port per rail end: "<rail index><side>" -> port
        self.state.setdefault(
            "rail_ports",
            {
                f"{r.index}{side}": ports.free_port(socket.SOCK_DGRAM, "127.0.0.1")
                for r in self.rails()
                for side in "ab"
            },
        )
        if self.has_lan:
            # the LAN hub's UDP port: a free one, so that two labs' LANs never meet
            self.state.setdefault("lan_port", ports.free_port(socket.SOCK_DGRAM, "127.0.0.1"))
        self._save_state()
        self._ensure_keys()
        started = {}
        for n, host in enumerate(self.hosts, start=1):
            if self.running(host):
                continue
            started[host] = time.monotonic()
            self._start(n, host, base)
        self._write_ssh_config()
        for host in self.hosts:
            self.wait_ssh(host)
            if host in started:
                self.say(f"{host}: SSH answers after {time.monotonic() - started[host]:.0f} s")
        for host in self.hosts:
            self.wait_booted(host)
            if host in started:
                self.say(f"{host}: booted (systemd finished) after {time.monotonic() - started[host]:.0f} s")
        self._write_inventory()
        self.say(self.describe())
        return 0

    def _ensure_keys(self) -> None:
        ssh = self.key_file.parent
        ssh.mkdir(parents=True, exist_ok=True, mode=0o700)
        keys = [(self.key_file, f"sparkfleet-lab-{self.name}")]
        keys += [(self.node_dir(h) / "ssh_host_ed25519_key", f"root@{h}") for h in self.hosts]
        for path, comment in keys:
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                cmd = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)]
                subprocess.run(cmd, check=True)

    def _mac(self, node: int, nic: int) -> str:
        return f"52:54:00:5f:{node:02x}:{nic:02x}"

    def qemu_argv(self, n: int, host: str) -> list[str]:
        if self.arch == "arm64":
            return self._qemu_argv_arm64(n, host)
        argv = [
            "qemu-system-x86_64",
            "-name",
            f"sparkfleet-lab-{self.name}-{host}",
            "-machine",
            "pc,accel=tcg",
            "-cpu",
            "max",
            "-smp",
            "1",
            "-m",
            str(MEMORY_MIB),
            "-vga",
            "none",
            *self._qemu_common(n, host),
            # the management LAN: every node of the lab on one multicast group, sent and joined on loopback
            # only (localaddr), so its frames never leave this machine
            "-netdev",
            f"socket,id=lan,mcast={LAN_GROUP}:{self.state['lan_port']},localaddr=127.0.0.1",
            "-device",
            f"virtio-net-pci,netdev=lan,mac={self._mac(n, LAN_NIC)}",
        ]
        for i, (rail, side, _end) in enumerate(self._node_rails(n), start=1):
            other = "b" if side == "a" else "a"
            local = self.state["rail_ports"][f"{rail.index}{side}"]
            remote = self.state["rail_ports"][f"{rail.index}{other}"]
            argv += [
                "-netdev",
                f"socket,id=rail{i},udp=127.0.0.1:{remote},localaddr=127.0.0.1:{local}",
                "-device",
                f"virtio-net-pci,netdev=rail{i},mac={self._mac(n, i)},host_mtu={RAIL_MTU},"
                f"speed={RAIL_SPEED_MBPS},duplex=full",
            ]
        return argv

    def _qemu_argv_arm64(self, n: int, host: str) -> list[str]:
        d = self.node_dir(host)
        return [
            "qemu-system-aarch64",
            "-name",
            f"sparkfleet-lab-{self.name}-{host}",
            "-machine",
            "virt,accel=tcg",
            # max: 4K, 16K and 64K granules (a Cortex-A72/A57 has no 16K); pauth-impdef: QEMU's own pointer
            # authentication hash, much faster under TCG than the architected QARMA
            "-cpu",
            "max,pauth-impdef=on",
            "-smp",
            str(ARM64_CPUS),
            "-m",
            str(ARM64_MEMORY_MIB),
            # UEFI: the firmware read-only, the node's own copy of its variable store
            "-drive",
            f"if=pflash,format=raw,unit=0,readonly=on,file={AAVMF_CODE}",
            "-drive",
            f"if=pflash,format=raw,unit=1,file={d / 'efivars.fd'}",
            *self._qemu_common(n, host),
        ]

    def _qemu_common(self, n: int, host: str) -> list[str]:
        """Every node's qemu, either arch: no display, the console to a file, the disk, fw_cfg, the
        controller's NIC."""
        d = self.node_dir(host)
        return [
            "-display",
            "none",
            "-monitor",
            "none",
            "-serial",
            f"file:{self.console_log(host)}",
            "-daemonize",
            "-pidfile",
            str(d / "qemu.pid"),
            "-drive",
            f"file={d / 'disk.qcow2'},if=virtio,format=qcow2",
            "-fw_cfg",
            f"name=opt/sparkfleet/config,file={d / 'fw_cfg.conf'}",
            "-fw_cfg",
            f"name=opt/sparkfleet/hostkey,file={d / 'ssh_host_ed25519_key'}",
            # the controller's NIC: no route out of the lab (restrict), SSH from the controller only
            "-netdev",
            f"user,id=mgmt,restrict=on,hostfwd=tcp:{self.ssh_address(host)}:{self.ssh_port(host)}-:22",
            "-device",
            f"virtio-net-pci,netdev=mgmt,mac={self._mac(n, 0)}",
        ]

    def _fw_cfg(self, n: int, host: str) -> str:
        lines = [
            f"hostname {host}",
            f"authorized_key {self.key_file.with_suffix('.pub').read_text().strip()}",
        ]
        # the controller's NIC, on qemu's DHCP; without a LAN it is the management link itself
        ctl = CTL_IFACE if self.has_lan else MGMT_IFACE
        lines += [f"nic {self._mac(n, 0)} {ctl}", f"dhcp {ctl}"]
        if self.has_lan:
            lan = self._mac(n, LAN_NIC)
            lines += [f"nic {lan} {MGMT_IFACE}", f"address {MGMT_IFACE} {self.mgmt_address(host)}/24"]
        for i, (_rail, _side, end) in enumerate(self._node_rails(n), start=1):
            lines.append(f"nic {self._mac(n, i)} {end.netdev}")
        for _rail, _side, end in self._node_rails(n):
            lines.append(f"rxe {end.netdev} {end.hca}")
        return "\n".join(lines) + "\n"

    def _start(self, n: int, host: str, base: Path) -> None:
        d = self.node_dir(host)
        d.mkdir(parents=True, exist_ok=True)
        disk = d / "disk.qcow2"
        if not disk.exists():
            self.say(f"creating {host}'s disk (a copy-on-write overlay of {base.name})")
            cmd = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(base), str(disk)]
            subprocess.run(cmd, check=True, capture_output=True)
        if self.arch == "arm64" and not (d / "efivars.fd").exists():
            shutil.copyfile(AAVMF_VARS, d / "efivars.fd")  # the node's own UEFI variable store
        (d / "fw_cfg.conf").write_text(self._fw_cfg(n, host))
        where = f"{self.ssh_address(host)}:{self.ssh_port(host)}"
        mem = ARM64_MEMORY_MIB if self.arch == "arm64" else MEMORY_MIB
        self.say(f"starting {host} ({self.arch}, qemu TCG, {mem} MiB; SSH {where})")
        proc = subprocess.run(self.qemu_argv(n, host), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise LabError(f"qemu for {host} did not start: {proc.stderr.strip()}")

    def pid(self, host: str) -> int | None:
        """The pid of this node's qemu, if it runs (checked against its command line, never a reused pid)."""
        pidfile = self.node_dir(host) / "qemu.pid"
        try:
            pid = int(pidfile.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        return pid if f"sparkfleet-lab-{self.name}-{host}".encode() in cmdline else None

    def running(self, host: str) -> bool:
        return self.pid(host) is not None

    def _write_ssh_config(self) -> None:
        lines = []
        for host in self.hosts:
            pub = (self.node_dir(host) / "ssh_host_ed25519_key.pub").read_text().split()
            lines.append(f"[{self.ssh_address(host)}]:{self.ssh_port(host)} {pub[0]} {pub[1]}")
        self.known_hosts.write_text("\n".join(lines) + "\n")
        cfg = []
        for host in self.hosts:
            cfg += [
                f"Host {host}",
                f"  HostName {self.ssh_address(host)}",
                f"  Port {self.ssh_port(host)}",
                f"  User {NODE_USER}",
                f"  IdentityFile {self.key_file}",
                "  IdentitiesOnly yes",
                f"  UserKnownHostsFile {self.known_hosts}",
                "  StrictHostKeyChecking yes",
                "  BatchMode yes",
                "",
            ]
        self.ssh_config.write_text("\n".join(cfg))

    def ssh(self, host: str, *cmd: str, check: bool = True, timeout: float = 120) -> str:
        proc = subprocess.run(
            ["ssh", "-F", str(self.ssh_config), "-o", "ConnectTimeout=10", host, *cmd],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise LabError(f"ssh {host} {' '.join(cmd)}: exit {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout

    def wait_ssh(self, host: str, timeout: float = BOOT_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not self.running(host):
                raise LabError(f"{host}'s qemu is not running; {self._console_tail(host)}")
            proc = subprocess.run(
                ["ssh", "-F", str(self.ssh_config), "-o", "ConnectTimeout=5", host, "true"],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode == 0:
                return
            if time.monotonic() > deadline:
                why = proc.stderr.strip()
                raise LabError(f"{host}: no SSH within {timeout:.0f} s ({why}); {self._console_tail(host)}")
            time.sleep(2)

    def _console_tail(self, host: str, lines: int = 15) -> str:
        """The end of a node's console, for an error: a CI run removes the lab (and its console file) after a
        failure, so the message itself has to say how far the guest got."""
        path = self.console_log(host)
        try:
            text = path.read_text(errors="replace")
        except OSError as exc:
            return f"its console {path}: unreadable ({exc.strerror})"
        text = ANSI_RE.sub("", text).replace("\r", "\n")  # systemd's colours, the kernel's carriage returns
        tail = [ln.rstrip() for ln in text.splitlines() if ln.strip()][-lines:]
        return f"the last {len(tail)} lines of its console ({path}):\n" + "\n".join(f"  {ln}" for ln in tail)

    def wait_booted(self, host: str, timeout: float = BOOT_TIMEOUT_S) -> None:
        """Until systemd has finished booting (the first boot's update-grub included: a playbook must not
        race it for /boot/grub/grub.cfg)."""
        cmd = f"timeout {int(timeout)} systemctl is-system-running --wait"
        state = self.ssh(host, cmd, check=False, timeout=timeout + 30).strip()
        if state == "degraded":
            failed = self.ssh(host, "systemctl --failed --no-legend --plain", check=False).strip()
            self.say(f"{host}: systemd is degraded; failed units: {failed or '?'}")
        elif state != "running":
            raise LabError(
                f"{host} did not finish booting within {timeout:.0f} s (state {state!r}); "
                + self._console_tail(host)
            )

    # ---- inventory -----------------------------------------------------------------------
    def _write_inventory(self) -> None:
        gv = self.inventory_dir / "group_vars" / "all"
        gv.mkdir(parents=True, exist_ok=True)
        head, *workers = self.hosts

        def hv(h: str) -> dict:
            out = {"ansible_host": self.ssh_address(h), "ansible_port": self.ssh_port(h)}
            if self.has_lan:
                out["sparkfleet_mgmt_address"] = self.mgmt_address(h)  # where its peers reach it
            return out

        hosts = {
            "all": {
                "children": {
                    "cluster": {
                        "children": {
                            "head": {"hosts": {head: hv(head)}},
                            "workers": {"hosts": {h: hv(h) for h in workers}},
                        }
                    }
                }
            }
        }
        if self.arch == "arm64":
            header = f"# Written by `sparkfleet lab up --vm --arch arm64 --name {self.name}`; "
            header += f"inventory/{self.topology}'s group_vars copied in (00-base-*).\n"
        else:
            header = f"# Written by `sparkfleet lab up --vm --name {self.name}`; "
            header += f"layered on inventory/{self.topology}.\n"
        (self.inventory_dir / "hosts.yml").write_text(
            header + "---\n" + yaml.safe_dump(hosts, sort_keys=False, width=1000)
        )
        # The TP2 example's pins, whatever the topology: the VM lab fetches no weights and builds no engine
        # (it has no hub), and the TP3 example's pins are placeholders that sparkfleet's own check refuses
        base_pins = yaml.safe_load(
            (self.project_dir / "inventory" / "tp2" / "group_vars" / "all" / "pins.yml").read_text()
        )["sparkfleet_pins"]
        lab_vars = {
            "sparkfleet_lab": True,
            "sparkfleet_lab_name": self.name,
            "ansible_user": NODE_USER,
            "ansible_ssh_private_key_file": str(self.key_file),
            "ansible_ssh_common_args": (
                f"-o UserKnownHostsFile={self.known_hosts} -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes"
            ),
            "sparkfleet_pins": base_pins,
        }
        (gv / "00-lab.yml").write_text(
            header + "---\n" + yaml.safe_dump(lab_vars, sort_keys=False, width=1000)
        )
        for old in [*gv.glob("10-*.yml"), *gv.glob("00-base-*.yml"), *gv.glob("20-*.yml")]:
            old.unlink()
        if self.arch == "arm64":
            # the TP2 example's group_vars under the lab's (its hosts.yml names a second node: not used)
            for src in sorted(
                (self.project_dir / "inventory" / self.topology / "group_vars" / "all").glob("*.yml")
            ):
                shutil.copyfile(src, gv / f"00-base-{src.name}")
        for src in sorted((Path(__file__).resolve().parent / "group_vars").glob("*.yml")):
            shutil.copyfile(src, gv / f"10-{src.name}")
        if self.arch == "arm64":
            (gv / "20-arm64-kernel.yml").write_text(header + "---\n" + self._arm64_kernel_vars())

    def _arm64_kernel_vars(self) -> str:
        """host_tuning's 64k profile aimed at the image's 16K-page kernel, at the version the image holds."""
        info = image.image_info(self.arch)
        k = info.get("kernel_16k")
        if not k:
            raise LabError(
                f"the arm64 image {image.image_path(self.arch)} has no record of its 16K kernel (.json)"
            )
        lab_vars = {
            "host_tuning_kernel_profile": "64k",
            "host_tuning_kernel_64k_version": k["release"].removesuffix("-arm64-16k"),
            "host_tuning_kernel_64k_package_version": k["version"],
            "host_tuning_kernel_64k_release": k["release"],
            "host_tuning_kernel_64k_packages": [{"name": k["package"], "version": k["version"]}],
            "host_tuning_kernel_64k_page_size": ARM64_PAGE_SIZE,
        }
        comment = (
            "# The arm64 node: the 64k profile, Debian's 16K-page kernel from the image's apt repository\n"
            "# (no 64K flavour in Debian, no NVIDIA modules for it: their stand-in is in the image).\n"
        )
        return comment + yaml.safe_dump(lab_vars, sort_keys=False, width=1000)

    # ---- inspection ------------------------------------------------------------------------
    def describe(self) -> str:
        kind = "arm64, one node" if self.arch == "arm64" else self.topology
        lines = [f"VM lab {self.name} ({kind}), image {Path(self.state.get('image', '-')).name}"]
        for n, host in enumerate(self.hosts, start=1):
            state = "running" if self.running(host) else "stopped"
            port = self.state.get("ports", {}).get(host, "-")
            where = f"{self.ssh_address(host)}:{port}"
            lan = f"mgmt {MGMT_IFACE} {self.mgmt_address(host)}" if self.has_lan else f"mgmt {MGMT_IFACE}"
            lines.append(f"  {host:<7} qemu {state:<8} {lan} ssh {where}")
            for rail, _side, end in self._node_rails(n):
                lines.append(f"          {end.netdev:<14} {end.hca:<14} cable {rail.cable} rail {rail.rail}")
        if self.ssh_config.exists():
            lines.append(f"  reach a node:  ssh -F {self.ssh_config} spark1")
            inv = " ".join(f"-i {p}" for p in self.inventories)
            lines.append(f"  run playbooks: ansible-playbook {inv} playbooks/host.yml")
        return "\n".join(lines)

    def status(self) -> dict:
        return {
            "name": self.name,
            "kind": "vm",
            "topology": self.topology,
            "arch": self.arch,
            "exists": bool(self.state),
            "nodes": [
                {"host": h, "running": self.running(h), "ssh_port": self.state.get("ports", {}).get(h)}
                for h in self.hosts
            ],
        }

    # ---- down ----------------------------------------------------------------------------
    def down(self) -> None:
        for host in self.hosts:
            pid = self.pid(host)
            if pid is None:
                continue
            self.say(f"stopping {host} (qemu pid {pid})")
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                if self.pid(host) is None:
                    break
                time.sleep(0.1)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if self.state.get("topology"):
            from sparkfleet import runner

            facts = runner.fact_cache_env(self.inventories).get("ANSIBLE_CACHE_PLUGIN_CONNECTION")
            if facts and Path(facts).is_dir():
                self.say(f"removing {facts} (the facts Ansible cached of this lab's nodes)")
                shutil.rmtree(facts)
        if self.state_dir.exists():
            self.say(f"removing {self.state_dir} (disks, keys, inventory, consoles)")
            shutil.rmtree(self.state_dir)
        self.state = {}

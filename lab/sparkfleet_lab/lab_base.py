"""What every part of the lab shares: the label on everything it creates, the nodes' user and management
interface, the hub's ports, the lab's errors and a node's description, where the sparkfleet checkout is."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

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


def say(msg: str) -> None:
    print(f"lab: {msg}", file=sys.stderr, flush=True)


class LabPaths:
    """Where a lab (container or VM) keeps its state, inventory and SSH files: .lab/<name>/ of the checkout.
    The class using it sets project_dir, name and topology."""

    project_dir: Path
    name: str
    topology: str

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

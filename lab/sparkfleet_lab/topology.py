"""The lab's wiring, read from the same data the roles use (roles/cluster_plan/defaults/main.yml).

The cabling plan and the ConnectX-7 interface names exist once, as role data; the lab builds its
cables from that data, so the lab and the addressing plan cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from sparkfleet.collection import CONSTANTS

NODE_COUNT = CONSTANTS.NODE_COUNT  # plugins/module_utils/cluster_constants.py


@dataclass(frozen=True)
class End:
    node: int
    port: int
    netdev: str
    hca: str


@dataclass(frozen=True)
class Rail:
    """One rail of one cable: a point-to-point L2 link between two netdevs."""

    cable: str  # e.g. n1p0-n2p1
    index: int  # 0.. over all rails of the lab (decides the lab network's placeholder subnet)
    rail: int  # 1 or 2
    a: End
    b: End


def load_plan_data(project_dir: Path) -> dict:
    path = project_dir / "roles" / "cluster_plan" / "defaults" / "main.yml"
    return yaml.safe_load(path.read_text())


def rails(project_dir: Path, topology: str) -> list[Rail]:
    if topology not in NODE_COUNT:
        raise ValueError(f"topology {topology!r}: expected one of {', '.join(NODE_COUNT)}")
    data = load_plan_data(project_dir)
    ports = {int(k): v for k, v in data["cluster_plan_port_netdevs"].items()}
    out: list[Rail] = []
    for cable in data["cluster_plan_default_cabling"][topology]:
        a, b = cable["a"], cable["b"]
        name = f"n{a['node']}p{a['port']}-n{b['node']}p{b['port']}"
        for ra, rb in zip(ports[a["port"]], ports[b["port"]], strict=True):
            out.append(
                Rail(
                    cable=name,
                    index=len(out),
                    rail=ra["rail"],
                    a=End(a["node"], a["port"], ra["netdev"], ra["hca"]),
                    b=End(b["node"], b["port"], rb["netdev"], rb["hca"]),
                )
            )
    return out

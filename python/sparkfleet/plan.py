"""`sparkfleet plan`: the cabling and addressing plan of a cluster, drawn from its inventory.

The plan is what role cluster_plan computes on every run (plugins/filter/plan.py, the same code):
nodes and ranks, the head, the QSFP ports every cable joins, one subnet per rail per cable and the
address of each end. Here it is computed on the controller from the inventory alone (ansible's own
inventory and variable loading, the role's defaults); no host is contacted.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Sequence
from html import escape
from pathlib import Path
from types import ModuleType
from typing import Any

from sparkfleet.ansible_inprocess import init_ansible
from sparkfleet.runner import RunnerError
from sparkfleet.runner.project import resolve

FORMATS = ("text", "mermaid", "svg")


def _plan_module(project: Path) -> ModuleType:
    """plugins/filter/plan.py of the project (pure Python: no Ansible objects inside)."""
    path = project / "plugins" / "filter" / "plan.py"
    spec = importlib.util.spec_from_file_location("sparkfleet_cluster_plan_filter", path)
    if spec is None or spec.loader is None:
        raise RunnerError(f"cannot load the cluster plan code from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_plan(
    inventories: Sequence[str | Path],
    project: Path,
    *,
    vault_password_files: Sequence[str] = (),
    vault_password: str | None = None,
) -> dict[str, Any]:
    """The cluster plan of `inventories` (layered in order, like repeated -i)."""
    init_ansible(project)  # the project's ansible.cfg, and the loaders its fact cache plugin needs
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.parsing.vault import VaultSecret
    from ansible.template import Templar, trust_as_template
    from ansible.vars.manager import VariableManager

    sources = [resolve(i, project, "inventory") for i in inventories]
    loader = DataLoader()
    secrets = []
    for path in vault_password_files:
        secret = Path(path).expanduser().read_bytes().strip()
        secrets.append(("default", VaultSecret(secret)))
    if vault_password is not None:
        secrets.append(("default", VaultSecret(vault_password.encode())))
    if secrets:
        loader.set_vault_secrets(secrets)
    try:
        inventory = InventoryManager(loader=loader, sources=sources)
        variables = VariableManager(loader=loader, inventory=inventory)
        cluster = [h.name for h in inventory.get_hosts("cluster")]
        if not cluster:
            raise RunnerError(f"no hosts in group cluster of {', '.join(sources)}")
        defaults = loader.load_from_file(
            str(project / "roles" / "cluster_plan" / "defaults" / "main.yml"), trusted_as_template=True
        )
        hosts: dict[str, dict[str, Any]] = {}
        head_group = {h.name for h in inventory.get_hosts("head")}
        settings: dict[str, Any] = {}
        for name in cluster:
            host_vars = {**defaults, **variables.get_vars(host=inventory.get_host(name))}
            templar = Templar(loader=loader, variables=host_vars)

            def value(var: str, fallback: Any = None, *, _t: Templar = templar, _v: dict = host_vars) -> Any:
                return _t.template(trust_as_template("{{ %s }}" % var)) if var in _v else fallback  # noqa: UP031

            mgmt = value("sparkfleet_mgmt_address", None) or value("ansible_host", name)
            hosts[name] = {
                "node": value("sparkfleet_node"),
                "mgmt_address": mgmt,
                "group": "head" if name in head_group else "workers",
            }
            if not settings:
                settings = {
                    "topology": value("sparkfleet_topology"),
                    "cabling": value("cluster_plan_cabling", []),
                    "port_netdevs": value("cluster_plan_port_netdevs", {}),
                    "subnet_template": value("cluster_plan_subnet_template", ""),
                }
    except AnsibleError as exc:
        raise RunnerError(f"cannot read the inventory: {exc.message}") from exc
    module = _plan_module(project)
    problems = module.plan_problems(hosts, **settings)
    if problems:
        raise RunnerError("the cluster plan cannot be computed:\n- " + "\n- ".join(problems))
    return module.cluster_plan(hosts, **settings)


# ---- text ------------------------------------------------------------------------------------


def _cables(plan: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(cable name, its links: one per rail), in the plan's order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for link in plan["links"]:
        out.setdefault(link["cable"], []).append(link)
    return list(out.items())


def _role(plan: dict[str, Any], host: str) -> str:
    return "head" if host == plan["head"] else "worker"


def render_text(plan: dict[str, Any]) -> str:
    lines = [
        f"{plan['topology'].upper()} cluster: {plan['size']} Sparks, head {plan['head']} (rank 0); "
        f"MASTER_ADDR {plan['master_addr']} ({_master_where(plan)})",
        "",
    ]
    rows = [["NODE", "SPARK", "RANK", "ROLE", "MANAGEMENT"]]
    for host in plan["hosts_by_rank"]:
        node, rank = str(plan["nodes"][host]), str(plan["ranks"][host])
        rows.append([host, node, rank, _role(plan, host), plan["mgmt_addresses"][host]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    for name, links in _cables(plan):
        a, b = links[0]["a"], links[0]["b"]
        lines += ["", f"cable {name}: {a['host']} port {a['port']} <-> {b['host']} port {b['port']} (QSFP)"]
        for link in links:
            a, b = link["a"], link["b"]
            lines.append(
                f"  rail {link['rail']}  {link['subnet']:<15}  "
                f"{a['host']} {a['netdev']} ({a['hca']}) {a['address']}  <->  "
                f"{b['host']} {b['netdev']} ({b['hca']}) {b['address']}"
            )
    return "\n".join(lines) + "\n"


# ---- mermaid ---------------------------------------------------------------------------------


def render_mermaid(plan: dict[str, Any]) -> str:
    lines = ["graph LR"]
    for host in plan["hosts_by_rank"]:
        label = (
            f"<b>{host}</b><br/>Spark {plan['nodes'][host]}, rank {plan['ranks'][host]} ({_role(plan, host)})"
            f"<br/>mgmt {plan['mgmt_addresses'][host]}"
        )
        lines.append(f'  {host}["{label}"]')
    for name, links in _cables(plan):
        for link in links:
            a, b = link["a"], link["b"]
            text = (
                f"{name} rail {link['rail']}: {link['subnet']}<br/>"
                f"{a['netdev']} {a['address']} ↔ {b['netdev']} {b['address']}"
            )
            lines.append(f'  {a["host"]} <-- "{text}" --> {b["host"]}')
    return "\n".join(lines) + "\n"


# ---- svg -------------------------------------------------------------------------------------

NODE_W, NODE_H = 230, 110
RAIL_GAP = {2: 84, 3: 56}  # pixels between the two rails of a cable
END_LABEL_AT = 95  # pixels from a node's edge to the label of that end of a rail
SIZE = {2: (960, 360), 3: (1040, 860)}
POSITIONS = {  # node box centres, in rank order
    2: [(150, 190), (810, 190)],
    3: [(520, 125), (170, 715), (870, 715)],
}


def _text(x: float, y: float, s: str, size: int = 13, *, weight: str = "normal", angle: float = 0.0) -> str:
    # a white halo keeps a label readable where it crosses a line; labels of a rail run along it
    turn = f' transform="rotate({angle:.1f} {x:.0f} {y:.0f})"' if angle else ""
    return (
        f'<text x="{x:.0f}" y="{y:.0f}" font-size="{size}" text-anchor="middle" font-weight="{weight}" '
        f'stroke="#ffffff" stroke-width="4" paint-order="stroke"{turn}>{escape(s)}</text>'
    )


def _along(ux: float, uy: float) -> tuple[float, float, float]:
    """The angle (degrees, never upside down) of a line, and the unit normal that is 'up' for its text."""
    angle = math.degrees(math.atan2(uy, ux))
    if angle > 90:
        angle -= 180
    elif angle <= -90:
        angle += 180
    rad = math.radians(angle)
    return angle, math.sin(rad), -math.cos(rad)


def _exit(px: float, py: float, ux: float, uy: float, box: tuple[float, float]) -> float:
    """How far from (px, py), along the unit vector (ux, uy), the line leaves the box centred at `box`."""
    bx, by = box
    ts = []
    if ux:
        ts.append(((bx + NODE_W / 2 if ux > 0 else bx - NODE_W / 2) - px) / ux)
    if uy:
        ts.append(((by + NODE_H / 2 if uy > 0 else by - NODE_H / 2) - py) / uy)
    return max(0.0, min(ts)) if ts else 0.0


def render_svg(plan: dict[str, Any]) -> str:
    n = plan["size"]
    width, height = SIZE.get(n, SIZE[3])
    centres = dict(zip(plan["hosts_by_rank"], POSITIONS.get(n, POSITIONS[3]), strict=False))
    cx = sum(x for x, _ in centres.values()) / len(centres)
    cy = sum(y for _, y in centres.values()) / len(centres)
    gap = RAIL_GAP.get(n, RAIL_GAP[3])
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        _text(
            width / 2,
            26,
            f"{plan['topology'].upper()}: {n} DGX Sparks, head {plan['head']} (rank 0), "
            f"MASTER_ADDR {plan['master_addr']} ({_master_where(plan)})",
            15,
            weight="bold",
        ),
        _text(width / 2, height - 14, "blue: rail 1 (a port's first PCIe half), red: rail 2", 11),
    ]
    labels: list[str] = []
    for name, links in _cables(plan):
        a_box, b_box = centres[links[0]["a"]["host"]], centres[links[0]["b"]["host"]]
        (ax, ay), (bx, by) = a_box, b_box
        length = max(1.0, ((bx - ax) ** 2 + (by - ay) ** 2) ** 0.5)
        ux, uy = (bx - ax) / length, (by - ay) / length
        nx, ny = -uy, ux
        if (cx - (ax + bx) / 2) * nx + (cy - (ay + by) / 2) * ny > 0:
            nx, ny = -nx, -ny  # rail 1 on the inside of the ring, rail 2 outside
        for i, link in enumerate(links):
            off = (i - (len(links) - 1) / 2) * gap
            x1, y1 = ax + nx * off, ay + ny * off
            start = _exit(x1, y1, ux, uy, a_box)
            end = length - _exit(bx + nx * off, by + ny * off, -ux, -uy, b_box)
            colour = "#1f77b4" if link["rail"] == 1 else "#d62728"
            out.append(
                f'<line x1="{x1 + ux * start:.0f}" y1="{y1 + uy * start:.0f}" x2="{x1 + ux * end:.0f}" '
                f'y2="{y1 + uy * end:.0f}" stroke="{colour}" stroke-width="3"/>'
            )
            mid = (start + end) / 2
            angle, upx, upy = _along(ux, uy)
            title = f"{name} rail {link['rail']}: {link['subnet']}"
            tx, ty = x1 + ux * mid + upx * 7, y1 + uy * mid + upy * 7
            labels.append(_text(tx, ty, title, 12, weight="bold", angle=angle))
            for e, at in ((link["a"], start + END_LABEL_AT), (link["b"], end - END_LABEL_AT)):
                ex, ey = x1 + ux * at - upx * 15, y1 + uy * at - upy * 15
                labels.append(_text(ex, ey, f"{e['netdev']} {e['address']}", 11, angle=angle))
    for host in plan["hosts_by_rank"]:
        x, y = centres[host]
        head = host == plan["head"]
        out.append(
            f'<rect x="{x - NODE_W / 2:.0f}" y="{y - NODE_H / 2:.0f}" width="{NODE_W}" height="{NODE_H}" '
            f'rx="10" fill="{"#fff3d6" if head else "#eef4fb"}" stroke="#333" stroke-width="1.5"/>'
        )
        out.append(_text(x, y - 26, f"{host}  (Spark {plan['nodes'][host]})", 15, weight="bold"))
        out.append(_text(x, y - 4, f"rank {plan['ranks'][host]} · {_role(plan, host)}", 13))
        out.append(_text(x, y + 17, f"mgmt {plan['mgmt_addresses'][host]}", 12))
        ports = sorted({i["port"] for i in plan["interfaces"][host]})
        out.append(_text(x, y + 37, "QSFP " + ", ".join(f"port {p}" for p in ports), 11))
    out += labels
    out.append("</svg>")
    return "\n".join(out) + "\n"


RENDER: dict[str, Callable[[dict[str, Any]], str]] = {
    "text": render_text,
    "mermaid": render_mermaid,
    "svg": render_svg,
}


def _master_where(plan: dict) -> str:
    """Where the ranks meet: on the cable (TP2, as the real TP2 runs) or the management network (TP3)."""
    for rails in (plan.get("interfaces") or {}).values():
        if any(r.get("address") == plan.get("master_addr") for r in rails):
            return "rank 0's fabric address"
    return "management"

"""The tables `sparkfleet status`, `host-status` and `clocks` print, drawn from the data the roles
report with set_stats (RunResult.data, the `data` of `--json`; docs/json-schema.md).

When the CLI draws a table it passes `-e sparkfleet_cli_tables=true`, and the roles leave out
their own text report of the same data (plain ansible-playbook still prints it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparkfleet.collection import TEXT_FORMAT

CLI_TABLES_VAR = "sparkfleet_cli_tables"

# engine_status row keys -> headers (the role's own report uses the same words)
ENGINE_HEADERS = {
    "node": "NODE",
    "rank": "RANK",
    "unit": "UNIT",
    "container": "CONTAINER",
    "commit": "IMAGE COMMIT",
    "weights": "WEIGHTS",
    "clock": "CLOCK CAP",
    "image": "IMAGE ID",
    "nccl": "NCCL",
    "api": "API HEALTH",
    "model": "SERVED MODEL",
}


# the roles' own table renderer (plugins/module_utils/text_format.py): fixed-width columns, '-' for nothing
text_table = TEXT_FORMAT.text_table


def engine_status_table(data: dict[str, Any]) -> str:
    status = data.get("engine_status")
    if not isinstance(status, dict) or not status.get("rows"):
        return ""
    rows = status["rows"]
    keys = list(rows[0])
    for row in rows[1:]:
        keys += [k for k in row if k not in keys]
    lines = [
        "ENGINE STATUS",
        *text_table(
            [ENGINE_HEADERS.get(k, k.upper()) for k in keys], [[row.get(k) for k in keys] for row in rows]
        ),
    ]
    lines += [f"! {note}" for note in status.get("notes") or []]
    lines.append("engine: healthy" if status.get("healthy") else "engine: NOT healthy")
    return "\n".join(lines) + "\n"


STATUS_MARK = {"ok": "ok", "off": "OFF", "n/a": "n/a", "warn": "WARN"}


def host_status_table(data: dict[str, Any]) -> str:
    """One row per check, one column per node (ok, OFF, n/a, WARN); then what is off or warns, and the fix."""
    hosts = data.get("host_status")
    if not isinstance(hosts, dict) or not hosts:
        return ""
    names = sorted(hosts)
    checks: list[str] = []
    for name in names:
        checks += [c["check"] for c in hosts[name].get("checks") or [] if c["check"] not in checks]
    by_host = {name: {c["check"]: c for c in hosts[name].get("checks") or []} for name in names}
    rows = [
        [check, *(STATUS_MARK.get((by_host[n].get(check) or {}).get("status", ""), "-") for n in names)]
        for check in checks
    ]
    lines = ["HOST STATUS", *text_table(["CHECK", *names], rows)]
    for name in names:
        for c in by_host[name].values():
            if c.get("status") == "off":
                lines.append(f"! {name}: {c['check']}: {c['value']} (expected {c['expected']}; {c['fix']})")
            elif c.get("status") == "warn":
                lines.append(f"! {name}: warning: {c['check']}: {c['value']} ({c['fix']})")
        reasons = hosts[name].get("reboot_reasons") or []
        if reasons:
            lines.append(f"! {name}: reboot needed: {'; '.join(reasons)}")
    skipped: dict[tuple[str, str], list[str]] = {}  # (check, why) -> hosts where it cannot apply
    for name in names:
        for c in by_host[name].values():
            if c.get("status") == "n/a":
                skipped.setdefault((c["check"], str(c.get("fix") or "")), []).append(name)
    for (check, why), where in skipped.items():
        lines.append(f"n/a {check} on {', '.join(where)}: {why}")
    off = [n for n in names if hosts[n].get("off")]
    lines.append(f"checks off on: {', '.join(off)}" if off else f"every check passed on {', '.join(names)}")
    return "\n".join(lines) + "\n"


def _mhz(value: Any) -> str:
    if value is None:
        return "not set"
    return "stock" if value == 0 else f"{value} MHz"


def _gpu_cell(g: dict[str, Any]) -> str:
    """'345/3003 idle': the SM clock now/max and what the GPU was doing (a low clock means something only
    under load)."""
    cell = f"{g.get('sm_mhz')}/{g.get('max_sm_mhz')}"
    return f"{cell} {g['activity']}" if g.get("activity") else cell


def clocks_table(data: dict[str, Any]) -> str:
    clocks = data.get("clocks")
    if not isinstance(clocks, dict) or not clocks:
        return ""
    rows, notes = [], []
    for name in sorted(clocks):
        c = clocks[name]
        gpus = c.get("gpus") or []
        sm = ", ".join(_gpu_cell(g) for g in gpus) or "-"
        applied = "yes" if c.get("gpu_in_effect") else "NO (not applied since boot)"
        cpu = _mhz(c.get("cpu_cap_mhz"))
        if c.get("cpu_skipped"):
            cpu += " (not applied)"
            notes.append(f"! {name}: CPU cap not applied: {c['cpu_skipped']}")
        if c.get("gpu_error"):
            notes.append(f"! {name}: GPU clocks not read: {c['gpu_error']}")
        rows.append([name, _mhz(c.get("gpu_cap_mhz")), applied, sm, "YES" if c.get("latched") else "no", cpu])
        wanted, configured = c.get("wanted_gpu_cap_mhz"), c.get("gpu_cap_mhz")
        if wanted is not None and wanted != (configured or 0):  # never configured = stock
            fix = f"set {wanted}" if wanted else "reset"
            notes.append(
                f"! {name}: the inventory wants GPU cap {_mhz(wanted)}: run `sparkfleet clocks {fix}`"
            )
        for g in gpus:
            if g.get("latched"):
                notes.append(
                    f"! {name}: GPU {g.get('index')} is latched: SM clock {g.get('sm_mhz')} MHz under load; "
                    "only an AC power cycle clears it (shut down, unplug for 30 s)"
                )
    headers = ["NODE", "GPU CAP", "IN EFFECT", "SM MHZ NOW/MAX", "LATCHED", "CPU CAP"]
    return "\n".join(["CLOCKS", *text_table(headers, rows), *notes]) + "\n"


TABLES: dict[str, Callable[[dict[str, Any]], str]] = {
    "status": engine_status_table,
    "start": engine_status_table,  # start ends with the status (playbooks/start.yml)
    "host-status": host_status_table,
    "clocks": clocks_table,
}

"""The engine's status, in words: one row per node (unit, container, image commit, weights, clock cap,
what its log says, the API), the problems with why and what brings a rank back, and the text of the table.

Built from what engine_node and engine_api report (role engine_service, tasks/status.yml). Used by the
engine filters (plugins/filter/engine.py). Pure functions: unit-tested in
tests/unit/test_engine_spec.py and tests/unit/test_faults.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ansible_collections.sparkfleet.cluster.plugins.module_utils.engine_container import COMMIT_LABEL
from ansible_collections.sparkfleet.cluster.plugins.module_utils.text_format import minutes, text_table


def short_commit(value: object) -> str:
    text = str(value or "")
    return text[:12] if re.fullmatch(r"[0-9a-f]{40}", text) else (text or "-")


def status_table(rows: list[dict], columns: list[list[str]]) -> list[str]:
    """Fixed-width text table: columns are [key, header] pairs; missing values show as '-'."""
    return text_table([head for _, head in columns], [[row.get(key) for key, _ in columns] for row in rows])


def _unit_text(unit: Mapping) -> str:
    if not unit.get("exists"):
        return "absent"
    text = f"{unit.get('active', '?')}/{unit.get('sub', '?')}"
    if unit.get("active") == "failed" and unit.get("exit_status") not in (None, 0):
        text += f" (exit {unit['exit_status']})"
    return text


def _container_text(c: Mapping) -> str:
    if c.get("unknown"):
        return "unknown (Docker down)"
    if c.get("foreign"):
        return "foreign (not sparkfleet's)"
    if not c.get("exists"):
        return "absent"
    if c.get("running"):
        return "running"
    text = f"{c.get('status', '?')} ({c.get('exit_code')})"
    return text + (" OOM-killed" if c.get("oom_killed") else "")


# Exit statuses 128+N of a rank whose process got signal N (docker-init passes the child's on).
SIGNALS = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 7: "SIGBUS", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}


def docker_down(node: Mapping) -> str:
    """Why Docker is not running on the node ('' when it runs or engine_node did not say)."""
    daemon = node.get("docker_daemon") or {}
    if not daemon or daemon.get("running", True):
        return ""
    return str(daemon.get("error") or "the Docker daemon does not answer")


def death_text(c: Mapping) -> str:
    """How a rank's container ended, in plain words: killed by a signal, OOM-killed, or its exit status."""
    code = c.get("exit_code")
    finished = str(c.get("finished_at") or "")
    when = f" at {finished}" if finished and not finished.startswith("0001-") else ""
    if c.get("oom_killed"):
        return f"killed by the kernel's OOM killer (exit {code}){when}"
    if isinstance(code, int) and code > 128 and code - 128 in SIGNALS:
        return f"killed by {SIGNALS[code - 128]} (exit {code}){when}"
    return f"exited with status {code}{when}"


# Below this much free space a filesystem holding an unfinished copy is called full.
FULL_BYTES = 64 << 20


def weights_partial(host: str, node: Mapping) -> str:
    """A note when a copy of the weights to this node was cut off ('' otherwise): its part files sit in
    .rsync-partial (never at their final path), and whether the disk there is full."""
    part = node.get("weights_partial") or {}
    files = part.get("files") or []
    if not files:
        return ""
    free = part.get("free_bytes")
    where = f"{part.get('path')}/.rsync-partial"
    first = f"{files[0]}" + (f" and {len(files) - 1} more" if len(files) > 1 else "")
    if isinstance(free, int) and free < FULL_BYTES:
        return (
            f"{host}: the disk is full at {part.get('path')} ({free} bytes free): the copy of the weights was"
            f" cut off ({first} in {where}): free space there and run `sparkfleet weights`"
        )
    return (
        f"{host}: the copy of the weights was cut off ({first} in {where}): `sparkfleet weights` resumes it"
    )


def stopping(node: Mapping) -> bool:
    """A rank whose container runs while its unit is not active (deactivating, inactive, failed): the unit is
    on its way down (an admin's stop, Docker stopping) or no longer holds the container."""
    unit = node.get("unit") or {}
    return bool(unit.get("exists")) and unit.get("active") not in ("active", "reloading", None)


def rank_problem(host: str, rank: int, node: Mapping, advice: bool = True) -> str:
    """Why a rank is not running, named for what it is (unreachable, Docker down, died, stopped, absent); with
    `advice`, what brings it back."""
    c = node.get("container") or {}
    who = f"{host} (rank {rank})"
    if node.get("unreachable"):
        return f"{who}: unreachable (no answer over SSH): is it powered on and on the management network?"
    down = docker_down(node)
    if down:
        text = f"{who}: Docker is not running on {host} ({down})"
        start = ": `sparkfleet start` starts it (docker.service is enabled and started as desired state)"
        return text + (start + ", then the engine" if advice else "")
    unit = _unit_text(node.get("unit") or {})
    if c.get("exists") and not c.get("running") and not c.get("foreign") and c.get("status") == "exited":
        how = "stopped" if c.get("exit_code") in (0, 143) and not c.get("oom_killed") else "died"
        text = f"{who} {how}: {death_text(c)}; unit {unit}"
        return text + (": `sparkfleet start` restarts the cluster in order" if advice else "")
    return f"{who}: container {_container_text(c)}, unit {unit}"


def _weights_text(record: object) -> str:
    if not isinstance(record, Mapping) or not record:
        return "no record"
    verified = record.get("verified")
    digest = str(record.get("manifest_digest") or record.get("digest") or "")
    if verified is False:
        return "NOT verified"
    if verified is None and not digest:
        return "?"
    return ("verified " + digest.removeprefix("sha256:")[:12]).strip()


def _clock_text(clock: Mapping) -> str:
    configured, applied = clock.get("configured_mhz"), clock.get("applied_mhz")
    if configured is None:
        return "-"
    text = "stock" if configured == 0 else f"{configured} MHz"
    if applied is None or applied != configured:
        text += " (not applied since boot)"
    return text


def _log_text(node: Mapping, rank: int) -> str:
    """The ENGINE column: what the rank's own log says."""
    log = node.get("log") or {}
    phase = log.get("phase")
    if not phase or node.get("unreachable"):
        return "-"
    if phase == "loading":
        return f"loading ({minutes(node.get('container', {}).get('running_s'))})"
    if phase == "following":
        return "following rank 0"
    return str(phase)


def _api_text(api: Mapping, head: Mapping, first_start: object) -> str:
    state = api.get("state", "down")
    if state == "down" and (head.get("container") or {}).get("running"):
        log = head.get("log") or {}
        if log.get("phase") in ("loading", "starting"):
            running = minutes((head.get("container") or {}).get("running_s"))
            return f"loading, {running} of the ~{first_start}"
    return str(state)


def _nccl_text(nccl: Mapping | None) -> str:
    """The NCCL library a rank mapped (module engine_nccl): 'version file', or why there is none."""
    if not nccl:
        return "not read"
    libs = nccl.get("libraries") or []
    if libs:
        return ", ".join(f"{lib.get('version')} {lib.get('path')}" for lib in libs)
    return "none loaded" if nccl.get("running") else "-"


def cluster_notes(rows: list[dict]) -> list[str]:
    """What must be the same on every rank and is not: the engine image (its ID), the NCCL library."""
    notes = []
    images = {r["node"]: r["image"] for r in rows if r["image"] != "-"}
    if len(set(images.values())) > 1:
        notes.append(
            "the engine image differs between nodes ("
            + ", ".join(f"{h} {i}" for h, i in images.items())
            + "): `sparkfleet engine` ships the head's, then `sparkfleet start`"
        )
    loaded = {r["node"]: r["nccl"] for r in rows if r["nccl"] not in ("not read", "none loaded", "-")}
    if len(set(loaded.values())) > 1:
        notes.append(
            "the ranks loaded different NCCL libraries ("
            + "; ".join(f"{h}: {n}" for h, n in loaded.items())
            + "): builds of one version differ; give every rank the same image"
        )
    return notes


def status_rows(
    nodes: Mapping, plan: Mapping, api: Mapping | None, pin_commit: str, first_start: object = 15
) -> dict:
    """The status table's rows (one per node, in rank order), the ranks' own log lines that matter (`log`:
    ready, loading progress), the problems with why (`notes`), and overall health."""
    api = api or {}
    rows: list[dict] = []
    notes: list[str] = []
    logs: list[str] = []
    healthy = api.get("state") == "ok"
    head = nodes.get(plan["head"]) or {}
    for host in plan["hosts_by_rank"]:
        rank = int(plan["ranks"][host])
        node = nodes.get(host) or {"unreachable": True}
        c = node.get("container") or {}
        labels = c.get("labels") or {}
        commit = labels.get(COMMIT_LABEL) or (node.get("image") or {}).get("labels", {}).get(COMMIT_LABEL)
        commit_text = short_commit(commit)
        if commit and pin_commit and commit != pin_commit:
            commit_text += f" (pin {short_commit(pin_commit)})"
        log = node.get("log") or {}
        rows.append(
            {
                "node": host,
                "rank": rank,
                "unit": "unreachable" if node.get("unreachable") else _unit_text(node.get("unit") or {}),
                "container": "unreachable"
                if node.get("unreachable")
                else "unknown (Docker down)"
                if docker_down(node)
                else _container_text(c),
                "commit": commit_text,
                "weights": _weights_text(node.get("weights")),
                "clock": _clock_text(node.get("clock") or {}),
                "image": str((node.get("image") or {}).get("id") or "-")[:19],
                "nccl": _nccl_text(node.get("nccl")),
                "engine": _log_text(node, rank),
                "api": _api_text(api, head, first_start) if rank == 0 else "",
                "model": ", ".join(api.get("models") or []) if rank == 0 else "",
            }
        )
        if log.get("ready"):
            logs.append(f"{host} (rank {rank}): {log['ready']}")
        elif log.get("phase") in ("loading", "starting") and log.get("last"):
            logs.append(f"{host} (rank {rank}) {log['phase']}: {log['last']}")
        if log.get("fatal"):
            healthy = False
            notes.append(f"{host} (rank {rank}) failed: {log['fatal']}")
        if not c.get("running"):
            healthy = False
            why = rank_problem(host, rank, node)
            tail = c.get("log_tail") or []
            if tail and not log.get("fatal") and not node.get("unreachable"):
                why += f"; last log: {tail[-1]}"
            notes.append(why)
        elif stopping(node):
            # Docker or an admin is stopping the unit (Requires=docker.service): the container goes with it
            healthy = False
            unit = _unit_text(node.get("unit") or {})
            notes.append(
                f"{host} (rank {rank}): its unit is {unit} while the container still runs: the rank is going "
                "down with it; `sparkfleet start` restarts the cluster in order"
            )
        elif rank != 0 and api.get("state") == "ok" and log.get("phase") not in ("following", None):
            notes.append(f"{host} (rank {rank}): its log does not say it follows rank 0 ({log.get('phase')})")
        partial = weights_partial(host, node)
        if partial:
            healthy = False
            notes.append(partial)
        if commit and pin_commit and commit != pin_commit:
            notes.append(
                f"{host}: runs engine {short_commit(commit)}, the pin is {short_commit(pin_commit)}: "
                "run `sparkfleet engine` and `sparkfleet start`"
            )
    across = cluster_notes(rows)
    healthy = healthy and not any(n.startswith("the engine image differs") for n in across)
    notes += across
    if api.get("state") != "ok":
        notes.append(f"API on {plan['head']}: {rows[0]['api']}: {api.get('detail', 'not probed')}")
    return {"rows": rows, "log": logs, "notes": notes, "healthy": healthy}


STATUS_COLUMNS = [
    ["node", "NODE"],
    ["rank", "RANK"],
    ["unit", "UNIT"],
    ["container", "CONTAINER"],
    ["commit", "IMAGE COMMIT"],
    ["weights", "WEIGHTS"],
    ["clock", "CLOCK CAP"],
    ["image", "IMAGE ID"],
    ["nccl", "NCCL"],
    ["engine", "ENGINE LOG"],
    ["api", "API"],
    ["model", "SERVED MODEL"],
]


def status_lines(status: Mapping, title: str = "") -> list[str]:
    lines = [title] if title else []
    lines += status_table(status["rows"], STATUS_COLUMNS)
    lines += [f"  {line}" for line in status.get("log") or []]
    lines += [f"! {n}" for n in status["notes"]]
    lines.append("engine: healthy" if status["healthy"] else "engine: NOT healthy")
    return lines

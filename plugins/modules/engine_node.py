#!/usr/bin/python3
# sparkfleet: what one node runs of the engine, read-only (stdlib only; runs on the node as root).
from __future__ import annotations

DOCUMENTATION = r"""
module: engine_node
short_description: Read one node's engine state - unit, container, image, hardware, clock cap
description:
  - Read-only; never changes anything (check mode is the same as a normal run).
  - The container is reported only when it carries sparkfleet's label (I(label)); a container of
    that name without the label is reported as C(foreign) and never touched by sparkfleet.
  - Hardware gates for the container spec - whether an NVIDIA container runtime exists (for
    C(--gpus all)) and which of I(devices) are present.
  - Why not C(community.docker.docker_container_info), C(docker_image_info) and
    C(ansible.builtin.systemd_service) - every engine_service run and status starts with this read, and it
    takes the unit, the container, the image, the hardware gates, the clock cap, the weights record and the
    rank's log in one round trip a node, where those would be a task (a round trip) each.
options:
  name:
    type: str
    required: true
    description: Container name (the unit is I(name).service unless I(unit) is set).
  unit: {type: str, description: The systemd unit.}
  image: {type: str, description: "Image reference whose ID, labels and layer diffIDs to report."}
  label:
    type: str
    default: io.sparkfleet.engine.managed
    description: The label that marks sparkfleet's container.
  devices: {type: list, elements: str, default: [], description: Device paths to look for.}
  docker: {type: str, default: docker, description: The docker CLI.}
  docker_service:
    type: str
    default: docker.service
    description: >-
      The systemd unit of the Docker daemon. When it is not active the daemon is not asked anything (a docker
      command would start it through docker.socket): the result says Docker is not running. Empty: ask the
      docker CLI only.
  clock_state_file: {type: path, description: "gpu_clocks' configured cap (GPU_CLOCK_CAP_MHZ=N)."}
  clock_applied_file: {type: path, description: "gpu_clocks' marker of the cap applied since this boot."}
  weights_record: {type: path, description: "model_weights' record of the verified weights (JSON)."}
  weights_dir: {type: str, default: "", description: "The snapshot; empty = the record's."}
  rank_file: {type: str, default: "", description: "The rank file; empty = the record's."}
  chat_template: {type: str, default: "", description: "The chat template; empty = the record's."}
  log_lines: {type: int, default: 3, description: "Last lines of a stopped container's log to report."}
  log_rules:
    type: dict
    default: {}
    description: "The engine profile's log lines (regular expressions): loading, serving (rank 0), following
      (a worker), fatal (a list), progress. Empty: the log is not read."
  rank: {type: int, default: 0, description: "This node's rank (rank 0 serves, the others follow it)."}
  binds:
    type: list
    elements: dict
    default: []
    description: "Listeners the engine will open on this node, each C({name, host, port}) (C(name): the
      variable that sets it): each is tried with a bind, closed at once, and C(binds) says which would fail
      and why. A port in use is traced to the processes listening on it: one inside sparkfleet's running
      container is the engine's own and fine; anyone else's is named with its command and PID."
  paths:
    type: list
    elements: str
    default: []
    description: "Files and directories the role writes (its unit, environment file, helpers, kernel cache):
      C(paths) reports each one's sha256, mode and owner, so the role's write runs only when one differs
      (plugins/module_utils/files_state.py)."
  caches:
    type: list
    elements: dict
    default: []
    description: "The engine's caches on this node (C(engine_cache)'s entries: name, path, size_gib):
      C(caches) reports engine_cache's check of them, read-only, so its task runs only when a directory is
      missing or a cache cannot grow to its size."
  other_units:
    type: list
    elements: str
    default: []
    description: "More units to read, as I(unit) is read (rank 0's watch); reported in C(other_units)."
  wait_for_start:
    type: float
    default: 0
    description: "Seconds to wait until the container has logged that it loads (or serves, or follows rank 0)
      or has stopped: what a rank that passed its argument checks does. 0: no wait. Waiting changes nothing."
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: Read what this node runs of the engine
  sparkfleet.cluster.engine_node:
    name: sparkfleet-engine
    image: sparkfleet/tensorfold:0123456789ab
    devices: [/dev/infiniband]
    clock_state_file: /var/lib/sparkfleet/clocks/gpu.conf
    clock_applied_file: /run/sparkfleet/clocks/gpu.applied
    weights_record: /var/lib/sparkfleet/weights.json
  register: node
"""

RETURN = r"""
binds:
  description: I(binds), each with C(problem) (why its bind would fail here, or null).
  type: list
  elements: dict
  returned: always
docker: {description: docker CLI found and the daemon answering, type: bool, returned: always}
docker_daemon:
  description: >-
    running (the daemon answers), unit (active, sub, result, enabled of I(docker_service); exists false when
    systemd does not know it), error (why it is not running, in plain words)
  type: dict
  returned: always
image: {description: "exists, id, labels, layers (RootFS diffIDs) of I(image)", type: dict, returned: always}
container:
  description: >-
    exists, managed, running, status, exit_code, error, started_at, finished_at, image_id, labels; unknown
    true (and status C(unknown)) when Docker is not running
  type: dict
  returned: always
unit:
  description: "exists, active, sub, result, exit_status, enabled, need_reload"
  type: dict
  returned: always
other_units: {description: "I(other_units), each read as C(unit) is", type: dict, returned: always}
caches:
  description: "engine_cache's check of I(caches), read-only - C({report, problems, error}) (report: name,
    path, size_gib, used_bytes, free_bytes, created - true when the directory is missing)"
  type: dict
  returned: always
paths:
  description: "I(paths), each as phase_state records a path (sha256, mode, uid, gid; a directory: directory,
    mode, uid, gid); None: missing"
  type: dict
  returned: always
gpu_runtime: {description: an NVIDIA container runtime is installed, type: bool, returned: always}
devices_present: {description: which of I(devices) exist, type: list, returned: always}
memlock_hard:
  description: "the hard memlock limit containers get from dockerd, bytes; -1 unlimited"
  type: int
  returned: always
clock: {description: "configured_mhz, applied_mhz (None when unknown)", type: dict, returned: always}
capabilities:
  description: "which of IPC_LOCK, SYS_NICE, ... dockerd can grant (its bounding set)"
  type: list
  returned: always
weights: {description: "the weights record (None when there is none)", type: dict, returned: always}
weights_paths:
  description: "dir, rank_file, chat_template (the override, else the record's)"
  type: dict
  returned: always
weights_missing: {description: which of weights_paths do not exist, type: list, returned: always}
weights_partial:
  description: >-
    files of an unfinished copy (head to this worker) in the snapshot's .rsync-partial, the free bytes there
    (free_bytes) and the path measured: {files, free_bytes, path}; files empty when no copy was cut off
  type: dict
  returned: always
log:
  description: "what the rank's own log says - phase (failed, serving, following, loading, starting,
    stopped), ready (the serving or following line), fatal (the engine's message), loading, last (its
    latest progress line)"
  type: dict
  returned: when log_rules is set
"""

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils.binds import bind_problem
from ansible_collections.sparkfleet.cluster.plugins.module_utils.clock_state import GPU_KEY, read_cap
from ansible_collections.sparkfleet.cluster.plugins.module_utils.disk import cache_space
from ansible_collections.sparkfleet.cluster.plugins.module_utils.engine_logs import (
    Patterns,
    read_logs,
    seconds_since,
    summarize,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.files_state import observe

# `docker run --gpus` needs the hook (nvidia-container-toolkit) or a registered nvidia runtime.
GPU_RUNTIME_BINARIES = ("nvidia-container-runtime-hook",)


def memlock_limit(limits_text: str) -> int:
    """The hard 'Max locked memory' limit from /proc/<pid>/limits, in bytes; -1 = unlimited."""
    for line in limits_text.splitlines():
        if line.startswith("Max locked memory"):
            hard = line[len("Max locked memory") :].split()[1]
            return -1 if hard == "unlimited" else int(hard)
    return -1


CAPABILITIES = {"IPC_LOCK": 14, "SYS_NICE": 23, "SYS_RESOURCE": 24, "SYS_ADMIN": 21, "NET_ADMIN": 12}


def dockerd_proc(name: str) -> str:
    """/proc/<dockerd>/<name> (its pid file), else init's: what containers inherit."""
    for pidfile in ("/run/docker.pid", "/var/run/docker.pid"):
        try:
            with open(pidfile, encoding="ascii") as fh:
                pid = int(fh.read().strip())
            with open(f"/proc/{pid}/{name}", encoding="ascii") as fh:
                return fh.read()
        except (OSError, ValueError):
            continue
    try:
        with open(f"/proc/1/{name}", encoding="ascii") as fh:
            return fh.read()
    except OSError:
        return ""


def bounding_caps(status_text: str) -> list[str]:
    """The capabilities (of CAPABILITIES) in CapBnd: what --cap-add can grant a container here."""
    for line in status_text.splitlines():
        if line.startswith("CapBnd:"):
            mask = int(line.split()[1], 16)
            return sorted(name for name, bit in CAPABILITIES.items() if mask >> bit & 1)
    return sorted(CAPABILITIES)


def read_json(path: str | None) -> dict | None:
    if not path or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return {"verified": False, "error": f"{path} is not readable JSON"}
    return doc if isinstance(doc, dict) else None


def parse_unit(show: str) -> dict:
    props = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
    load = props.get("LoadState", "not-found")
    return {
        "exists": load not in ("not-found", ""),
        "load": load,
        "active": props.get("ActiveState", "inactive"),
        "sub": props.get("SubState", ""),
        "result": props.get("Result", ""),
        "exit_status": int(props["ExecMainStatus"]) if props.get("ExecMainStatus", "").isdigit() else None,
        "enabled": props.get("UnitFileState", ""),
        "since": props.get("ActiveEnterTimestamp") or props.get("InactiveEnterTimestamp") or "",
        "need_reload": props.get("NeedDaemonReload", "no") == "yes",
    }


def docker_daemon(unit: dict | None, rc: int | None, version: str, err: str, cli: bool = True) -> dict:
    """Whether the Docker daemon runs, and why not in plain words.

    `unit`: parse_unit of the daemon's systemd unit (None: no systemd); `rc`/`version`/`err`: `docker version`
    (rc None: not asked, because the unit is not active)."""
    out = {"running": False, "unit": unit or {"exists": False}, "error": ""}
    if unit and unit.get("exists") and unit.get("active") != "active":
        state = f"{unit.get('active')}/{unit.get('sub')}"
        if unit.get("active") == "failed" and unit.get("result") not in ("", "success"):
            state += f", {unit['result']}"
        out["error"] = f"{unit.get('name', 'docker.service')} is {state}"
        return out
    if not cli:
        out["error"] = "the docker CLI is not installed"
    elif rc is None or rc != 0 or not version.strip():
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        out["error"] = "the Docker daemon does not answer" + (f": {lines[-1].strip()}" if lines else "")
    else:
        out["running"] = True
    return out


UNKNOWN_CONTAINER = {
    "exists": False,
    "managed": False,
    "running": False,
    "unknown": True,
    "status": "unknown",
    "labels": {},
}


def parse_container(doc: dict | None, label: str) -> dict:
    if not doc:
        return {"exists": False, "managed": False, "running": False, "status": "absent", "labels": {}}
    state = doc.get("State") or {}
    labels = (doc.get("Config") or {}).get("Labels") or {}
    return {
        "exists": True,
        "managed": labels.get(label) == "true",
        "running": bool(state.get("Running")),
        "status": state.get("Status", "unknown"),
        "exit_code": state.get("ExitCode"),
        "error": state.get("Error") or "",
        "oom_killed": bool(state.get("OOMKilled")),
        "started_at": state.get("StartedAt", ""),
        "running_s": seconds_since(state.get("StartedAt", "")) if state.get("Running") else None,
        "finished_at": state.get("FinishedAt", ""),
        "image_id": doc.get("Image", ""),
        "pid": state.get("Pid") or None,
        "labels": labels,
    }


def parse_image(doc: dict | None) -> dict:
    if not doc:
        return {"exists": False, "id": "", "labels": {}, "layers": []}
    return {
        "exists": True,
        "id": doc.get("Id", ""),
        "labels": (doc.get("Config") or {}).get("Labels") or {},
        "layers": (doc.get("RootFS") or {}).get("Layers") or [],
    }


def nvidia_runtime_configured(path: str = "/etc/docker/daemon.json") -> bool:
    try:
        with open(path, encoding="utf-8") as fh:
            return "nvidia" in (json.load(fh).get("runtimes") or {})
    except (OSError, ValueError, AttributeError):
        return False


def weights_paths(record: dict | None, overrides: dict) -> dict:
    """Snapshot, rank file and chat template: the override, else what the weights record names."""
    record = record or {}
    rank = record.get("rank") if isinstance(record.get("rank"), dict) else {}
    template = record.get("chat_template") if isinstance(record.get("chat_template"), dict) else {}
    return {
        "dir": overrides.get("dir") or record.get("snapshot") or "",
        "rank_file": overrides.get("rank_file") or rank.get("path") or "",
        "chat_template": overrides.get("chat_template") or template.get("path") or "",
    }


def partial_copy(snapshot: str) -> dict:
    """Files rsync left in <snapshot>/.rsync-partial (a copy cut off) and the free bytes of its filesystem."""
    out: dict = {"files": [], "free_bytes": None, "path": snapshot}
    if not snapshot or not os.path.isdir(snapshot):
        return out
    part = os.path.join(snapshot, ".rsync-partial")
    for root, _dirs, names in os.walk(part):
        out["files"] += sorted(os.path.relpath(os.path.join(root, n), part) for n in names)
    st = os.statvfs(snapshot)
    out["free_bytes"] = st.f_bavail * st.f_frsize
    return out


def wait_started(docker: str, p: dict, inspect, daemon_up=lambda: True) -> None:
    """Until the rank logged that it loads (it passed its argument and option checks) or stopped, or the
    Docker daemon went away."""
    rules = Patterns(p["log_rules"])
    deadline = time.monotonic() + p["wait_for_start"]
    while time.monotonic() < deadline:
        container = parse_container(inspect("container", p["name"]), p["label"])
        if not daemon_up():
            return
        if container["exists"] and not container["running"] and container["status"] != "created":
            return  # it stopped: its log says why
        log = summarize(read_logs(docker, p["name"]), rules, rank=p["rank"], running=container["running"])
        if container["exists"] and log["phase"] in ("loading", "serving", "following", "failed"):
            return
        time.sleep(0.5)


def read_container(module, docker: str, p: dict, out: dict, inspect) -> None:
    """The container (ours, foreign or none), the image and what the rank's log says, into `out`."""
    container = parse_container(inspect("container", p["name"]), p["label"])
    if out["docker"] and p["image"]:
        out["image"] = parse_image(inspect("image", p["image"]))
    if not out["docker"]:  # the daemon went away while it was asked
        return
    if container["exists"] and not container["managed"]:
        container = {"exists": True, "managed": False, "foreign": True, "running": container["running"],
                     "status": "foreign", "labels": {}}  # fmt: skip
    elif container["exists"] and not container["running"] and p["log_lines"] > 0:
        _, logs, errs = module.run_command([docker, "logs", "--tail", str(p["log_lines"]), p["name"]])
        container["log_tail"] = [ln for ln in (logs + errs).splitlines() if ln.strip()][-p["log_lines"] :]
    out["container"] = container
    if p["log_rules"] and container["exists"] and not container.get("foreign"):
        lines = read_logs(docker, p["name"])
        out["log"] = summarize(lines, Patterns(p["log_rules"]), rank=p["rank"], running=container["running"])


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "unit": {"type": "str"},
            "image": {"type": "str"},
            "label": {"type": "str", "default": "io.sparkfleet.engine.managed"},
            "devices": {"type": "list", "elements": "str", "default": []},
            "docker": {"type": "str", "default": "docker"},
            "docker_service": {"type": "str", "default": "docker.service"},
            "clock_state_file": {"type": "path"},
            "clock_applied_file": {"type": "path"},
            "weights_record": {"type": "path"},
            "weights_dir": {"type": "str", "default": ""},
            "rank_file": {"type": "str", "default": ""},
            "chat_template": {"type": "str", "default": ""},
            "log_lines": {"type": "int", "default": 3},
            "log_rules": {"type": "dict", "default": {}},
            "rank": {"type": "int", "default": 0},
            "wait_for_start": {"type": "float", "default": 0},
            "binds": {"type": "list", "elements": "dict", "default": []},
            "paths": {"type": "list", "elements": "str", "default": []},
            "other_units": {"type": "list", "elements": "str", "default": []},
            "caches": {"type": "list", "elements": "dict", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    docker = module.get_bin_path(p["docker"])
    systemctl = module.get_bin_path("systemctl")
    props = "LoadState,ActiveState,SubState,Result,ExecMainStatus,UnitFileState,ActiveEnterTimestamp"

    def unit_state(name: str) -> dict | None:
        if not systemctl:
            return None
        rc, show, _ = module.run_command(
            [systemctl, "show", name, f"--property={props},InactiveEnterTimestamp,NeedDaemonReload"]
        )
        return {**parse_unit(show), "name": name} if rc == 0 else None

    daemon_unit = unit_state(p["docker_service"]) if p["docker_service"] else None
    rc = version = err = None
    if docker and not (daemon_unit and daemon_unit["exists"] and daemon_unit["active"] != "active"):
        rc, version, err = module.run_command([docker, "version", "--format", "{{.Server.Version}}"])
    out: dict = {
        "changed": False,
        "docker_daemon": docker_daemon(daemon_unit, rc, version or "", err or "", cli=bool(docker)),
        "image": {**parse_image(None), "unknown": True},
        "container": dict(UNKNOWN_CONTAINER),
    }
    out["docker"] = out["docker_daemon"]["running"]

    def inspect(kind: str, ref: str) -> dict | None:
        rc, stdout, stderr = module.run_command([docker, kind, "inspect", ref])
        if rc != 0:
            if "Cannot connect" in stderr or "permission denied" in stderr:
                out["docker"] = False
                out["docker_daemon"] = docker_daemon(unit_state(p["docker_service"]), 1, "", stderr)
            return None
        data = json.loads(stdout)
        return data[0] if data else None

    if out["docker"] and p["wait_for_start"] > 0 and p["log_rules"]:
        wait_started(docker, p, inspect, lambda: out["docker"])
    if out["docker"]:
        read_container(module, docker, p, out, inspect)
    hook = any(module.get_bin_path(b) for b in GPU_RUNTIME_BINARIES)
    out["gpu_runtime"] = hook or nvidia_runtime_configured()

    unit = p["unit"] or f"{p['name']}.service"
    out["unit"] = unit_state(unit) or {**parse_unit(""), "name": unit}
    out["other_units"] = {u: unit_state(u) or {**parse_unit(""), "name": u} for u in p["other_units"]}
    out["paths"] = observe(p["paths"])
    try:
        report, problems = cache_space(p["caches"])
        out["caches"] = {"report": report, "problems": problems, "error": ""}
    except ValueError as exc:  # engine_cache's task runs and fails with the same words
        out["caches"] = {"report": [], "problems": [], "error": str(exc)}
    out["devices_present"] = [d for d in p["devices"] if os.path.exists(d)]
    out["weights"] = read_json(p["weights_record"])
    overrides = {"dir": p["weights_dir"], "rank_file": p["rank_file"], "chat_template": p["chat_template"]}
    out["weights_paths"] = weights_paths(out["weights"], overrides)
    out["weights_missing"] = [v for v in out["weights_paths"].values() if v and not os.path.exists(v)]
    out["weights_partial"] = partial_copy(out["weights_paths"]["dir"])
    out["memlock_hard"] = memlock_limit(dockerd_proc("limits"))
    out["capabilities"] = bounding_caps(dockerd_proc("status"))
    engine_pid = out["container"].get("pid") if out["container"].get("running") else None
    out["binds"] = [
        {**b, "problem": bind_problem(str(b.get("host")), int(b.get("port", 0)), engine_pid=engine_pid)}
        for b in p["binds"]
    ]
    out["clock"] = {
        "configured_mhz": read_cap(p["clock_state_file"], GPU_KEY),
        "applied_mhz": read_cap(p["clock_applied_file"], GPU_KEY),
    }
    module.exit_json(**out)


if __name__ == "__main__":
    main()

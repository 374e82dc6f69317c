"""The engine described as data: from settings + the cluster plan to one rank's container.

`sparkfleet_engine_spec(settings)` returns, for the host in `settings["host"]`, everything the unit
runs: the docker run arguments, the engine command, the environment (with the per-rank NCCL env
from network_links and the fabric addresses from sparkfleet_plan), mounts, labels, what was left
out because the node lacks the hardware, and a settings digest. The digest covers every input
that reaches the container (arguments, environment, image ID), so "no change, no restart" is a
comparison of two strings. Pure functions: unit-tested in tests/unit/test_engine_spec.py.
"""

from __future__ import annotations

import hashlib
import json
import re

LABEL_PREFIX = "io.sparkfleet.engine"
MANAGED_LABEL = f"{LABEL_PREFIX}.managed"
SETTINGS_LABEL = f"{LABEL_PREFIX}.settings"
RANK_LABEL = f"{LABEL_PREFIX}.rank"
LOOPBACK = ("127.0.0.1", "::1", "localhost")
# Never into the engine's environment: the engine runs offline and needs no hub credentials.
FORBIDDEN_ENV = re.compile(
    r"^(HF_TOKEN|HUGGING_FACE_HUB_TOKEN|HF_HUB_TOKEN|.*API_KEY|.*SECRET.*|.*PASSWORD.*)$"
)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


try:  # inside Ansible, a clear "this setting is wrong" error instead of a traceback
    from ansible.errors import AnsibleFilterError as _Base
except ImportError:  # pragma: no cover - the filter is also importable without Ansible
    _Base = ValueError


class SpecError(_Base):
    pass


def _require(settings: dict, *keys: str) -> None:
    missing = [k for k in keys if settings.get(k) in (None, "")]
    if missing:
        raise SpecError(f"engine spec: missing {', '.join(missing)}")


def fabric_peers(plan: dict, host: str, port: int) -> dict:
    """SPARKFLEET_FABRIC for `host`: per peer rank, this host's and the peer's address on their cable.

    Rank 0 talks to every worker; a worker only to rank 0. Rail 1 of the direct cable is used.
    """
    ranks = plan["ranks"]
    head = plan["head"]
    peers = [h for h in plan["hosts_by_rank"] if h != host] if host == head else [head]
    out = {}
    for peer in peers:
        links = [i for i in plan.get("interfaces", {}).get(host, []) if i.get("peer_host") == peer]
        if not links:
            raise SpecError(
                f"sparkfleet_plan.interfaces has no fabric link between {host} and {peer}: "
                "the data plane needs a direct cable between rank 0 and every worker"
            )
        link = min(links, key=lambda i: int(i.get("rail", 1)))
        out[str(ranks[peer])] = {"local": link["address"], "peer": link["peer_address"]}
    return {"port": int(port), "peers": out}


def _flag_args(values: dict) -> list[str]:
    """{"--max-num-seqs": 4, "--x": None} -> ["--max-num-seqs", "4"]; None and "" are left out."""
    out: list[str] = []
    for flag, value in values.items():
        if value is None or value == "":
            continue
        text = ("on" if value else "off") if isinstance(value, bool) else str(value)
        out += [str(flag), text]
    return out


def _env(settings: dict, plan: dict) -> dict[str, str]:
    nccl = settings.get("nccl_env")
    if not isinstance(nccl, dict):
        raise SpecError(
            f"network_links_nccl_env is not set for {settings['host']}: run `sparkfleet network` "
            "(playbooks/network.yml) so the per-rank NCCL environment is computed"
        )
    env: dict[str, str] = {
        "HF_HUB_OFFLINE": "1",
        "MASTER_ADDR": str(plan["master_addr"]),
        "MASTER_PORT": str(settings["master_port"]),
    }
    for key, value in nccl.items():
        if key == "MASTER_ADDR" and str(value) != env["MASTER_ADDR"]:
            raise SpecError(
                f"network_links_nccl_env MASTER_ADDR={value} differs from the plan's {env['MASTER_ADDR']}"
            )
        env[str(key)] = str(value)
    if int(plan["size"]) > 1:
        fabric = fabric_peers(plan, settings["host"], settings["data_port"])
        env["SPARKFLEET_FABRIC"] = json.dumps(fabric, sort_keys=True, separators=(",", ":"))
    for key, value in (settings.get("extra_env") or {}).items():
        env[str(key)] = str(value)
    for key, value in env.items():
        if not ENV_NAME.match(key):
            raise SpecError(f"engine environment: {key!r} is not a variable name")
        if FORBIDDEN_ENV.match(key):
            raise SpecError(
                f"engine environment: {key} is a secret; secrets never go into the engine's environment"
            )
        if "\n" in value or "\r" in value:
            raise SpecError(f"engine environment: {key} contains a line break")
    return env


def _caches(settings: dict, is_head: bool) -> tuple[list[str], list[str], list[dict]]:
    args: list[str] = []
    mounts: list[str] = []
    used: list[dict] = []
    for cache in settings.get("caches") or []:
        where = cache.get("nodes", "all")
        if where not in ("all", "head"):
            raise SpecError(f"engine cache {cache.get('name')}: nodes must be all or head, not {where!r}")
    for cache in engine_caches(settings.get("caches") or [], is_head):
        mounts += ["--volume", f"{cache['path']}:{cache['mount']}:rw"]
        args += [str(cache["dir_arg"]), str(cache["mount"])]
        if cache.get("size_arg"):
            args += [str(cache["size_arg"]), f"{float(cache['size_gib']):g}"]
        used.append(cache)
    return args, mounts, used


def _api_part(settings: dict) -> tuple[list[str], list[str]]:
    """Rank 0 only: where the API listens, its name, its key file."""
    api = settings.get("api") or {}
    _require(api, "host", "port", "served_model_name")
    if api["host"] not in LOOPBACK and not api.get("key_required"):
        raise SpecError(
            f"engine_service_host={api['host']} exposes the API beyond loopback: "
            "set engine_service_api_key_required: true (a key is required off loopback)"
        )
    command = ["--host", str(api["host"]), "--port", str(api["port"])]
    command += ["--served-model-name", str(api["served_model_name"])]
    mounts: list[str] = []
    if api.get("key_required"):
        _require(api, "key_file", "key_mount")
        mounts += ["--volume", f"{api['key_file']}:{api['key_mount']}:ro"]
        command += ["--api-key-file", str(api["key_mount"])]
    return command + _flag_args(settings.get("api_args") or {}), mounts


def _command(settings: dict, plan: dict, rank: int) -> tuple[list[str], list[str], list[dict]]:
    """`tensorfold serve <snapshot> --tp N --rank R --master IP --master-port P ...` and its mounts."""
    command = [*settings.get("command", ["tensorfold", "serve"]), str(settings["weights_dir"])]
    command += ["--tp", str(plan["size"]), "--rank", str(rank)]
    command += ["--master", str(plan["master_addr"]), "--master-port", str(settings["master_port"])]
    mounts = ["--volume", f"{settings['weights_dir']}:{settings['weights_dir']}:ro"]
    if rank == 0:
        api_command, api_mounts = _api_part(settings)
        command += api_command
        mounts += api_mounts
    command += _flag_args(settings.get("rank_args") or {})
    for key, flag in (("rank_file", "--rank-file"), ("chat_template", "--chat-template")):
        if settings.get(key):  # read-only, at the same path as on the node
            mounts += ["--volume", f"{settings[key]}:{settings[key]}:ro"]
            command += [flag, str(settings[key])]
    cache_args, cache_mounts, caches = _caches(settings, rank == 0)
    command += cache_args + [str(a) for a in settings.get("extra_args") or []]
    return command, mounts + cache_mounts, caches


def _hardware(settings: dict) -> tuple[list[str], list[str], list[str]]:
    """--gpus and --device, each only where the node has it; and what was left out, with why."""
    omitted: list[str] = []
    gpu_args: list[str] = []
    device_args: list[str] = []
    gpus = settings.get("gpus", "auto")
    if gpus not in (True, False, "auto"):
        raise SpecError(f"engine_service_gpus must be auto, true or false, not {gpus!r}")
    if gpus is True or (gpus == "auto" and settings.get("node_has_gpu_runtime")):
        gpu_args = ["--gpus", "all"]
    elif gpus == "auto":
        omitted.append("--gpus all: this node has no NVIDIA container runtime (nvidia-container-toolkit)")
    present = set(settings.get("node_devices") or [])
    for device in settings.get("devices") or []:
        if device in present:
            device_args += ["--device", device]
        else:
            omitted.append(f"--device {device}: not present on this node")
    return gpu_args, device_args, omitted


def _ulimit(value: str, memlock_hard: int | None, omitted: list[str]) -> str:
    """memlock beyond what dockerd may grant fails the container: cap it there and say so."""
    name, _, limits = value.partition("=")
    if name != "memlock" or memlock_hard is None or int(memlock_hard) < 0:
        return value
    hard = int(memlock_hard)
    parts = [int(x) for x in limits.split(":")] if limits else [-1]
    if all(0 <= x <= hard for x in parts):
        return value
    capped = ":".join(str(hard if x < 0 or x > hard else x) for x in parts)
    omitted.append(
        f"--ulimit {value}: this node's hard memlock limit is {hard} bytes, capped to memlock={capped}"
    )
    return f"memlock={capped}"


def _limits(settings: dict, omitted: list[str]) -> list[str]:
    args = ["--oom-score-adj", str(settings.get("oom_score_adj", 1000))]
    args += ["--network", "host", "--ipc", "host"]
    available = settings.get("node_capabilities")
    for cap in settings.get("cap_add", ["IPC_LOCK"]):
        if available is None or cap in available:
            args += ["--cap-add", str(cap)]
        else:
            omitted.append(f"--cap-add {cap}: not in this node's capability bounding set")
    for ulimit in settings.get("ulimits", ["memlock=-1:-1", "stack=67108864"]):
        args += ["--ulimit", _ulimit(str(ulimit), settings.get("node_memlock_hard"), omitted)]
    args += ["--shm-size", str(settings.get("shm_size", "10g"))]
    args += ["--log-driver", str(settings.get("log_driver", "json-file"))]
    for key, value in (settings.get("log_opts") or {"max-size": "100m", "max-file": "5"}).items():
        args += ["--log-opt", f"{key}={value}"]
    return args


def engine_spec(settings: dict) -> dict:
    """One rank's container: see the module docstring. `settings` is built by engine_service."""
    _require(settings, "host", "plan", "name", "image", "image_id", "weights_dir", "master_port")
    plan = settings["plan"]
    host = settings["host"]
    if host not in plan.get("ranks", {}):
        raise SpecError(f"{host} has no rank in sparkfleet_plan.ranks")
    rank = int(plan["ranks"][host])
    command, mounts, caches = _command(settings, plan, rank)
    gpu_args, device_args, omitted = _hardware(settings)
    env = _env(settings, plan)
    labels = {MANAGED_LABEL: "true", RANK_LABEL: str(rank), f"{LABEL_PREFIX}.tp": str(plan["size"])}

    run = ["run", "--name", str(settings["name"]), "--init", "--restart", "no"]
    run += ["--stop-timeout", str(settings.get("stop_timeout", 30))]
    run += gpu_args + _limits(settings, omitted) + device_args
    run += ["--env-file", str(settings.get("env_file", "/etc/sparkfleet/engine.env"))]
    for key, value in sorted(labels.items()):
        run += ["--label", f"{key}={value}"]
    run += mounts

    digest_input = {"run": run, "env": env, "image": settings["image"], "image_id": settings["image_id"]}
    digest_input["command"] = command
    digest = hashlib.sha256(json.dumps(digest_input, sort_keys=True).encode()).hexdigest()
    labels[SETTINGS_LABEL] = digest
    run += ["--label", f"{SETTINGS_LABEL}={digest}"]
    return {
        "host": host,
        "rank": rank,
        "tp": int(plan["size"]),
        "is_head": rank == 0,
        "image": settings["image"],
        "image_id": settings["image_id"],
        "command": command,
        "env": env,
        "docker_args": run,
        "argv": [*run, str(settings["image"]), *command],
        "labels": labels,
        "caches": caches,
        "omitted": omitted,
        "digest": digest,
    }


def systemd_quote(arg: object) -> str:
    """One argument for an Exec= line: quoted when needed; % and $ escaped (systemd.service(5))."""
    text = str(arg)
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    if text and re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", text) and "\\" not in escaped:
        return escaped
    return f'"{escaped}"'


def systemd_exec(argv: list) -> str:
    """An Exec= command line, one argument per continuation line for readability."""
    return " \\\n    ".join(systemd_quote(a) for a in argv)


def env_file(env: dict) -> str:
    """docker --env-file content: KEY=VALUE, one per line, values literal (docker does no quoting)."""
    return "".join(f"{k}={v}\n" for k, v in sorted(env.items()))


def engine_caches(caches: list, is_head: bool) -> list:
    """The caches this node holds: nodes=all everywhere, nodes=head on rank 0 only."""
    return [
        c for c in caches or [] if c.get("nodes", "all") == "all" or (is_head and c.get("nodes") == "head")
    ]


def short_commit(value: object) -> str:
    text = str(value or "")
    return text[:12] if re.fullmatch(r"[0-9a-f]{40}", text) else (text or "-")


def status_table(rows: list[dict], columns: list[list[str]]) -> list[str]:
    """Fixed-width text table: columns are [key, header] pairs; missing values show as '-'."""
    cells = [
        [str(row.get(key) if row.get(key) not in (None, "") else "-") for key, _ in columns] for row in rows
    ]
    heads = [head for _, head in columns]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]
    line = "  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip()
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)).rstrip() for cell in cells]
    return out


def _unit_text(unit: dict) -> str:
    if not unit.get("exists"):
        return "absent"
    text = f"{unit.get('active', '?')}/{unit.get('sub', '?')}"
    if unit.get("active") == "failed" and unit.get("exit_status") not in (None, 0):
        text += f" (exit {unit['exit_status']})"
    return text


def _container_text(c: dict) -> str:
    if c.get("foreign"):
        return "foreign (not sparkfleet's)"
    if not c.get("exists"):
        return "absent"
    if c.get("running"):
        return "running"
    text = f"{c.get('status', '?')} ({c.get('exit_code')})"
    return text + (" OOM-killed" if c.get("oom_killed") else "")


def _weights_text(record: object) -> str:
    if not isinstance(record, dict) or not record:
        return "no record"
    verified = record.get("verified")
    digest = str(record.get("manifest_digest") or record.get("digest") or "")
    if verified is False:
        return "NOT verified"
    if verified is None and not digest:
        return "?"
    return ("verified " + digest.removeprefix("sha256:")[:12]).strip()


def _clock_text(clock: dict) -> str:
    configured, applied = clock.get("configured_mhz"), clock.get("applied_mhz")
    if configured is None:
        return "-"
    text = "stock" if configured == 0 else f"{configured} MHz"
    if applied is None or applied != configured:
        text += " (not applied since boot)"
    return text


def status_rows(
    nodes: dict, plan: dict, api: dict | None, pin_commit: str, weights: dict | None = None
) -> dict:
    """The status table's rows (one per node, in rank order), notes that say why, and overall health."""
    api = api or {}
    health = api.get("health") or {}
    ranks_health = {r.get("rank"): r for r in health.get("ranks") or []}
    rows, notes = [], []
    healthy = api.get("state") == "ok"
    for host in plan["hosts_by_rank"]:
        rank = int(plan["ranks"][host])
        node = nodes.get(host) or {"unreachable": True}
        c = node.get("container") or {}
        labels = c.get("labels") or {}
        commit = labels.get(f"{LABEL_PREFIX}.commit") or (node.get("image") or {}).get("labels", {}).get(
            f"{LABEL_PREFIX}.commit"
        )
        commit_text = short_commit(commit)
        if commit and pin_commit and commit != pin_commit:
            commit_text += f" (pin {short_commit(pin_commit)})"
        if rank == 0:
            api_text = api.get("state", "down")
            model = ", ".join(api.get("models") or []) or "-"
        else:
            rh = ranks_health.get(rank) or {}
            api_text = f"rank {rh['state']}" if rh else "-"
            if rh.get("rtt_ms") is not None:
                api_text += f" {rh['rtt_ms']:.1f} ms"
            model = ""
        rows.append(
            {
                "node": host,
                "rank": rank,
                "unit": "unreachable" if node.get("unreachable") else _unit_text(node.get("unit") or {}),
                "container": "unreachable" if node.get("unreachable") else _container_text(c),
                "commit": commit_text,
                "weights": _weights_text((weights or {}).get(host, node.get("weights"))),
                "clock": _clock_text(node.get("clock") or {}),
                "api": api_text,
                "model": model,
            }
        )
        served = health.get("weights_digest")
        recorded = ((node.get("weights") or {}) if isinstance(node.get("weights"), dict) else {}).get(
            "manifest_digest"
        )
        if rank == 0 and served and recorded:
            if served == recorded:
                rows[-1]["weights"] += " (served)"
            else:
                notes.append(
                    f"{host}: the engine serves weights {served[:19]}, the verified record: {recorded[:19]}"
                )
        if not c.get("running"):
            healthy = False
            unit = _unit_text(node.get("unit") or {})
            why = f"{host} (rank {rank}): container {_container_text(c)}, unit {unit}"
            if node.get("unreachable"):
                why = f"{host} (rank {rank}): unreachable (no answer over SSH)"
            tail = c.get("log_tail") or []
            notes.append(why + (f"; last log: {tail[-1]}" if tail else ""))
        if commit and pin_commit and commit != pin_commit:
            notes.append(
                f"{host}: runs engine {short_commit(commit)}, the pin is {short_commit(pin_commit)}: "
                "run `sparkfleet engine` and `sparkfleet start`"
            )
    if api.get("state") != "ok":
        notes.append(f"API on {plan['head']}: {api.get('state', 'down')}: {api.get('detail', 'not probed')}")
    return {"rows": rows, "notes": notes, "healthy": healthy}


STATUS_COLUMNS = [
    ["node", "NODE"],
    ["rank", "RANK"],
    ["unit", "UNIT"],
    ["container", "CONTAINER"],
    ["commit", "IMAGE COMMIT"],
    ["weights", "WEIGHTS"],
    ["clock", "CLOCK CAP"],
    ["api", "API HEALTH"],
    ["model", "SERVED MODEL"],
]


def status_lines(status: dict, title: str = "") -> list[str]:
    lines = [title] if title else []
    lines += status_table(status["rows"], STATUS_COLUMNS)
    lines += [f"! {n}" for n in status["notes"]]
    lines.append("engine: healthy" if status["healthy"] else "engine: NOT healthy")
    return lines


class FilterModule:
    def filters(self) -> dict:
        return {
            "engine_spec": engine_spec,
            "engine_fabric": fabric_peers,
            "systemd_exec": systemd_exec,
            "env_file": env_file,
            "short_commit": short_commit,
            "engine_caches": engine_caches,
            "engine_status": status_rows,
            "engine_status_lines": status_lines,
            "status_table": status_table,
        }

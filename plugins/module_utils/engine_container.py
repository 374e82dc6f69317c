"""One rank's engine container as data: from an engine profile, the settings and the cluster plan.

`engine_spec(settings)` returns, for the host in `settings["host"]`, everything its unit runs: the docker
run arguments, the engine command, the environment (the profile's, the settings' variables, the rank's
NCCL environment from network_links), mounts, labels, what was left out because the node lacks the
hardware, and a settings digest. The digest covers every input that reaches the container (arguments,
environment, image ID), so "no change, no restart" is a comparison of two strings. `systemd_exec` and
`env_file` render the unit's command line and the container's environment file.
Used by the engine filters (plugins/filter/engine.py). Pure functions:
unit-tested in tests/unit/test_engine_spec.py.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping

from ansible_collections.sparkfleet.cluster.plugins.module_utils.engine_profile import ENV_NAME, rank_args

LABEL_PREFIX = "io.sparkfleet.engine"
MANAGED_LABEL = f"{LABEL_PREFIX}.managed"
SETTINGS_LABEL = f"{LABEL_PREFIX}.settings"
RANK_LABEL = f"{LABEL_PREFIX}.rank"
PROFILE_LABEL = f"{LABEL_PREFIX}.profile"
COMMIT_LABEL = f"{LABEL_PREFIX}.commit"
LOOPBACK = ("127.0.0.1", "::1", "localhost")
# Never into the engine's environment: the engine runs offline and needs no hub credentials, and an API key
# in the environment (TENSORFOLD_API_KEY) would show in `docker inspect`; the key goes in as a file.
FORBIDDEN_ENV = re.compile(
    r"^(HF_TOKEN|HUGGING_FACE_HUB_TOKEN|HF_HUB_TOKEN|.*API_KEY|.*SECRET.*|.*PASSWORD.*)$"
)


class SpecError(ValueError):
    """A setting the container cannot be built from (the filter engine_spec raises it as a filter error)."""


def _require(settings: Mapping, *keys: str) -> None:
    missing = [k for k in keys if settings.get(k) in (None, "")]
    if missing:
        raise SpecError(f"engine spec: missing {', '.join(missing)}")


def _env(settings: Mapping, profile: Mapping, values: Mapping, cache_env: dict[str, str]) -> dict[str, str]:
    nccl = settings.get("nccl_env")
    if not isinstance(nccl, Mapping):
        raise SpecError(
            f"network_links_nccl_env is not set for {settings['host']}: run `sparkfleet network` "
            "(playbooks/network.yml) so the per-rank NCCL environment is computed"
        )
    env: dict[str, str] = {str(k): str(v) for k, v in (profile.get("env") or {}).items()}
    if settings.get("kernel_cache"):
        kernel_env = (profile.get("kernel_cache") or {}).get("env") or {}
        env.update({str(k): str(v) for k, v in kernel_env.items()})
    for setting, var in (profile.get("env_settings") or {}).items():
        value = values.get(setting)
        if value is not None and value != "" and not (setting == "kv_pool_tokens" and not value):
            env[str(var)] = str(value)
    env.update(cache_env)
    env.update({str(k): str(v) for k, v in nccl.items()})
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


def engine_caches(caches: list, is_head: bool) -> list:
    """The caches this node holds: nodes=all everywhere, nodes=head on rank 0 only."""
    return [
        c for c in caches or [] if c.get("nodes", "all") == "all" or (is_head and c.get("nodes") == "head")
    ]


def _caches(settings: Mapping, is_head: bool) -> tuple[list[str], list[str], dict[str, str], list[dict]]:
    """(flags, mounts, environment, caches) of the on-disk caches this node holds."""
    args: list[str] = []
    mounts: list[str] = []
    env: dict[str, str] = {}
    used: list[dict] = []
    for cache in settings.get("caches") or []:
        where = cache.get("nodes", "all")
        if where not in ("all", "head"):
            raise SpecError(f"engine cache {cache.get('name')}: nodes must be all or head, not {where!r}")
    for cache in engine_caches(settings.get("caches") or [], is_head):
        mounts += ["--volume", f"{cache['path']}:{cache['mount']}:rw"]
        size = f"{float(cache['size_gib']):g}"
        if cache.get("dir_arg"):
            args += [str(cache["dir_arg"]), str(cache["mount"])]
        if cache.get("size_arg"):
            args += [str(cache["size_arg"]), size]
        if cache.get("dir_env"):
            env[str(cache["dir_env"])] = str(cache["mount"])
        if cache.get("size_env"):
            env[str(cache["size_env"])] = size
        if not (cache.get("dir_arg") or cache.get("dir_env")):
            raise SpecError(
                f"engine cache {cache.get('name')}: it needs dir_arg (a flag) or dir_env (a variable) "
                "to reach the engine"
            )
        used.append(dict(cache))
    return args, mounts, env, used


def _api(settings: Mapping, profile: Mapping) -> tuple[str | None, list[str]]:
    """Rank 0's key file (its path in the container) and its mount; None without a key."""
    api = settings.get("api") or {}
    _require(api, "host", "port", "name")
    keyed = bool(api.get("key_required"))
    if api["host"] not in LOOPBACK and not keyed:
        raise SpecError(
            f"engine_service_host={api['host']} exposes the API beyond loopback: "
            "set engine_service_api_key_required: true (a key is required off loopback)"
        )
    if not keyed:
        return None, []
    if not profile.get("api_keys"):
        raise SpecError(
            f"engine_service_api_key_required: the engine of this profile ({profile.get('engine_version')}) "
            "reads no API key file"
        )
    _require(api, "key_file", "key_mount")
    return str(api["key_mount"]), ["--volume", f"{api['key_file']}:{api['key_mount']}:ro"]


def _values(settings: Mapping, plan: Mapping, rank: int, key_file: str | None) -> dict:
    values = dict(settings.get("values") or {})
    api = settings.get("api") or {}
    values.update(
        tp=int(plan["size"]),
        rank=rank,
        master=str(plan["master_addr"]),
        master_port=int(settings["master_port"]),
        host=str(api.get("host")),
        port=int(api.get("port")),
        name=str(api.get("name")),
        api_key_file=key_file,
    )
    return values


def _weights(settings: Mapping, profile: Mapping) -> tuple[list[str], list[str], dict[str, str]]:
    """Rank file and chat template: mounted read-only at their own path, handed over as the profile says."""
    w = profile.get("weights") or {}
    args: list[str] = []
    mounts: list[str] = []
    env: dict[str, str] = {}
    rank_file = settings.get("rank_file")
    if rank_file:
        mounts += ["--volume", f"{rank_file}:{rank_file}:ro"]
        if w.get("rank_file_flag"):
            args += [str(w["rank_file_flag"]), str(rank_file)]
        if w.get("rank_file_env"):
            env[str(w["rank_file_env"])] = str(rank_file)
    template = settings.get("chat_template")
    if template and w.get("chat_template_flag"):
        mounts += ["--volume", f"{template}:{template}:ro"]
        args += [str(w["chat_template_flag"]), str(template)]
    return args, mounts, env


def _command(settings: Mapping, profile: Mapping, plan: Mapping, rank: int) -> tuple:
    """`<command> <snapshot> <flags> <caches> <extra>`: command, mounts, environment, caches, values."""
    # the same refusal on every rank; only rank 0 gets the key file
    key_file, key_mounts = _api(settings, profile)
    if rank != 0:
        key_file, key_mounts = None, []
    values = _values(settings, plan, rank, key_file)
    weights = str(settings["weights_dir"])
    command = [*(profile.get("command") or ["tensorfold", "serve"]), weights]
    command += rank_args(profile, values, rank)
    mounts = ["--volume", f"{weights}:{weights}:ro", *key_mounts]
    w_args, w_mounts, w_env = _weights(settings, profile)
    cache_args, cache_mounts, cache_env, caches = _caches(settings, rank == 0)
    command += w_args + cache_args + [str(a) for a in settings.get("extra_args") or []]
    mounts += w_mounts + cache_mounts
    kernel = settings.get("kernel_cache")
    if kernel:
        target = (profile.get("kernel_cache") or {}).get("mount")
        if not target:
            raise SpecError(
                "engine profile: kernel_cache.mount is not set (where the engine keeps kernel builds)"
            )
        mounts += ["--volume", f"{kernel}:{target}:rw"]
    return command, mounts, {**w_env, **cache_env}, caches, values


def _hardware(settings: Mapping) -> tuple[list[str], list[str], list[str]]:
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


def _limits(settings: Mapping, omitted: list[str]) -> list[str]:
    args = ["--oom-score-adj", str(settings.get("oom_score_adj", 1000))]
    args += ["--network", "host", "--ipc", "host"]
    available = settings.get("node_capabilities")
    for cap in settings.get("cap_add") or []:
        if available is None or cap in available:
            args += ["--cap-add", str(cap)]
        else:
            omitted.append(f"--cap-add {cap}: not in this node's capability bounding set")
    for ulimit in settings.get("ulimits") or []:
        args += ["--ulimit", _ulimit(str(ulimit), settings.get("node_memlock_hard"), omitted)]
    if settings.get("shm_size"):
        args += ["--shm-size", str(settings["shm_size"])]
    args += ["--log-driver", "json-file"]
    for key, value in (settings.get("log_opts") or {}).items():
        args += ["--log-opt", f"{key}={value}"]
    return args


def engine_spec(settings: Mapping) -> dict:
    """One rank's container (the module docstring); `settings` is built by engine_service's configure.yml."""
    _require(settings, "host", "plan", "profile", "name", "image", "image_id", "weights_dir", "master_port")
    plan = settings["plan"]
    profile = settings["profile"]
    host = settings["host"]
    if host not in plan.get("ranks", {}):
        raise SpecError(f"{host} has no rank in sparkfleet_plan.ranks")
    rank = int(plan["ranks"][host])
    if int(plan["size"]) not in (profile.get("tp_sizes") or []):
        raise SpecError(
            f"engine profile {settings.get('profile_name', '?')} serves TP {profile.get('tp_sizes')}, "
            f"not {plan['size']}"
        )
    command, mounts, extra_env, caches, values = _command(settings, profile, plan, rank)
    gpu_args, device_args, omitted = _hardware(settings)
    env = _env(settings, profile, values, extra_env)
    labels = {
        MANAGED_LABEL: "true",
        RANK_LABEL: str(rank),
        f"{LABEL_PREFIX}.tp": str(plan["size"]),
        PROFILE_LABEL: str(settings.get("profile_name", "")),
    }

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


def env_file(env: Mapping) -> str:
    """docker --env-file content: KEY=VALUE, one per line, values literal (docker does no quoting)."""
    return "".join(f"{k}={v}\n" for k, v in sorted(env.items()))

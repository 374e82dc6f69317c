"""The engine as data: from an engine profile, the settings and the cluster plan to one rank's container.

An engine profile (role engine_service, vars/main.yml and README "Profiles") says how a rank of one engine
build is launched: the command, the flags after the positional model directory and which ranks get them,
the environment, the docker run options, where the weights, the caches and the API key go, the log lines
that say "loading", "serving", "following rank 0" or "failed", and what verify may send.

`engine_spec(settings)` returns, for the host in `settings["host"]`, everything its unit runs: the docker
run arguments, the engine command, the environment (the profile's, the settings' variables, the rank's
NCCL environment from network_links), mounts, labels, what was left out because the node lacks the
hardware, and a settings digest. The digest covers every input that reaches the container (arguments,
environment, image ID), so "no change, no restart" is a comparison of two strings.
`profile_problems` checks a profile's shape and `setting_problems` what the chosen engine cannot take
(preflight layer 1). Pure functions: unit-tested in tests/unit/test_engine_spec.py.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping

from ansible_collections.sparkfleet.cluster.plugins.module_utils.input_kinds import k_abs_path, k_data_dir

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
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FLAG = re.compile(r"^--[a-z0-9][a-z0-9-]*$")
# The engine settings a profile maps onto flags (args) or variables (env_settings); README "Profiles".
SETTINGS = (
    "tp", "rank", "master", "master_port", "name", "context", "parallel", "mtp_drafts", "mtp_confidence",
    "decode_share", "temperature", "top_p", "top_k", "thinking", "reasoning_effort", "host", "port",
    "max_tokens", "api_key_file", "kv_pool_tokens", "prompt_cache_gib", "prompt_cache_entries",
)  # fmt: skip
# The variable an admin sets for each setting (for messages).
SETTING_VARS = {
    "master_port": "engine_service_master_port",
    "name": "engine_service_served_model_name",
    "context": "engine_service_context",
    "parallel": "engine_service_parallel",
    "mtp_drafts": "engine_service_mtp_drafts",
    "mtp_confidence": "engine_service_mtp_confidence",
    "decode_share": "engine_service_decode_share",
    "temperature": "engine_service_sampling.temperature",
    "top_p": "engine_service_sampling.top_p",
    "top_k": "engine_service_sampling.top_k",
    "thinking": "engine_service_thinking.enabled",
    "reasoning_effort": "engine_service_thinking.effort",
    "host": "engine_service_host",
    "port": "engine_service_port",
    "max_tokens": "engine_service_max_tokens",
    "api_key_file": "engine_service_api_key_required",
    "kv_pool_tokens": "engine_service_kv_pool_tokens",
    "prompt_cache_gib": "engine_service_prompt_cache.gib",
    "prompt_cache_entries": "engine_service_prompt_cache.entries",
}
PROFILE_KEYS = {
    "engine_version": str,
    "tp_sizes": list,
    "api_keys": bool,
    "command": list,
    "args": list,
    "env": dict,
    "env_settings": dict,
    "kernel_cache": dict,
    "weights": dict,
    "docker": dict,
    "ready": dict,
    "verify": list,
    "settings": dict,
}
VERIFY_CHECKS = ("models", "auth", "chat", "stream", "tool", "json_schema", "tool_refused")
VERIFY_CHECKS += ("json_schema_refused",)
ENGINE_VERSIONS = ("0.6.4", "0.6.6", "tp3-recipe")


try:  # inside Ansible, a clear "this setting is wrong" error instead of a traceback
    from ansible.errors import AnsibleFilterError as _Base
except ImportError:  # pragma: no cover - the filter is also importable without Ansible
    _Base = ValueError


class SpecError(_Base):
    pass


def _require(settings: Mapping, *keys: str) -> None:
    missing = [k for k in keys if settings.get(k) in (None, "")]
    if missing:
        raise SpecError(f"engine spec: missing {', '.join(missing)}")


# ---- profiles -------------------------------------------------------------------------------------


def _shape(where: str, p: Mapping) -> list[str]:
    missing = [key for key in PROFILE_KEYS if key not in p]
    if missing:
        return [
            f"{where} lacks {', '.join(missing)}: a profile has every key a built-in one has (README "
            "'Profiles'); to change a built-in profile, set only the keys to change under its name"
        ]
    out = [
        f"{where}.{key}={p.get(key)!r}: expected a {kind.__name__} (README 'Profiles')"
        for key, kind in PROFILE_KEYS.items()
        if not isinstance(p.get(key), kind)
    ]
    if out:
        return out
    if str(p["engine_version"]) not in ENGINE_VERSIONS:
        out.append(
            f"{where}.engine_version={p['engine_version']!r}: expected one of "
            f"{', '.join(ENGINE_VERSIONS)} (the engine's serve parser)"
        )
    sizes = p["tp_sizes"]
    if not sizes or not all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in sizes):
        out.append(f"{where}.tp_sizes={sizes!r}: expected whole numbers, e.g. [2]")
    if not p["command"] or not all(isinstance(c, str) and c for c in p["command"]):
        out.append(
            f"{where}.command={p['command']!r}: expected the engine's command, e.g. [tensorfold, serve]"
        )
    unknown = [c for c in p["verify"] if c not in VERIFY_CHECKS]
    if unknown:
        out.append(f"{where}.verify has unknown checks {unknown}: known are {', '.join(VERIFY_CHECKS)}")
    return out


def _arg_problem(what: str, arg: object) -> str | None:
    if not isinstance(arg, Mapping) or not FLAG.match(str(arg.get("flag", ""))):
        return f"{what}: expected {{flag: --name[, setting: S][, off_flag: --no-name][, ranks: all|head]}}"
    if arg.get("setting") is not None and arg["setting"] not in SETTINGS:
        return f"{what}: setting {arg['setting']!r} is not one of {', '.join(SETTINGS)}"
    if arg.get("ranks", "all") not in ("all", "head"):
        return f"{what}: ranks must be all or head"
    if arg.get("off_flag") is not None and not FLAG.match(str(arg["off_flag"])):
        return f"{what}: off_flag must be a flag"
    return None


def _ready_problems(where: str, ready: Mapping) -> list[str]:
    out = [
        f"{where}.ready.{key} is not set: the log line (a regular expression)"
        for key in ("serving", "following", "loading")
        if not ready.get(key)
    ]
    for key in ("loading", "serving", "following", "progress", "fatal"):
        for pattern in ready.get(key) if isinstance(ready.get(key), list) else [ready.get(key) or ""]:
            try:
                re.compile(str(pattern))
            except re.error as exc:
                out.append(f"{where}.ready.{key}: {pattern!r} is not a regular expression ({exc})")
    return out


def profile_problems(profiles: Mapping, name: str) -> list[str]:
    """What is wrong with profile `name` of `profiles` (the built-ins merged with engine_service_profiles),
    each naming the variable to fix; [] when it can be used."""
    if not name or name not in profiles:
        return [
            f"engine_service_profile={name!r} is not a profile: the built-in ones and those of "
            f"engine_service_profiles are {', '.join(sorted(profiles))}"
        ]
    where = f"engine_service_profiles.{name}"
    p = profiles[name]
    if not isinstance(p, Mapping):
        return [f"{where} is {type(p).__name__}: expected a mapping (README 'Profiles')"]
    out = _shape(where, p)
    if out:
        return out
    out += [m for i, a in enumerate(p["args"]) if (m := _arg_problem(f"{where}.args[{i}]={a!r}", a))]
    out += [
        f"{where}.env_settings: {setting}: {var} is not a setting and a variable name"
        for setting, var in p["env_settings"].items()
        if setting not in SETTINGS or not ENV_NAME.match(str(var))
    ]
    return out + _ready_problems(where, p["ready"])


def profile_serves(profiles: Mapping, tp: int) -> list[str]:
    """Every profile that serves TP `tp`, with the engine pin it needs: what a refusal names as the fix."""
    out = []
    for name, p in sorted(profiles.items()):
        if not isinstance(p, Mapping) or int(tp) not in (p.get("tp_sizes") or []):
            continue
        if p.get("engine_repo"):
            commits = " or ".join(p.get("engine_commits") or []) or "the commit you checked it against"
            out.append(f"{name}, with sparkfleet_pins.engine {p['engine_repo']} at {commits}")
        else:
            out.append(
                f"{name} ({p.get('summary', '')}), with sparkfleet_pins.engine that engine's repository "
                "and full commit"
            )
    return out


def _arg(entry: Mapping, values: Mapping, rank: int) -> list[str]:
    if entry.get("ranks", "all") == "head" and rank != 0:
        return []
    flag = str(entry["flag"])
    value = values.get(entry["setting"]) if entry.get("setting") is not None else True
    if value is None or value == "":
        return []
    if isinstance(value, bool):
        off = [str(entry["off_flag"])] if entry.get("off_flag") else []
        return [flag] if value else off
    items = value if isinstance(value, list) else [value]
    return [part for item in items for part in (flag, str(item))]


def rank_args(profile: Mapping, values: Mapping, rank: int) -> list[str]:
    """The flags of one rank after the model directory, in the profile's order."""
    return [part for entry in profile.get("args") or [] for part in _arg(entry, values, rank)]


def consumed(profile: Mapping) -> set[str]:
    """The settings a profile hands to the engine (by flag or by variable)."""
    used = {a.get("setting") for a in profile.get("args") or [] if isinstance(a, Mapping)}
    return (used | set((profile.get("env_settings") or {}).keys())) - {None}


def setting_problems(profile: Mapping, values: Mapping, name: str) -> list[str]:
    """Settings with a value that the profile's engine has no flag or variable for (it would be ignored,
    or the engine would refuse the flag): each names its variable and the fix."""
    used = consumed(profile)
    out = []
    for setting, value in values.items():
        if setting in used or value is None or value == "" or value is False or value == 0:
            continue
        var = SETTING_VARS.get(setting, setting)
        out.append(
            f"{var}={value!r}: the engine of profile {name} has no flag or variable for it: leave it unset "
            "(null) or use a profile whose engine takes it"
        )
    return out


def owned_flags(profile: Mapping, caches: list | None = None) -> dict[str, str]:
    """The flags the role passes itself (profile args, off flags, cache and weights flags), who sets each."""
    out: dict[str, str] = {}
    for arg in profile.get("args") or []:
        if not isinstance(arg, Mapping):
            continue
        var = SETTING_VARS.get(arg.get("setting") or "", "the engine profile")
        for key in ("flag", "off_flag"):
            if arg.get(key):
                out[str(arg[key])] = var
    for cache in caches or []:
        for key in ("dir_arg", "size_arg"):
            if isinstance(cache, Mapping) and cache.get(key):
                out[str(cache[key])] = "engine_service_caches"
    weights = profile.get("weights") or {}
    for key in ("rank_file_flag", "chat_template_flag"):
        if weights.get(key):
            out[str(weights[key])] = "model_weights' record"
    return out


def extra_arg_problems(extra: list | None, profile: Mapping, caches: list | None = None) -> list[str]:
    """engine_service_extra_args that set a flag the role already passes: argparse keeps the last value and
    expands unambiguous prefixes (--cont is --context), so such an argument would bypass its variable's checks
    or make the ranks differ (as the TP2 recipe's run.sh refuses them in EXTRA_ARGS)."""
    owned = owned_flags(profile, caches)
    out = []
    for arg in extra or []:
        word = str(arg).split("=", 1)[0]
        if not word.startswith("--") or len(word) < 3:
            continue
        hits = sorted(flag for flag in owned if flag.startswith(word))
        if hits:
            out.append(
                f"engine_service_extra_args has {arg} (the engine reads it as {hits[0]}), which sparkfleet "
                f"passes itself: set {owned[hits[0]]} instead"
            )
    return out


def _cache_problems(where: str, cache: Mapping) -> list[str]:
    # path: a directory on the node the role makes and owns (never a system one); mount: inside the container
    out = [
        f"{where}: {key}={cache.get(key)!r}: expected {want}"
        for key, check in (("path", k_data_dir), ("mount", k_abs_path))
        for want in [check(cache.get(key), {})]
        if want
    ]
    if cache.get("nodes", "all") not in ("all", "head"):
        out.append(f"{where}: nodes={cache.get('nodes')!r} must be all or head")
    try:
        size = float(cache.get("size_gib"))
    except (TypeError, ValueError):
        size = 0
    if size <= 0:
        out.append(f"{where}: size_gib={cache.get('size_gib')!r} must be a number of GiB > 0")
    if not (cache.get("dir_arg") or cache.get("dir_env")):
        out.append(f"{where}: set dir_arg (the engine's flag) or dir_env (its variable) for the directory")
    out += [
        f"{where}: {key}={cache[key]!r} must be an engine flag (--name)"
        for key in ("dir_arg", "size_arg")
        if cache.get(key) and not FLAG.match(str(cache[key]))
    ]
    out += [
        f"{where}: {key}={cache[key]!r} must be a variable name"
        for key in ("dir_env", "size_env")
        if cache.get(key) and not ENV_NAME.match(str(cache[key]))
    ]
    return out


def cache_problems(caches: object) -> list[str]:
    """engine_service_caches entries: each names what is wrong with it."""
    if not isinstance(caches, list):
        return [f"engine_service_caches={caches!r}: expected a list of caches (README 'Caches')"]
    out = []
    for i, cache in enumerate(caches):
        name = cache.get("name") if isinstance(cache, Mapping) else None
        where = f"engine_service_caches[{i}] ({name or 'no name'})"
        if not isinstance(cache, Mapping) or not name:
            out.append(f"{where}: it needs a name")
            continue
        out += _cache_problems(where, cache)
    return out


# ---- one rank's container ---------------------------------------------------------------------------


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


def short_commit(value: object) -> str:
    text = str(value or "")
    return text[:12] if re.fullmatch(r"[0-9a-f]{40}", text) else (text or "-")


# ---- status ------------------------------------------------------------------------------------------


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


def _minutes(seconds: object) -> str:
    try:
        return f"{int(float(seconds) // 60)} min"
    except (TypeError, ValueError):
        return "?"


def _log_text(node: Mapping, rank: int) -> str:
    """The ENGINE column: what the rank's own log says."""
    log = node.get("log") or {}
    phase = log.get("phase")
    if not phase or node.get("unreachable"):
        return "-"
    if phase == "loading":
        return f"loading ({_minutes(node.get('container', {}).get('running_s'))})"
    if phase == "following":
        return "following rank 0"
    return str(phase)


def _api_text(api: Mapping, head: Mapping, first_start: object) -> str:
    state = api.get("state", "down")
    if state == "down" and (head.get("container") or {}).get("running"):
        log = head.get("log") or {}
        if log.get("phase") in ("loading", "starting"):
            running = _minutes((head.get("container") or {}).get("running_s"))
            return f"loading, {running} of the ~{first_start}"
    return str(state)


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


class FilterModule:
    def filters(self) -> dict:
        return {
            "engine_spec": engine_spec,
            "engine_profile_problems": profile_problems,
            "engine_profile_serves": profile_serves,
            "engine_setting_problems": setting_problems,
            "engine_extra_arg_problems": extra_arg_problems,
            "engine_cache_problems": cache_problems,
            "engine_rank_args": rank_args,
            "systemd_exec": systemd_exec,
            "env_file": env_file,
            "short_commit": short_commit,
            "engine_caches": engine_caches,
            "engine_status": status_rows,
            "engine_status_lines": status_lines,
            "engine_rank_problem": rank_problem,
            "status_table": status_table,
        }

"""Engine profiles, checked: what is wrong with a profile, the settings its engine cannot take, the extra
arguments that would override a flag the role passes, the on-disk caches; and one rank's flags.

An engine profile (role engine_service, vars/main.yml and README "Profiles") says how a rank of one engine
build is launched: the command, the flags after the positional model directory and which ranks get them,
the environment, the docker run options, where the weights, the caches and the API key go, the log lines
that say "loading", "serving", "following rank 0" or "failed", and what verify may send.
`profile_problems` checks a profile's shape and `setting_problems` what the chosen engine cannot take
(preflight layer 1). Used by the engine filters (plugins/filter/engine.py).
Pure functions, standard library only: unit-tested in tests/unit/test_engine_spec.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ansible_collections.sparkfleet.cluster.plugins.module_utils.input_kinds import k_abs_path, k_data_dir

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

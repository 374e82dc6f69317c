"""Preflight's inventory-shape checks and the pins' formats (no facts, no connection).

- `inventory_problems(hostvars, groups)`: the inventory's shape - groups cluster > {head, workers},
  one head, the host count of the topology, each Spark's own node number and management address.
  Role cluster_plan's validation runs it (tasks/validate.yml).
- `pin_problems(pins)` / `pin_warnings(pins)`: the pins table (role sparkfleet's validation).
- `cluster_value`, `settings_differ`, `check_line`: helpers of preflight layer 2.
Every problem names the variable (and host), the bad value and the fix. Pure Python over plain
mappings, unit-tested directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible_collections.sparkfleet.cluster.plugins.module_utils.cluster_constants import NODE_COUNT
from ansible_collections.sparkfleet.cluster.plugins.module_utils.input_kinds import (
    DIGEST,
    GIT_URL,
    HEX40,
    HEX_SHORT,
    HF_REPO,
    IMAGE,
    PLACEHOLDER,
    VERSION,
    k_host,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.input_kinds import show as _show

PINS_FILE = "group_vars/all/pins.yml"


def _placeholder(path: str, v: Any, what: str) -> str:
    return f"{path}={_show(v)} is the sample inventory's placeholder: {what} in {PINS_FILE}"


def _revision(path: str, v: Any, problems: list[str], warnings: list[str]) -> None:
    text = str(v).strip() if isinstance(v, str) else v
    if isinstance(text, str) and HEX40.match(text):
        return
    if text == PLACEHOLDER:
        problems.append(_placeholder(path, v, "pin the full 40-hex commit"))
    elif isinstance(text, str) and HEX_SHORT.match(text):
        warnings.append(
            f"{path}={_show(v)} is a short commit ({len(text)} hex, as the recipes publish it): it is "
            f"accepted, but pin the full 40-hex commit in {PINS_FILE} (a short form can become ambiguous)"
        )
    else:
        problems.append(
            f"{path}={_show(v)}: expected a commit, 40 lowercase hex digits (a branch or tag moves; "
            f"the repos' main holds only the card); set it in {PINS_FILE}"
        )


def _hf_pin(key: str, e: Mapping, problems: list[str], warnings: list[str]) -> None:
    repo = e["repo"]
    path = f"sparkfleet_pins.{key}.repo"
    if repo == PLACEHOLDER:
        problems.append(_placeholder(path, repo, "set the Hugging Face repository (owner/name)"))
    elif not (isinstance(repo, str) and HF_REPO.match(repo)):
        problems.append(f"{path}={_show(repo)}: expected a Hugging Face repository owner/name")
    _revision(f"sparkfleet_pins.{key}.revision", e["revision"], problems, warnings)


def _engine_pin(e: Mapping, problems: list[str], warnings: list[str]) -> None:
    repo = e["repo"]
    path = "sparkfleet_pins.engine.repo"
    if repo == PLACEHOLDER:
        problems.append(_placeholder(path, repo, "set the engine's git repository (owner/name or a git URL)"))
    elif not (isinstance(repo, str) and (HF_REPO.match(repo) or GIT_URL.match(repo))):
        problems.append(f"{path}={_show(repo)}: expected owner/name or a git URL (https://, git://, ssh://)")
    commit = e["commit"]
    if commit == PLACEHOLDER:
        problems.append(_placeholder("sparkfleet_pins.engine.commit", commit, "pin the full 40-hex commit"))
    elif not (isinstance(commit, str) and HEX40.match(commit)):
        problems.append(
            f"sparkfleet_pins.engine.commit={_show(commit)}: expected the full commit, 40 lowercase hex "
            "digits (the image is built from and labelled with exactly this commit; a short form as the "
            f"recipes publish it, a branch or a tag is not enough); set it in {PINS_FILE}"
        )


def _image_pin(e: Mapping, problems: list[str]) -> None:
    name, digest = e["name"], e["digest"]
    if name == PLACEHOLDER:
        problems.append(
            _placeholder(
                "sparkfleet_pins.base_image.name", name, "set the engine's base image (registry/path)"
            )
        )
    elif not (isinstance(name, str) and IMAGE.match(name)):
        problems.append(
            f"sparkfleet_pins.base_image.name={_show(name)}: expected an image name like "
            "nvcr.io/nvidia/pytorch (lowercase registry/path, optional :tag; the digest goes in digest)"
        )
    if digest == PLACEHOLDER:
        problems.append(
            _placeholder("sparkfleet_pins.base_image.digest", digest, "set sha256:<64 hex> of the base image")
        )
    elif not (isinstance(digest, str) and DIGEST.match(digest)):
        problems.append(
            f"sparkfleet_pins.base_image.digest={_show(digest)}: expected sha256:<64 lowercase hex> "
            "(the base image is pulled by digest)"
        )


def pins_problems(pins: Any) -> tuple[list[str], list[str]]:
    problems: list[str] = []
    warnings: list[str] = []
    if not isinstance(pins, Mapping):
        return [
            f"sparkfleet_pins={_show(pins)}: expected the pins table of {PINS_FILE} "
            "(model, engram, engine, base_image, hf_client)"
        ], []
    shapes = {
        "model": ("repo", "revision"),
        "engram": ("repo", "revision"),
        "engine": ("repo", "commit"),
        "base_image": ("name", "digest"),
        "hf_client": ("huggingface_hub",),
    }
    entries: dict[str, Mapping] = {}
    for key, fields in shapes.items():
        e = pins.get(key)
        if not isinstance(e, Mapping) or any(f not in e for f in fields):
            problems.append(
                f"sparkfleet_pins.{key}={_show(e)}: expected a mapping with {', '.join(fields)}; "
                f"see {PINS_FILE} of the sample inventories"
            )
        else:
            entries[key] = e
    for key in ("model", "engram"):
        if key in entries:
            _hf_pin(key, entries[key], problems, warnings)
    if "engine" in entries:
        _engine_pin(entries["engine"], problems, warnings)
    if "base_image" in entries:
        _image_pin(entries["base_image"], problems)
    if "hf_client" in entries:
        ver = entries["hf_client"]["huggingface_hub"]
        if not (isinstance(ver, str) and VERSION.match(ver)):
            problems.append(
                f"sparkfleet_pins.hf_client.huggingface_hub={_show(ver)}: expected an exact version in "
                'quotes, e.g. "2.4.0"'
            )
    return problems, warnings


def _group_problems(groups: Mapping[str, list[str]]) -> list[str]:
    problems: list[str] = []
    cluster = list(groups.get("cluster", []))
    head = list(groups.get("head", []))
    workers = list(groups.get("workers", []))
    both = sorted(set(head) & set(workers))
    if len([h for h in head if h not in both]) != 1:  # a worker also listed under head is named below
        problems.append(
            f"group head={head}: expected exactly one host (rank 0: it downloads, builds and serves the "
            "API); keep one host under cluster > head in hosts.yml"
        )
    problems += [f"{h} is in both head and workers: a Spark is either the head or a worker" for h in both]
    problems += [
        f"{h} is in cluster but neither in head nor in workers: put it in one of them"
        for h in cluster
        if h not in head and h not in workers
    ]
    problems += [
        f"{h} is in head/workers but not in cluster: keep head and workers as children of cluster"
        for h in head + workers
        if h not in cluster
    ]
    return problems


def _cluster_wide_problems(
    hosts: Mapping[str, Mapping[str, Any]], cluster: list[str], ref: Mapping
) -> list[str]:
    problems: list[str] = []
    topo = ref.get("sparkfleet_topology")
    if topo is None:
        problems.append("sparkfleet_topology is not set: set tp2 or tp3 in group_vars/all/cluster.yml")
    elif topo in NODE_COUNT and len(cluster) != NODE_COUNT[topo]:
        problems.append(
            f"group cluster has {len(cluster)} hosts ({', '.join(cluster)}) but sparkfleet_topology={topo!r} "
            f"needs exactly {NODE_COUNT[topo]}: fix hosts.yml or sparkfleet_topology in "
            "group_vars/all/cluster.yml"
        )
    return problems


def _node_problem(h: str, node: Any, nodes: dict[int, str]) -> str | None:
    if node is None:
        return None  # role sparkfleet's spec: sparkfleet_node is required
    try:
        node = int(node)
    except (TypeError, ValueError):
        return None  # not a number: role sparkfleet's rule for sparkfleet_node says so
    if node in nodes:
        return f"{h}: sparkfleet_node={node} is already {nodes[node]}'s: every Spark needs its own number"
    nodes[node] = h
    return None


def _address_problem(h: str, addr: Any, addrs: dict[str, str]) -> str | None:
    if addr is None:
        return f"{h}: ansible_host is not set: give the Spark's management (LAN) address in hosts.yml"
    if isinstance(addr, str) and addr.strip() == PLACEHOLDER:
        return (
            f"{h}: ansible_host={_show(addr)} is the sample inventory's placeholder: set the Spark's "
            "management (LAN) address in hosts.yml"
        )
    if k_host(addr, {}) is not None:
        return f"{h}: ansible_host={_show(addr)}: expected an IP address or a host name"
    if addr in addrs:
        return f"{h}: ansible_host={_show(addr)} is also {addrs[addr]}'s: every Spark has its own address"
    addrs[addr] = h
    return None


def inventory_problems(hosts: Mapping[str, Mapping[str, Any]], groups: Mapping[str, list[str]]) -> list[str]:
    """`hosts`: {host: {var: value}} of group cluster (only variables that are defined).
    `groups`: the inventory groups (cluster, head, workers)."""
    cluster = list(groups.get("cluster", []))
    if not cluster:
        return [
            "group cluster is empty or missing: hosts.yml needs all > cluster > {head, workers} "
            "(copy inventory/tp2 or inventory/tp3)"
        ]
    head = list(groups.get("head", []))
    ref = hosts[head[0]] if len(head) == 1 and head[0] in hosts else hosts.get(cluster[0], {})
    problems = _group_problems(groups) + _cluster_wide_problems(hosts, cluster, ref)
    nodes: dict[int, str] = {}
    addrs: dict[str, str] = {}
    for h in cluster:
        hv = hosts.get(h, {})
        for msg in (
            _node_problem(h, hv.get("sparkfleet_node"), nodes),
            _address_problem(h, hv.get("ansible_host"), addrs),
        ):
            if msg:
                problems.append(msg)
    return problems


def _collect(hostvars: Mapping, groups: Mapping) -> dict[str, dict[str, Any]]:
    names = ("ansible_host", "sparkfleet_node", "sparkfleet_topology")
    out: dict[str, dict[str, Any]] = {}
    for h in groups.get("cluster", []):
        hv = hostvars[h]
        vals: dict[str, Any] = {}
        for n in names:
            if n in hv:
                try:
                    vals[n] = hv[n]
                except Exception as exc:  # an undefined reference inside the value
                    vals[n] = f"<cannot evaluate: {exc}>"
        out[h] = vals
    return out


def _filter_inventory(hostvars: Mapping, groups: Mapping) -> list[str]:
    return inventory_problems(_collect(hostvars, groups), groups)


def _filter_pin_problems(pins: Any) -> list[str]:
    return pins_problems(pins)[0]


def _filter_pin_warnings(pins: Any) -> list[str]:
    return pins_problems(pins)[1]


def _filter_cluster_value(hostvars: Mapping, groups: Mapping, name: str, fallback: Any = None) -> Any:
    """The head's value of a cluster-wide variable (the first cluster host's without a head), else
    fallback."""
    for h in list(groups.get("head", [])) + list(groups.get("cluster", [])):
        hv = hostvars[h]
        if name in hv:
            return hv[name]
        break
    return fallback


def settings_differ(per_host: Mapping[str, Mapping[str, Any]], keys: list[str]) -> list[str]:
    """`per_host`: {host: {setting: value}}. One line per setting whose value is not the same everywhere."""
    out = []
    for key in keys:
        vals = {h: str(s.get(key, "unknown")) for h, s in per_host.items()}
        if len(set(vals.values())) > 1:
            out.append(f"{key}: " + ", ".join(f"{h}={v}" for h, v in sorted(vals.items())))
    return out


def _filter_settings_differ(hostvars: Mapping, hosts: list[str], regvar: str, keys: list[str]) -> list[str]:
    per_host = {}
    for h in hosts:
        hv = hostvars[h]
        if regvar in hv:
            per_host[h] = (hv[regvar] or {}).get("settings", {})
    return settings_differ(per_host, list(keys))


def validation_verdict(hostvars: Mapping, cluster: list[str]) -> dict[str, list[str]]:
    """Every role's problems (and warnings) of every validated node, each once: a message all nodes
    share is shown as is, one that only some nodes have is prefixed with their names."""
    if not cluster:
        return {"problems": inventory_problems({}, {"cluster": []}), "warnings": []}
    cluster = list(cluster)
    recorded = {h: hostvars[h].get("ansible_facts") or {} for h in cluster}  # the validate action's facts
    out: dict[str, list[str]] = {"problems": [], "warnings": []}
    for kind in ("problems", "warnings"):
        seen: dict[str, list[str]] = {}
        checked = []
        for h in cluster:
            entries = recorded[h].get(f"sparkfleet_validation_{kind}")
            if entries is None and kind == "problems":
                continue  # not in this run's layer 1 (e.g. --limit): nothing to say about it
            checked.append(h)
            for entry in entries or []:
                role = entry.get("role", "?") if isinstance(entry, Mapping) else "?"
                msg = entry.get("msg") if isinstance(entry, Mapping) else str(entry)
                hosts = seen.setdefault(f"{role}: {msg}", [])
                if h not in hosts:
                    hosts.append(h)
        every = set(checked) or set(cluster)
        for msg, hosts in seen.items():
            out[kind].append(msg if set(hosts) >= every else f"{', '.join(hosts)}: {msg}")
    out["problems"] += uniform_problems(
        {h: recorded[h].get("sparkfleet_validation_values") or {} for h in cluster}, cluster[0]
    )
    return out


def uniform_problems(values: Mapping[str, Mapping[str, Any]], head: str) -> list[str]:
    """`values`: {host: {var: {role, value}}} of the variables that must be equal on every node. One
    problem per node whose value differs from the head's."""
    problems = []
    ref = values.get(head) or {}
    for name, entry in sorted(ref.items()):
        for host, theirs in values.items():
            if host == head or name not in theirs or theirs[name].get("value") == entry.get("value"):
                continue
            problems.append(
                f"{host}: {entry.get('role', '?')}: {name}={_show(theirs[name].get('value'))} on {host} "
                f"differs from {head}'s {_show(entry.get('value'))}: it must be the same on every node; "
                "set it once in group_vars/all, not in host_vars"
            )
    return problems


def check_line(check: Mapping[str, Any], ok: bool = False) -> str:
    """One layer-2 check as a sentence: what, what was found, and (for a failed one) the fix."""
    line = f"{check.get('name')}: {str(check.get('found', '')).strip()}"
    return line if ok else f"{line}. Fix: {str(check.get('fix', '')).strip()}"


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "inventory_problems": _filter_inventory,
            "pin_problems": _filter_pin_problems,
            "validation_verdict": validation_verdict,
            "pin_warnings": _filter_pin_warnings,
            "cluster_value": _filter_cluster_value,
            "settings_differ": _filter_settings_differ,
            "check_line": check_line,
        }

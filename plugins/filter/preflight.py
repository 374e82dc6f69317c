"""Preflight layer 1: the inventory alone (no facts, no connection), checked before anything runs.

`sparkfleet_preflight_inventory(hostvars, groups, table)` returns {"problems": [...], "warnings": [...]}.
Every problem names the variable (and host), the bad value and what is expected or how to fix it.
It checks the inventory's shape (groups, one head, node numbers, management addresses), the pins
table, and every variable of the data table (roles/preflight/vars/main.yml) that is defined.
The cluster plan's own inputs (cabling, subnets) are checked by cluster_plan's
`sparkfleet_plan_problems`, which the preflight tasks run next to this one.
Pure Python over plain mappings, unit-tested directly.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from typing import Any

PLACEHOLDER = "CHANGE-ME"
NODE_COUNT = {"tp2": 2, "tp3": 3}
HEX40 = re.compile(r"^[0-9a-f]{40}$")
HEX_SHORT = re.compile(r"^[0-9a-f]{7,12}$")
HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
GIT_URL = re.compile(r"^(?:(?:https?|git|ssh|file)://[^\s]+|[\w.-]+@[\w.-]+:[^\s]+)$")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# A Docker image reference without a digest: [registry[:port]/]path[:tag]
_COMP = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE = re.compile(
    rf"^(?:(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*)(?::[0-9]+)?/)?{_COMP}(?:/{_COMP})*(?::[\w][\w.-]{{0,127}})?$"
)
VERSION = re.compile(r"^[0-9]+(?:\.[0-9]+){1,3}$")
IFNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}$")
HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
INT_TEXT = re.compile(r"^[0-9]+$")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _as_int(v: Any) -> int | None:
    """Whole numbers, also as digit strings (`-e key=value` gives strings)."""
    if _is_int(v):
        return int(v)
    if isinstance(v, str) and INT_TEXT.match(v.strip()):
        return int(v.strip())
    return None


def _show(v: Any) -> str:
    if isinstance(v, str):
        return repr(str(v))
    if isinstance(v, Mapping):
        return repr(dict(v))
    return repr(v)


# ---- value kinds of the data table ------------------------------------------------------------
# Each returns None when the value is fine, else what is expected.


def _k_bool(v: Any, row: Mapping) -> str | None:
    if isinstance(v, bool):
        return None
    return "true or false as a YAML boolean (no quotes; on the command line -e '{\"VAR\": true}')"


def _k_int(v: Any, row: Mapping) -> str | None:
    n = _as_int(v)
    lo, hi = row.get("min"), row.get("max")
    if lo is not None and hi is not None:
        rng = f" between {lo} and {hi}"
    elif lo is not None:
        rng = f" >= {lo}"
    elif hi is not None:
        rng = f" <= {hi}"
    else:
        rng = ""
    if n is None or (lo is not None and n < lo) or (hi is not None and n > hi):
        return f"a whole number{rng}"
    return None


def _k_port(v: Any, row: Mapping) -> str | None:
    n = _as_int(v)
    if n is None or not 1 <= n <= 65535:
        return "a TCP port, a whole number 1..65535"
    return None


def _k_mhz(v: Any, row: Mapping) -> str | None:
    n = _as_int(v)
    lo, hi = row.get("min", 100), row.get("max", 10000)
    if n is None or (n != 0 and not lo <= n <= hi):
        return f"a clock in whole MHz: 0 (stock) or {lo}..{hi}"
    return None


def _k_abs_path(v: Any, row: Mapping) -> str | None:
    if (
        not isinstance(v, str)
        or not v.startswith("/")
        or "\n" in v
        or "//" in v.rstrip("/")
        or v.strip() != v
    ):
        return "an absolute path (starting with /)"
    pattern = row.get("pattern")
    if pattern and not re.match(pattern, v):
        return f"an absolute path matching {pattern}"
    return None


def _k_choice(v: Any, row: Mapping) -> str | None:
    choices = list(row.get("choices", []))
    return None if v in choices else f"one of {', '.join(map(str, choices))}"


def _k_ip(v: Any, row: Mapping) -> str | None:
    try:
        ipaddress.ip_address(str(v))
    except ValueError:
        return "an IP address"
    return None


def _k_cidr(v: Any, row: Mapping) -> str | None:
    try:
        ipaddress.ip_network(str(v), strict=True)
    except ValueError:
        return "a network in CIDR form, e.g. 10.12.1.0/24 (host bits zero)"
    return None


def _k_ifname(v: Any, row: Mapping) -> str | None:
    return None if isinstance(v, str) and IFNAME.match(v) else "a network interface name (1-15 characters)"


def _k_str(v: Any, row: Mapping) -> str | None:
    if not isinstance(v, str) or not v.strip():
        return "a non-empty string"
    pattern = row.get("pattern")
    if pattern and not re.match(pattern, v):
        return f"a string matching {pattern}"
    return None


def _k_list(v: Any, row: Mapping) -> str | None:
    return None if isinstance(v, list) else "a YAML list"


KINDS: dict[str, Callable[[Any, Mapping], str | None]] = {
    "bool": _k_bool,
    "int": _k_int,
    "port": _k_port,
    "mhz": _k_mhz,
    "abs_path": _k_abs_path,
    "choice": _k_choice,
    "ip": _k_ip,
    "cidr": _k_cidr,
    "ifname": _k_ifname,
    "str": _k_str,
    "list": _k_list,
}


def check_value(name: str, value: Any, row: Mapping, where: str = "") -> str | None:
    """One problem sentence for a bad value, else None."""
    prefix = f"{where}: " if where else ""
    fix = row.get("fix") or f"fix {name} in {row.get('file', 'the inventory group_vars')}"
    if isinstance(value, str) and value.strip() == PLACEHOLDER:
        return (
            f"{prefix}{name}={_show(value)} is the sample inventory's placeholder: set a real value ({fix})"
        )
    kind = row.get("kind")
    check = KINDS.get(kind)
    if check is None:
        return f"preflight table row for {name}: unknown kind {kind!r} (known: {', '.join(sorted(KINDS))})"
    expected = check(value, row)
    if expected is None:
        return None
    return f"{prefix}{name}={_show(value)}: expected {expected.replace('VAR', name)}; {fix}"


def table_problems(values: Mapping[str, Mapping[str, Any]], table: list[Mapping]) -> list[str]:
    """`values`: {host: {var: value}} for the variables that are defined; one problem per bad value.
    A value that is the same on every host is reported once (it comes from group_vars)."""
    problems: list[str] = []
    for row in table:
        name = row.get("var")
        if not isinstance(name, str):
            problems.append(f"preflight table row {dict(row)!r}: it needs var: <variable name>")
            continue
        seen: dict[str, list[str]] = {}
        cond = row.get("only_if") or {}
        for host, hv in values.items():
            if name not in hv:
                continue
            if cond and hv.get(cond.get("var")) != cond.get("equals"):
                continue  # e.g. the 64K kernel version matters only on the 64K profile
            msg = check_value(name, hv[name], row)
            if msg:
                seen.setdefault(msg, []).append(host)
        for msg, hosts in seen.items():
            where = "" if len(hosts) == len(values) else f"{', '.join(sorted(hosts))}: "
            problems.append(where + msg)
    return problems


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
    _revision("sparkfleet_pins.engine.commit", e["commit"], problems, warnings)


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
    if len(head) != 1:
        problems.append(
            f"group head={head}: expected exactly one host (rank 0: it downloads, builds and serves the "
            "API); keep one host under cluster > head in hosts.yml"
        )
    problems += [
        f"{h} is in both head and workers: a Spark is either the head or a worker"
        for h in sorted(set(head) & set(workers))
    ]
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
    # cluster-wide settings must agree on every host (a host_vars override would split the cluster)
    for name in ("sparkfleet_topology", "sparkfleet_pins", "sparkfleet_lab"):
        vals = {h: hosts[h].get(name) for h in cluster if h in hosts}
        if len({repr(v) for v in vals.values()}) > 1:
            problems.append(
                f"{name} differs between hosts ({'; '.join(f'{h}={_show(v)}' for h, v in vals.items())}): "
                "it is cluster-wide, set it once in group_vars/all"
            )
    return problems


def _node_problem(h: str, node: Any, nodes: dict[int, str]) -> str | None:
    if node is None:
        return f"{h}: sparkfleet_node is not set: give every Spark its number (1..9) in hosts.yml"
    if not _is_int(node) or not 1 <= node <= 9:
        return (
            f"{h}: sparkfleet_node={_show(node)}: expected a whole number 1..9 without quotes (the Spark's "
            "number in the cabling plan and the host part of its fabric addresses; the subnet template "
            "10.<a><b>.<rail>.0/24 needs one digit)"
        )
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
    if not isinstance(addr, str) or not (_k_ip(addr, {}) is None or HOSTNAME.match(addr)):
        return f"{h}: ansible_host={_show(addr)}: expected an IP address or a host name"
    if addr in addrs:
        return f"{h}: ansible_host={_show(addr)} is also {addrs[addr]}'s: every Spark has its own address"
    addrs[addr] = h
    return None


def inventory_problems(
    hosts: Mapping[str, Mapping[str, Any]],
    groups: Mapping[str, list[str]],
    table: list[Mapping],
) -> dict[str, list[str]]:
    """`hosts`: {host: {var: value}} of group cluster (only variables that are defined).
    `groups`: the inventory groups (cluster, head, workers)."""
    cluster = list(groups.get("cluster", []))
    if not cluster:
        return {
            "problems": [
                "group cluster is empty or missing: hosts.yml needs all > cluster > {head, workers} "
                "(copy inventory/tp2 or inventory/tp3)"
            ],
            "warnings": [],
        }
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
        mgmt = hv.get("sparkfleet_mgmt_address")
        if mgmt is not None and _k_ip(mgmt, {}) is not None:
            problems.append(
                f"{h}: sparkfleet_mgmt_address={_show(mgmt)}: expected the IP address of {h}'s management "
                "link (MASTER_ADDR, when ansible_host is a name or a NAT address)"
            )
    pins, warnings = pins_problems(ref.get("sparkfleet_pins"))
    problems += pins
    problems += table_problems({h: hosts[h] for h in cluster if h in hosts}, table)
    return {"problems": problems, "warnings": warnings}


def _collect(hostvars: Mapping, groups: Mapping, table: list[Mapping]) -> dict[str, dict[str, Any]]:
    names = {
        "ansible_host",
        "sparkfleet_node",
        "sparkfleet_mgmt_address",
        "sparkfleet_topology",
        "sparkfleet_pins",
        "sparkfleet_lab",
    }
    names |= {row["var"] for row in table if isinstance(row.get("var"), str)}
    names |= {row["only_if"]["var"] for row in table if isinstance(row.get("only_if"), Mapping)}
    out: dict[str, dict[str, Any]] = {}
    for h in groups.get("cluster", []):
        hv = hostvars[h]
        vals: dict[str, Any] = {}
        for n in sorted(names):
            if n in hv:
                try:
                    vals[n] = hv[n]
                except Exception as exc:  # an undefined reference inside the value
                    vals[n] = f"<cannot evaluate: {exc}>"
        out[h] = vals
    return out


def _filter_inventory(hostvars: Mapping, groups: Mapping, table: list[Mapping]) -> dict[str, list[str]]:
    return inventory_problems(_collect(hostvars, groups, table), groups, list(table))


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


def check_line(check: Mapping[str, Any], ok: bool = False) -> str:
    """One layer-2 check as a sentence: what, what was found, and (for a failed one) the fix."""
    line = f"{check.get('name')}: {str(check.get('found', '')).strip()}"
    return line if ok else f"{line}. Fix: {str(check.get('fix', '')).strip()}"


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "preflight_inventory": _filter_inventory,
            "cluster_value": _filter_cluster_value,
            "settings_differ": _filter_settings_differ,
            "check_line": check_line,
        }

"""Kinds of input values the roles' validation rules name (`{var: X, kind: port}`): what is accepted
and, when a value is not, what is expected, in words. Used on the controller by the action plugin
`sparkfleet.cluster.validate` and the preflight filters. Standard library only."""

from __future__ import annotations

import ipaddress
import posixpath
import re
from collections.abc import Callable, Mapping
from typing import Any

PLACEHOLDER = "CHANGE-ME"
HEX40 = re.compile(r"^[0-9a-f]{40}$")
HEX_SHORT = re.compile(r"^[0-9a-f]{7,12}$")
HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
GIT_URL = re.compile(r"^(?:(?:https?|git|ssh|file)://[^\s]+|[\w.-]+@[\w.-]+:[^\s]+)$")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_COMP = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE = re.compile(
    rf"^(?:(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*)(?::[0-9]+)?/)?{_COMP}(?:/{_COMP})*(?::[\w][\w.-]{{0,127}})?$"
)
VERSION = re.compile(r"^[0-9]+(?:\.[0-9]+){1,3}$")
IFNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}$")
HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
INT_TEXT = re.compile(r"^-?[0-9]+$")


def as_int(v: Any) -> int | None:
    """Whole numbers, also as digit strings (`-e key=value` gives strings); never booleans."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and INT_TEXT.match(v.strip()):
        return int(v.strip())
    return None


def show(v: Any) -> str:
    text = repr(v) if not isinstance(v, Mapping) else repr(dict(v))
    return text if len(text) <= 120 else text[:117] + "..."


def _range(lo: Any, hi: Any) -> str:
    if lo is not None and hi is not None:
        return f" between {lo} and {hi}"
    if lo is not None:
        return f" >= {lo}"
    if hi is not None:
        return f" <= {hi}"
    return ""


def k_int(v: Any, rule: Mapping) -> str | None:
    n = as_int(v)
    lo, hi = rule.get("min"), rule.get("max")
    if n is None or (lo is not None and n < lo) or (hi is not None and n > hi):
        return f"a whole number{_range(lo, hi)}"
    return None


def k_number(v: Any, rule: Mapping) -> str | None:
    try:
        n = float(v) if not isinstance(v, bool) else None
    except (TypeError, ValueError):
        n = None
    lo, hi = rule.get("min"), rule.get("max")
    if n is None or (lo is not None and n < lo) or (hi is not None and n > hi):
        return f"a number{_range(lo, hi)}"
    return None


def k_port(v: Any, rule: Mapping) -> str | None:
    n = as_int(v)
    return None if n is not None and 1 <= n <= 65535 else "a TCP port, a whole number 1..65535"


def k_mhz(v: Any, rule: Mapping) -> str | None:
    n = as_int(v)
    lo, hi = rule.get("min", 100), rule.get("max", 10000)
    if n is None or (n != 0 and not lo <= n <= hi):
        return f"a clock in whole MHz: 0 (stock) or {lo}..{hi}"
    return None


# ---- paths ----------------------------------------------------------------------------------------
# What a role must never take for its own: these directories themselves (a role would create files in them,
# own them or, pointed at one, change its owner) ...
SYSTEM_DIRS = frozenset(
    {
        "/", "/bin", "/boot", "/cdrom", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32",
        "/lost+found", "/media", "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/snap", "/srv", "/sys",
        "/tmp", "/usr", "/usr/local", "/var", "/var/backups", "/var/cache", "/var/lib", "/var/local",
        "/var/log", "/var/mail", "/var/opt", "/var/spool", "/var/tmp",
    }
)  # fmt: skip
# ... and anything inside these: the distribution's files, the kernel's, the package manager's and the
# container runtime's state, root's home, and the world-writable temporary directories.
SYSTEM_TREES = (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/lost+found", "/proc", "/root",
    "/run", "/sbin", "/snap", "/sys", "/tmp", "/usr", "/var/cache/apt", "/var/lib/apt", "/var/lib/containerd",
    "/var/lib/docker", "/var/lib/dpkg", "/var/lib/systemd", "/var/log", "/var/mail", "/var/spool", "/var/tmp",
)  # fmt: skip


def plain_path(v: str) -> str:
    """The path written plainly: no '.', '..', '//' or trailing '/' (what the admin most likely meant)."""
    norm = posixpath.normpath(v)
    return "/" + norm.lstrip("/") if norm.startswith("/") else norm


def inside(path: str, tree: str) -> bool:
    """`path` is `tree` or lies under it (both plain)."""
    return tree in ("/", path) or path.startswith(tree.rstrip("/") + "/")


def system_path_problem(path: str, rule: Mapping, what: str) -> str | None:
    """Why a plain absolute path is no place for a role's own directory or file, or None.

    `allow` (a list of trees) names the places inside a system tree where this variable's file belongs
    (e.g. /etc/sysctl.d for a sysctl drop-in, /run/sparkfleet for sparkfleet's runtime state)."""
    allow = rule.get("allow") or []
    allow = [allow] if isinstance(allow, str) else list(allow)
    if path in SYSTEM_DIRS:
        return f"{what} of sparkfleet's own, not the system directory {path} (sparkfleet would own it)"
    if path.startswith("/home/") and path.count("/") == 2:
        return f"{what} of sparkfleet's own, not the home directory {path} (a directory inside it will do)"
    if any(inside(path, str(a)) for a in allow):
        return None
    for tree in SYSTEM_TREES:
        if inside(path, tree):
            return f"{what} outside {tree} (a system tree: sparkfleet would make, own or remove files there)"
    return None


def _path_problem(v: Any, rule: Mapping, what: str | None) -> str | None:
    """abs_path (what None: any absolute path, e.g. a binary) or a role's own directory/file (what given)."""
    if not isinstance(v, str) or not v.startswith("/") or "\n" in v or "\0" in v or v.strip() != v:
        return "an absolute path (starting with /)"
    plain = plain_path(v)
    if plain != v:
        why = system_path_problem(plain, rule, what) if what else None
        if why:
            return f"{why} ({v!r} written plainly is {plain!r})"
        return f"the path written plainly: {plain!r} (no '.', '..', '//' or trailing '/')"
    if what:
        why = system_path_problem(v, rule, what)
        if why:
            return why
    pattern = rule.get("pattern")
    if pattern and not re.match(pattern, v):
        return f"an absolute path matching {pattern}"
    return None


def k_abs_path(v: Any, rule: Mapping) -> str | None:
    """Any absolute path, written plainly (a binary, a sysfs root, a path inside the container)."""
    return _path_problem(v, rule, None)


def k_data_dir(v: Any, rule: Mapping) -> str | None:
    """A directory a role makes and keeps its own files in (weights, state, caches, a venv)."""
    return _path_problem(v, rule, "a directory")


def k_data_file(v: Any, rule: Mapping) -> str | None:
    """A file a role writes (a record, a key file, a swapfile, a drop-in where `allow` says)."""
    return _path_problem(v, rule, "a file")


def k_ip(v: Any, rule: Mapping) -> str | None:
    try:
        ipaddress.ip_address(str(v))
    except ValueError:
        return "an IP address"
    return None


def k_host(v: Any, rule: Mapping) -> str | None:
    if isinstance(v, str) and (k_ip(v, rule) is None or HOSTNAME.match(v)):
        return None
    return "an IP address or a host name"


def k_cidr(v: Any, rule: Mapping) -> str | None:
    try:
        ipaddress.ip_network(str(v), strict=True)
    except ValueError:
        return "a network in CIDR form, e.g. 10.12.1.0/24 (host bits zero)"
    return None


def k_ifname(v: Any, rule: Mapping) -> str | None:
    return None if isinstance(v, str) and IFNAME.match(v) else "a network interface name (1-15 characters)"


def k_str(v: Any, rule: Mapping) -> str | None:
    if not isinstance(v, str) or not v.strip():
        return "a non-empty string"
    pattern = rule.get("pattern")
    if pattern and not re.match(pattern, v):
        return f"a string matching {pattern}"
    return None


def k_hex40(v: Any, rule: Mapping) -> str | None:
    return None if isinstance(v, str) and HEX40.match(v) else "a commit, 40 lowercase hex digits"


def k_digest(v: Any, rule: Mapping) -> str | None:
    return None if isinstance(v, str) and DIGEST.match(v) else "sha256:<64 lowercase hex>"


def k_image(v: Any, rule: Mapping) -> str | None:
    if isinstance(v, str) and IMAGE.match(v):
        return None
    return "an image name like nvcr.io/nvidia/pytorch (lowercase registry/path, optional :tag)"


def k_hf_repo(v: Any, rule: Mapping) -> str | None:
    return None if isinstance(v, str) and HF_REPO.match(v) else "a Hugging Face repository owner/name"


def k_version(v: Any, rule: Mapping) -> str | None:
    return None if isinstance(v, str) and VERSION.match(v) else 'an exact version in quotes, e.g. "2.4.0"'


KINDS: dict[str, Callable[[Any, Mapping], str | None]] = {
    "int": k_int,
    "number": k_number,
    "port": k_port,
    "mhz": k_mhz,
    "abs_path": k_abs_path,
    "data_dir": k_data_dir,
    "data_file": k_data_file,
    "ip": k_ip,
    "host": k_host,
    "cidr": k_cidr,
    "ifname": k_ifname,
    "str": k_str,
    "hex40": k_hex40,
    "digest": k_digest,
    "image": k_image,
    "hf_repo": k_hf_repo,
    "version": k_version,
}


def check_kind(value: Any, rule: Mapping) -> str | None:
    """None when `value` is of the rule's kind (with its min/max/pattern), else what is expected.
    A rule without a kind but with min/max is a whole-number range."""
    kind = rule.get("kind") or ("int" if ("min" in rule or "max" in rule) else None)
    if kind is None:
        return None
    check = KINDS.get(str(kind))
    if check is None:
        return f"(unknown kind {kind!r}; known: {', '.join(sorted(KINDS))})"
    return check(value, rule)

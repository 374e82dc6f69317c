# sparkfleet: a role's phase record on a node (written and read by plugins/modules/phase_state.py; see
# docs/design.md "Phase gates"): the state its manifest lists re-read, and why it differs. Stdlib only.
from __future__ import annotations

import glob
import json
import os
import pwd
import stat
import subprocess

from ansible_collections.sparkfleet.cluster.plugins.module_utils.files_state import file_state

VERSION = 1  # the record's format: a record of another format is not clean


WILDCARD = ("*", "?", "[")
MAX_NAMED = 5  # drift lines per stat path: the first few entries by name, then how many more


def stat_key(path: str) -> dict:
    """What is recorded of one entry by its stat (lstat: a link is not followed): size, mtime_ns, ctime_ns,
    inode and device (as the weights' stat cache, module_utils/weights_hash.stat_key), a link's target, and
    whether it is a directory (whose own times change with its listing, recorded entry by entry instead)."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        return {"directory": True}
    key: dict = {"stat": [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]}
    if stat.S_ISLNK(st.st_mode):
        key["link"] = os.readlink(path)
    elif not stat.S_ISREG(st.st_mode):
        key["type"] = stat.S_IFMT(st.st_mode)
    return key


def tree_state(path: str) -> dict | None:
    """A path by stat alone: a file's stat key, or a directory's entries (relative path -> stat key) under it,
    recursively, without following links; None if missing."""
    try:
        top = stat_key(path)
    except FileNotFoundError:
        return None
    except OSError as exc:  # not permitted: recorded as what it is, so a change still shows
        return {"error": exc.__class__.__name__}
    if not top.get("directory"):
        return top
    entries: dict[str, dict] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        for name in dirnames + sorted(filenames):
            full = os.path.join(dirpath, name)
            try:
                entries[os.path.relpath(full, path)] = stat_key(full)
            except FileNotFoundError:  # gone while listed: as if never there
                continue
            except OSError as exc:
                entries[os.path.relpath(full, path)] = {"error": exc.__class__.__name__}
    return {"tree": entries}


def stat_state(path: str) -> dict | None:
    """What stat_paths records of one path: tree_state, or for a wildcard every match's (none: None)."""
    if not any(c in path for c in WILDCARD):
        return tree_state(path)
    matches = sorted(glob.glob(path))
    return {"glob": {m: tree_state(m) for m in matches}} if matches else None


def _named(what: str, names: list[str]) -> str:
    shown = ", ".join(names[:MAX_NAMED])
    more = f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else ""
    return f"{len(names)} {what} ({shown}{more})"


def stat_drift(path: str, was: dict | None, now: dict | None) -> list[str]:
    """Why a stat path differs from its record, naming the entries (a path, never content)."""
    if was == now:
        return []
    if was is None or now is None:
        return [f"{path}: {'removed' if now is None else 'appeared'}"]
    kind = "glob" if "glob" in was else "tree" if "tree" in was else None
    if kind is None or kind not in now:
        return [f"{path}: stat changed"]
    old, new = was[kind], now[kind]
    parts = []
    for what, names in (
        ("removed", sorted(set(old) - set(new))),
        ("appeared", sorted(set(new) - set(old))),
        ("changed", sorted(k for k in set(old) & set(new) if old[k] != new[k])),
    ):
        if names:
            parts.append(_named(what, names))
    return [f"{path}: {'; '.join(parts)}"]


def unit_states(systemctl: str, units: list[str]) -> dict[str, dict]:
    """ActiveState and UnitFileState of each unit, in one systemctl call."""
    if not units:
        return {}
    proc = subprocess.run(
        [systemctl, "show", "-p", "Id", "-p", "ActiveState", "-p", "UnitFileState", "--", *units],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    # one block per unit, in the order asked, separated by a blank line
    blocks = [b for b in proc.stdout.split("\n\n") if b.strip()]
    states = {}
    for unit, block in zip(units, blocks, strict=False):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        states[unit] = {"active": fields.get("ActiveState", ""), "enabled": fields.get("UnitFileState", "")}
    for unit in units[len(blocks) :]:
        states[unit] = {"active": "unknown", "enabled": "unknown"}
    return states


def read_record(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def drift(record: dict | None, digest: str, systemctl: str) -> list[str]:
    """Why the phase is not clean (empty: clean)."""
    if record is None:
        return ["no record of a successful apply"]
    if record.get("version") != VERSION:
        return [f"record format {record.get('version')!r}, not {VERSION}"]
    if record.get("digest") != digest:
        return ["the inputs changed (digest of the role's variables and files)"]
    reasons = []
    for path, was in sorted(record.get("files", {}).items()):
        now = file_state(path)
        if now != was:
            if now is None or was is None:
                reasons.append(f"{path}: {'removed' if now is None else 'appeared'}")
            else:
                what = [k for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k)]
                reasons.append(f"{path}: {', '.join(what)} changed")
    for path, was in sorted(record.get("stats", {}).items()):
        reasons += stat_drift(path, was, stat_state(path))
    units = record.get("units", {})
    for unit, now in unit_states(systemctl, sorted(units)).items():
        was = units[unit]
        for key in ("active", "enabled"):
            if now[key] != was.get(key):
                reasons.append(f"{unit}: {key} {was.get(key)!r} -> {now[key]!r}")
    return reasons


def passwd_entry(user: str) -> list[str] | None:
    """The user's passwd fields after the name, as strings (getent's getent_passwd value), or None."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        return None
    return [pw.pw_passwd, str(pw.pw_uid), str(pw.pw_gid), pw.pw_gecos, pw.pw_dir, pw.pw_shell]


def survey(phase_dir: str, systemctl: str) -> dict[str, dict]:
    """Every record under phase_dir (`<role>.json`) re-read against its own digest, read-only: record path ->
    {digest: the recorded digest, drift: why its manifest differs (empty: unchanged), data: the recorded
    data}. A gate that computes the same digest later in the same run, with nothing changed since, may take
    this instead of a round trip of its own (plugins/action/phase_state.py says when). Removes nothing."""
    try:
        names = sorted(n for n in os.listdir(phase_dir) if n.endswith(".json"))
    except OSError:
        return {}
    found = {}
    for name in names:
        path = os.path.join(phase_dir, name)
        record = read_record(path)
        if record is None or not isinstance(record.get("digest"), str):
            continue
        reasons = drift(record, record["digest"], systemctl)
        found[path] = {
            "digest": record["digest"],
            "drift": reasons,
            "data": {} if reasons else record.get("data") or {},
        }
    return found

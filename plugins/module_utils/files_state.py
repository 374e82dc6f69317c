# What the files module (plugins/modules/files.py) would change, judged on the controller from a read the
# node already made: a role that reads its node first (engine_service's engine_node) hands over the paths its
# files task writes, the node reports each one's sha256, mode and owner with its units' state, and the files
# task runs only when something differs. A read that cannot tell (a path it did not report) counts as
# different: the files module itself then decides, as it always did. Standard library only (the node half
# runs in a module).
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Mapping


def file_state(path: str) -> dict | None:
    """What is recorded of a path: sha256 of its content (never the content: a private key is hashed like any
    file), and owner and mode for a real file; owner and mode for a directory; None if missing."""
    try:
        with open(path, "rb") as fh:
            digest = hashlib.sha256(fh.read()).hexdigest()
        if path.startswith(("/proc/", "/sys/")):
            return {"sha256": digest}
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except IsADirectoryError:  # a directory (~/.ssh: sshd's StrictModes checks its mode): owner and mode
        st = os.stat(path)
        return {"directory": True, "mode": f"{st.st_mode & 0o7777:04o}", "uid": st.st_uid, "gid": st.st_gid}
    except OSError as exc:  # not permitted: recorded as what it is, so a change still shows
        return {"error": exc.__class__.__name__}
    return {"sha256": digest, "mode": f"{st.st_mode & 0o7777:04o}", "uid": st.st_uid, "gid": st.st_gid}


def observe(paths: Iterable[str]) -> dict[str, dict | None]:
    """file_state of each path (the phase gates' read of a file: plugins/modules/phase_state.py)."""
    return {path: file_state(path) for path in paths}


def unit_files(run: Callable[[list[str]], tuple], systemctl: str | None, names: Iterable[str]) -> dict:
    """What `pending` needs of each unit (the key `other_units` of a read): its UnitFileState (`enabled`) and
    NeedDaemonReload, by `systemctl show` through `run` (AnsibleModule.run_command). A unit systemctl cannot
    show is None, which `pending` counts as needing the files module."""
    out: dict[str, dict | None] = {}
    for name in names:
        rc, show, _ = (
            run([systemctl, "show", name, "--property=UnitFileState,NeedDaemonReload"])
            if systemctl
            else (1, "", "")
        )
        props = dict(line.split("=", 1) for line in show.splitlines() if "=" in line) if rc == 0 else None
        out[name] = (
            None
            if props is None
            else {
                "name": name,
                "enabled": props.get("UnitFileState", ""),
                "need_reload": props.get("NeedDaemonReload", "no") == "yes",
            }
        )
    return out


def pending(
    observed: Mapping[str, Mapping | None],
    files: Iterable[Mapping] = (),
    dirs: Iterable[Mapping] = (),
    units: Mapping[str, Mapping] | None = None,
    enable: Iterable[str] = (),
) -> list[str]:
    """What the files module would change, in words (empty: nothing). `files` and `dirs` are the module's own
    entries; `units` maps each unit of the module's `units` and `enable` to the node's read of it
    (`enabled`: its UnitFileState, `need_reload`: NeedDaemonReload)."""
    out = []
    for entry in files:
        path, want_mode = str(entry["path"]), f"{int(str(entry['mode']), 8):04o}"
        have = observed.get(path)
        want_sha = hashlib.sha256(str(entry["content"]).encode("utf-8")).hexdigest()
        if not have or have.get("sha256") != want_sha:
            out.append(f"{path}: content")
        elif have.get("mode") != want_mode or (have.get("uid"), have.get("gid")) != (0, 0):
            out.append(f"{path}: mode or owner")
    for entry in dirs:
        path, want_mode = str(entry["path"]), f"{int(str(entry['mode']), 8):04o}"
        have = observed.get(path)
        if not have or not have.get("directory"):
            out.append(f"{path}: missing")
        elif str(entry.get("if_missing", False)).lower() in ("true", "yes", "on", "1"):
            continue
        elif entry.get("owner") or entry.get("group") or have.get("mode") != want_mode:
            # an owner by name is resolved on the node: the files module judges it
            out.append(f"{path}: mode or owner")
    units = units or {}
    for name, state in units.items():
        if not state or state.get("need_reload", True):
            out.append(f"{name}: systemd reload")
    for name in enable:
        if (units.get(name) or {}).get("enabled") != "enabled":
            out.append(f"{name}: enable")
    return out

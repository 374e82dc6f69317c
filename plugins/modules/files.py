#!/usr/bin/python3
# sparkfleet: a role's directories, unit files, drop-ins and helpers in one round trip (stdlib only; runs
# on the node as root). Shared by several roles.
from __future__ import annotations

DOCUMENTATION = r"""
module: files
short_description: Directories and root-owned files in one step; reload systemd when it needs it; enable units
description:
  - Creates each of O(dirs) that is missing (with missing parents, which get the same owner and mode) and
    corrects the owner and mode of those that exist, before any file is written - except a directory with
    C(if_missing), which is made with its owner and mode only when missing and otherwise left exactly as it is
    (a directory an admin points to may be someone else's - C(/etc), a mount point, a home - so only a
    directory the role makes is given an owner or mode).
  - Writes each file only when its content, mode or owner differ (atomically, with a diff), creating
    missing parent directories 0755.
  - Reloads systemd when a written file lies under /etc/systemd, or when one of O(units) reports
    C(NeedDaemonReload=yes) (a file an interrupted run wrote before it could reload).
  - Enables each of O(enable) that is not enabled. Never starts, stops or restarts anything.
  - One module call instead of a file/copy/template/command/systemd task each keeps a no-op run fast.
  - Check mode and diff are supported. None of these files may hold secrets (they are shown in diffs).
options:
  dirs:
    type: list
    elements: dict
    default: []
    description: "Entries with an absolute path, mode (octal string), optional owner and group (names;
      default: root for a new directory, unchanged for an existing one) and optional if_missing (true: only
      a missing directory is made and given that owner and mode; an existing one is never changed)."
  files:
    type: list
    elements: dict
    default: []
    description: "Entries with an absolute path, content and mode (octal string); owned by root:root."
  units:
    type: list
    elements: str
    default: []
    description: Units whose C(NeedDaemonReload) is read (the units these files define or extend).
  enable:
    type: list
    elements: str
    default: []
    description: Units to enable (at boot); they must be among the files written or exist already.
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: A unit and its drop-in, in one round trip; enable the unit
  sparkfleet.cluster.files:
    dirs:
      - {path: /var/lib/sparkfleet, mode: "0755", if_missing: true}
    files:
      - path: /etc/systemd/system/example.service
        mode: "0644"
        content: |
          [Service]
          ExecStart=/bin/true
    units: [example.service]
    enable: [example.service]
"""

RETURN = r"""
changed_dirs: {description: the directories created or corrected (or to be), type: list, returned: always}
changed_files: {description: the paths written (or to be, in check mode), type: list, returned: always}
reloaded: {description: systemd was (or, in check mode, would be) reloaded, type: bool, returned: always}
enabled: {description: the units enabled (or to be) in this run, type: list, returned: always}
"""

import grp
import os
import pwd

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils.fileio import write_atomic


def current(path: str) -> tuple[str | None, int | None, tuple[int, int] | None]:
    try:
        st = os.stat(path)
        with open(path, encoding="utf-8") as fh:
            return fh.read(), st.st_mode & 0o7777, (st.st_uid, st.st_gid)
    except FileNotFoundError:
        return None, None, None


def plan(files: list[dict]) -> list[dict]:
    """The entries that differ from what is on disk, each with its diff."""
    todo = []
    for entry in files:
        path, content, mode = entry["path"], entry["content"], int(str(entry["mode"]), 8)
        have, have_mode, owner = current(path)
        if have == content and have_mode == mode and owner == (0, 0):
            continue
        diff = {"before_header": path, "after_header": path, "before": have or "", "after": content}
        todo.append({"path": path, "content": content, "mode": mode, "diff": diff})
    return todo


def ids(entry: dict) -> tuple[int, int]:
    """(uid, gid) an entry asks for; -1 leaves that id as it is (os.chown's convention)."""
    uid = pwd.getpwnam(entry["owner"]).pw_uid if entry.get("owner") else -1
    gid = grp.getgrnam(entry["group"]).gr_gid if entry.get("group") else -1
    return uid, gid


def plan_dirs(dirs: list[dict]) -> list[dict]:
    """The directories that are missing or have another mode or owner, each with its diff. An entry with
    if_missing is planned only when missing: an existing directory it names is not the role's to change."""
    todo = []
    for entry in dirs:
        path, mode = str(entry["path"]), int(str(entry["mode"]), 8)
        uid, gid = ids(entry)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            before = "absent"
        else:
            if not os.path.isdir(path):
                raise ValueError(f"{path} exists and is not a directory")
            if str(entry.get("if_missing", False)).lower() in ("true", "yes", "on", "1"):
                continue  # someone else's (or made by an earlier run): its owner and mode stay as they are
            if st.st_mode & 0o7777 == mode and uid in (-1, st.st_uid) and gid in (-1, st.st_gid):
                continue
            before = f"directory mode {st.st_mode & 0o7777:04o} owner {st.st_uid}:{st.st_gid}"
        owner, group = entry.get("owner") or "(as is)", entry.get("group") or "(as is)"
        after = f"directory mode {mode:04o} owner {owner}:{group}"
        diff = {"before_header": path, "after_header": path, "before": before + "\n", "after": after + "\n"}
        todo.append({"path": path, "mode": mode, "uid": uid, "gid": gid, "diff": diff})
    return todo


def make_dir(path: str, mode: int, uid: int, gid: int) -> None:
    missing = []
    head = path
    while not os.path.exists(head):
        missing.append(head)
        head = os.path.dirname(head)
    for d in reversed(missing):
        os.mkdir(d)
        os.chmod(d, mode)  # not mkdir's mode argument: the umask would cut it
        os.chown(d, uid, gid)
    os.chmod(path, mode)
    os.chown(path, uid, gid)


def pending_reload(show_output: str) -> bool:
    """`systemctl show -p NeedDaemonReload UNIT...` prints one line per unit."""
    return any(line.strip() == "NeedDaemonReload=yes" for line in show_output.splitlines())


def bad_entries(files: list[dict], keys: frozenset = frozenset({"path", "content", "mode"})) -> list[str]:
    return [
        repr(entry.get("path"))
        for entry in files
        if not keys <= set(entry) or not os.path.isabs(str(entry["path"])) or not str(entry["mode"]).isdigit()
    ]


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dirs": {"type": "list", "elements": "dict", "default": []},
            "files": {"type": "list", "elements": "dict", "default": []},
            "units": {"type": "list", "elements": "str", "default": []},
            "enable": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    bad = bad_entries(p["files"])
    if bad:
        module.fail_json(msg=f"each file needs an absolute path, content and an octal mode: {', '.join(bad)}")
    bad = bad_entries(p["dirs"], frozenset({"path", "mode"}))
    if bad:
        module.fail_json(msg=f"each directory needs an absolute path and an octal mode: {', '.join(bad)}")
    try:
        dirs = plan_dirs(p["dirs"])
    except (KeyError, ValueError) as exc:  # KeyError: no such user or group
        module.fail_json(msg=f"directories: {exc}")
    todo = plan(p["files"])
    systemctl = module.get_bin_path("systemctl", required=True)
    reload = any(t["path"].startswith("/etc/systemd/") for t in todo)
    if not reload and p["units"]:
        rc, out, err = module.run_command([systemctl, "show", "-p", "NeedDaemonReload", "--", *p["units"]])
        if rc != 0:
            module.fail_json(msg=f"systemctl show {' '.join(p['units'])} failed: {err.strip()}")
        reload = pending_reload(out)
    to_enable = []
    for unit in p["enable"]:
        _rc, state, _err = module.run_command([systemctl, "is-enabled", "--", unit])
        if state.strip() != "enabled":
            to_enable.append(unit)
    if not module.check_mode:
        for t in dirs:
            make_dir(t["path"], t["mode"], t["uid"], t["gid"])
        for t in todo:
            write_atomic(t["path"], t["content"], t["mode"], uid=0, gid=0)
        if reload:
            module.run_command([systemctl, "daemon-reload"], check_rc=True)
        for unit in to_enable:
            module.run_command([systemctl, "enable", "--", unit], check_rc=True)
    module.exit_json(
        changed=bool(dirs) or bool(todo) or reload or bool(to_enable),
        changed_dirs=[t["path"] for t in dirs],
        changed_files=[t["path"] for t in todo],
        reloaded=reload,
        enabled=to_enable,
        diff=[t["diff"] for t in dirs + todo],
    )


if __name__ == "__main__":
    main()

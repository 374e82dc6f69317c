#!/usr/bin/python3
# sparkfleet: a role's unit files, drop-ins and helpers in one round trip (stdlib only; runs on the node
# as root). Shared by gpu_clocks, earlyoom and engine_service (ansible.cfg: library = ./library).
from __future__ import annotations

DOCUMENTATION = r"""
module: sparkfleet_unit_files
short_description: Write files owned by root in one step; reload systemd when it needs it; enable units
description:
  - Writes each file only when its content, mode or owner differ (atomically, with a diff), creating
    missing parent directories 0755.
  - Reloads systemd when a written file lies under /etc/systemd, or when one of O(units) reports
    C(NeedDaemonReload=yes) (a file an interrupted run wrote before it could reload).
  - Enables each of O(enable) that is not enabled. Never starts, stops or restarts anything.
  - One module call instead of a file/copy/template/command/systemd task each keeps a no-op run fast.
  - Check mode and diff are supported. None of these files may hold secrets (they are shown in diffs).
options:
  files:
    type: list
    elements: dict
    required: true
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
"""

RETURN = r"""
changed_files: {description: the paths written (or to be, in check mode), type: list, returned: always}
reloaded: {description: systemd was (or, in check mode, would be) reloaded, type: bool, returned: always}
enabled: {description: the units enabled (or to be) in this run, type: list, returned: always}
"""

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule


def current(path: str) -> tuple[str | None, int | None, tuple[int, int] | None]:
    try:
        st = os.stat(path)
        with open(path, encoding="utf-8") as fh:
            return fh.read(), st.st_mode & 0o7777, (st.st_uid, st.st_gid)
    except FileNotFoundError:
        return None, None, None


def write_atomic(path: str, content: str, mode: int) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".sparkfleet-", dir=directory)
    try:
        os.fchmod(fd, mode)
        os.fchown(fd, 0, 0)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(content)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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


def pending_reload(show_output: str) -> bool:
    """`systemctl show -p NeedDaemonReload UNIT...` prints one line per unit."""
    return any(line.strip() == "NeedDaemonReload=yes" for line in show_output.splitlines())


def bad_entries(files: list[dict]) -> list[str]:
    return [
        repr(entry.get("path"))
        for entry in files
        if not {"path", "content", "mode"} <= set(entry)
        or not os.path.isabs(str(entry["path"]))
        or not str(entry["mode"]).isdigit()
    ]


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "list", "elements": "dict", "required": True},
            "units": {"type": "list", "elements": "str", "default": []},
            "enable": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    bad = bad_entries(p["files"])
    if bad:
        module.fail_json(msg=f"each file needs an absolute path, content and an octal mode: {', '.join(bad)}")
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
        for t in todo:
            write_atomic(t["path"], t["content"], t["mode"])
        if reload:
            module.run_command([systemctl, "daemon-reload"], check_rc=True)
        for unit in to_enable:
            module.run_command([systemctl, "enable", "--", unit], check_rc=True)
    module.exit_json(
        changed=bool(todo) or reload or bool(to_enable),
        changed_files=[t["path"] for t in todo],
        reloaded=reload,
        enabled=to_enable,
        diff=[t["diff"] for t in todo],
    )


if __name__ == "__main__":
    main()

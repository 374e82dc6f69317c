#!/usr/bin/python3
# sparkfleet: the engine unit's files in one round trip (stdlib only; runs on the node as root).
from __future__ import annotations

DOCUMENTATION = r"""
module: sparkfleet_engine_files
short_description: Write the engine unit, its environment file and helper in one step; reload and enable
description:
  - Writes each file only when its content, mode or owner differ (atomically, with a diff), creating
    parent directories. When the unit file changed, runs C(systemctl daemon-reload); enables the unit
    when it is not enabled. Never starts, stops or restarts anything - engine_service does that in order.
  - One module instead of a copy/template/file/systemd task each keeps a no-op run fast.
  - Check mode and diff are supported. None of these files may hold secrets (they are shown in diffs).
options:
  files:
    type: list
    elements: dict
    required: true
    description: "Entries with path, content and mode (octal string); owned by root."
  unit:
    type: str
    required: true
    description: The unit name; its file is the entry whose path ends with that name.
"""

RETURN = r"""
changed_files: {description: the paths written (or to be, in check mode), type: list, returned: always}
reloaded: {description: systemd was reloaded, type: bool, returned: always}
enabled: {description: the unit was enabled in this run, type: bool, returned: always}
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


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "list", "elements": "dict", "required": True},
            "unit": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    for entry in p["files"]:
        if not {"path", "content", "mode"} <= set(entry) or not os.path.isabs(entry["path"]):
            module.fail_json(msg=f"each file needs an absolute path, content and mode: {entry.get('path')!r}")
    todo = plan(p["files"])
    unit_changed = any(t["path"].endswith("/" + p["unit"]) for t in todo)
    systemctl = module.get_bin_path("systemctl", required=True)
    _rc, state, _err = module.run_command([systemctl, "is-enabled", p["unit"]])
    needs_enable = state.strip() != "enabled"
    reloaded = enabled = False
    if not module.check_mode:
        for t in todo:
            write_atomic(t["path"], t["content"], t["mode"])
        if unit_changed:
            module.run_command([systemctl, "daemon-reload"], check_rc=True)
            reloaded = True
        if needs_enable:
            module.run_command([systemctl, "enable", p["unit"]], check_rc=True)
            enabled = True
    module.exit_json(
        changed=bool(todo) or needs_enable,
        changed_files=[t["path"] for t in todo],
        reloaded=reloaded,
        enabled=enabled,
        diff=[t["diff"] for t in todo],
    )


if __name__ == "__main__":
    main()

#!/usr/bin/python3
# sparkfleet: a role's phase record on a node - read it and re-read the state it lists in one round trip, or
# write it at the end of a successful apply (stdlib only; runs on the node as root).
from __future__ import annotations

DOCUMENTATION = r"""
module: phase_state
short_description: Read or write the record of a role's last successful apply, with the cheap state it owns
description:
  - A role's phase gate. At the end of a successful apply the role records, in one JSON file per role under
    the state directory, the digest of its inputs (computed on the controller by the action plugin of the same
    name) and a manifest of the cheap state it owns - files and their content, owner and mode, units and
    whether each is active and enabled, kernel values read from files under C(/proc/sys) or C(/sys).
  - C(state=read) reads the record and re-reads everything in its manifest in one call. The phase is C(clean)
    when the record exists, its digest equals O(digest) and nothing in the manifest differs; the role then
    skips its apply. Otherwise the record is removed before the role applies (not in check mode), so an apply
    that fails or is interrupted leaves no record and the next run applies fully.
  - C(state=record) reads the current state of O(files) and O(units) and writes the record atomically (a
    reader sees the old record or the new one, never a part). It is the last task of the apply.
  - C(state=absent) removes the record.
  - Reading never changes anything but the removal of a stale record; check mode writes and removes nothing.
  - The action plugin of the same name computes O(digest) from the task's role and O(inputs).
options:
  path:
    type: path
    required: true
    description: The record file (e.g. C(/var/lib/sparkfleet/phases/earlyoom.json)).
  state:
    type: str
    choices: [read, record, absent]
    default: read
    description: What to do with the record.
  digest:
    type: str
    default: ""
    description: The digest of the role's inputs (required for C(read) and C(record)).
  files:
    type: list
    elements: path
    default: []
    description: >-
      (record) Paths whose content (as its sha256, never the content itself), owner and mode are recorded (a
      missing path is recorded as missing, so a file that appears is drift too). A directory is recorded by
      owner and mode. Paths under C(/proc) or C(/sys) are recorded by content only.
  units:
    type: list
    elements: str
    default: []
    description: (record) Units whose C(ActiveState) and C(UnitFileState) are recorded.
  systemctl:
    type: path
    default: systemctl
    description: The systemctl to ask (tests).
  inputs:
    type: dict
    default: {}
    description: >-
      Values the role depends on beyond its own options (e.g. the cluster plan): the action plugin hashes them
      into O(digest) on the controller and never sends them to the node (the module ignores them).
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: Read this phase's record and re-read the state it lists
  sparkfleet.cluster.phase_state:
    path: /var/lib/sparkfleet/phases/earlyoom.json
    digest: "{{ digest }}"
  register: phase

- name: Record the apply
  sparkfleet.cluster.phase_state:
    path: /var/lib/sparkfleet/phases/earlyoom.json
    state: record
    digest: "{{ digest }}"
    files: [/etc/default/earlyoom]
    units: [earlyoom.service]
"""

RETURN = r"""
clean:
  description: (read) The record exists, its digest matches and the state it lists is unchanged.
  type: bool
  returned: always
drift:
  description: (read) Why the phase is not clean, one line per reason (empty when clean).
  type: list
  returned: always
"""

import contextlib
import hashlib
import json
import os
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils.fileio import write_atomic

VERSION = 1  # the record's format: a record of another format is not clean


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
    units = record.get("units", {})
    for unit, now in unit_states(systemctl, sorted(units)).items():
        was = units[unit]
        for key in ("active", "enabled"):
            if now[key] != was.get(key):
                reasons.append(f"{unit}: {key} {was.get(key)!r} -> {now[key]!r}")
    return reasons


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["read", "record", "absent"], "default": "read"},
            "digest": {"type": "str", "default": ""},
            "files": {"type": "list", "elements": "path", "default": []},
            "units": {"type": "list", "elements": "str", "default": []},
            "systemctl": {"type": "path", "default": "systemctl"},
            "inputs": {"type": "dict", "default": {}},  # hashed by the action plugin, never sent here
        },
        required_if=[("state", "read", ["digest"]), ("state", "record", ["digest"])],
        supports_check_mode=True,
    )
    p = module.params
    path = p["path"]
    exists = os.path.lexists(path)
    if p["state"] == "absent":
        if exists and not module.check_mode:
            os.unlink(path)
        module.exit_json(changed=exists, clean=False, drift=[])
    if p["state"] == "read":
        reasons = drift(read_record(path), p["digest"], p["systemctl"])
        # a stale record goes before the apply starts: an apply that stops half way leaves none behind
        if reasons and exists and not module.check_mode:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        module.exit_json(changed=False, clean=not reasons, drift=reasons)
    record = {
        "version": VERSION,
        "digest": p["digest"],
        "files": {f: file_state(f) for f in p["files"]},
        "units": unit_states(p["systemctl"], p["units"]),
    }
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    changed = read_record(path) != record
    if changed and not module.check_mode:
        write_atomic(path, text, 0o644)
    module.exit_json(changed=changed, clean=True, drift=[])


if __name__ == "__main__":
    main()

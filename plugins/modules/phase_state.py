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
    whether each is active and enabled, kernel values read from files under C(/proc/sys) or C(/sys), and big
    files (model weights) by their stat alone, with the listing of the directories that hold them.
  - C(state=read) reads the record and re-reads everything in its manifest in one call. The phase is C(clean)
    when the record exists, its digest equals O(digest) and nothing in the manifest differs; the role then
    skips its apply. Otherwise the record is removed before the role applies (not in check mode), so an apply
    that fails or is interrupted leaves no record and the next run applies fully.
  - C(state=record) reads the current state of O(files), O(stat_paths) and O(units) and writes the record
    atomically (a reader sees the old record or the new one, never a part). It is the last task of the apply.
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
  stat_paths:
    type: list
    elements: path
    default: []
    description: >-
      (record) Paths recorded by their stat alone, never opened (files too big to hash on every run, such
      as model weights): size, mtime_ns, ctime_ns, inode and device, and a symbolic link's target. ctime
      cannot be set from user space, so a file rewritten, truncated or replaced shows even with its mtime put
      back. A directory is recorded by the stat of every entry under it, recursively, so a file that appears
      or vanishes in it shows too. A path with a wildcard (C(*), C(?), C([)) is expanded on the node and every
      match recorded the same way, so a match that appears or vanishes shows (e.g. the C(*.dist-info)
      directory of a pinned package in a venv, whose name holds the version). A missing path is recorded as
      missing.
  units:
    type: list
    elements: str
    default: []
    description: (record) Units whose C(ActiveState) and C(UnitFileState) are recorded.
  data:
    type: dict
    default: {}
    description: >-
      (record) Small values kept in the record and returned by C(state=read) while the phase is clean, for a
      run that skips the apply (e.g. the commits the apply resolved its pins to). Never compared; nothing
      secret.
  systemctl:
    type: path
    default: systemctl
    description: The systemctl to ask (tests).
  passwd_of:
    type: str
    description: >-
      (read) A user whose passwd entry to return in the same round trip, as the fact C(getent_passwd) that
      C(ansible.builtin.getent) (database passwd, fail_key false) sets: C({user: [password, uid, gid, gecos,
      home, shell]}), C({user: null}) when the user does not exist.
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

- name: Record the weights by stat (never read) and the listing of their directory
  sparkfleet.cluster.phase_state:
    path: /var/lib/sparkfleet/phases/model_weights.json
    state: record
    digest: "{{ digest }}"
    files: [/var/lib/sparkfleet/weights.json]
    stat_paths:
      - /srv/sparkfleet/models/snapshot
      - /opt/sparkfleet/hf-client/lib/python3*/site-packages/huggingface_hub-*.dist-info
    data: {repos: [{name: model, revision: afc7aa0a, commit: afc7aa0a0123456789abcdef0123456789abcdef}]}
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
data:
  description: (read) The O(data) recorded with the apply, while the phase is clean; else empty.
  type: dict
  returned: always
ansible_facts:
  description: (read, with O(passwd_of)) C(getent_passwd), as ansible.builtin.getent sets it.
  type: dict
  returned: when O(passwd_of) is set
"""

import contextlib
import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils.fileio import write_atomic
from ansible_collections.sparkfleet.cluster.plugins.module_utils.files_state import file_state
from ansible_collections.sparkfleet.cluster.plugins.module_utils.phase_record import (
    VERSION,
    drift,
    passwd_entry,
    read_record,
    stat_state,
    unit_states,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["read", "record", "absent"], "default": "read"},
            "digest": {"type": "str", "default": ""},
            "files": {"type": "list", "elements": "path", "default": []},
            "stat_paths": {"type": "list", "elements": "path", "default": []},
            "units": {"type": "list", "elements": "str", "default": []},
            "data": {"type": "dict", "default": {}},
            "systemctl": {"type": "path", "default": "systemctl"},
            # a user name, not a secret: no_log False says so (Ansible warns of any option named like "pass")
            "passwd_of": {"type": "str", "no_log": False},
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
        module.exit_json(changed=exists, clean=False, drift=[], data={})
    if p["state"] == "read":
        recorded = read_record(path)
        reasons = drift(recorded, p["digest"], p["systemctl"])
        # a stale record goes before the apply starts: an apply that stops half way leaves none behind
        if reasons and exists and not module.check_mode:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        data = {} if reasons or recorded is None else recorded.get("data") or {}
        extra = {}
        if p["passwd_of"]:
            extra["ansible_facts"] = {"getent_passwd": {p["passwd_of"]: passwd_entry(p["passwd_of"])}}
        module.exit_json(changed=False, clean=not reasons, drift=reasons, data=data, **extra)
    record = {
        "version": VERSION,
        "digest": p["digest"],
        "files": {f: file_state(f) for f in p["files"]},
        "units": unit_states(p["systemctl"], p["units"]),
    }
    # only when asked: the records of the roles that list neither stay as they were written
    if p["stat_paths"]:
        record["stats"] = {f: stat_state(f) for f in p["stat_paths"]}
    if p["data"]:
        record["data"] = p["data"]
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    changed = read_record(path) != record
    if changed and not module.check_mode:
        write_atomic(path, text, 0o644)
    module.exit_json(changed=changed, clean=True, drift=[], data={})


if __name__ == "__main__":
    main()

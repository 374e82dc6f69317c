#!/usr/bin/python3
# sparkfleet: the engine's on-disk caches (prefix cache, spill tier), sized and kept (stdlib only).
from __future__ import annotations

DOCUMENTATION = r"""
module: engine_cache
short_description: Make the engine's cache directories and check they can grow to their configured size
description:
  - For each cache, creates the directory (mode 0750) if missing and checks that the filesystem can
    hold its configured size - free space plus what the directory already holds must reach it.
  - Never deletes anything; the caches are kept across restarts (the prefix cache's point is that a
    restarted engine finds its cached prompts).
options:
  caches:
    type: list
    elements: dict
    required: true
    description: "Entries with name, path and size_gib."
  owner: {type: str, default: root, description: Owner of new directories.}
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: The engine's caches on this node
  sparkfleet.cluster.engine_cache:
    caches:
      - {name: prefix, path: /srv/sparkfleet/cache/prefix, size_gib: 100}
"""

RETURN = r"""
caches:
  description: "per cache: name, path, size_gib, used_bytes, free_bytes, created"
  type: list
  returned: always
"""

import os
import pwd

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils.disk import (  # noqa: F401 - the tests' names
    GIB,
    cache_space,
    shortfall,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "caches": {"type": "list", "elements": "dict", "required": True},
            "owner": {"type": "str", "default": "root"},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        pw = pwd.getpwnam(p["owner"])
    except KeyError:
        module.fail_json(msg=f"unknown owner {p['owner']!r}")
    # measured before a missing directory is made: it will hold nothing, on its parent's filesystem
    try:
        report, problems = cache_space(p["caches"])
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    changed = any(entry["created"] for entry in report)
    for entry in report:
        if entry["created"] and not module.check_mode:
            os.makedirs(entry["path"], mode=0o750, exist_ok=True)
            os.chown(entry["path"], pw.pw_uid, pw.pw_gid)
    if problems:
        module.fail_json(msg=" ".join(problems), caches=report, changed=changed)
    module.exit_json(changed=changed, caches=report)


if __name__ == "__main__":
    main()

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
from ansible_collections.sparkfleet.cluster.plugins.module_utils.disk import free_bytes, tree_bytes

GIB = 1 << 30


def shortfall(size_gib: float, used: int, free: int) -> int:
    """Bytes missing for the cache to reach its size (0 when it fits)."""
    return max(0, int(size_gib * GIB) - used - free)


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
    changed = False
    report = []
    problems = []
    for cache in p["caches"]:
        name, path = cache.get("name"), cache.get("path")
        try:
            size = float(cache.get("size_gib"))
        except (TypeError, ValueError):
            module.fail_json(msg=f"cache {name}: size_gib must be a number, not {cache.get('size_gib')!r}")
        if not path or not os.path.isabs(path) or size <= 0:
            module.fail_json(
                msg=f"cache {name}: needs an absolute path and size_gib > 0 (got {path!r}, {size})"
            )
        created = not os.path.isdir(path)
        if created:
            changed = True
            if not module.check_mode:
                os.makedirs(path, mode=0o750, exist_ok=True)
                os.chown(path, pw.pw_uid, pw.pw_gid)
        used = tree_bytes(path)
        free, _measured_at = free_bytes(path)
        missing = shortfall(size, used, free)
        entry = {"name": name, "path": path, "size_gib": size, "used_bytes": used, "free_bytes": free,
                 "created": created}  # fmt: skip
        report.append(entry)
        if missing:
            problems.append(
                f"cache {name} at {path} is configured for {size:g} GiB but the filesystem has "
                f"{free / GIB:.1f} GiB free (+{used / GIB:.1f} GiB already in it): "
                f"{missing / GIB:.1f} GiB short. "
                "Free disk space or lower its size_gib in engine_service_caches."
            )
    if problems:
        module.fail_json(msg=" ".join(problems), caches=report, changed=changed)
    module.exit_json(changed=changed, caches=report)


if __name__ == "__main__":
    main()

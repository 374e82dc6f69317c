#!/usr/bin/python
# Free-disk check before a byte moves: total + margin - what is already there.
from __future__ import annotations

DOCUMENTATION = r"""
module: weights_space
short_description: Refuse a download or copy that would not fit, with the numbers
description:
  - Needed = the manifest's bytes + extra items (e.g. a rank file) + margin - the bytes already there
    (whole files of the right size, and resumable parts, the head's C(.incomplete) blobs, rsync's
    C(.rsync-partial) files). Fails when the filesystem holding C(path) has less free space.
  - Changes nothing.
options:
  path: {type: path, required: true, description: the weights root}
  snapshot: {type: path, description: "the plain snapshot (default <path>/snapshot)"}
  files:
    type: list
    elements: dict
    required: true
    description: "manifest entries: path, size (repo_id, etag on the head)"
  layout:
    type: str
    choices: [head, worker]
    default: worker
    description: where parts of unfinished files are
  margin_bytes: {type: int, default: 0, description: space to leave free}
  extra:
    type: list
    elements: dict
    default: []
    description: "[{what, size, path}] more files this run writes"
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: Check free disk before the download
  sparkfleet.cluster.weights_space:
    path: /srv/sparkfleet/models
    files: "{{ resolved.manifest.files }}"
    layout: head
    margin_bytes: 20000000000
"""

RETURN = r"""
needed_bytes:
  description: Free bytes this run needs (files + extra + margin - what is already there).
  type: int
  returned: always
free_bytes:
  description: Free bytes on the filesystem of I(path).
  type: int
  returned: always
present_bytes:
  description: Bytes of the listed files already there (whole or as resumable parts).
  type: int
  returned: always
filesystem:
  description: The path measured (I(path) or its nearest existing parent).
  type: str
  returned: always
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils.disk import free_bytes
from ansible_collections.sparkfleet.cluster.plugins.module_utils.text_format import size as human
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_layout import (
    blob_path,
    present_bytes,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_main import WeightsError, run_module


def run(params: dict, check_mode: bool = False) -> dict:
    root = params["path"]
    snapshot = params.get("snapshot") or os.path.join(root, "snapshot")
    head = params.get("layout") == "head"
    total = present = 0
    for f in params["files"]:
        size = int(f["size"])
        total += size
        final = os.path.join(snapshot, *f["path"].split("/"))
        partials = [os.path.join(os.path.dirname(final), ".rsync-partial", os.path.basename(final))]
        if head and f.get("repo_id") and f.get("etag"):
            blob = blob_path(os.path.join(root, "hub"), f)
            partials = [blob, blob + ".incomplete"]
        present += present_bytes(final, size, partials)
    extra_total = 0
    extra_text = ""
    for item in params.get("extra") or []:
        size = int(item["size"])
        have = size if item.get("path") and os.path.isfile(item["path"]) else 0
        extra_total += size - have
        extra_text += f" + {human(size - have)} {item['what']}"
    margin = int(params.get("margin_bytes") or 0)
    needed = max(0, total - present + extra_total) + margin
    free, where = free_bytes(root)
    detail = f"{human(total)} of files{extra_text} + {human(margin)} margin - {human(present)} already there"
    result = {
        "changed": False,
        "total_bytes": total,
        "present_bytes": present,
        "missing_bytes": total - present,
        "extra_bytes": extra_total,
        "margin_bytes": margin,
        "needed_bytes": needed,
        "free_bytes": free,
        "filesystem": where,
        "msg": f"{root}: needs {human(needed)} free ({detail}); {where} has {human(free)} free",
    }
    if free < needed:
        raise WeightsError(
            f"not enough disk for the weights at {root}: needs {human(needed)} ({detail}), "
            "but the filesystem "
            f"of {where} has only {human(free)} free; free {human(needed - free)} or lower "
            "model_weights_disk_margin_gb. Nothing was downloaded or copied.",
            result,
        )
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "snapshot": {"type": "path"},
            "files": {"type": "list", "elements": "dict", "required": True},
            "layout": {"type": "str", "choices": ["head", "worker"], "default": "worker"},
            "margin_bytes": {"type": "int", "default": 0},
            "extra": {"type": "list", "elements": "dict", "default": []},
        },
        supports_check_mode=True,
    )
    run_module(module, run)


if __name__ == "__main__":
    main()

#!/usr/bin/python
# Build this rank's TP3 rank file from tp3/rank<N>.keys and check it against the release manifest.
from __future__ import annotations

DOCUMENTATION = r"""
module: weights_rank
short_description: Build a TP3 rank file deterministically and check its SHA-256
description:
  - Builds C(dest) from the verified snapshot, the tensors listed in C(keys), in that order, in the
    format the role README defines (sparkfleet-rank-v1, a valid safetensors file).
  - The file is written as C(dest.partial) and renamed only when complete and its SHA-256 equals
    C(expected_sha256) (from the release manifest); a mismatch deletes the part and fails clearly.
  - C(builder=builtin) uses the module's own builder; any other value is a command template run
    without a shell, with C({snapshot}), C({keys}), C({index}), C({rank}) and C({output}) (the
    C(.partial) path it must write) filled in; the engine image ships such a builder.
  - An existing rank file with the expected digest (stat cache, else a hash) is kept, not rebuilt.
options:
  snapshot: {type: path, required: true, description: the verified snapshot}
  keys: {type: str, required: true, description: "keys file, relative to the snapshot (tp3/rank<N>.keys)"}
  rank: {type: int, required: true, description: this node's rank}
  index: {type: str, default: model.safetensors.index.json, description: the index, relative to the snapshot}
  dest: {type: path, required: true, description: the rank file}
  expected_sha256: {type: str, required: true, description: the release manifest's SHA-256 of this rank file}
  builder: {type: str, default: builtin, description: builtin, or a command template}
  cache_file: {type: path, description: stat cache}
  margin_bytes: {type: int, default: 0, description: space to leave free}
  status_file: {type: path, description: progress file}
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: Build this node's rank file
  sparkfleet.cluster.weights_rank:
    snapshot: /srv/sparkfleet/models/snapshot
    keys: tp3/rank1.keys
    rank: 1
    dest: /srv/sparkfleet/models/rank/rank1.safetensors
    expected_sha256: "{{ release_sha256 }}"
"""

RETURN = r"""
rank:
  description: This node's rank.
  type: int
  returned: always
path:
  description: The rank file.
  type: str
  returned: always
sha256:
  description: Its SHA-256 (the release manifest's).
  type: str
  returned: always
build:
  description: The file was built (or would be, in check mode) by this run.
  type: bool
  returned: always
size:
  description: Its size in bytes.
  type: int
  returned: always
"""

import os
import shlex
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils.disk import free_bytes
from ansible_collections.sparkfleet.cluster.plugins.module_utils.text_format import size as human
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_hash import StatCache, sha256_file
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_main import WeightsError, run_module
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_progress import Progress
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_rank_files import (
    plan_rank_file,
    write_rank_file,
)


def run(params: dict, check_mode: bool = False) -> dict:  # noqa: PLR0912, PLR0915 - keep, plan, build, check: one flow
    snapshot = params["snapshot"]
    dest = params["dest"]
    rank = int(params["rank"])
    want = (params.get("expected_sha256") or "").lower()
    if len(want) != 64:
        raise WeightsError(
            f"rank {rank}: no SHA-256 for the rank file in the release manifest (got {want!r})"
        )
    builder = (params.get("builder") or "builtin").strip()
    cache = StatCache(params.get("cache_file"))
    key = "rank:" + os.path.basename(dest)
    base = {
        "rank": rank,
        "path": dest,
        "sha256": want,
        "builder": "builtin" if builder == "builtin" else "command",
    }
    if os.path.isfile(dest):
        st = os.stat(dest)
        hit = cache.get(key, st)
        sha = hit["sha256"] if hit else sha256_file(dest)[0]
        if sha == want:
            if not hit and not check_mode:
                cache.put(key, st, sha)
                cache.save()
            return {
                **base,
                "changed": False,
                "build": False,
                "present": True,
                "size": st.st_size,
                "msg": f"rank {rank}: {dest} matches the release manifest",
            }
        if not check_mode:
            os.unlink(dest)
            cache.drop(key)
    keys_path = os.path.join(snapshot, params["keys"])
    try:
        with open(keys_path) as fh:
            keys_text = fh.read()
    except OSError as exc:
        raise WeightsError(f"rank {rank}: cannot read the keys file {keys_path}: {exc}") from exc
    try:
        plan = plan_rank_file(
            snapshot, keys_text, rank, params.get("index") or "model.safetensors.index.json"
        )
    except WeightsError as exc:
        raise WeightsError(f"rank {rank}: {params['keys']}: {exc}") from exc
    if check_mode:
        return {
            **base,
            "changed": True,
            "build": True,
            "present": False,
            "size": plan["size"],
            "msg": f"rank {rank}: would build {dest} ({human(plan['size'])})",
        }
    partial = dest + ".partial"
    if os.path.exists(partial):
        os.unlink(partial)  # a part of an earlier, cut-off build: a build is cheap next to a download
    free, where = free_bytes(os.path.dirname(dest))
    need = plan["size"] + int(params.get("margin_bytes") or 0)
    if free < need:
        raise WeightsError(
            f"rank {rank}: building {dest} needs {human(need)} ({human(plan['size'])} rank file + margin), "
            f"{where} has {human(free)} free"
        )
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    progress = Progress(params.get("status_file"), f"rank {rank} file", plan["size"], 1)
    if builder == "builtin":
        got = write_rank_file(plan, partial, progress)
    else:
        fields = {
            "snapshot": snapshot,
            "keys": keys_path,
            "index": os.path.join(snapshot, params.get("index") or "model.safetensors.index.json"),
            "rank": str(rank),
            "output": partial,
        }
        try:
            argv = [part.format(**fields) for part in shlex.split(builder)]
        except (KeyError, ValueError, IndexError) as exc:
            raise WeightsError(f"rank builder command {builder!r}: bad template ({exc})") from exc
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            if os.path.exists(partial):
                os.unlink(partial)
            raise WeightsError(
                f"rank {rank}: the builder command exited {proc.returncode}: "
                f"{(proc.stderr or proc.stdout).strip()[-800:]}"
            )
        if not os.path.isfile(partial):
            raise WeightsError(f"rank {rank}: the builder command wrote no {partial}")
        got = sha256_file(partial)[0]
    if got != want:
        size = os.path.getsize(partial)
        os.unlink(partial)
        raise WeightsError(
            f"rank {rank}: the rank file built by the {base['builder']} builder from {params['keys']} has "
            f"sha256 {got} ({size} bytes), but the release manifest says {want}. "
            "The snapshot is verified, so "
            "the builder does not make the release's format: use the engine image's builder "
            "(model_weights_rank_builder) or check the release manifest. The part was deleted."
        )
    os.replace(partial, dest)
    st = os.stat(dest)
    cache.put(key, st, got)
    cache.save()
    progress.set_done(plan["size"])
    progress.file_done()
    progress.maybe_write(force=True, state="done")
    return {
        **base,
        "changed": True,
        "build": True,
        "present": True,
        "size": st.st_size,
        "msg": f"rank {rank}: built {dest} ({human(st.st_size)}), sha256 ok",
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "snapshot": {"type": "path", "required": True},
            "keys": {"type": "str", "required": True},
            "rank": {"type": "int", "required": True},
            "index": {"type": "str", "default": "model.safetensors.index.json"},
            "dest": {"type": "path", "required": True},
            "expected_sha256": {"type": "str", "required": True},
            "builder": {"type": "str", "default": "builtin"},
            "cache_file": {"type": "path"},
            "margin_bytes": {"type": "int", "default": 0},
            "status_file": {"type": "path"},
        },
        supports_check_mode=True,
    )
    run_module(module, run)


if __name__ == "__main__":
    main()

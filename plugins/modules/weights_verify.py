#!/usr/bin/python
# Verify a weights snapshot against its manifest on every core, skipping unchanged files.
from __future__ import annotations

DOCUMENTATION = r"""
module: weights_verify
short_description: Verify a weights snapshot (SHA-256, sizes, safetensors headers, index shard counts)
description:
  - Hashes the listed files in parallel on every core and compares SHA-256 (or the git blob id of
    small files whose SHA-256 the hub does not publish) and sizes with the manifest.
  - Keeps a stat cache (size, mtime, ctime, inode, device -> digest), so a file whose stat is unchanged
    since it was last hashed is not hashed again and an unchanged re-verify takes seconds.
  - Checks every .safetensors header (length, JSON, every tensor's data end within the file) and each
    index (shard count and names, tensors present in their shard).
  - With remove_bad, a corrupt or wrongly sized file is deleted (on the head with its hub-cache blob)
    so that the download or the copy fetches it again; it is never kept.
  - It removes only files it can prove are its own - a file the manifest names, under C(root) (a path that
    leaves C(root), also through a symbolic link, is never touched), and its blob under C(hub_cache). With
    prune, a file the manifest does not list is removed only when it is sparkfleet's - named in the
    manifest written earlier (C(write_manifest)) or the very file the stat cache recorded (same size,
    times, inode); any other file is someone else's, kept and returned in C(foreign).
options:
  root: {type: path, required: true, description: the snapshot directory}
  files:
    type: list
    elements: dict
    required: true
    description: "manifest entries: path, size, sha256 or git_oid"
  cache_file: {type: path, description: stat cache}
  workers: {type: int, default: 0, description: hashing threads (0 = every core)}
  full: {type: bool, default: false, description: ignore the stat cache}
  remove_bad: {type: bool, default: false, description: delete corrupt files}
  hub_cache: {type: path, description: the head's hub cache (bad files' blobs are deleted too)}
  require_complete: {type: bool, default: false, description: fail unless every file is present and good}
  indexes:
    type: list
    elements: dict
    default: []
    description: "[{path, complete}] indexes; default: every *.safetensors.index.json"
  release_manifest:
    type: str
    default: ""
    description: SHA256SUMS-style file in the snapshot to cross-check
  write_manifest: {type: path, description: where to write the verified manifest when complete}
  repos: {type: list, elements: dict, default: [], description: repo records for the written manifest}
  prune:
    type: bool
    default: false
    description: "delete files under root that the manifest does not list and that are sparkfleet's (an
      earlier manifest or the stat cache names them); others are kept (C(foreign))"
  status_file: {type: path, description: progress file}
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: Verify the snapshot and write its manifest
  sparkfleet.cluster.weights_verify:
    root: /srv/sparkfleet/models/snapshot
    files: "{{ resolved.manifest.files }}"
    cache_file: /srv/sparkfleet/models/.sparkfleet/verify-cache.json
    require_complete: true
    write_manifest: /srv/sparkfleet/models/.sparkfleet/manifest.json
"""

RETURN = r"""
complete:
  description: Every listed file is present and good, and the indexes and the release manifest agree.
  type: bool
  returned: always
digest:
  description: "sha256:<hex> of the canonical file list (when complete)."
  type: str
  returned: always
files:
  description: "[{path, size, sha256}] (when complete)."
  type: list
  returned: always
missing:
  description: The files that are not there.
  type: list
  returned: always
bad:
  description: "[{path, reason}] of the files that are not good."
  type: list
  returned: always
removed:
  description: The files deleted because they were bad (with remove_bad).
  type: list
  returned: always
foreign:
  description: Files under root that no manifest of sparkfleet's names (kept, never removed).
  type: list
  returned: always
cache_hits:
  description: Files not hashed again because their stat is unchanged.
  type: int
  returned: always
"""

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils.fileio import write_atomic
from ansible_collections.sparkfleet.cluster.plugins.module_utils.text_format import size as human
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_hash import StatCache
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_layout import blob_path, list_tree
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_main import WeightsError, run_module
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_manifest import (
    MANIFEST_FORMAT,
    manifest_digest,
    parse_sha256sums,
    verify_files,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_progress import Progress
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_safetensors import check_indexes


def _remove(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def within(top: str, rel: str) -> str | None:
    """`top`/`rel` when it is a file inside `top` (no absolute path, no '..', no symbolic link on the way
    out of it), else None: what the role may remove is only ever in its own directory."""
    if not rel or os.path.isabs(rel) or os.path.normpath(rel) != rel or rel.split("/", 1)[0] == "..":
        return None
    path = os.path.join(top, rel)
    real_top = os.path.realpath(top)
    parent = os.path.realpath(os.path.dirname(path))
    if parent != real_top and not parent.startswith(real_top.rstrip("/") + "/"):
        return None
    return path


def previous_manifest(path: str | None) -> set[str]:
    """The paths of the manifest this module wrote earlier (the files it verified there): its own."""
    if not path:
        return set()
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return set()
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        return set()
    return {str(f.get("path")) for f in doc.get("files") or [] if isinstance(f, dict)}


def owned_strays(
    root: str, stray: list[str], cache: StatCache, earlier: set[str]
) -> tuple[list[str], list[str]]:
    """(sparkfleet's, someone else's) of the files under root the manifest does not list."""
    own, foreign = [], []
    for rel in stray:
        path = within(root, rel)
        try:
            st = os.lstat(path) if path else None
        except OSError:
            st = None
        mine = st is not None and (rel in earlier or cache.get(rel, st) is not None)
        (own if mine else foreign).append(rel)
    return own, foreign


def indexes_of(params: dict, by_path: dict) -> list[dict]:
    """The indexes to check: given, or every *.safetensors.index.json of the manifest.

    An index is complete (all its shards must be there) unless its repo was downloaded with
    allow-patterns (the Engram subset): then only the shards that are there are checked.
    """
    if params.get("indexes"):
        return params["indexes"]
    subsets = {(r.get("dir") or "").strip("/") for r in params.get("repos") or [] if r.get("allow_patterns")}
    return [
        {"path": p, "complete": os.path.dirname(p) not in subsets}
        for p in sorted(by_path)
        if p.endswith(".safetensors.index.json")
    ]


def remove_bad(params: dict, res: dict, by_path: dict, check_mode: bool) -> list[str]:
    """Delete corrupt files (and the head's blobs of them): they must be fetched again, not kept."""
    removed = []
    for item in res["bad"]:
        rel = item["path"]
        path = within(params["root"], rel) if rel in by_path else None
        if path is None:
            continue  # not a manifest file inside the snapshot: never removed
        if check_mode:
            removed.append(rel)
            continue
        gone = _remove(path)
        entry = by_path[rel]
        if params.get("hub_cache") and entry.get("repo_id") and entry.get("etag"):
            blob = blob_path(params["hub_cache"], entry)
            if within(params["hub_cache"], os.path.relpath(blob, params["hub_cache"])):
                gone = _remove(blob) or gone
        if gone:
            removed.append(rel)
    return removed


def cross_check_release(root: str, name: str, res: dict, by_path: dict) -> tuple[dict, list[str]]:
    """Compare the release manifest with the verified digests; return its other entries (rank files)."""
    if name not in by_path:
        return {}, [f"the release manifest {name} is not one of the snapshot's files"]
    try:
        with open(os.path.join(root, name)) as fh:
            sums = parse_sha256sums(fh.read())
    except (OSError, WeightsError) as exc:
        return {}, [f"{name}: {exc}"]
    release, errors = {}, []
    for rel, sha in sorted(sums.items()):
        if rel not in res["ok"]:
            release[rel] = sha
        elif res["ok"][rel] != sha:
            errors.append(f"{rel}: sha256 {res['ok'][rel]} matches the hub, but {name} says {sha}")
    return release, errors


def write_manifest(path: str, doc: dict, check_mode: bool) -> bool:
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    try:
        with open(path) as fh:
            if fh.read() == text:
                return False
    except OSError:
        pass
    if not check_mode:
        write_atomic(path, text)
    return True


def summarize(res: dict, files: list, removed: list, errors: list, elapsed: float) -> str:
    text = (
        f"{len(res['ok'])}/{len(files)} files good ({human(res['hashed_bytes'])} hashed, "
        f"{res['cache_hits']} unchanged since the last hash) in {elapsed} s"
    )
    if res["missing"]:
        text += f"; {len(res['missing'])} missing"
    if res["bad"]:
        text += f"; {len(res['bad'])} bad: " + "; ".join(
            f"{b['path']}: {b['reason']}" for b in res["bad"][:3]
        )
    if removed:
        text += f"; removed {len(removed)} bad files so they are fetched again"
    return text + ("; " + "; ".join(errors) if errors else "")


def run(params: dict, check_mode: bool = False) -> dict:
    start = time.monotonic()
    root = params["root"]
    files = params["files"]
    by_path = {f["path"]: f for f in files}
    if len(by_path) != len(files):
        raise WeightsError("the manifest lists a path twice")
    cache = StatCache(params.get("cache_file"))
    earlier = previous_manifest(params.get("write_manifest"))
    progress = Progress(params.get("status_file"), "verify", sum(int(f["size"]) for f in files), len(files))
    if os.path.isdir(root):
        workers = params.get("workers") or 0
        res = verify_files(
            root, files, cache, workers=workers, full=bool(params.get("full")), progress=progress
        )
        stray = [p for p in list_tree(root) if p not in by_path]
    else:
        res = {"ok": {}, "missing": sorted(by_path), "bad": [], "hashed_bytes": 0, "cache_hits": 0}
        stray = []
    removed = remove_bad(params, res, by_path, check_mode) if params.get("remove_bad") else []
    pruned: list[str] = []
    own, foreign = owned_strays(root, stray, cache, earlier)
    for rel in own if params.get("prune") else []:  # an earlier revision's: listed by its manifest or cache
        path = within(root, rel)
        if path and (check_mode or _remove(path)):
            pruned.append(rel)

    errors: list[str] = []
    complete = not res["missing"] and not res["bad"]
    verified: list[dict] = []
    digest = None
    release: dict = {}
    if complete:
        errors += check_indexes(root, indexes_of(params, by_path), set(by_path))
        verified = [
            {"path": p, "size": int(by_path[p]["size"]), "sha256": res["ok"][p]} for p in sorted(by_path)
        ]
        if params.get("release_manifest"):
            release, more = cross_check_release(root, params["release_manifest"], res, by_path)
            errors += more
        digest = manifest_digest(verified)

    written = False
    if complete and not errors and params.get("write_manifest"):
        doc = {
            "format": MANIFEST_FORMAT,
            "digest": digest,
            "repos": params.get("repos") or [],
            "files": verified,
        }
        if release:
            doc["release"] = release
        written = write_manifest(params["write_manifest"], doc, check_mode)

    if not check_mode:
        cache.keep_only(set(by_path))
        cache.save()
    progress.maybe_write(force=True, state="done")
    elapsed = round(time.monotonic() - start, 2)
    bad_bytes = sum(int(by_path[b["path"]]["size"]) for b in res["bad"])
    result = {
        "changed": bool(removed or pruned or written),
        "complete": complete and not errors,
        "ok_files": len(res["ok"]),
        "missing": res["missing"],
        "bad": res["bad"],
        "removed": removed,
        "stray": stray,
        "pruned": pruned,
        "foreign": foreign,
        "errors": errors,
        "digest": digest,
        "files": verified,
        "release": release,
        "total_bytes": sum(int(f["size"]) for f in files),
        "missing_bytes": sum(int(by_path[p]["size"]) for p in res["missing"]) + bad_bytes,
        "hashed_bytes": res["hashed_bytes"],
        "cache_hits": res["cache_hits"],
        "elapsed_s": elapsed,
        "manifest_written": written,
        "msg": summarize(res, files, removed, errors, elapsed),
    }
    if params.get("require_complete") and not result["complete"]:
        raise WeightsError(f"{root} is not a complete, verified snapshot: {result['msg']}", result)
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "files": {"type": "list", "elements": "dict", "required": True},
            "cache_file": {"type": "path"},
            "workers": {"type": "int", "default": 0},
            "full": {"type": "bool", "default": False},
            "remove_bad": {"type": "bool", "default": False},
            "hub_cache": {"type": "path"},
            "require_complete": {"type": "bool", "default": False},
            "indexes": {"type": "list", "elements": "dict", "default": []},
            "release_manifest": {"type": "str", "default": ""},
            "write_manifest": {"type": "path"},
            "repos": {"type": "list", "elements": "dict", "default": []},
            "prune": {"type": "bool", "default": False},
            "status_file": {"type": "path"},
        },
        supports_check_mode=True,
    )
    run_module(module, run)


if __name__ == "__main__":
    main()

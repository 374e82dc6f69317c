#!/usr/bin/python
# The download driver: huggingface_hub (in the role's venv) at pinned revisions, parallel per file,
# resumable inside a file, with a progress file the role's wait action prints.
from __future__ import annotations

DOCUMENTATION = r"""
module: weights_fetch
short_description: Resolve pinned Hugging Face revisions and download repo files, resumably
description:
  - C(mode=resolve) resolves each repo's revision (a branch, a short or full commit) to the full
    commit through the hub and lists the files to get (allow-patterns applied) with their size and
    SHA-256 (LFS files) or git blob id (small files). It changes nothing.
  - C(mode=download) downloads the listed files into a Hugging Face cache under
    C(<weights_path>/hub) (blobs, snapshots, refs, as huggingface_hub lays them out) and hard-links
    each into the plain snapshot C(<weights_path>/snapshot/<dir>/<path>). Files are fetched in
    parallel; a file that was cut off resumes from its C(.incomplete) part with an HTTP Range
    request; finished files are not fetched again. Every byte is hashed as it arrives and checked.
  - Runs under the interpreter of the venv that holds huggingface_hub.
  - Why not C(ansible.builtin.get_url) - one file a task, no resolve of a revision, no resume from a cut-off
    part and no Hugging Face cache layout; this fetches every file of the pins in parallel in one async task.
options:
  mode: {type: str, choices: [resolve, download], default: resolve, description: what to do}
  endpoint: {type: str, default: "", description: hub URL; empty = huggingface_hub's default}
  token: {type: str, default: "", no_log: true, description: HF token (optional)}
  repos: {type: list, elements: dict, description: "[{name, repo, revision, dir, allow_patterns}]"}
  weights_path: {type: path, required: true, description: weights root}
  snapshot: {type: path, description: "the plain snapshot (default <weights_path>/snapshot)"}
  manifest: {type: dict, description: the resolve result (download mode)}
  workers: {type: int, default: 8, description: files fetched at once}
  retries: {type: int, default: 3, description: attempts per file}
  status_file: {type: path, description: progress file}
  cache_file: {type: path, description: the verify stat cache to seed with the digests computed here}
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: Resolve the pinned revisions
  sparkfleet.cluster.weights_fetch:
    mode: resolve
    repos:
      - {name: main, repo: LibertAIDAI/DeepSeek-V4.1-Flash-1017-EXL3-2.9bpw, revision: afc7aa0a}
    weights_path: /srv/sparkfleet/models
  register: resolved

- name: Download what is missing, in the background
  sparkfleet.cluster.weights_fetch:
    mode: download
    weights_path: /srv/sparkfleet/models
    manifest: "{{ resolved.manifest }}"
    status_file: /srv/sparkfleet/models/.sparkfleet/progress-download.json
  async: 86400
  poll: 0
  register: download_job
"""

RETURN = r"""
manifest:
  description: >-
    mode=resolve: repos (with the resolved commits), files (path, size, sha256 or git_oid, etag),
    total_bytes
  type: dict
  returned: mode=resolve
downloaded:
  description: The files fetched by this run (or that would be, in check mode).
  type: list
  returned: mode=download
bytes_downloaded:
  description: Bytes received by this run.
  type: int
  returned: mode=download
"""

import contextlib
import hashlib
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from urllib.parse import urlsplit

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils.fileio import write_atomic
from ansible_collections.sparkfleet.cluster.plugins.module_utils.text_format import size as human
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_hash import StatCache
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_layout import (
    copy_or_link,
    repo_folder,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_main import WeightsError, run_module
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_progress import Progress

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")


RESUME_CHUNK = 1 << 20


def _hf():
    try:
        import huggingface_hub
        from huggingface_hub import constants, errors, file_download
    except ImportError as exc:
        raise WeightsError(
            f"huggingface_hub is not importable by {sys.executable} ({exc}); "
            "the role installs it into its venv"
        ) from exc
    # http_get writes what it receives in chunks of this size: 1 MiB keeps the progress lines moving
    # and loses at most 1 MiB of a file when the download is killed (huggingface_hub: 10 MB).
    constants.DOWNLOAD_CHUNK_SIZE = RESUME_CHUNK
    return huggingface_hub, errors, file_download


def _describe_http_error(exc: Exception, what: str, endpoint: str) -> str:
    resp = getattr(exc, "response", None)
    status = getattr(resp, "status_code", None)
    hub = endpoint or "https://huggingface.co"
    if status == 401:
        return (
            f"the hub at {hub} refused {what} (HTTP 401): the repo needs a token, or the token is not valid "
            "for it; set HF_TOKEN in the controller's environment (it is passed to the head, never logged)"
        )
    if status == 403:
        return f"the hub at {hub} refused {what} (HTTP 403): accept the repo's terms with the token's account"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{what}: {first}"


# ---- resolve ------------------------------------------------------------------------------------
def resolve(params: dict) -> dict:  # noqa: PLR0912 - one check per way a pin can be wrong
    hf, errors, _ = _hf()
    from huggingface_hub.utils import filter_repo_objects

    endpoint = params.get("endpoint") or None
    token = params.get("token") or None
    api = hf.HfApi(endpoint=endpoint, token=token, library_name="sparkfleet")
    repos_out = []
    files = []
    for spec in params["repos"]:
        repo, revision = spec["repo"], str(spec["revision"])
        what = f"{repo} at revision {revision}"
        try:
            info = api.model_info(repo, revision=revision, files_metadata=True)
        except errors.RevisionNotFoundError as exc:
            raise WeightsError(f"{what}: the hub has no such revision ({spec['name']} pin)") from exc
        except errors.HfHubHTTPError as exc:
            raise WeightsError(_describe_http_error(exc, what, params.get("endpoint", ""))) from exc
        except Exception as exc:  # connection refused, DNS, TLS: say which hub
            raise WeightsError(
                f"cannot reach the hub at {endpoint or 'https://huggingface.co'} for {what}: {exc}"
            ) from exc
        commit = info.sha
        if not commit or len(commit) != 40:
            raise WeightsError(f"{what}: the hub answered no full commit (sha={commit!r})")
        if (
            not commit.startswith(revision.lower())
            and len(revision) >= 7
            and all(c in "0123456789abcdef" for c in revision.lower())
        ):
            raise WeightsError(f"{what}: the hub resolved it to {commit}, which does not start with the pin")
        siblings = {s.rfilename: s for s in info.siblings or []}
        patterns = spec.get("allow_patterns") or None
        # Dot-paths (.gitattributes) are git metadata: not served, and left out of the snapshot's
        # digest by the engine too.
        names = sorted(n for n in siblings if not any(part.startswith(".") for part in n.split("/")))
        chosen = list(filter_repo_objects(names, allow_patterns=patterns))
        if patterns:
            for pat in patterns:
                if not list(filter_repo_objects(names, allow_patterns=[pat])):
                    raise WeightsError(f"{what}: allow pattern {pat!r} matches no file of the repo")
        if not chosen:
            raise WeightsError(f"{what}: no files to download")
        base = (spec.get("dir") or "").strip("/")
        for name in chosen:
            s = siblings[name]
            if s.size is None:
                raise WeightsError(f"{what}: the hub gave no size for {name}")
            lfs = s.lfs
            entry = {
                "path": f"{base}/{name}" if base else name,
                "repo": spec["name"],
                "repo_id": repo,
                "repo_path": name,
                "commit": commit,
                "size": int(s.size),
                "lfs": lfs is not None,
                "sha256": lfs.sha256 if lfs is not None else None,
                "git_oid": None if lfs is not None else s.blob_id,
            }
            entry["etag"] = entry["sha256"] or entry["git_oid"]
            if not entry["etag"]:
                raise WeightsError(f"{what}: the hub gave neither an LFS sha256 nor a blob id for {name}")
            files.append(entry)
        repos_out.append(
            {
                "name": spec["name"],
                "repo": repo,
                "revision": revision,
                "commit": commit,
                "dir": base,
                "allow_patterns": patterns,
                "files": len(chosen),
            }
        )
    paths = [f["path"] for f in files]
    dupes = sorted({p for p in paths if paths.count(p) > 1})
    if dupes:
        raise WeightsError(f"two repos put a file at the same path: {', '.join(dupes)}; give one a 'dir'")
    files.sort(key=lambda f: f["path"])
    return {"repos": repos_out, "files": files, "total_bytes": sum(f["size"] for f in files)}


# ---- download -----------------------------------------------------------------------------------
class HashingWriter:
    """A file that hashes what is written to it; resumes after the bytes already there."""

    def __init__(self, path: str, expected_size: int, want_git: bool, progress: Progress | None):
        self.path = path
        self.size = expected_size
        self.want_git = want_git
        self.progress = progress
        mode = "r+b" if os.path.exists(path) else "w+b"
        self.fh = open(path, mode)  # noqa: SIM115 - closed by close()
        self.fh.seek(0, os.SEEK_END)
        if self.fh.tell() > expected_size:
            self.fh.truncate(0)
            self.fh.seek(0)
        self._rehash(self.fh.tell())
        self.received = 0

    def _rehash(self, upto: int) -> None:
        self.sha = hashlib.sha256()
        self.git = hashlib.sha1(b"blob %d\0" % self.size, usedforsecurity=False) if self.want_git else None
        self.fh.seek(0)
        left = upto
        while left:
            block = self.fh.read(min(8 << 20, left))
            if not block:
                break
            self.sha.update(block)
            if self.git:
                self.git.update(block)
            left -= len(block)
        self.fh.seek(upto)
        self.fh.truncate(upto)

    @property
    def resume_size(self) -> int:
        return self.fh.tell()

    def write(self, data: bytes) -> int:
        n = self.fh.write(data)
        self.sha.update(data)
        if self.git:
            self.git.update(data)
        self.received += len(data)
        if self.progress:
            self.progress.add(len(data))
        return n

    def tell(self) -> int:
        return self.fh.tell()

    def seek(self, pos: int, whence: int = 0) -> int:
        return self.fh.seek(pos, whence)

    def truncate(self, size: int | None = None) -> int:
        # huggingface_hub rewinds when a server ignores Range: restart the hashes at that point.
        pos = self.fh.tell() if size is None else size
        before = self.fh.seek(0, os.SEEK_END)
        if self.progress:
            self.progress.add(pos - before)
        self._rehash(pos)
        return pos

    def flush(self) -> None:
        self.fh.flush()

    def close(self) -> None:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()


def _layout(root: str, entry: dict, snapshot: str | None = None) -> dict:
    hub = os.path.join(root, "hub")
    storage = os.path.join(hub, repo_folder(entry["repo_id"]))
    blob = os.path.join(storage, "blobs", entry["etag"])
    return {
        "storage": storage,
        "blob": blob,
        "incomplete": blob + ".incomplete",
        "pointer": os.path.join(storage, "snapshots", entry["commit"], *entry["repo_path"].split("/")),
        "plain": os.path.join(snapshot or os.path.join(root, "snapshot"), *entry["path"].split("/")),
    }


def _same_file(a: str, b: str) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_ino, sa.st_dev) == (sb.st_ino, sb.st_dev)


def _ensure_links(root: str, entry: dict, snapshot: str | None = None) -> bool:
    """Blob -> HF snapshot symlink + plain hard link. True if anything was made."""
    lay = _layout(root, entry, snapshot)
    made = False
    pointer = lay["pointer"]
    target = os.path.relpath(lay["blob"], os.path.dirname(pointer))
    if not (os.path.islink(pointer) and os.readlink(pointer) == target):
        os.makedirs(os.path.dirname(pointer), exist_ok=True)
        tmp = pointer + ".link-partial"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(target, tmp)
        os.replace(tmp, pointer)
        made = True
    if not _same_file(lay["blob"], lay["plain"]):
        copy_or_link(lay["blob"], lay["plain"])
        made = True
    return made


def _state(root: str, entry: dict, snapshot: str | None = None) -> str:
    lay = _layout(root, entry, snapshot)
    size = entry["size"]
    for path in (lay["blob"], lay["plain"]):
        try:
            if os.path.getsize(path) != size:
                return "fetch"
        except OSError:
            continue
    if os.path.exists(lay["blob"]):
        return "present"
    if os.path.exists(lay["plain"]):
        return "relink"  # the snapshot (verified before this runs) has it, the hub cache lost it
    return "fetch"


def _fetch_one(  # noqa: PLR0917 - submitted to a thread pool positionally
    entry: dict, root: str, endpoint: str | None, token: str | None, retries: int, progress: Progress
) -> int:
    _, _, fd = _hf()
    lay = _layout(root, entry)
    os.makedirs(os.path.dirname(lay["blob"]), exist_ok=True)
    url = fd.hf_hub_url(entry["repo_id"], entry["repo_path"], revision=entry["commit"], endpoint=endpoint)
    received = 0
    last_error: Exception | None = None
    for attempt in range(1, retries + 1):
        headers = fd.build_hf_headers(token=token, library_name="sparkfleet")
        try:
            meta = fd.get_hf_file_metadata(url, token=token, endpoint=endpoint, retry_on_errors=True)
        except Exception as exc:
            raise WeightsError(
                _describe_http_error(exc, f"{entry['repo_id']} {entry['repo_path']}", endpoint or "")
            ) from exc
        if meta.etag != entry["etag"]:
            raise WeightsError(
                f"{entry['repo_id']}@{entry['commit'][:12]} {entry['repo_path']}: the hub now answers etag "
                f"{meta.etag}, the manifest says {entry['etag']}"
            )
        location = meta.location or url
        if urlsplit(location).netloc != urlsplit(url).netloc:
            headers.pop("authorization", None)  # a CDN gets no token, as huggingface_hub does it
        writer = HashingWriter(lay["incomplete"], entry["size"], want_git=not entry["lfs"], progress=progress)
        try:
            fd.http_get(
                location,
                writer,
                resume_size=writer.resume_size,
                headers=headers,
                expected_size=entry["size"],
                displayed_filename=entry["repo_path"],
            )
        except Exception as exc:
            received += writer.received
            writer.close()
            last_error = exc
            time.sleep(min(5, attempt))
            continue  # the part stays: the next attempt (or run) resumes it
        received += writer.received
        writer.close()
        sha = writer.sha.hexdigest()
        git = writer.git.hexdigest() if writer.git else None
        good = (entry["sha256"] and sha == entry["sha256"]) or (
            not entry["sha256"] and git == entry["git_oid"]
        )
        if not good:
            os.unlink(lay["incomplete"])
            progress.add(-entry["size"])
            last_error = WeightsError(
                f"{entry['repo_path']}: downloaded bytes hash to sha256 {sha} / git {git}, expected "
                f"{entry['sha256'] or entry['git_oid']}; fetching it again"
            )
            continue
        os.replace(lay["incomplete"], lay["blob"])
        entry["_sha256"] = sha
        entry["_git_oid"] = git
        return received
    raise WeightsError(
        f"{entry['repo_id']} {entry['repo_path']}: gave up after {retries} attempts: {last_error}"
    )


def _write_refs(root: str, manifest: dict) -> None:
    for repo in manifest["repos"]:
        if repo["revision"] == repo["commit"]:
            continue
        ref = os.path.join(root, "hub", repo_folder(repo["repo"]), "refs", repo["revision"])
        try:
            with open(ref) as fh:
                if fh.read() == repo["commit"]:
                    continue
        except OSError:
            pass
        write_atomic(ref, repo["commit"])


def download(params: dict, check_mode: bool) -> dict:  # noqa: PLR0912, PLR0915 - plan, fetch, link, report
    root = params["weights_path"]
    snap = params.get("snapshot") or os.path.join(root, "snapshot")
    manifest = params.get("manifest") or {}
    files = manifest.get("files") or []
    if not files:
        raise WeightsError("download needs the manifest of mode=resolve")
    states = {f["path"]: _state(root, f, snap) for f in files}
    todo = [f for f in files if states[f["path"]] == "fetch"]
    relink = [f for f in files if states[f["path"]] == "relink"]
    if check_mode:
        return {
            "changed": bool(todo or relink),
            "downloaded": [f["path"] for f in todo],
            "bytes_downloaded": 0,
            "would_download_bytes": sum(f["size"] for f in todo),
            "msg": f"would download {len(todo)} files ({human(sum(f['size'] for f in todo))})",
        }
    for f in relink:
        lay = _layout(root, f, snap)
        os.makedirs(os.path.dirname(lay["blob"]), exist_ok=True)
        os.link(lay["plain"], lay["blob"])
    total = manifest.get("total_bytes") or sum(f["size"] for f in files)
    progress = Progress(params.get("status_file"), "download", total, len(files))
    already = 0
    for f in files:
        if states[f["path"]] != "fetch":
            already += f["size"]
            progress.files_done += 1
        else:
            with contextlib.suppress(OSError):
                already += min(os.path.getsize(_layout(root, f)["incomplete"]), f["size"])
    progress.skipped = already
    progress.set_done(already)
    progress.detail = f"{len(todo)} files to fetch"
    progress.maybe_write(force=True)
    endpoint = params.get("endpoint") or None
    token = params.get("token") or None
    cache = StatCache(params.get("cache_file"))
    received = 0
    failures = []
    with ThreadPoolExecutor(max_workers=max(1, params.get("workers") or 8)) as pool:
        futures = {
            pool.submit(_fetch_one, f, root, endpoint, token, params.get("retries") or 3, progress): f
            for f in todo
        }
        for fut in as_completed(futures):
            f = futures[fut]
            try:
                received += fut.result()
                progress.file_done()
            except WeightsError as exc:
                failures.append(str(exc))
            except Exception as exc:  # keep going: the other files still finish and are kept
                failures.append(f"{f['path']}: {type(exc).__name__}: {exc}")
    linked = []
    for f in files:
        lay = _layout(root, f, snap)
        if not os.path.exists(lay["blob"]):
            continue
        if _ensure_links(root, f, snap):
            linked.append(f["path"])
        if f.get("_sha256"):
            st = os.stat(lay["plain"])
            cache.put(f["path"], st, f["_sha256"], f.get("_git_oid"))
    _write_refs(root, manifest)
    cache.save()
    progress.detail = f"{len(failures)} failed" if failures else "complete"
    progress.maybe_write(force=True, state="failed" if failures else "done")
    if failures:
        raise WeightsError(
            f"{len(failures)} of {len(todo)} files did not download (finished files are kept, parts resume "
            f"on the next run): " + "; ".join(failures[:5])
        )
    fetched = [f["path"] for f in todo]
    return {
        "changed": bool(fetched or relink or linked),
        "downloaded": fetched,
        "bytes_downloaded": received,
        "msg": f"downloaded {len(fetched)} files ({human(received)}); {len(files) - len(fetched)} were there",
    }


def run(params: dict, check_mode: bool = False) -> dict:
    if params.get("mode", "resolve") == "resolve":
        if not params.get("repos"):
            raise WeightsError("resolve needs repos")
        manifest = resolve(params)
        commits = ", ".join(
            f"{r['name']} {r['repo']}@{r['revision']} -> {r['commit']}" for r in manifest["repos"]
        )
        return {
            "changed": False,
            "manifest": manifest,
            "msg": f"{len(manifest['files'])} files, {human(manifest['total_bytes'])}: {commits}",
        }
    return download(params, check_mode)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "mode": {"type": "str", "choices": ["resolve", "download"], "default": "resolve"},
            "endpoint": {"type": "str", "default": ""},
            "token": {"type": "str", "default": "", "no_log": True},
            "repos": {"type": "list", "elements": "dict"},
            "weights_path": {"type": "path", "required": True},
            "snapshot": {"type": "path"},
            "manifest": {"type": "dict"},
            "workers": {"type": "int", "default": 8},
            "retries": {"type": "int", "default": 3},
            "status_file": {"type": "path"},
            "cache_file": {"type": "path"},
        },
        supports_check_mode=True,
    )
    run_module(module, run)


if __name__ == "__main__":
    main()

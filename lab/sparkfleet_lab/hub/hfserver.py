"""A Hugging-Face-compatible file server: the lab's stand-in for huggingface.co (stdlib only).

It serves the repos that `models.generate` wrote under `data_dir/hf/` on the endpoints that
huggingface_hub 2.4.0 calls (read from its source: hf_api.py, file_download.py, utils/_http.py):

  GET  /api/models/{repo}[/revision/{rev}][?blobs=True]   model_info / repo_info: `sha` is the full
       commit (short hex revisions and branch names are resolved), `siblings` with size, blobId
       and lfs {sha256, size, pointerSize} when blobs=True
  GET  /api/models/{repo}/tree/{rev}[/{path}]?recursive=   list_repo_tree, paginated with a
       GitHub-style `Link: <...>; rel="next"` header (lfs {oid, size, pointerSize})
  HEAD|GET /{repo}/resolve/{rev}/{path}                    small files: 200 with ETag "<git blob id>",
       X-Repo-Commit; LFS files: 302 to /_cdn/... with X-Linked-Etag "<sha256>", X-Linked-Size,
       X-Repo-Commit (the client follows a same-origin redirect and reads the CDN's headers)
  HEAD|GET /_cdn/{repo}/{commit}/{sha256}                   the "CDN": ETag, X-Repo-Commit, Range
  GET  /wheels/  /wheels/{file}                             pip --find-links directory

Range requests (`bytes=a-b`, `bytes=a-`, `bytes=-n`) answer 206 with Content-Range; a bad range
416. Errors carry X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo) as
the client expects. `data_dir/hf/_settings.json` is re-read when it changes:
  {"tokens": ["hf_..."], "private": ["org/name"], "throttle_bytes_per_s": 0}
A private repo without a valid `Authorization: Bearer` token answers 401 (GatedRepo), with an
unknown token 401 "Invalid credentials in Authorization header". The throttle limits each
response body (tests use it to kill a download mid-file).
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import json
import os
import re
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

CHUNK = 256 << 10
TREE_PAGE = 1000
HEX = re.compile(r"^[0-9a-f]{4,40}$")
RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.commit = commit


class Store:
    """The generated repos on disk (read-only), with the settings file watched for changes."""

    def __init__(self, data_dir: Path):
        self.root = Path(data_dir) / "hf"
        self.wheels = Path(data_dir) / "wheels"
        self._settings: dict = {}
        self._settings_stamp: tuple | None = None
        self._lock = threading.Lock()
        self._listing_cache: dict[tuple[str, str], list[dict]] = {}

    @property
    def settings(self) -> dict:
        path = self.root / "_settings.json"
        try:
            st = path.stat()
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = None
        with self._lock:
            if stamp != self._settings_stamp:
                try:
                    self._settings = json.loads(path.read_text()) if stamp else {}
                except (OSError, ValueError):
                    self._settings = {}
                self._settings_stamp = stamp
            return self._settings

    def repo(self, repo_id: str) -> dict:
        if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", repo_id) or ".." in repo_id:
            raise HubError(404, "RepoNotFound", f"Repository {repo_id} not found")
        path = self.root / repo_id / "repo.json"
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise HubError(404, "RepoNotFound", f"Repository {repo_id} not found") from None

    def resolve(self, repo: dict, revision: str) -> str:
        """Branch, full commit or unique short commit prefix -> full commit."""
        refs = repo.get("refs", {})
        commits = repo.get("commits", [])
        if revision in refs:
            return refs[revision]
        rev = revision.lower()
        if HEX.match(rev):
            found = [c for c in commits if c.startswith(rev)]
            if len(found) == 1:
                return found[0]
        raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    def listing(self, repo_id: str, commit: str) -> list[dict]:
        key = (repo_id, commit)
        if key not in self._listing_cache:
            path = self.root / repo_id / "commits" / f"{commit}.json"
            self._listing_cache[key] = json.loads(path.read_text())
        return self._listing_cache[key]

    def entry(self, repo_id: str, commit: str, path: str) -> dict:
        for e in self.listing(repo_id, commit):
            if e["path"] == path:
                return e
        raise HubError(404, "EntryNotFound", f"{path} does not exist at {commit}", commit=commit)

    def blob(self, repo_id: str, sha256: str) -> Path:
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise HubError(404, "EntryNotFound", "no such blob")
        path = self.root / repo_id / "blobs" / sha256
        if not path.is_file():
            raise HubError(404, "EntryNotFound", "no such blob")
        return path

    def check_access(self, repo_id: str, repo: dict, authorization: str | None) -> None:
        settings = self.settings
        private = repo.get("private") or repo_id in settings.get("private", [])
        token = None
        if authorization and authorization.lower().startswith("bearer "):
            token = authorization[7:].strip()
        tokens = settings.get("tokens")
        if token is not None and tokens is not None and token not in tokens:
            raise HubError(401, None, "Invalid credentials in Authorization header")
        if private and (token is None or token not in (tokens or [])):
            raise HubError(
                401,
                "GatedRepo",
                f"Access to model {repo_id} is restricted. You must have access to it and be "
                "authenticated to access it.",
            )


def _etag(value: str) -> str:
    return f'"{value}"'


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sparkfleet-lab-hub/1"
    store: Store
    server: HubServer

    # ---- plumbing ---------------------------------------------------------------------------
    def log_message(self, format: str, *args: object) -> None:
        if os.environ.get("SPARKFLEET_HUB_LOG"):
            super().log_message(format, *args)

    def _record(self, status: int, sent: int = 0) -> None:
        self.server.log_request_info(
            {
                "method": self.command,
                "path": urlsplit(self.path).path,
                "range": self.headers.get("Range"),
                "auth": "Authorization" in self.headers,
                "status": status,
                "sent": sent,
            }
        )

    def _send(
        self, status: int, body: bytes = b"", headers: dict | None = None, ctype: str = "application/json"
    ):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)
        self._record(status, len(body) if self.command != "HEAD" else 0)

    def _json(self, obj: object, headers: dict | None = None) -> None:
        self._send(200, json.dumps(obj).encode(), headers)

    def _error(self, exc: HubError) -> None:
        headers = {"X-Error-Message": exc.message}
        if exc.code:
            headers["X-Error-Code"] = exc.code
        if exc.commit:
            headers["X-Repo-Commit"] = exc.commit
        self._send(exc.status, json.dumps({"error": exc.message}).encode(), headers)

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        parts = [unquote(p) for p in url.path.split("/")[1:]]
        try:
            if url.path in ("", "/"):
                return self._send(200, b"sparkfleet lab hub\n", ctype="text/plain")
            if parts[0] == "wheels":
                return self._wheels(parts[1:])
            if parts[0] == "api" and len(parts) >= 4 and parts[1] == "models":
                return self._api(parts[2:], query)
            if parts[0] == "_cdn" and len(parts) == 5:
                return self._cdn(f"{parts[1]}/{parts[2]}", parts[3], parts[4])
            if len(parts) >= 5 and parts[2] == "resolve":
                return self._resolve(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
            raise HubError(404, None, f"no route for {url.path}")
        except HubError as exc:
            self._error(exc)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # ---- API --------------------------------------------------------------------------------
    def _api(self, parts: list[str], query: dict) -> None:
        repo_id = f"{parts[0]}/{parts[1]}"
        repo = self.store.repo(repo_id)
        self.store.check_access(repo_id, repo, self.headers.get("Authorization"))
        rest = parts[2:]
        if not rest:
            return self._model_info(repo_id, repo, "main", query)
        if rest[0] == "revision" and len(rest) >= 2:
            return self._model_info(repo_id, repo, "/".join(rest[1:]), query)
        if rest[0] == "tree" and len(rest) >= 2:
            return self._tree(repo_id, repo, rest[1], "/".join(rest[2:]), query)
        raise HubError(404, None, f"no API route {'/'.join(rest)}")

    def _model_info(self, repo_id: str, repo: dict, revision: str, query: dict) -> None:
        commit = self.store.resolve(repo, revision)
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for e in self.store.listing(repo_id, commit):
            sib: dict = {"rfilename": e["path"]}
            if blobs:
                sib["size"] = e["size"]
                sib["blobId"] = e["pointer_oid"] if e["lfs"] else e["git_oid"]
                if e["lfs"]:
                    sib["lfs"] = {"sha256": e["sha256"], "size": e["size"], "pointerSize": e["pointer_size"]}
            siblings.append(sib)
        info = {
            "_id": repo_id,
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/", maxsplit=1)[0],
            "sha": commit,
            "private": bool(repo.get("private")),
            "gated": False,
            "disabled": False,
            "tags": ["safetensors", "exl3"],
            "library_name": "transformers",
            "siblings": siblings,
            "usedStorage": sum(e["size"] for e in self.store.listing(repo_id, commit)),
        }
        self._json(info)

    def _tree(self, repo_id: str, repo: dict, revision: str, path: str, query: dict) -> None:
        commit = self.store.resolve(repo, revision)
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        prefix = path.strip("/")
        entries: list[dict] = []
        dirs: set[str] = set()
        found = not prefix
        for e in self.store.listing(repo_id, commit):
            p = e["path"]
            if prefix:
                if not p.startswith(prefix + "/"):
                    continue
                found = True
            rel = p[len(prefix) + 1 :] if prefix else p
            segs = rel.split("/")
            for i in range(1, len(segs)):
                d = "/".join(([prefix] if prefix else []) + segs[:i])
                if recursive or i == 1:
                    dirs.add(d)
            if not recursive and len(segs) > 1:
                continue
            item = {
                "type": "file",
                "oid": e["pointer_oid"] if e["lfs"] else e["git_oid"],
                "size": e["size"],
                "path": p,
            }
            if e["lfs"]:
                item["lfs"] = {"oid": e["sha256"], "size": e["size"], "pointerSize": e["pointer_size"]}
            entries.append(item)
        if not found:
            raise HubError(404, "EntryNotFound", f"{path} does not exist at {commit}", commit=commit)
        for d in sorted(dirs):
            oid = hashlib.sha1(f"{commit}:{d}".encode(), usedforsecurity=False).hexdigest()
            entries.append({"type": "directory", "oid": oid, "size": 0, "path": d})
        entries.sort(key=lambda x: x["path"])
        page = int(self.store.settings.get("tree_page", TREE_PAGE))
        cursor = int(query.get("cursor", ["0"])[0] or 0)
        chunk = entries[cursor : cursor + page]
        headers = {}
        if cursor + page < len(entries):
            host = self.headers.get("Host", "localhost")
            nxt = (
                f"http://{host}/api/models/{repo_id}/tree/{quote(revision, safe='')}"
                + (f"/{quote(prefix)}" if prefix else "")
                + f"?recursive={'True' if recursive else 'False'}&cursor={cursor + page}"
            )
            headers["Link"] = f'<{nxt}>; rel="next"'
        self._json(chunk, headers)

    # ---- files ------------------------------------------------------------------------------
    def _resolve(self, repo_id: str, revision: str, path: str) -> None:
        repo = self.store.repo(repo_id)
        self.store.check_access(repo_id, repo, self.headers.get("Authorization"))
        commit = self.store.resolve(repo, revision)
        e = self.store.entry(repo_id, commit, path)
        if e["lfs"]:
            location = f"/_cdn/{repo_id}/{commit}/{e['sha256']}"
            headers = {
                "Location": location,
                "X-Repo-Commit": commit,
                "X-Linked-Etag": _etag(e["sha256"]),
                "X-Linked-Size": str(e["size"]),
                "ETag": _etag(e["pointer_oid"]),
            }
            return self._send(302, b"", headers, ctype="text/plain")
        blob = self.store.blob(repo_id, e["sha256"])
        self._file(blob, {"ETag": _etag(e["git_oid"]), "X-Repo-Commit": commit})

    def _cdn(self, repo_id: str, commit: str, sha256: str) -> None:
        blob = self.store.blob(repo_id, sha256)
        self._file(blob, {"ETag": _etag(sha256), "X-Repo-Commit": commit})

    def _file(self, path: Path, headers: dict) -> None:  # noqa: PLR0912 - Range parsing and a throttled stream, one flow
        size = path.stat().st_size
        start, end = 0, size - 1
        status = 200
        spec = self.headers.get("Range")
        if spec:
            m = RANGE.match(spec.strip())
            if m and (m.group(1) or m.group(2)):
                a, b = m.group(1), m.group(2)
                if a:
                    start, end = int(a), (min(int(b), size - 1) if b else size - 1)
                else:
                    start, end = max(0, size - int(b)), size - 1
                if start >= size or start > end:
                    return self._send(
                        416, b"", {"Content-Range": f"bytes */{size}", **headers}, ctype="text/plain"
                    )
                status = 206
        length = end - start + 1 if size else 0
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            return self._record(status)
        sent = 0
        rate = float(self.store.settings.get("throttle_bytes_per_s") or 0)
        began = time.monotonic()
        try:
            with path.open("rb") as fh:
                fh.seek(start)
                left = length
                while left:
                    block = fh.read(min(CHUNK if not rate else max(4096, int(rate / 20)), left))
                    if not block:
                        break
                    self.wfile.write(block)
                    sent += len(block)
                    left -= len(block)
                    if rate:
                        ahead = sent / rate - (time.monotonic() - began)
                        if ahead > 0:
                            time.sleep(ahead)
        finally:
            self._record(status, sent)

    def _wheels(self, parts: list[str]) -> None:
        root = self.store.wheels
        name = "/".join(p for p in parts if p)
        if not name:
            files = sorted(p.name for p in root.glob("*.whl") if p.is_file())
            links = "".join(f'<a href="{quote(f)}">{html.escape(f)}</a><br>\n' for f in files)
            body = f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode()
            return self._send(200, body, ctype="text/html")
        if "/" in name or name.startswith("."):
            raise HubError(404, None, "no such wheel")
        path = root / name
        if not path.is_file():
            raise HubError(404, None, f"no wheel {name}")
        self._file(path, {})


class HubServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], store: Store):
        handler = type("BoundHandler", (Handler,), {"store": store})
        super().__init__(address, handler)
        self.store = store
        self.requests: deque[dict] = deque(maxlen=10000)
        self._req_lock = threading.Lock()

    def log_request_info(self, info: dict) -> None:
        with self._req_lock:
            self.requests.append(info)

    def request_log(self) -> list[dict]:
        with self._req_lock:
            return list(self.requests)


def build_server(data_dir: Path, host: str, port: int) -> ThreadingHTTPServer:
    """The hub's HF API + wheel server on (host, port) for the repos under data_dir/hf."""
    return HubServer((host, port), Store(Path(data_dir)))


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="serve the lab's stand-in Hugging Face repos")
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    args = ap.parse_args(argv)
    server = build_server(args.data, args.host, args.port)
    print(f"hfserver: http://{args.host}:{server.server_address[1]}/ serving {args.data}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Push a local image to the lab hub's registry over the Registry HTTP API v2.

The host's Docker engine cannot be told to trust the hub's plain-HTTP registry without editing
its daemon configuration, so the lab uploads the image itself: `docker save`, then each layer
(gzip, deterministic) and the config as blobs, then a schema-2 manifest. The registry answers
with the manifest digest, which is what `sparkfleet_pins.base_image.digest` pins.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import io
import json
import subprocess
import tarfile
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_V1 = "application/vnd.docker.container.image.v1+json"
LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"


class RegistryError(RuntimeError):
    pass


class _Client:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict | None = None
    ) -> tuple[int, dict, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def has_blob(self, repo: str, digest: str) -> bool:
        status, _, _ = self.request("HEAD", f"/v2/{repo}/blobs/{digest}")
        return status == 200

    def put_blob(self, repo: str, digest: str, data: bytes) -> None:
        if self.has_blob(repo, digest):
            return
        status, headers, body = self.request("POST", f"/v2/{repo}/blobs/uploads/")
        if status != 202:
            raise RegistryError(f"start upload {repo}: HTTP {status} {body[:200]!r}")
        loc = urlsplit(headers["location"])
        path = loc.path + ("?" + loc.query + "&" if loc.query else "?") + f"digest={digest}"
        status, _, body = self.request(
            "PUT", path, data, {"Content-Type": "application/octet-stream", "Content-Length": str(len(data))}
        )
        if status != 201:
            raise RegistryError(f"upload {digest} to {repo}: HTTP {status} {body[:200]!r}")


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def push(image: str, registry: str, repo: str, tag: str) -> str:
    """Push local `image` as `<registry>/<repo>:<tag>`; return the manifest digest."""
    host, _, port = registry.partition(":")
    client = _Client(host, int(port or 5000))
    with tempfile.TemporaryDirectory(prefix="sparkfleet-push-") as tmp:
        archive = Path(tmp) / "image.tar"
        subprocess.run(["docker", "save", "-o", str(archive), image], check=True, capture_output=True)
        with tarfile.open(archive) as tar:
            manifest = json.load(tar.extractfile("manifest.json"))[0]  # type: ignore[arg-type]
            config = tar.extractfile(manifest["Config"]).read()  # type: ignore[union-attr]
            layers = []
            for name in manifest["Layers"]:
                raw = tar.extractfile(name).read()  # type: ignore[union-attr]
                buf = io.BytesIO()
                with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=1, mtime=0) as gz:
                    gz.write(raw)
                blob = buf.getvalue()
                digest = _sha(blob)
                client.put_blob(repo, digest, blob)
                layers.append({"mediaType": LAYER_GZIP, "size": len(blob), "digest": digest})
    config_digest = _sha(config)
    client.put_blob(repo, config_digest, config)
    doc = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_V2,
        "config": {"mediaType": CONFIG_V1, "size": len(config), "digest": config_digest},
        "layers": layers,
    }
    body = json.dumps(doc, indent=3).encode()
    status, headers, resp = client.request(
        "PUT", f"/v2/{repo}/manifests/{tag}", body, {"Content-Type": MANIFEST_V2}
    )
    if status != 201:
        raise RegistryError(f"put manifest {repo}:{tag}: HTTP {status} {resp[:200]!r}")
    digest = headers.get("docker-content-digest") or _sha(body)
    if digest != _sha(body):
        raise RegistryError(f"registry digest {digest} differs from the manifest sent ({_sha(body)})")
    return digest


def manifest_digest(registry: str, repo: str, tag: str) -> str | None:
    host, _, port = registry.partition(":")
    status, headers, body = _Client(host, int(port or 5000)).request(
        "GET", f"/v2/{repo}/manifests/{tag}", headers={"Accept": MANIFEST_V2}
    )
    if status != 200:
        return None
    return headers.get("docker-content-digest") or _sha(body)

"""Role model_weights on a two-node lab with the hub (molecule/model_weights): the head downloaded the
pinned files from the Hugging Face stand-in, the worker got them over the fabric, and on both nodes every
file is what the manifest says (sha256sum, run here independently of the role's own verification)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.usefixtures("lab")
ROOT = "/srv/sparkfleet/models"


def manifest(host) -> dict:
    return json.loads(host.file(f"{ROOT}/.sparkfleet/manifest.json").content_string)


@pytest.mark.parametrize("name", ["spark1", "spark2"])
def test_every_file_has_the_manifest_sha256(node, name):
    host = node(name)
    files = manifest(host)["files"]
    assert files
    listing = "\n".join(f"{f['sha256']}  {f['path']}" for f in files)
    out = host.run(f"cd {ROOT}/snapshot && sha256sum --quiet -c - <<'EOF'\n{listing}\nEOF")
    assert out.rc == 0, out.stdout + out.stderr
    for f in files[:5]:  # regular files, not hub-cache symlinks (the worker has no hub cache)
        assert not host.file(f"{ROOT}/snapshot/{f['path']}").is_symlink


def test_both_nodes_hold_the_same_manifest_and_record_it(node):
    digests = {name: manifest(node(name))["digest"] for name in ("spark1", "spark2")}
    assert len(set(digests.values())) == 1, digests
    for name in ("spark1", "spark2"):
        record = json.loads(node(name).file("/var/lib/sparkfleet/weights.json").content_string)
        assert json.dumps(record).count(digests["spark1"]) >= 1


def test_only_the_head_talks_to_the_hub(node):
    assert node("spark1").file(f"{ROOT}/hub").is_directory  # the head's Hugging Face cache
    assert not node("spark2").file(f"{ROOT}/hub").exists
    assert node("spark2").run(f"find {ROOT} -name '*.rsync-partial' -o -name '*.incomplete'").stdout == ""

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


def test_an_existing_directory_the_weights_path_points_to_keeps_its_owner_and_mode(lab, play):
    """issue 21 (model_weights_path: /etc once made the admin the owner of /etc): pointed at an existing
    directory owned by root with mode 0755, the role leaves its owner and mode as they were; the directories
    it makes inside (the snapshot, .sparkfleet, the head's hub) are the admin's; the weights verify there."""
    theirs, record = "/srv/theirs", "/srv/theirs-weights.json"
    head = lab.hosts[0]
    try:
        for h in lab.hosts:
            lab.exec(h, "install", "-d", "-o", "root", "-g", "root", "-m", "0755", theirs)
        result = play(
            "playbooks/weights.yml", extravars={"model_weights_path": theirs, "model_weights_record": record}
        )
        assert result.exit_code == 0, " ".join(f"{f.host}: {f.task}: {f.msg}" for f in result.failures)
        for h in lab.hosts:
            admin = lab.exec(h, "stat", "-c", "%U", ROOT).strip()  # the role made ROOT: the admin's
            assert admin != "root"
            assert lab.exec(h, "stat", "-c", "%U:%G %a", theirs).strip() == "root:root 755", h
            for own in ["snapshot", ".sparkfleet"] + (["hub"] if h == head else []):
                assert lab.exec(h, "stat", "-c", "%U %a", f"{theirs}/{own}").strip() == f"{admin} 755", (
                    h,
                    own,
                )
            assert json.loads(lab.exec(h, "cat", record))["verified"] is True
    finally:
        for h in lab.hosts:
            lab.exec(h, "rm", "-rf", theirs, record, check=False)

"""Manifest verification: parallel hashing, the stat cache, safetensors and index checks, repair."""

from __future__ import annotations

import json
import os

import pytest
from ansible_collections.sparkfleet.cluster.plugins.module_utils import weights_manifest, weights_safetensors
from test_weights_support import ROOT, load_module, start_hub

pytest.importorskip("huggingface_hub")
fetch = load_module("weights_fetch")
verify = load_module("weights_verify")
space = load_module("weights_space")


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A downloaded tp3 snapshot (hub manifest with git ids, and the verified one with SHA-256)."""
    base = tmp_path_factory.mktemp("verify")
    hub = start_hub(base / "hub", "tp3", 8)
    m = fetch.run({"mode": "resolve", "endpoint": hub.endpoint, "repos": hub.repos(), "weights_path": "/x"})[
        "manifest"
    ]
    root = base / "node"
    fetch.run({"mode": "download", "endpoint": hub.endpoint, "weights_path": str(root), "manifest": m})
    hub.close()
    return root, m


def params(root, m, **extra):
    return {
        "root": str(root / "snapshot"),
        "files": m["files"],
        "repos": m["repos"],
        "cache_file": str(root / ".sparkfleet" / "cache.json"),
        **extra,
    }


def flip(path, offset):
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0x01]))


def test_a_complete_snapshot_verifies_and_writes_the_manifest(tree, tmp_path):
    root, m = tree
    out = tmp_path / "manifest.json"
    res = verify.run(params(root, m, full=True, release_manifest="SHA256SUMS", write_manifest=str(out)))
    assert res["complete"], res["msg"]
    assert res["hashed_bytes"] == m["total_bytes"]
    doc = json.loads(out.read_text())
    assert doc["digest"] == res["digest"] == weights_manifest.manifest_digest(res["files"])
    assert all(len(f["sha256"]) == 64 for f in doc["files"])
    assert {f"tp3/rank{r}.safetensors" for r in range(3)} <= set(doc["release"])
    assert not set(doc["release"]) & {f["path"] for f in doc["files"]}
    again = verify.run(params(root, m, release_manifest="SHA256SUMS", write_manifest=str(out)))
    assert not again["changed"] and again["hashed_bytes"] == 0 and again["cache_hits"] == len(m["files"])


def test_the_engine_sees_exactly_the_manifest_files(tree):
    import sys

    root, m = tree
    sys.path.insert(0, str(ROOT / "lab/sparkfleet_lab/engine"))
    from tensorfold import weights as engine_weights

    res = verify.run(params(root, m))
    seen = engine_weights.load(root / "snapshot").files
    # the same files, sizes and digests; the manifest digest is over them sorted by path
    assert sorted(seen, key=lambda f: f["path"]) == res["files"]
    assert weights_manifest.manifest_digest(seen) == res["digest"]


def test_parallel_and_serial_hashing_agree(tree):
    root, m = tree
    one = verify.run(params(root, m, full=True, workers=1, cache_file=None))
    many = verify.run(params(root, m, full=True, workers=4, cache_file=None))
    assert one["files"] == many["files"] and one["complete"]


def test_a_flipped_byte_is_caught_even_with_its_mtime_restored_and_removed(tree, tmp_path):
    root, m = tree
    work = tmp_path / "copy"
    import shutil

    shutil.copytree(root / "snapshot", work / "snapshot")
    p = dict(params(work, m), cache_file=str(work / "cache.json"))
    assert verify.run(p)["complete"]
    shard = work / "snapshot" / "model-00002-of-00006.safetensors"
    st = shard.stat()
    flip(shard, st.st_size - 10)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))  # the stat cache must still see it (ctime)
    res = verify.run(p)
    assert [b["path"] for b in res["bad"]] == ["model-00002-of-00006.safetensors"]
    assert "sha256" in res["bad"][0]["reason"] and not res["complete"]
    res = verify.run(dict(p, remove_bad=True))
    assert res["removed"] == ["model-00002-of-00006.safetensors"] and not shard.exists() and res["changed"]
    with pytest.raises(verify.WeightsError, match="not a complete"):
        verify.run(dict(p, require_complete=True))


def test_remove_bad_on_the_head_also_drops_the_blob(tree, tmp_path):
    root, m = tree
    import shutil

    work = tmp_path / "head"
    shutil.copytree(root, work, symlinks=True)
    entry = next(f for f in m["files"] if f["path"] == "config.json")
    blob = work / "hub" / ("models--" + entry["repo_id"].replace("/", "--")) / "blobs" / entry["etag"]
    (work / "snapshot" / "config.json").write_text('{"changed": 1}' + " " * (entry["size"] - 14))
    res = verify.run(dict(params(work, m), hub_cache=str(work / "hub"), remove_bad=True, cache_file=None))
    assert res["removed"] == ["config.json"] and "git blob id" in res["bad"][0]["reason"]
    assert not blob.exists()


def test_safetensors_headers_and_index_shard_counts_are_checked(tree, tmp_path):
    root, m = tree
    import shutil

    work = tmp_path / "st"
    shutil.copytree(root / "snapshot", work / "snapshot")
    shard = work / "snapshot" / "model-00001-of-00006.safetensors"
    data = bytearray(shard.read_bytes())
    data[0:8] = (len(data) + 1).to_bytes(8, "little")  # header length past the end of the file
    shard.write_bytes(bytes(data))
    files = [dict(f, sha256=None, git_oid=None) if f["path"] == shard.name else f for f in m["files"]]
    res = verify.run(dict(params(work, m), files=files, cache_file=None))
    assert any("safetensors" in b["reason"] and b["path"] == shard.name for b in res["bad"])
    # an index that names a shard the snapshot does not have
    idx = work / "snapshot" / "model.safetensors.index.json"
    shard.unlink()
    shutil.copy(root / "snapshot" / shard.name, shard)
    doc = json.loads(idx.read_text())
    doc["weight_map"]["model.extra.weight"] = "model-00007-of-00006.safetensors"
    errors = weights_safetensors.check_indexes(
        str(work / "snapshot"), [{"path": idx.name, "complete": True}], {f["path"] for f in m["files"]}
    )
    assert errors == []  # the original index is consistent
    idx.write_text(json.dumps(doc))
    errors = weights_safetensors.check_indexes(
        str(work / "snapshot"), [{"path": idx.name, "complete": True}], {f["path"] for f in m["files"]}
    )
    assert any("7 shards" in e and "missing" in e for e in errors)
    assert any("the file names say 6" in e for e in errors)
    # the Engram subset: its index names 48 shards, two are there, that is fine when not complete
    eng = [{"path": "engram/model.safetensors.index.json", "complete": False}]
    assert (
        weights_safetensors.check_indexes(str(root / "snapshot"), eng, {f["path"] for f in m["files"]}) == []
    )


def test_missing_files_and_strays(tree, tmp_path):
    """Prune removes a file of an earlier revision (its manifest named it), never one of someone else's."""
    root, m = tree
    import shutil

    work = tmp_path / "prune"
    shutil.copytree(root / "snapshot", work / "snapshot")
    (work / "snapshot" / "old-shard.safetensors").write_bytes(b"x")
    (work / "snapshot" / "notes.txt").write_text("someone else's\n")
    (work / "snapshot" / "tokenizer.json").unlink()
    earlier = work / ".sparkfleet" / "manifest.json"
    earlier.parent.mkdir()
    earlier.write_text(json.dumps({"format": 1, "files": [{"path": "old-shard.safetensors", "size": 1}]}))
    res = verify.run(dict(params(work, m), cache_file=None, prune=True, write_manifest=str(earlier)))
    assert res["missing"] == ["tokenizer.json"] and res["pruned"] == ["old-shard.safetensors"]
    assert (
        res["foreign"] == ["notes.txt"]
        and (work / "snapshot" / "notes.txt").read_text() == "someone else's\n"
    )
    assert not (work / "snapshot" / "old-shard.safetensors").exists()
    assert res["missing_bytes"] == next(f["size"] for f in m["files"] if f["path"] == "tokenizer.json")


def test_prune_removes_a_file_the_stat_cache_recorded_but_not_a_look_alike(tree, tmp_path):
    root, m = tree
    import shutil

    work = tmp_path / "prune-cache"
    shutil.copytree(root / "snapshot", work / "snapshot")
    p = params(work, m)
    assert verify.run(dict(p, full=True))["complete"]  # the cache now records every manifest file
    shard = next(f["path"] for f in m["files"] if f["path"].endswith(".safetensors"))
    # the next revision drops that shard: it is the role's (the cache has its very size, times and inode)
    fewer = dict(p, files=[f for f in m["files"] if f["path"] != shard], prune=True)
    res = verify.run(fewer, check_mode=True)
    assert res["pruned"] == [shard] and (work / "snapshot" / shard).exists()
    res = verify.run(fewer)
    assert res["pruned"] == [shard] and not (work / "snapshot" / shard).exists()
    # a file put there under the same name afterwards is not the one the cache saw: kept
    (work / "snapshot" / shard).write_bytes(b"mine")
    res = verify.run(fewer)
    assert (
        res["pruned"] == []
        and res["foreign"] == [shard]
        and (work / "snapshot" / shard).read_bytes() == b"mine"
    )


def test_a_foreign_file_beside_the_weights_survives_a_verify_that_removes_a_corrupt_shard(tree, tmp_path):
    """issue 21: the role removes only files it can prove are its own (in its snapshot, named by its
    manifest), with the role's own settings (remove_bad and prune both on)."""
    root, m = tree
    import shutil

    work = tmp_path / "foreign"
    shutil.copytree(root, work, symlinks=True)
    snap = work / "snapshot"
    shard = snap / "model-00004-of-00006.safetensors"
    flip(shard, shard.stat().st_size - 3)
    beside_in_snapshot = snap / "README.admin"
    beside_in_snapshot.write_text("not sparkfleet's\n")
    (snap / "extra").mkdir()
    (snap / "extra" / "model-00004-of-00006.safetensors").write_bytes(b"a look-alike name, elsewhere")
    beside_the_weights = work / "my-notes.txt"
    beside_the_weights.write_text("mine\n")
    outside = tmp_path / "outside.safetensors"
    outside.write_text("outside the snapshot\n")
    (snap / "escape").symlink_to(tmp_path)  # a path through a link out of the snapshot is never followed
    files = m["files"] + [{"path": "escape/outside.safetensors", "size": 1, "sha256": "0" * 64}]
    p = dict(params(work, m), files=files, hub_cache=str(work / "hub"), remove_bad=True, prune=True,
             write_manifest=str(work / ".sparkfleet" / "manifest.json"))  # fmt: skip
    res = verify.run(p)
    assert res["removed"] == ["model-00004-of-00006.safetensors"] and not shard.exists()
    assert beside_in_snapshot.read_text() == "not sparkfleet's\n"
    assert (snap / "extra" / "model-00004-of-00006.safetensors").exists()
    assert beside_the_weights.read_text() == "mine\n" and outside.read_text() == "outside the snapshot\n"
    assert res["pruned"] == [] and set(res["foreign"]) >= {
        "README.admin",
        "extra/model-00004-of-00006.safetensors",
    }
    assert any(b["path"] == "escape/outside.safetensors" for b in res["bad"])  # bad, yet not removed
    assert (
        verify.within(str(snap), "../my-notes.txt") is None
        and verify.within(str(snap), "/etc/passwd") is None
    )
    assert verify.within(str(snap), "escape/outside.safetensors") is None


def test_check_mode_removes_nothing(tree, tmp_path):
    root, m = tree
    import shutil

    work = tmp_path / "check"
    shutil.copytree(root / "snapshot", work / "snapshot")
    flip(work / "snapshot" / "model-00003-of-00006.safetensors", 100)
    res = verify.run(dict(params(work, m), cache_file=None, remove_bad=True), check_mode=True)
    assert res["removed"] == ["model-00003-of-00006.safetensors"]
    assert (work / "snapshot" / "model-00003-of-00006.safetensors").exists()


def test_disk_check_refuses_with_the_numbers_and_counts_what_is_there(tree, tmp_path):
    root, m = tree
    ok = space.run({"path": str(root), "files": m["files"], "layout": "head", "margin_bytes": 0})
    assert ok["present_bytes"] == m["total_bytes"] and ok["needed_bytes"] == 0
    empty = tmp_path / "empty"
    res = space.run({"path": str(empty), "files": m["files"], "margin_bytes": 1000})
    assert res["needed_bytes"] == m["total_bytes"] + 1000 and res["present_bytes"] == 0
    # a resumable rsync part counts
    part = empty / "snapshot" / ".rsync-partial" / "model-00001-of-00006.safetensors"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"\0" * 1234)
    assert space.run({"path": str(empty), "files": m["files"]})["present_bytes"] == 1234
    with pytest.raises(space.WeightsError) as exc:
        space.run({"path": str(empty), "files": m["files"], "margin_bytes": 10**18})
    text = str(exc.value)
    assert (
        "not enough disk" in text and str(empty) in text and "free" in text and "GB" in text
    ) or "TB" in text
    assert "Nothing was downloaded or copied" in text

"""The download driver (model_weights_fetch) against the HF stand-in, with the real client."""
# ruff: noqa: S106 - the tokens are test values for the stand-in hub

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from test_weights_support import load_module, module_process, start_hub

pytest.importorskip("huggingface_hub")
fetch = load_module("weights_fetch")
verify = load_module("weights_verify")


@pytest.fixture
def hub(tmp_path):
    h = start_hub(tmp_path / "hub", "tp2", 8)
    yield h
    h.close()


def resolve(hub, **extra):
    params = {"mode": "resolve", "endpoint": hub.endpoint, "token": "", "repos": hub.repos(), **extra}
    params.setdefault("weights_path", "/nonexistent")
    return fetch.run(params)["manifest"]


def download(hub, root, manifest, **extra):
    params = {
        "mode": "download",
        "endpoint": hub.endpoint,
        "token": "",
        "weights_path": str(root),
        "manifest": manifest,
        "workers": 4,
        "retries": 2,
        "cache_file": str(root / ".sparkfleet" / "cache.json"),
        "status_file": str(root / ".sparkfleet" / "progress.json"),
        **extra,
    }
    return fetch.run(params)


def gets(hub):
    return [r for r in hub.requests() if r["method"] == "GET" and r["status"] in (200, 206)]


def test_resolve_records_full_commits_and_applies_allow_patterns(hub):
    m = resolve(hub)
    model, _engram = m["repos"]
    assert model["revision"] == hub.pins["model"]["revision"] and len(model["commit"]) == 40
    assert model["commit"].startswith(model["revision"])
    engram_files = sorted(f["path"] for f in m["files"] if f["repo"] == "engram")
    assert engram_files == [
        "engram/config.json",
        "engram/model-00047-of-00048.safetensors",
        "engram/model-00048-of-00048.safetensors",
        "engram/model.safetensors.index.json",
    ]
    assert not any(os.path.basename(f["path"]).startswith(".") for f in m["files"])
    for f in m["files"]:
        assert bool(f["sha256"]) == f["lfs"] and bool(f["git_oid"]) != f["lfs"]
    assert m["total_bytes"] == sum(f["size"] for f in m["files"])


def test_resolve_refuses_bad_pins_and_patterns_with_the_reason(hub):
    repos = hub.repos()
    repos[0]["revision"] = "0badc0de"
    with pytest.raises(fetch.WeightsError, match="no such revision"):
        fetch.run({"mode": "resolve", "endpoint": hub.endpoint, "repos": repos, "weights_path": "/x"})
    repos = hub.repos()
    repos[1]["allow_patterns"] = ["model-00099-of-00048.safetensors"]
    with pytest.raises(fetch.WeightsError, match="matches no file"):
        fetch.run({"mode": "resolve", "endpoint": hub.endpoint, "repos": repos, "weights_path": "/x"})


def test_token_is_used_for_private_repos_and_never_echoed(hub, tmp_path):
    hub.settings(private=[hub.pins["model"]["repo"]], tokens=["hf_secret_value_123"])
    with pytest.raises(fetch.WeightsError) as exc:
        resolve(hub)
    assert "401" in str(exc.value) and "HF_TOKEN" in str(exc.value)
    with pytest.raises(fetch.WeightsError) as exc:
        resolve(hub, token="hf_not_it")
    assert "hf_not_it" not in str(exc.value)
    m = resolve(hub, token="hf_secret_value_123")
    out = download(hub, tmp_path / "n", m, token="hf_secret_value_123")
    assert "hf_secret_value_123" not in json.dumps(out) + json.dumps(m)
    authed = [r for r in hub.requests() if r["path"].startswith("/api/") or "/resolve/" in r["path"]]
    assert authed and all(r["auth"] for r in authed[-5:])


def test_download_writes_a_real_hf_cache_and_a_hard_linked_plain_snapshot(hub, tmp_path):
    import huggingface_hub as hf

    root = tmp_path / "node"
    m = resolve(hub)
    out = download(hub, root, m)
    assert out["changed"] and len(out["downloaded"]) == len(m["files"])
    for f in m["files"]:
        plain = root / "snapshot" / f["path"]
        blob = root / "hub" / ("models--" + f["repo_id"].replace("/", "--")) / "blobs" / f["etag"]
        assert plain.stat().st_ino == blob.stat().st_ino and not plain.is_symlink()
    # huggingface_hub itself can use the cache offline (HF_HUB_OFFLINE-style)
    model = m["repos"][0]
    path = hf.snapshot_download(
        model["repo"], revision=model["commit"], cache_dir=root / "hub", local_files_only=True
    )
    assert sorted(os.listdir(path)) == sorted(f["repo_path"] for f in m["files"] if f["repo"] == "model")
    ref = root / "hub" / ("models--" + model["repo"].replace("/", "--")) / "refs" / model["revision"]
    assert ref.read_text() == model["commit"]
    progress = json.loads((root / ".sparkfleet" / "progress.json").read_text())
    assert progress["state"] == "done" and progress["done_bytes"] == m["total_bytes"]
    assert "MB/s" in progress["line"] and "ETA" in progress["line"]
    # the digests computed while downloading seed the stat cache: the verify after it hashes nothing
    res = verify.run(
        {
            "root": str(root / "snapshot"),
            "files": m["files"],
            "repos": m["repos"],
            "cache_file": str(root / ".sparkfleet" / "cache.json"),
        }
    )
    assert res["complete"], res["msg"]
    assert res["hashed_bytes"] == 0 and res["cache_hits"] == len(m["files"])


def test_second_download_fetches_nothing(hub, tmp_path):
    root = tmp_path / "node"
    m = resolve(hub)
    download(hub, root, m)
    before = len(gets(hub))
    out = download(hub, root, m)
    assert not out["changed"] and out["downloaded"] == []
    assert len(gets(hub)) == before


def test_a_killed_download_resumes_mid_file_and_keeps_finished_files(tmp_path):
    hub = start_hub(tmp_path / "hub", "tp2", 24)  # shards of ~3 MB: several 1 MiB chunks each
    root = tmp_path / "node"
    m = resolve(hub)
    hub.settings(throttle_bytes_per_s=1_000_000)
    params = {
        "mode": "download",
        "endpoint": hub.endpoint,
        "weights_path": str(root),
        "manifest": m,
        "workers": 2,
        "cache_file": str(root / ".sparkfleet" / "cache.json"),
        "status_file": str(root / ".sparkfleet" / "progress.json"),
    }
    proc = module_process("weights_fetch", params, tmp_path)
    blobs = root / "hub"
    deadline = time.monotonic() + 60
    partials: list = []
    finished: list = []
    while time.monotonic() < deadline:
        partials = [p for p in blobs.rglob("*.incomplete") if p.stat().st_size > 100_000]
        finished = [p for p in blobs.rglob("blobs/*") if not p.name.endswith(".incomplete")]
        if partials and finished:
            break
        time.sleep(0.05)
    assert partials and finished, "the download never had a finished file and a part at once"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    cut = {p.name.removesuffix(".incomplete"): _size(p) for p in blobs.rglob("*.incomplete") if _size(p) > 0}
    done = {p.name for p in blobs.rglob("blobs/*") if not p.name.endswith(".incomplete")}
    hub.settings()
    # the server logs a request when its response ends: let the killed one's streams end first
    settled, last = 0, -1
    while settled < 10:
        n = len(hub.requests())
        settled = settled + 1 if n == last else 0
        last = n
        time.sleep(0.1)
    mark = len(hub.requests())
    out = download(hub, root, m)
    later = [r for r in hub.requests()[mark:] if r["method"] == "GET"]
    fetched_paths = {r["path"] for r in later}
    # finished files are not asked for again
    for etag in done:
        assert not any(p.endswith(etag) for p in fetched_paths), f"{etag} was fetched again"
    # a cut-off file continues where it stopped
    resumed = [r for r in later if r["path"].rsplit("/", 1)[-1] in cut]
    assert resumed, "no part was resumed"
    for r in resumed:
        start = int(r["range"].removeprefix("bytes=").split("-")[0])
        assert start == cut[r["path"].rsplit("/", 1)[-1]] and start > 0
        assert r["status"] == 206
    res = verify.run({"root": str(root / "snapshot"), "files": m["files"], "repos": m["repos"], "full": True})
    assert res["complete"], res["msg"]
    assert set(out["downloaded"]) <= {f["path"] for f in m["files"]}
    hub.close()


def _size(path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def test_a_corrupt_part_is_detected_and_fetched_again_from_zero(hub, tmp_path):
    root = tmp_path / "node"
    m = resolve(hub)
    shard = next(f for f in m["files"] if f["lfs"])
    storage = root / "hub" / ("models--" + shard["repo_id"].replace("/", "--")) / "blobs"
    storage.mkdir(parents=True)
    (storage / (shard["etag"] + ".incomplete")).write_bytes(b"\0" * 4096)  # garbage "prefix"
    download(hub, root, m)
    res = verify.run({"root": str(root / "snapshot"), "files": m["files"], "repos": m["repos"], "full": True})
    assert res["complete"], res["msg"]
    asked = [r for r in hub.requests() if r["method"] == "GET" and r["path"].endswith(shard["etag"])]
    assert [r["range"] for r in asked][-1] is None  # the last try started from the first byte


def test_check_mode_says_what_it_would_download_and_downloads_nothing(hub, tmp_path):
    root = tmp_path / "node"
    m = resolve(hub)
    out = fetch.run({"mode": "download", "weights_path": str(root), "manifest": m}, check_mode=True)
    assert out["changed"] and len(out["downloaded"]) == len(m["files"])
    assert not (root / "hub").exists()

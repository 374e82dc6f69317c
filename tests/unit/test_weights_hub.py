"""The lab's HF stand-in, driven by the real huggingface_hub client on loopback."""
# ruff: noqa: S310, S106 - urlopen only reaches the test's own loopback hub; the tokens are test values

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request

import pytest
from test_weights_support import ENGRAM_PATTERNS, start_hub

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
hf = pytest.importorskip("huggingface_hub")
from huggingface_hub import errors  # noqa: E402


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = start_hub(tmp_path_factory.mktemp("hub"), "tp3", 4)
    yield h
    h.close()


def api(hub, token=False):
    return hf.HfApi(endpoint=hub.endpoint, token=token)


def test_short_revision_resolves_to_the_full_commit_with_file_metadata(hub):
    short = hub.pins["model"]["revision"]
    assert len(short) == 8
    info = api(hub).model_info(hub.pins["model"]["repo"], revision=short, files_metadata=True)
    assert len(info.sha) == 40 and info.sha.startswith(short)
    shards = [s for s in info.siblings if s.rfilename.endswith(".safetensors")]
    assert len(shards) == 6
    for s in shards:
        blob = hub.data_dir / "hf" / hub.pins["model"]["repo"] / "blobs" / s.lfs.sha256
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == s.lfs.sha256
        assert s.size == blob.stat().st_size == s.lfs.size
    small = {s.rfilename: s for s in info.siblings}["config.json"]
    assert small.lfs is None and len(small.blob_id) == 40


def test_main_holds_only_the_card_as_on_the_real_repos(hub, tmp_path):
    path = hf.snapshot_download(
        hub.pins["model"]["repo"], revision="main", cache_dir=tmp_path, endpoint=hub.endpoint, token=False
    )
    assert sorted(os.listdir(path)) == [".gitattributes", "README.md"]


def test_snapshot_download_with_allow_patterns_gets_only_the_engram_subset(hub, tmp_path):
    path = hf.snapshot_download(
        hub.pins["engram"]["repo"],
        revision=hub.pins["engram"]["revision"],
        cache_dir=tmp_path,
        endpoint=hub.endpoint,
        token=False,
        allow_patterns=ENGRAM_PATTERNS,
    )
    assert sorted(os.listdir(path)) == sorted(ENGRAM_PATTERNS)
    # the cache layout is the real one: snapshot symlinks into blobs named by etag
    link = os.path.join(path, "model-00047-of-00048.safetensors")
    assert os.path.islink(link) and "/blobs/" in os.path.realpath(link)


def test_lfs_files_redirect_with_linked_etag_and_the_client_follows(hub):
    repo, rev = hub.pins["model"]["repo"], hub.pins["model"]["revision"]
    url = hf.hf_hub_url(repo, "model-00001-of-00006.safetensors", revision=rev, endpoint=hub.endpoint)
    req = urllib.request.Request(url, method="HEAD")

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    with pytest.raises(urllib.error.HTTPError) as exc:
        opener.open(req)
    assert exc.value.code == 302
    headers = exc.value.headers
    assert headers["X-Linked-Etag"].strip('"') == headers["Location"].rsplit("/", 1)[1]
    assert len(headers["X-Repo-Commit"]) == 40
    meta = hf.get_hf_file_metadata(url, token=False)
    assert meta.etag == headers["X-Linked-Etag"].strip('"')
    assert meta.commit_hash == headers["X-Repo-Commit"]
    assert meta.size == int(headers["X-Linked-Size"])


def test_range_requests_answer_206_and_bad_ranges_416(hub):
    repo, rev = hub.pins["model"]["repo"], hub.pins["model"]["revision"]
    url = hf.hf_hub_url(repo, "model.safetensors.index.json", revision=rev, endpoint=hub.endpoint)
    whole = urllib.request.urlopen(url).read()
    for spec, want in (("bytes=10-", whole[10:]), ("bytes=3-7", whole[3:8]), ("bytes=-5", whole[-5:])):
        resp = urllib.request.urlopen(urllib.request.Request(url, headers={"Range": spec}))
        assert resp.status == 206
        assert resp.read() == want
        assert resp.headers["Content-Range"].endswith(f"/{len(whole)}")
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(urllib.request.Request(url, headers={"Range": f"bytes={len(whole) + 5}-"}))
    assert exc.value.code == 416


def test_unknown_revision_repo_and_file_map_to_the_clients_errors(hub, tmp_path):
    repo = hub.pins["model"]["repo"]
    with pytest.raises(errors.RevisionNotFoundError):
        api(hub).model_info(repo, revision="deadbeef")
    with pytest.raises(errors.RepositoryNotFoundError):
        api(hub).model_info("sparkfleet-lab/no-such-repo")
    with pytest.raises(errors.EntryNotFoundError):
        hf.hf_hub_download(
            repo,
            "nope.bin",
            revision=hub.pins["model"]["revision"],
            endpoint=hub.endpoint,
            cache_dir=tmp_path,
        )


def test_private_repo_needs_a_valid_token(hub):
    repo = hub.pins["engram"]["repo"]
    hub.settings(private=[repo], tokens=["hf_lab_secret"])
    try:
        with pytest.raises(errors.HfHubHTTPError) as exc:
            api(hub).model_info(repo, revision="main")
        assert exc.value.response.status_code == 401
        with pytest.raises(errors.HfHubHTTPError) as exc:
            api(hub, token="hf_wrong").model_info(repo, revision="main")
        assert exc.value.response.status_code == 401
        assert api(hub, token="hf_lab_secret").model_info(repo, revision="main").sha
    finally:
        hub.settings()


def test_tree_listing_paginates_like_the_hub(hub):
    hub.settings(tree_page=4)
    try:
        repo, rev = hub.pins["model"]["repo"], hub.pins["model"]["revision"]
        files = [
            f.path for f in api(hub).list_repo_tree(repo, revision=rev, recursive=True) if hasattr(f, "size")
        ]
        info = api(hub).model_info(repo, revision=rev)
        assert sorted(f for f in files if not f.endswith("tp3")) == sorted(s.rfilename for s in info.siblings)
        assert "tp3/rank1.keys" in files
    finally:
        hub.settings()


def test_wheel_directory_lists_wheels_for_pip(hub):
    wheels = hub.data_dir / "wheels"
    wheels.mkdir(exist_ok=True)
    (wheels / "demo-1.0-py3-none-any.whl").write_bytes(b"PK")
    (wheels / "demo.whl.partial").write_bytes(b"x")
    page = urllib.request.urlopen(f"{hub.endpoint}/wheels/").read().decode()
    assert 'href="demo-1.0-py3-none-any.whl"' in page
    assert "partial" not in page
    assert urllib.request.urlopen(f"{hub.endpoint}/wheels/demo-1.0-py3-none-any.whl").read() == b"PK"

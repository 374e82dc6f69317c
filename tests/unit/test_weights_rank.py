"""TP3 rank files: deterministic build, the release manifest's SHA-256, pluggable builder."""

from __future__ import annotations

import json
import shlex
import struct
import sys

import pytest
from ansible_collections.sparkfleet.cluster.plugins.module_utils import weights_main, weights_rank_files
from test_weights_support import load_module, start_hub

pytest.importorskip("huggingface_hub")
fetch = load_module("weights_fetch")
verify = load_module("weights_verify")
rank_mod = load_module("weights_rank")


@pytest.fixture(scope="module")
def snap(tmp_path_factory):
    base = tmp_path_factory.mktemp("rank")
    hub = start_hub(base / "hub", "tp3", 8)
    m = fetch.run(
        {"mode": "resolve", "endpoint": hub.endpoint, "repos": hub.repos(engram=False), "weights_path": "/x"}
    )["manifest"]
    root = base / "node"
    fetch.run({"mode": "download", "endpoint": hub.endpoint, "weights_path": str(root), "manifest": m})
    hub.close()
    res = verify.run({"root": str(root / "snapshot"), "files": m["files"], "release_manifest": "SHA256SUMS"})
    assert res["complete"], res["msg"]
    return root / "snapshot", res["release"]


def build(snap, tmp_path, rank=1, **extra):
    snapshot, release = snap
    params = {
        "snapshot": str(snapshot),
        "keys": f"tp3/rank{rank}.keys",
        "rank": rank,
        "index": "model.safetensors.index.json",
        "dest": str(tmp_path / f"rank{rank}.safetensors"),
        "expected_sha256": release[f"tp3/rank{rank}.safetensors"],
        "builder": "builtin",
        "cache_file": str(tmp_path / "rank-cache.json"),
        **extra,
    }
    return rank_mod.run(params), params


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_builtin_builder_matches_the_release_manifest(snap, tmp_path, rank):
    out, params = build(snap, tmp_path, rank)
    assert out["changed"] and out["sha256"] == params["expected_sha256"]
    assert out["build"] and out["present"]
    assert not (tmp_path / f"rank{rank}.safetensors.partial").exists()


def test_the_rank_file_is_a_valid_safetensors_file_in_keys_order(snap, tmp_path):
    snapshot, _ = snap
    build(snap, tmp_path, 2)
    data = (tmp_path / "rank2.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    assert (8 + n) % 8 == 0
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__")
    assert meta["rank"] == "2" and meta["format"] == "pt" and len(meta["keys_sha256"]) == 64
    keys = [k for k in (snapshot / "tp3/rank2.keys").read_text().splitlines() if k]
    assert list(header) == keys
    end = 0
    for name in keys:  # contiguous, no holes (safetensors' own rule)
        b, e = header[name]["data_offsets"]
        assert b == end
        end = e
    assert 8 + n + end == len(data)


def test_an_existing_good_rank_file_is_kept_and_a_bad_one_rebuilt(snap, tmp_path):
    build(snap, tmp_path, 0)
    again, _ = build(snap, tmp_path, 0)
    assert not again["changed"] and not again["build"] and again["present"]
    dest = tmp_path / "rank0.safetensors"
    with dest.open("r+b") as fh:
        fh.seek(-1, 2)
        last = fh.read(1)
        fh.seek(-1, 2)
        fh.write(bytes([last[0] ^ 0xFF]))
    fixed, params = build(snap, tmp_path, 0)
    assert fixed["changed"] and fixed["sha256"] == params["expected_sha256"]


def test_check_mode_says_it_would_build_and_writes_nothing(snap, tmp_path):
    snapshot, release = snap
    out = rank_mod.run(
        {
            "snapshot": str(snapshot),
            "keys": "tp3/rank2.keys",
            "rank": 2,
            "dest": str(tmp_path / "rank2.safetensors"),
            "expected_sha256": release["tp3/rank2.safetensors"],
        },
        check_mode=True,
    )
    assert out["build"] and not out["present"] and not (tmp_path / "rank2.safetensors").exists()


def test_a_mismatch_is_a_clear_error_and_leaves_no_file(snap, tmp_path):
    with pytest.raises(rank_mod.WeightsError) as exc:
        build(snap, tmp_path, 1, expected_sha256="0" * 64)
    assert "release manifest says" in str(exc.value) and "model_weights_rank_builder" in str(exc.value)
    assert not (tmp_path / "rank1.safetensors").exists()
    assert not (tmp_path / "rank1.safetensors.partial").exists()


def test_a_command_builder_gets_the_placeholders_and_is_checked(snap, tmp_path):
    build(snap, tmp_path / "ref", 1)
    good = tmp_path / "ref" / "rank1.safetensors"
    copy = f"{shlex.quote(sys.executable)} -c 'import shutil,sys; shutil.copy(sys.argv[1], sys.argv[2])'"
    out, _ = build(snap, tmp_path / "cmd", 1, builder=f"{copy} {good} {{output}}")
    assert out["changed"] and out["builder"] == "command"
    seen = tmp_path / "seen.json"
    record = (
        f"{shlex.quote(sys.executable)} -c "
        "'import json,sys; json.dump(sys.argv[1:], open(sys.argv[1], \"w\"))' "
        f"{seen} {{snapshot}} {{keys}} {{rank}} {{output}}"
    )
    with pytest.raises(rank_mod.WeightsError, match="wrote no"):
        build(snap, tmp_path / "cmd2", 1, builder=record)
    args = json.loads(seen.read_text())
    assert args[1].endswith("snapshot") and args[2].endswith("tp3/rank1.keys") and args[3] == "1"
    assert args[4].endswith("rank1.safetensors.partial")
    wrong = f'{shlex.quote(sys.executable)} -c \'open("{{output}}", "wb").write(b"nope")\''
    with pytest.raises(rank_mod.WeightsError, match="release manifest says"):
        build(snap, tmp_path / "cmd3", 1, builder=wrong)


def test_keys_naming_an_unknown_tensor_or_twice_are_refused(snap):
    snapshot, _ = snap
    with pytest.raises(weights_main.WeightsError, match="listed twice"):
        weights_rank_files.parse_keys("a\nb\na\n")
    with pytest.raises(weights_main.WeightsError, match=r"not in model\.safetensors\.index\.json"):
        weights_rank_files.plan_rank_file(
            str(snapshot), "model.nope.weight\n", 0, "model.safetensors.index.json"
        )

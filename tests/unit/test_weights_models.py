"""The generated stand-in repos: real safetensors, consistent indexes, deterministic pins."""

from __future__ import annotations

import hashlib
import json

import pytest
import yaml
from ansible_collections.sparkfleet.cluster.plugins.module_utils import (
    weights_hash,
    weights_manifest,
    weights_rank_files,
    weights_safetensors,
)
from sparkfleet_lab.hub import models
from test_weights_support import ROLE, ROOT, load_module


def listing(data_dir, repo, commit):
    return json.loads((data_dir / "hf" / repo / "commits" / f"{commit}.json").read_text())


def full_commit(data_dir, repo, short):
    commits = json.loads((data_dir / "hf" / repo / "repo.json").read_text())["commits"]
    (commit,) = [c for c in commits if c.startswith(short)]
    return commit


@pytest.mark.parametrize("topology", ["tp2", "tp3"])
def test_same_inputs_give_the_same_bytes_and_pins(tmp_path, topology):
    a = models.generate(tmp_path / "a", topology, 4)
    b = models.generate(tmp_path / "b", topology, 4)
    assert a == b
    for key in ("model", "engram"):
        repo = a[key]["repo"]
        c = full_commit(tmp_path / "a", repo, a[key]["revision"])
        assert listing(tmp_path / "a", repo, c) == listing(tmp_path / "b", repo, c)
    assert models.generate(tmp_path / "c", topology, 6)["model"] != a["model"]  # size changes the commit
    again = models.generate(tmp_path / "a", topology, 4)  # idempotent in place
    assert again == a


def test_files_are_real_safetensors_with_consistent_indexes(tmp_path):
    pins = models.generate(tmp_path, "tp3", 4)
    repo = pins["model"]["repo"]
    commit = full_commit(tmp_path, repo, pins["model"]["revision"])
    snap = tmp_path / "snap"
    for e in listing(tmp_path, repo, commit):
        blob = tmp_path / "hf" / repo / "blobs" / e["sha256"]
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == e["sha256"]
        assert weights_hash.git_blob_oid(str(blob)) == e["git_oid"]
        (snap / e["path"]).parent.mkdir(parents=True, exist_ok=True)
        (snap / e["path"]).write_bytes(blob.read_bytes())
        if e["path"].endswith(".safetensors"):
            header, start = weights_safetensors.read_safetensors_header(str(snap / e["path"]))
            ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
            assert start % 8 == 0 and start + max(ends) == e["size"]
    present = {str(p.relative_to(snap)) for p in snap.rglob("*") if p.is_file()}
    assert (
        weights_safetensors.check_indexes(str(snap), [{"path": "model.safetensors.index.json"}], present)
        == []
    )
    sums = weights_manifest.parse_sha256sums((snap / "SHA256SUMS").read_text())
    assert {f"tp3/rank{r}.safetensors" for r in range(3)} <= set(sums)
    for r in range(3):
        keys = weights_rank_files.parse_keys((snap / f"tp3/rank{r}.keys").read_text())
        index = json.loads((snap / "model.safetensors.index.json").read_text())["weight_map"]
        assert all(k in index for k in keys)
        assert keys != sorted(keys)  # numeric layer order, not the index's sorted order


def test_engram_repo_has_48_shards_and_main_only_the_card(tmp_path):
    pins = models.generate(tmp_path, "tp2", 4)
    repo = pins["engram"]["repo"]
    commit = full_commit(tmp_path, repo, pins["engram"]["revision"])
    names = [e["path"] for e in listing(tmp_path, repo, commit)]
    assert sum(n.endswith("-of-00048.safetensors") for n in names) == 48
    main = json.loads((tmp_path / "hf" / repo / "repo.json").read_text())["refs"]["main"]
    assert [e["path"] for e in listing(tmp_path, repo, main)] == [".gitattributes", "README.md"]


def test_argument_spec_matches_the_defaults():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"][
        "options"
    ]
    assert set(spec) == set(defaults)
    for name, option in spec.items():
        assert option.get("default") == defaults[name], name
        assert option.get("description"), name
    assert spec["model_weights_hf_token"].get("no_log") is True


def test_inventories_only_set_variables_the_role_knows():
    defaults = set(yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()))
    for path in [
        ROOT / "inventory" / "tp2" / "group_vars" / "all" / "weights.yml",
        ROOT / "inventory" / "tp3" / "group_vars" / "all" / "weights.yml",
        ROOT / "lab" / "sparkfleet_lab" / "group_vars" / "weights.yml",
    ]:
        unknown = set(yaml.safe_load(path.read_text())) - defaults
        assert not unknown, f"{path}: {unknown}"


def test_the_wait_module_reads_job_and_progress_files(tmp_path):
    wait = load_module("weights_wait")
    job = tmp_path / "job"
    status = tmp_path / "status.json"
    job.write_text(json.dumps({"started": True, "finished": False, "ansible_job_id": "1"}))
    status.write_text(json.dumps({"line": "download: 1 GB / 2 GB"}))
    out = wait.poll({"results_file": str(job), "status_file": str(status)})
    assert not out["finished"] and out["progress"]["line"].startswith("download")
    job.write_text(json.dumps({"changed": True, "msg": "done"}))
    out = wait.poll({"results_file": str(job), "status_file": str(status), "cleanup": True})
    assert out["finished"] and out["job"]["msg"] == "done" and not job.exists()

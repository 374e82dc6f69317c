"""The engine double's git repository: one commit per engine version on its own branch, deterministic, and
pip-installable at a commit as the real engine is (`tensorfold @ git+<repo>@<commit>`)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from sparkfleet_lab import engine as engine_repo


def git(bare: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=bare, capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("git")
    made = engine_repo.make_repo(root)
    return root, made


def test_one_commit_per_version_on_its_own_branch(repo):
    root, made = repo
    bare = root / made["repo"]
    assert (bare / "git-daemon-export-ok").exists()
    assert made["branches"] == {"0.6.4": "dsv41-0.6.4", "0.6.6": "dsv41-0.6.6", "tp3-recipe": "tp3-recipe"}
    assert len(set(made["commits"].values())) == 3 and made["commit"] == made["commits"]["0.6.6"]
    for version, commit in made["commits"].items():
        assert git(bare, "rev-parse", made["branches"][version]).strip() == commit
        assert git(bare, "rev-list", "--count", commit).strip() == "1"
        build = git(bare, "show", f"{commit}:tensorfold/_build.py")
        assert f'ENGINE = "{version}"' in build
        files = git(bare, "ls-tree", "-r", "--name-only", commit).split()
        assert {"pyproject.toml", "README.md", "tensorfold/cli.py", "tensorfold/cli_args.py"} <= set(files)
        assert not [f for f in files if "__pycache__" in f or f.endswith(("local.py", ".pyc"))]
        assert "Dockerfile" not in files  # the recipe keeps the Dockerfile, not the engine


def test_make_repo_is_deterministic_and_idempotent(repo, tmp_path):
    root, made = repo
    assert engine_repo.make_repo(tmp_path) == made
    assert engine_repo.make_repo(root) == made


def test_add_commit_moves_one_version_s_branch(tmp_path):
    made = engine_repo.make_repo(tmp_path)
    bare = tmp_path / made["repo"]
    new = engine_repo.add_commit(tmp_path, note="pin change", version="tp3-recipe")
    assert git(bare, "rev-parse", "tp3-recipe").strip() == new != made["commits"]["tp3-recipe"]
    assert git(bare, "rev-parse", "dsv41-0.6.6").strip() == made["commits"]["0.6.6"]
    assert "REVISION = 1" in git(bare, "show", f"{new}:tensorfold/_build.py")
    again = tmp_path / "again"
    engine_repo.make_repo(again)
    assert engine_repo.add_commit(again, note="pin change", version="tp3-recipe") == new
    with pytest.raises(engine_repo.RepoError, match="unknown engine version"):
        engine_repo.add_commit(tmp_path, version="0.7")


def _builder() -> str | None:
    """A python whose setuptools builds a wheel without build isolation (>= 70.1, or with `wheel`)."""
    for python in ("python3", "/usr/bin/python3"):
        found = shutil.which(python)
        probe = (
            "import setuptools as s, importlib.util as u; v = tuple(map(int, s.__version__.split('.')[:2])); "
        )
        probe += "assert v >= (61, 0) and (v >= (70, 1) or u.find_spec('wheel'))"
        if found and subprocess.run([found, "-c", probe], capture_output=True, check=False).returncode == 0:
            return found
    return None


@pytest.mark.skipif(_builder() is None, reason="no python here with setuptools that builds wheels offline")
@pytest.mark.parametrize("version", ["0.6.4", "tp3-recipe"])
def test_pip_installs_a_version_at_its_commit(repo, tmp_path, version):
    root, made = repo
    commit = made["commits"][version]
    url = f"git+file://localhost{root / made['repo']}@{commit}"
    target = tmp_path / "site"
    proc = subprocess.run(
        [_builder(), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-build-isolation",
         "--no-deps", "--no-index", "--target", str(target), f"tensorfold @ {url}"],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (direct,) = target.glob("tensorfold-*.dist-info/direct_url.json")
    assert json.loads(direct.read_text())["vcs_info"]["commit_id"] == commit
    out = subprocess.run(
        [str(target / "bin" / "tensorfold"), "--version"],
        capture_output=True, text=True, check=False, env={"PYTHONPATH": str(target)},
    )  # fmt: skip
    want = "0.6.4" if version == "0.6.4" else "0.6.6+tp3recipe"
    assert out.stdout.strip() == f"tensorfold {want}", out.stderr

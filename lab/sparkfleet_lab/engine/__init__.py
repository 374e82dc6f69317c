"""The engine double's git repository, made for the lab hub's `git daemon` (controller side).

The repository is a pip-installable project as the real engine's is (pyproject.toml, package
`tensorfold`, console script `tensorfold`), one commit per engine version, each on its own branch:
`dsv41-0.6.4`, `dsv41-0.6.6`, `tp3-recipe`. A version's tree is the double's source with
`tensorfold/_build.py` naming the version. Commits use fixed authors and dates, so the same source
always gives the same 40-hex commits, which the lab pins as an admin pins TensorFold.

- `make_repo(git_root)` creates (or finds) the bare repo; returns the commit of every version.
- `add_commit(git_root, note, version)` adds a later commit on a version's branch (a pin change).
- `materialize(version, dest)` writes a version's tree to a directory (LocalCluster runs it from there).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = "sparkfleet/tensorfold.git"
SOURCES = ("pyproject.toml", "README.md", "tensorfold")
BRANCHES = {"0.6.4": "dsv41-0.6.4", "0.6.6": "dsv41-0.6.6", "tp3-recipe": "tp3-recipe"}
VERSION_BY_TOPOLOGY = {"tp2": "0.6.6", "tp3": "tp3-recipe"}
DEFAULT_VERSION = "0.6.6"
AUTHOR = ("sparkfleet lab", "lab@sparkfleet.invalid")
EPOCH = 1_792_195_200  # 2026-10-17T00:00:00Z, the day of the TP2 recipe's measurements


class RepoError(RuntimeError):
    pass


def _env(day: int) -> dict[str, str]:
    stamp = f"{EPOCH + day * 86400} +0000"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_AUTHOR_NAME=AUTHOR[0],
        GIT_AUTHOR_EMAIL=AUTHOR[1],
        GIT_COMMITTER_NAME=AUTHOR[0],
        GIT_COMMITTER_EMAIL=AUTHOR[1],
        GIT_AUTHOR_DATE=stamp,
        GIT_COMMITTER_DATE=stamp,
        GIT_CONFIG_GLOBAL=os.devnull,  # no user config (signing, hooks, templates) in the commit
        GIT_CONFIG_NOSYSTEM="1",
    )
    return env


def _git(*args: str, cwd: Path, day: int = 0) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, env=_env(day), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RepoError(f"git {' '.join(args)} in {cwd}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def source_files() -> list[Path]:
    """The engine repository's files, relative to this directory, sorted."""
    out: list[Path] = []
    for name in SOURCES:
        path = HERE / name
        if path.is_file():
            out.append(Path(name))
        else:
            out += sorted(
                p.relative_to(HERE)
                for p in path.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
            )
    return out


def build_file(version: str, revision: int = 0) -> str:
    if version not in BRANCHES:
        raise RepoError(f"unknown engine version {version!r}; known: {', '.join(BRANCHES)}")
    return (
        '"""The engine version this tree is (the lab writes this file on each version\'s branch)."""\n\n'
        f'ENGINE = "{version}"\n'
        f"REVISION = {revision}  # a later lab commit on the same branch (engine.add_commit) counts up\n"
    )


def materialize(version: str, dest: Path, revision: int = 0) -> Path:
    """Version `version`'s tree under `dest` (made or refreshed); -> dest."""
    dest.mkdir(parents=True, exist_ok=True)
    for rel in source_files():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(HERE / rel, target)
        target.chmod(0o644)
    (dest / "tensorfold" / "_build.py").write_text(build_file(version, revision))
    return dest


def _bare(git_root: Path) -> Path:
    bare = git_root / REPO
    if not (bare / "HEAD").exists():
        bare.mkdir(parents=True, exist_ok=True)
        _git("init", "-q", "--bare", "-b", BRANCHES[DEFAULT_VERSION], str(bare), cwd=git_root)
    (bare / "git-daemon-export-ok").touch()
    return bare


def _has(bare: Path, commit: str) -> bool:
    proc = subprocess.run(
        ["git", "cat-file", "-e", f"{commit}^{{commit}}"],
        cwd=bare,
        env=_env(0),
        capture_output=True,
        check=False,
    )
    return proc.returncode == 0


def _heads(bare: Path) -> dict[str, str]:
    out = _git("for-each-ref", "--format=%(refname:short) %(objectname)", "refs/heads", cwd=bare)
    return dict(line.split(" ", 1) for line in out.splitlines() if line)


def make_repo(git_root: Path) -> dict:
    """Create (or find) the bare repo under `git_root`.

    Returns {"repo": its path under git_root, "commits": {version: 40-hex}, "branches": {version: branch},
    "commit": the default version's commit}.
    """
    git_root = Path(git_root)
    git_root.mkdir(parents=True, exist_ok=True)
    bare = _bare(git_root)
    commits, branches = {}, {}
    for day, (version, name) in enumerate(BRANCHES.items()):
        branch = name
        with tempfile.TemporaryDirectory(prefix="sparkfleet-engine-src-") as tmp:
            work = materialize(version, Path(tmp))
            _git("init", "-q", "-b", branch, cwd=work)
            _git("add", "--all", cwd=work)
            _git(
                "commit",
                "-q",
                "-m",
                f"TensorFold double, engine {version} (sparkfleet lab)",
                cwd=work,
                day=day,
            )
            commit = _git("rev-parse", "HEAD", cwd=work)
            heads = _heads(bare)
            if branch in heads and heads[branch] != commit:
                branch = f"{branch}-{commit[:12]}"  # never rewrite an existing branch
            if not _has(bare, commit) or branch not in heads:
                _git("push", "-q", str(bare), f"HEAD:refs/heads/{branch}", cwd=work, day=day)
        commits[version], branches[version] = commit, branch
    return {"repo": REPO, "commit": commits[DEFAULT_VERSION], "commits": commits, "branches": branches}


def add_commit(git_root: Path, note: str = "bump version", version: str = DEFAULT_VERSION) -> str:
    """A later commit on `version`'s branch: its version gets a +labN suffix. Returns its 40-hex id."""
    bare = _bare(Path(git_root))
    branch = BRANCHES.get(version)
    if branch is None:
        raise RepoError(f"unknown engine version {version!r}; known: {', '.join(BRANCHES)}")
    with tempfile.TemporaryDirectory(prefix="sparkfleet-engine-bump-") as tmp:
        work = Path(tmp) / "src"
        _git("clone", "-q", "--branch", branch, str(bare), str(work), cwd=Path(tmp))
        count = int(_git("rev-list", "--count", "HEAD", cwd=work))
        build = work / "tensorfold" / "_build.py"
        build.write_text(re.sub(r"REVISION = \d+", f"REVISION = {count}", build.read_text()))
        _git("commit", "-q", "-am", f"{note} (+{count})", cwd=work, day=count + len(BRANCHES))
        commit = _git("rev-parse", "HEAD", cwd=work)
        _git("push", "-q", "origin", f"HEAD:refs/heads/{branch}", cwd=work, day=count)
    return commit

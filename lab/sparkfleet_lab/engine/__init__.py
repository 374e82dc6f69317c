"""The stand-in engine's git repository, made for the lab hub's `git daemon` (controller side).

`make_repo(git_root)` commits the engine source next to this file (Dockerfile, README.md, bin/,
tensorfold/) with fixed author, committer and dates, so the same source always gives the same
40-hex commit, which the lab pins like an admin pins TensorFold. `add_commit(git_root)` adds a
later commit (a version bump) so tests can prove that a pin change rebuilds and reships.
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
BRANCH = "main"
SOURCES = ("Dockerfile", "README.md", "bin", "tensorfold")
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


def _bare(git_root: Path) -> Path:
    bare = git_root / REPO
    if not (bare / "HEAD").exists():
        bare.mkdir(parents=True, exist_ok=True)
        _git("init", "-q", "--bare", "-b", BRANCH, str(bare), cwd=git_root)
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


def make_repo(git_root: Path) -> dict:
    """Create (or find) the bare repo under `git_root`.

    Returns {"repo": its path under git_root, "commit": the 40-hex commit of this source}.
    """
    git_root = Path(git_root)
    git_root.mkdir(parents=True, exist_ok=True)
    bare = _bare(git_root)
    with tempfile.TemporaryDirectory(prefix="sparkfleet-engine-src-") as tmp:
        work = Path(tmp)
        _git("init", "-q", "-b", BRANCH, cwd=work)
        for rel in source_files():
            dest = work / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(HERE / rel, dest)
            dest.chmod(0o755 if os.access(HERE / rel, os.X_OK) else 0o644)
        _git("add", "--all", cwd=work)
        _git("commit", "-q", "-m", "TensorFold stand-in for the sparkfleet lab", cwd=work)
        commit = _git("rev-parse", "HEAD", cwd=work)
        if not _has(bare, commit):
            heads = _git("for-each-ref", "--format=%(refname)", "refs/heads", cwd=bare)
            ref = BRANCH if not heads else f"lab-{commit[:12]}"  # never rewrite an existing branch
            _git("push", "-q", str(bare), f"HEAD:refs/heads/{ref}", cwd=work)
    return {"repo": REPO, "commit": commit}


def add_commit(git_root: Path, note: str = "bump version") -> str:
    """A later commit on the branch: the stand-in's version gets a +N suffix. Returns its 40-hex id."""
    bare = _bare(Path(git_root))
    with tempfile.TemporaryDirectory(prefix="sparkfleet-engine-bump-") as tmp:
        work = Path(tmp) / "src"
        _git("clone", "-q", "--branch", BRANCH, str(bare), str(work), cwd=Path(tmp))
        count = int(_git("rev-list", "--count", "HEAD", cwd=work))
        init = work / "tensorfold" / "__init__.py"
        text = re.sub(
            r'__version__ = "([0-9.]+)(\+\d+)?"', rf'__version__ = "\g<1>+{count}"', init.read_text()
        )
        init.write_text(text)
        _git("commit", "-q", "-am", f"{note} (+{count})", cwd=work, day=count)
        commit = _git("rev-parse", "HEAD", cwd=work)
        _git("push", "-q", "origin", f"HEAD:refs/heads/{BRANCH}", cwd=work, day=count)
    return commit

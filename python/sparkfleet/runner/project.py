"""Where a run happens: the sparkfleet checkout, the playbook and inventories in it, and a fresh
private data dir per run under the runs root (default `<project>/.cache/runs/`, env
`SPARKFLEET_RUNS_DIR`), named `<UTC timestamp>-<verb>`; only the newest `SPARKFLEET_KEEP_RUNS`
(default 20) are kept."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
from pathlib import Path

from sparkfleet.runner.result import RunnerError

DEFAULT_KEEP_RUNS = 20
_RUN_DIR_RE = re.compile(r"^\d{8}T\d{6}Z")


def is_project(path: Path) -> bool:
    return (path / "site.yml").is_file() and (path / "ansible.cfg").is_file()


def find_project(explicit: str | Path | None = None) -> Path:
    """The sparkfleet checkout: explicit, $SPARKFLEET_PROJECT, cwd and parents, this package's repo."""
    if explicit is not None or os.environ.get("SPARKFLEET_PROJECT"):
        where = Path(explicit if explicit is not None else os.environ["SPARKFLEET_PROJECT"]).resolve()
        if not is_project(where):
            raise RunnerError(f"{where} is not a sparkfleet project (no site.yml + ansible.cfg there)")
        return where
    cwd = Path.cwd().resolve()
    for candidate in (cwd, *cwd.parents, *Path(__file__).resolve().parents):
        if is_project(candidate):
            return candidate
    raise RunnerError(
        "cannot find the sparkfleet project (a directory with site.yml and ansible.cfg): "
        "run from inside it, or pass --project-dir / set SPARKFLEET_PROJECT"
    )


def resolve(path: str | Path, project: Path, what: str) -> str:
    """Relative paths mean the cwd first (as with ansible-playbook), then the project."""
    text = str(path)
    if what == "inventory" and "," in text and not Path(text).exists():
        return text  # an inline host list, e.g. "host1,host2,"
    for candidate in (Path(text).expanduser(), project / text):
        if candidate.exists():
            return str(candidate.resolve())
    raise RunnerError(f"{what} not found: {text} (looked in {Path.cwd()} and {project})")


def run_name(playbook: str | Path) -> str:
    """The verb a playbook belongs to, for the run directory's name."""
    stem = Path(playbook).stem
    return "up" if stem == "site" else re.sub(r"[^A-Za-z0-9.-]+", "-", stem.replace("_", "-"))


def runs_root(project: Path) -> Path:
    return Path(os.environ.get("SPARKFLEET_RUNS_DIR") or project / ".cache" / "runs")


def keep_runs() -> int:
    try:
        return max(1, int(os.environ.get("SPARKFLEET_KEEP_RUNS", DEFAULT_KEEP_RUNS)))
    except ValueError:
        return DEFAULT_KEEP_RUNS


def make_run_dir(root: Path, name: str, now: dt.datetime) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    for n in range(1000):
        candidate = root / (f"{stamp}-{name}" if n == 0 else f"{stamp}.{n}-{name}")
        try:
            candidate.mkdir(mode=0o700)
        except FileExistsError:
            continue
        return candidate
    raise RunnerError(f"cannot create a run directory under {root}")


def prune_runs(root: Path, current: Path, keep: int) -> None:
    """Keep the newest `keep` run dirs (the current one included); never touch other files."""
    runs = sorted(p for p in root.iterdir() if p.is_dir() and _RUN_DIR_RE.match(p.name))
    older = [p for p in runs if p.name < current.name]
    for stale in older[: max(0, len(older) - (keep - 1))]:
        shutil.rmtree(stale, ignore_errors=True)


def new_run_dir(project: Path, playbook: str, now: dt.datetime) -> Path:
    """A fresh private data dir for one run; older runs beyond the keep count are removed."""
    root = runs_root(project)
    private = make_run_dir(root, run_name(playbook), now)
    prune_runs(root, private, keep_runs())
    # ansible-runner reads its own settings from env/settings; nothing secret goes there.
    # A 1 s poll lets Ctrl-C and the elapsed-time display react within a second.
    (private / "env").mkdir(mode=0o700)
    (private / "env" / "settings").write_text(json.dumps({"pexpect_timeout": 1}))
    return private

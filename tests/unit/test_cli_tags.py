"""Every phase of site.yml has a tag, and `--tags PHASE` runs the whole phase and nothing of the
others (ansible-playbook's own --list-tasks, through sparkfleet, against the sample inventory)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PHASES = ["preflight", "network", "host", "reboot", "clocks", "weights", "engine", "start"]
PLAY_RE = re.compile(r"^  play #\d+ \((?P<hosts>[^)]*)\): (?P<name>.*)\tTAGS: \[(?P<tags>[^]]*)\]$")
TASK_RE = re.compile(r"^      (?P<name>.*)\tTAGS: \[(?P<tags>[^]]*)\]$")


def list_tasks(*args: str) -> list[tuple[str, set[str], list[str]]]:
    """(play name, play tags, task names) per play, as `sparkfleet up --list-tasks` prints them."""
    env = dict(os.environ, SPARKFLEET_RUNS_DIR=tempfile.mkdtemp(prefix="sparkfleet-test-tags-"))
    proc = subprocess.run(
        [sys.executable, "-m", "sparkfleet", "up", "-i", "inventory/tp3", "--list-tasks", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plays: list[tuple[str, set[str], list[str]]] = []
    for line in proc.stdout.splitlines():
        if m := PLAY_RE.match(line):
            plays.append((m["name"], {t.strip() for t in m["tags"].split(",") if t.strip()}, []))
        elif (m := TASK_RE.match(line)) and plays:
            tags = {t.strip() for t in m["tags"].split(",")}
            if "always" not in tags:  # argument specs and validation run whatever the tags
                plays[-1][2].append(m["name"])
    return plays


@pytest.fixture(scope="module")
def everything() -> list[tuple[str, set[str], list[str]]]:
    return list_tasks()


def test_every_play_of_site_yml_has_its_phase_tag(everything) -> None:
    assert len(everything) >= len(PHASES)
    for name, tags, _ in everything:
        assert tags & set(PHASES), f"play {name!r} has no phase tag: {sorted(tags)}"
    assert {t for _, tags, _ in everything for t in tags} >= set(PHASES)


@pytest.mark.parametrize("phase", PHASES)
def test_a_phase_tag_runs_its_whole_phase_and_nothing_else(phase: str, everything) -> None:
    selected = list_tasks("--tags", phase)
    assert [name for name, _, _ in selected] == [name for name, _, _ in everything]
    for (name, tags, tasks), (_, _, all_tasks) in zip(selected, everything, strict=True):
        if phase in tags:
            assert tasks == all_tasks, f"{phase}: play {name!r} runs only part of its tasks"
        else:
            assert tasks == [], f"{phase}: play {name!r} of another phase runs {tasks}"
    assert any(tasks for _, tags, tasks in selected if phase in tags) or phase == "reboot"

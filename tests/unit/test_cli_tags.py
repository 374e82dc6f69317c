"""Every phase of site.yml has a tag, and `--tags PHASE` runs the whole phase and nothing of the
others.

Two real runs of `sparkfleet up --list-tasks` against the sample inventory (ansible-playbook's own
listing, through sparkfleet): without tags, and with `--tags network`. The other phases' selections are
made in-process by the code that listing runs (Ansible's Playbook loader, `Block.filter_tagged_tasks`
with the play's `only_tags`, as ansible-playbook's --list-tasks does), from the same site.yml and
inventory; a test checks that the in-process listings match the real runs task for task, so the
in-process ones are the listing's, not a copy of Ansible's tag rules (parsing site.yml alone costs about
1.4 s of CPU per process; nine runs were 17 CPU-s)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import ansible.constants as C
import pytest
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.playbook import Playbook
from ansible.playbook.block import Block
from ansible.vars.manager import VariableManager

REPO = Path(__file__).resolve().parents[2]
PHASES = ["preflight", "network", "host", "reboot", "clocks", "weights", "engine", "start"]
REAL = "network"  # the phase whose `--tags` selection is also a real run
PLAY_RE = re.compile(r"^  play #\d+ \((?P<hosts>[^)]*)\): (?P<name>.*)\tTAGS: \[(?P<tags>[^]]*)\]$")
TASK_RE = re.compile(r"^      (?P<name>.*)\tTAGS: \[(?P<tags>[^]]*)\]$")

Listing = list[tuple[str, set[str], list[str]]]  # (play name, play tags, task names) per play


def list_tasks(*args: str) -> Listing:
    """Per play, as `sparkfleet up --list-tasks` prints them (tasks tagged `always` left out: argument
    specs and validation run whatever the tags)."""
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
    plays: Listing = []
    for line in proc.stdout.splitlines():
        if m := PLAY_RE.match(line):
            plays.append((m["name"], {t.strip() for t in m["tags"].split(",") if t.strip()}, []))
        elif (m := TASK_RE.match(line)) and plays:
            tags = {t.strip() for t in m["tags"].split(",")}
            if "always" not in tags:
                plays[-1][2].append(m["name"])
    return plays


class InProcess:
    """site.yml and the sample inventory loaded once; `select(tags)` lists what `--list-tasks --tags
    TAGS` lists, by ansible-playbook's own steps (ansible/cli/playbook.py: play.compile(),
    filter_tagged_tasks with the play's variables, then the blocks' tasks, implicit meta tasks left out)."""

    def __init__(self) -> None:
        loader = DataLoader()
        inventory = InventoryManager(loader=loader, sources=[str(REPO / "inventory/tp3")])
        self.vm = VariableManager(loader=loader, inventory=inventory)
        playbook = Playbook.load(str(REPO / "site.yml"), variable_manager=self.vm, loader=loader)
        self.plays = playbook.get_plays()

    def select(self, tags: set[str] | None = None) -> Listing:
        out: Listing = []
        for play in self.plays:
            saved = play.only_tags, play.skip_tags
            play.only_tags, play.skip_tags = set(tags or {"all"}), set()
            try:
                names: list[str] = []
                all_vars = self.vm.get_vars(play=play)
                for compiled in play.compile():
                    block = compiled.filter_tagged_tasks(all_vars)
                    if block.has_tasks():
                        names += self._names(block, set(play.tags))
            finally:
                play.only_tags, play.skip_tags = saved
            out.append((play.name, set(play.tags), names))
        return out

    def _names(self, block: Block, play_tags: set[str]) -> list[str]:
        names: list[str] = []
        for task in block.block:
            if isinstance(task, Block):
                names += self._names(task, play_tags)
            elif task.action in C._ACTION_META and task.implicit:
                continue
            elif "always" not in play_tags | set(task.tags):
                names.append(task.get_name() if task.name else task.action)
        return names


@pytest.fixture(scope="module")
def everything() -> Listing:
    return list_tasks()


@pytest.fixture(scope="module")
def in_process() -> InProcess:
    return InProcess()


def test_the_in_process_listings_are_the_real_runs(everything, in_process) -> None:
    assert in_process.select() == everything
    assert in_process.select({REAL}) == list_tasks("--tags", REAL)


def test_every_play_of_site_yml_has_its_phase_tag(everything) -> None:
    assert len(everything) >= len(PHASES)
    for name, tags, _ in everything:
        assert tags & set(PHASES), f"play {name!r} has no phase tag: {sorted(tags)}"
    assert {t for _, tags, _ in everything for t in tags} >= set(PHASES)


@pytest.mark.parametrize("phase", PHASES)
def test_a_phase_tag_runs_its_whole_phase_and_nothing_else(phase: str, everything, in_process) -> None:
    selected = in_process.select({phase})
    assert [name for name, _, _ in selected] == [name for name, _, _ in everything]
    for (name, tags, tasks), (_, _, all_tasks) in zip(selected, everything, strict=True):
        if phase in tags:
            assert tasks == all_tasks, f"{phase}: play {name!r} runs only part of its tasks"
        else:
            assert tasks == [], f"{phase}: play {name!r} of another phase runs {tasks}"
    assert any(tasks for _, tags, tasks in selected if phase in tags) or phase == "reboot"

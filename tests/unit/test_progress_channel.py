"""The channel a long step's progress takes to the display: the weights role's real wait action,
polling a real progress file, through ansible-playbook and ansible-runner at normal verbosity."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from sparkfleet.progress import Progress
from sparkfleet.runner import run_playbook

REPO = Path(__file__).resolve().parents[2]
PB = REPO / "tests" / "unit" / "playbooks"
LOCAL = PB / "inventory" / "local.yml"


@pytest.mark.parametrize("strategy", ["mitogen", "linear"])
def test_wait_action_progress_reaches_the_display(
    strategy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARKFLEET_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("SPARKFLEET_STRATEGY", strategy)
    # the last run's progress file is still there until the new job writes its own: never shown
    stale = {"phase": "copy", "state": "done", "line": "copy: STALE 100%", "done_bytes": 9, "total_bytes": 9}
    (tmp_path / "progress.json").write_text(json.dumps(stale))
    events: list[dict] = []
    out = io.StringIO()
    result = run_playbook(
        PB / "progress_wait.yml",
        [LOCAL],
        extravars={"workdir": str(tmp_path)},
        project_dir=REPO,
        quiet=True,
        display=Progress(out, tty=False),
        on_event=events.append,
    )
    assert result.exit_code == 0, result.failures
    polls = [
        e["event_data"]["res"]
        for e in events
        if e["event"] == "runner_on_async_poll" and e["event_data"].get("task") == "Wait for the long step"
    ]
    assert polls, "no progress event reached ansible-runner"
    data = [p["sparkfleet_progress_data"] for p in polls if "sparkfleet_progress_data" in p]
    assert data and all(d["label"] == "copy" and d["total"] == 4000 and d["unit"] == "B" for d in data)
    assert all(set(d["parts"]) == {"w1", "w2"} for d in data)
    assert any(p["sparkfleet_progress"].startswith("copy: ") for p in polls if "sparkfleet_progress" in p)
    assert "STALE" not in json.dumps(polls) and "STALE" not in out.getvalue()
    assert polls[-1]["finished"] == 1 and polls[-1]["sparkfleet_progress_data"]["done"] == 4000  # the end too
    # each poll is also an event ansible's own output shows (what -vv and ansible-navigator see)
    stdout = (result.artifacts_dir / "stdout").read_text()
    assert "ASYNC POLL on local1" in stdout
    # and the display prints per host and per part, at normal verbosity
    text = out.getvalue()
    assert "  local1: copy: " in text and "ETA" in text
    assert "  local1 → w1: copy " in text and "  local1 → w2: copy " in text
    # the final result carries the last progress line
    final = next(
        e["event_data"]["res"]
        for e in events
        if e["event"] == "runner_on_ok" and e["event_data"].get("task") == "Wait for the long step"
    )
    assert final["sparkfleet_progress"].startswith("copy: 4.0 KB / 4.0 KB (100.0%)")

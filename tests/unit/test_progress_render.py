"""Event → progress rendering, fed with the events of real ansible-runner runs against localhost
and with recorded events of the roles' long steps."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from sparkfleet.progress import Progress, meters_from, plain_failure, render_recap, shorten
from sparkfleet.runner import run_playbook
from sparkfleet.text import strip_ansi

REPO = Path(__file__).resolve().parents[2]
PB = REPO / "tests" / "unit" / "playbooks"
LOCAL = PB / "inventory" / "local.yml"


class FakeClock:
    def __init__(self, step: float = 0.0) -> None:
        self.now = 1000.0
        self.step = step  # seconds that pass on every reading

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def record(
    tmp_path_factory: pytest.TempPathFactory, playbook: str, seen=None, **kw
) -> tuple[list[dict], object]:
    """The events of a real run of `playbook`; `seen` is called with each one as it comes."""
    events: list[dict] = []
    runs = tmp_path_factory.mktemp("runs")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPARKFLEET_RUNS_DIR", str(runs))

    def on_event(event: dict) -> None:
        events.append(event)
        if seen is not None:
            seen(event)

    try:
        result = run_playbook(PB / playbook, [LOCAL], project_dir=REPO, quiet=True, on_event=on_event, **kw)
    finally:
        mp.undo()
    return events, result


@pytest.fixture(scope="module")
def fail_run(tmp_path_factory: pytest.TempPathFactory):
    return record(tmp_path_factory, "fail.yml")


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory):
    """long.yml's async job runs until its first poll has been seen (the gate file): on a busy machine a
    fixed sleep could end before Ansible's first poll, and the run then has no poll event."""
    work = tmp_path_factory.mktemp("work")

    def seen(event: dict) -> None:
        if event.get("event") == "runner_on_async_poll":
            (work / "polled").touch()

    return record(tmp_path_factory, "long.yml", seen=seen, extravars={"workdir": str(work)})


@pytest.fixture(scope="module")
def diff_run(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("work")
    return record(tmp_path_factory, "basic.yml", extravars={"workdir": str(work)}, check=True, diff=True)


def render(events: list[dict], **kw) -> str:
    out = io.StringIO()
    # On a terminal the live area is redrawn at most every 0.1 s: let time pass between events.
    clock = FakeClock(step=0.05 if kw.get("tty") else 0.0)
    progress = Progress(out, clock=clock, width=200, **kw)
    for event in events:
        progress(event)
    progress.close()
    return out.getvalue()


def test_plain_lines_without_tty(fail_run) -> None:
    text = render(fail_run[0], tty=False)
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert "[0.0s] PLAY Failing play" in lines
    assert "[0.0s] TASK Check the disk" in lines
    assert "  FAILED  local2  Check the disk: command exited with status 3" in lines
    assert "  local1: still here" in lines  # a debug msg is shown as it arrives
    # Without -v, successful results are not listed one by one.
    assert not any(line.lstrip().startswith("ok ") for line in lines)


def test_verbose_lists_each_result(fail_run) -> None:
    lines = render(fail_run[0], tty=False, verbosity=1).splitlines()
    assert any(line.split()[:2] == ["ok", "local1"] and "Check the disk" in line for line in lines)
    assert any(line.split()[:2] == ["ok", "local1"] and "After the failure" in line for line in lines)


def test_tty_live_area_and_lines_that_stay(fail_run) -> None:
    raw = render(fail_run[0], tty=True)
    assert "\x1b[?25l" in raw and raw.rstrip().endswith("\x1b[2K")  # rich's live area, erased at the end
    text = strip_ansi(raw)
    # The live area names play and task and counts hosts done of those started.
    assert "Failing play > Check the disk  [1/2 hosts]" in text
    # Lines that stay: the play, the failure, a debug message.
    assert "PLAY Failing play\n" in text
    assert "  FAILED  local2  Check the disk: command exited with status 3\n" in text
    assert "  local1: still here\n" in text


def test_tty_shows_elapsed_and_busy_hosts_on_tick() -> None:
    out = io.StringIO()
    clock = FakeClock()
    progress = Progress(out, tty=True, clock=clock, width=200)
    progress({"event": "playbook_on_play_start", "event_data": {"name": "Weights"}})
    progress({"event": "playbook_on_task_start", "event_data": {"name": "Reboot", "uuid": "t1"}})
    progress({"event": "runner_on_start", "event_data": {"host": "spark1", "task": "Reboot"}})
    clock.now += 75
    progress.tick()
    text = strip_ansi(out.getvalue())
    assert "[1m15s] Weights > Reboot  [0/1 hosts]" in text
    assert "  spark1 running 1m15s" in text  # a host busy for a while gets a row with its time
    progress.close()


def test_long_steps_show_their_progress(long_run) -> None:
    events, result = long_run
    assert result.exit_code == 0
    kinds = {e["event"] for e in events}
    assert {"runner_on_async_poll", "runner_retry"} <= kinds
    plain = render(events, tty=False)
    assert "  local1: still running (0.0s)" in plain  # async poll (fake clock: no time passes)
    assert "  local1: weights: 1.0/3.0 GiB, 310 MB/s (attempt 1/6)" in plain
    assert "  local1: engine ready on rank 0" in plain  # a result's sparkfleet_progress
    assert "  local1: __download.attempts: 3" in plain  # debug var=
    assert "  local1: part 1" in plain and "  local1: part 2" in plain  # debug in a loop, per item
    assert "All items completed" not in plain
    # On a terminal every poll updates the host's row in the live area.
    tty = strip_ansi(render(events, tty=True))
    assert "local1" in tty and "weights: 2.0/3.0 GiB, 310 MB/s (attempt 2/6)" in tty


COPY_POLL = {
    "event": "runner_on_async_poll",
    "event_data": {
        "host": "spark1",
        "task": "Wait for the copy (bytes, rate, ETA)",
        "res": {
            "ansible_job_id": "j1",
            "started": 1,
            "finished": 0,
            "sparkfleet_progress": "copy: 1.2 GB / 4.0 GB (30.0%), 600.0 MB/s, ETA 0m05s, files 3/90",
            "sparkfleet_progress_data": {
                "label": "copy",
                "unit": "B",
                "done": 1_200_000_000,
                "total": 4_000_000_000,
                "rate": 600_000_000,
                "eta_s": 5,
                "parts": {
                    "spark2": {"done": 800_000_000, "total": 2_000_000_000, "rate": 400_000_000, "eta_s": 3},
                    "spark3": {"done": 400_000_000, "total": 2_000_000_000, "rate": 200_000_000, "eta_s": 8},
                },
            },
        },
    },
}


def test_meters_per_host_and_per_worker() -> None:
    meters = meters_from("spark1", COPY_POLL["event_data"]["res"], "copy: ...")
    assert set(meters) == {"", "spark2", "spark3"}
    assert meters["spark2"].label == "spark1 → spark2" and meters["spark2"].sized
    assert meters["spark2"].numbers() == "800.0 MB / 2.0 GB (40.0%), 400.0 MB/s, ETA 3.0s"
    assert meters_from("spark1", {}, "waiting")[""].line() == "waiting"  # a note without numbers


def test_copy_progress_plain_and_on_a_terminal() -> None:
    task = {"event": "playbook_on_task_start", "event_data": {"name": "Wait for the copy", "uuid": "t1"}}
    play = {"event": "playbook_on_play_start", "event_data": {"name": "Model weights"}}
    plain = render([play, task, COPY_POLL], tty=False).splitlines()
    assert "  spark1: copy: 1.2 GB / 4.0 GB (30.0%), 600.0 MB/s, ETA 0m05s, files 3/90" in plain
    assert "  spark1 → spark2: copy 800.0 MB / 2.0 GB (40.0%), 400.0 MB/s, ETA 3.0s" in plain
    assert "  spark1 → spark3: copy 400.0 MB / 2.0 GB (20.0%), 200.0 MB/s, ETA 8.0s" in plain
    tty = strip_ansi(render([play, task, COPY_POLL], tty=True))
    bar_rows = [line for line in tty.splitlines() if "━" in line]
    worker = [r for r in bar_rows if r.startswith("  spark1 → spark2 ")]
    assert worker and worker[-1].rstrip().endswith("(40.0%), 400.0 MB/s, ETA 3.0s")
    assert any(r.startswith("  spark1 ") and "1.2 GB / 4.0 GB (30.0%)" in r for r in bar_rows)


FIXTURES = Path(__file__).resolve().parent / "fixtures" / "events"


def replay(name: str, *, tty: bool) -> str:
    """Recorded events of the real roles in the lab (tests/unit/fixtures/events, trimmed job_events),
    replayed at their recorded times."""
    import datetime as dt

    events = json.loads((FIXTURES / name).read_text())
    times = [dt.datetime.fromisoformat(e["created"]).timestamp() for e in events]
    clock = FakeClock()
    clock.now = times[0]
    out = io.StringIO()
    progress = Progress(out, tty=tty, clock=clock, width=160)
    for when, event in zip(times, events, strict=True):
        clock.now = when
        progress(event)
    progress.close()
    return strip_ansi(out.getvalue())


def test_recorded_weights_download_and_copy() -> None:
    plain = replay("weights-download-and-copy.json", tty=False).splitlines()
    first = "  spark1: download: 548.0 MB / 630.1 MB (87.0%), 2.0 MB/s, ETA 0m40s, files 16/17; 1 files to"
    assert any(line.startswith(first) for line in plain)
    last = "  spark1: download: 630.1 MB / 630.1 MB (100.0%), 19.9 MB/s, ETA 0m00s, files 17/17; complete"
    assert last in plain
    # the polls in between came less than 5 s apart: not printed, but the end always is
    assert not any("(91.3%)" in line for line in plain)
    assert any(line.startswith("  spark1 → spark2: copy 0 B / 84.2 MB (0.0%)") for line in plain)
    assert any(line.startswith("  spark1 → spark2: copy 84.2 MB / 84.2 MB (100.0%)") for line in plain)
    tty = replay("weights-download-and-copy.json", tty=True)
    # on a terminal every poll redraws the bar
    assert re.search(r"  spark1 +[━╸╺]+ *download 575\.2 MB / 630\.1 MB \(91\.3%\), 14\.5 MB/s, ETA \d", tty)
    assert re.search(r"  spark1 → spark2 +[━╸╺]+ *copy 84\.2 MB / 84\.2 MB \(100\.0%\)", tty)


def test_recorded_engine_start() -> None:
    plain = replay("engine-start.json", tty=False).splitlines()
    probes = [line for line in plain if line.startswith("  spark1: ") and "(attempt " in line]
    assert probes and probes[0].endswith("(attempt 1/301)") and "Connection refused" in probes[0]
    assert plain[-1].startswith("  spark1: ok: ready: ")


def test_recorded_reboot() -> None:
    plain = replay("reboot.json", tty=False).splitlines()
    for host in ("spark1", "spark2"):
        mine = [line for line in plain if line.startswith(f"  {host}: reboot: ")]
        assert mine[0].startswith(f"  {host}: reboot: reboot command sent")
        assert any("waiting for the new boot, try " in line and "Connection refused" in line for line in mine)
        assert any("waiting for the new boot: done after " in line for line in mine)


def test_plain_notes_are_throttled_per_host() -> None:
    out = io.StringIO()
    clock = FakeClock()
    progress = Progress(out, tty=False, clock=clock)
    progress({"event": "playbook_on_task_start", "event_data": {"name": "Download", "uuid": "t1"}})
    for n in range(1, 5):
        res = {"stdout": f"weights: {n}/4 GiB", "attempts": n, "retries": 9}
        progress({"event": "runner_retry", "event_data": {"host": "spark1", "res": res}})
        clock.now += 2
    notes = [line for line in out.getvalue().splitlines() if "weights:" in line]
    assert notes == ["  spark1: weights: 1/4 GiB (attempt 1/9)", "  spark1: weights: 4/4 GiB (attempt 4/9)"]


def test_plain_notes_of_a_long_task_thin_out_after_a_minute() -> None:
    out = io.StringIO()
    clock = FakeClock()
    progress = Progress(out, tty=False, clock=clock)
    progress({"event": "playbook_on_task_start", "event_data": {"name": "Build", "uuid": "t1"}})
    for _ in range(36):  # an async poll every 5 s for 3 minutes
        clock.now += 5
        progress({"event": "runner_on_async_poll", "event_data": {"host": "spark1", "res": {}}})
    notes = [line for line in out.getvalue().splitlines() if "still running" in line]
    # every poll during the first minute, then one per 30 s
    assert len(notes) == 11 + 4, notes


def test_diff_shown_only_with_diff(diff_run) -> None:
    events, _ = diff_run
    assert any(e["event"] == "runner_on_file_diff" for e in events)
    assert "+local1" in render(events, tty=False, show_diff=True)
    assert "+local1" not in render(events, tty=False, show_diff=False)


def test_errors_and_warnings_are_shown(tmp_path_factory: pytest.TempPathFactory) -> None:
    events, result = record(tmp_path_factory, "reach.yml", limit="nosuchhost")
    assert result.exit_code == 1
    text = render(events, tty=False)
    assert "[WARNING]: Could not match supplied host pattern, ignoring: nosuchhost" in text
    assert "[ERROR]: Specified inventory, host pattern and/or --limit leaves us with no hosts" in text


def test_high_verbosity_passes_ansible_output_through(fail_run) -> None:
    text = render(fail_run[0], tty=False, verbosity=2)
    assert "TASK [Check the disk]" in text and "PLAY RECAP" in text


def test_recap_table_failures_and_artifacts(fail_run) -> None:
    _, result = fail_run
    text = render_recap(result)
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("host"))
    assert header.split() == [
        "host",
        "ok",
        "changed",
        "failed",
        "unreachable",
        "skipped",
        "rescued",
        "ignored",
        "time",
    ]
    row = next(line for line in lines if line.startswith("local2 "))
    assert row.split()[1:8] == ["0", "0", "1", "0", "0", "0", "0"]
    assert 'FAILED  local2  task "Check the disk" (play "Failing play")' in lines
    assert "  command exited with status 3" in lines
    assert "    | disk /dev/nvme9 is missing" in lines
    assert "result: failed (exit 2) in" in text
    assert f"artifacts: {result.artifacts_dir}" in lines


def test_recap_says_check_mode(diff_run) -> None:
    assert "(check mode: nothing was changed)" in render_recap(diff_run[1])


def test_plain_failure_words() -> None:
    assert plain_failure({"censored": "hidden"}) == ("output hidden (no_log: true)", "")
    crash = {
        "msg": "MODULE FAILURE\nSee stdout/stderr for the exact error",
        "module_stderr": "Traceback\nKeyError: 'x'",
    }
    assert plain_failure(crash) == ("the module crashed on the host", "Traceback\nKeyError: 'x'")
    assertion = {"msg": "Assertion failed", "assertion": "cap > 0"}
    assert plain_failure(assertion)[0] == "assertion failed: cap > 0"
    assert plain_failure({"msg": "Task failed: boom"})[0] == "boom"
    assert plain_failure({}) == ("task failed", "")


def test_shorten_keeps_the_end() -> None:
    text = "\n".join(f"line {n}" for n in range(1, 21)) + "\n" + "x" * 500
    short = shorten(text, max_lines=3, width=50).splitlines()
    assert short[0] == "… (18 earlier lines)"
    assert short[1:3] == ["line 19", "line 20"]
    assert len(short[3]) == 50 and short[3].endswith("…")


def test_a_steps_last_word_is_shown_however_soon_it_follows() -> None:
    """sparkfleet.cluster.reboot marks each step's final report `finished` (plugins/action/reboot.py): the
    throttle that keeps a host to a line every few seconds never drops it. An unmarked report that soon
    is dropped (what hid 'done after 1 try' when a reboot came back within a second of the last try)."""

    def poll(note: str, finished: int) -> dict:
        res = {"started": 1, "finished": finished, "sparkfleet_progress": note}
        return {"event": "runner_on_async_poll", "event_data": {"host": "spark1", "res": res}}

    for finished, shown in ((1, True), (0, False)):
        out = io.StringIO()
        clock = FakeClock()
        progress = Progress(out, tty=False, clock=clock)
        progress({"event": "playbook_on_task_start", "event_data": {"name": "Reboot", "uuid": "t1"}})
        progress(poll("reboot: waiting for the new boot, try 1 (timeout 600 s): refused (3s)", 0))
        clock.now += 0.5
        progress(poll("reboot: waiting for the new boot: done after 1 try (4s)", finished))
        lines = out.getvalue().splitlines()
        assert any("try 1 (timeout 600 s)" in line for line in lines), lines
        assert any("done after 1 try" in line for line in lines) is shown, lines

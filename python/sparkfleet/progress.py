"""The live display of a run, fed with ansible-runner events.

Lines worth keeping (plays, failures, debug messages, warnings, diffs, `-v` result lines) are
printed as they come. Long steps report progress through their task results (docs/cli.md,
"Progress of long steps"): a note (`sparkfleet_progress`, a polled task's msg or last stdout line)
and, when the step knows its size, a meter (`sparkfleet_progress_data`: done, total, rate, ETA,
per part, e.g. per worker of a copy).

On a terminal a live area under those lines shows the play and task, hosts done of those started,
and a row per host (and per part): a progress bar with bytes, rate and ETA, or the latest note
and how long the host has been at it (rich). Without a terminal (CI logs) everything is plain
lines; progress is printed per host (and part) at most every NOTE_EVERY_S seconds during a task's
first minute, then every NOTE_EVERY_LONG_S; a host that reports nothing gets a "still running"
line every NOTE_EVERY_LONG_S.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

# Re-exported: the words live in sparkfleet.text.
from sparkfleet.text import (  # noqa: F401
    CENSORED_MSG,
    _item_label,
    _text,
    fmt_bytes,
    fmt_duration,
    plain_failure,
    progress_note,
    render_failure,
    render_recap,
    shorten,
    strip_ansi,
)

DEBUG_ACTIONS = {"debug", "ansible.builtin.debug", "ansible.legacy.debug"}
NOTE_EVERY_S = 5.0  # plain progress lines per host (and part), during a task's first minute
NOTE_EVERY_LONG_S = 30.0  # and after it: a 30-minute build is ~60 lines, not 360
SHOW_RUNNING_AFTER_S = 3.0  # terminal: a host busy this long gets a row of its own
REFRESH_EVERY_S = 0.1  # terminal: redraws at most this often (events can come by the hundred)
DEBUG_MAX_LINES = 40
BAR_WIDTH = 30


@dataclass
class Meter:
    """What one host (or one part of its work, e.g. one worker of a copy) reports."""

    label: str  # "spark1", or "spark1 → spark2" for a part
    note: str = ""
    phase: str = ""
    done: float | None = None
    total: float | None = None
    rate: float | None = None  # units per second
    eta_s: float | None = None
    unit: str = "B"

    @property
    def sized(self) -> bool:
        return self.total is not None and self.total > 0 and self.done is not None

    def amount(self) -> str:
        fmt = fmt_bytes if self.unit == "B" else (lambda n: f"{n:.0f} {self.unit}")
        return f"{fmt(self.done or 0)} / {fmt(self.total or 0)}"

    def numbers(self) -> str:
        """`1.2 GB / 2.0 GB (60.0%), 300.0 MB/s, ETA 0m04s`"""
        parts = [self.amount() + (f" ({100.0 * (self.done or 0) / self.total:.1f}%)" if self.total else "")]
        if self.rate is not None:
            rate = fmt_bytes(self.rate) if self.unit == "B" else f"{self.rate:.1f} {self.unit}"
            parts.append(f"{rate}/s")
        if self.eta_s is not None and self.done != self.total:
            parts.append(f"ETA {fmt_duration(self.eta_s)}")
        return ", ".join(parts)

    def line(self) -> str:
        """The plain line: the step's own note for a host, the numbers for a part."""
        if self.note:
            return self.note
        return f"{self.phase} {self.numbers()}".strip() if self.sized else self.phase


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def meters_from(host: str, res: dict[str, Any], note: str | None) -> dict[str, Meter]:
    """part ('' for the host itself) -> Meter, from a result's note and `sparkfleet_progress_data`."""
    data = res.get("sparkfleet_progress_data")
    data = data if isinstance(data, dict) else {}
    phase = str(data.get("label") or "")
    unit = str(data.get("unit") or "B")
    out = {
        "": Meter(
            label=host,
            note=note or "",
            phase=phase,
            done=_number(data.get("done")),
            total=_number(data.get("total")),
            rate=_number(data.get("rate")),
            eta_s=_number(data.get("eta_s")),
            unit=unit,
        )
    }
    parts = data.get("parts")
    for name, part in sorted((parts if isinstance(parts, dict) else {}).items()):
        if isinstance(part, dict):
            out[str(name)] = Meter(
                label=f"{host} → {name}",
                phase=phase,
                done=_number(part.get("done")),
                total=_number(part.get("total")),
                rate=_number(part.get("rate")),
                eta_s=_number(part.get("eta_s")),
                unit=unit,
            )
    return out


class Progress:
    """Callable on ansible-runner events; writes the live display to `stream`."""

    def __init__(
        self,
        stream: TextIO,
        *,
        tty: bool | None = None,
        verbosity: int = 0,
        show_diff: bool = False,
        width: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        listing: bool = False,
    ) -> None:
        self.stream = stream
        self.tty = bool(stream.isatty()) if tty is None else tty
        self.verbosity = verbosity
        self.show_diff = show_diff
        # --list-hosts, --list-tasks, --list-tags, --syntax-check: ansible's own text is the output
        self.listing = listing
        self.width = width
        self.clock = clock
        self.started = clock()
        self.play = ""
        self.task = ""
        self.task_uuid = ""
        self.task_started = self.started
        self.hosts_started: dict[str, float] = {}  # host -> when it started the task
        self.hosts_done: set[str] = set()
        self.meters: dict[tuple[str, str], Meter] = {}
        # (task, host, part) -> (when, line) of the last plain progress line
        self._printed: dict[tuple[str, str, str], tuple[float, str]] = {}
        self._in_error = False
        self._console: Console | None = None
        self._live: Live | None = None
        self._last_refresh = 0.0
        if self.tty and not listing:
            self._console = Console(file=stream, force_terminal=True, width=width, highlight=False)
            self._live = Live(
                get_renderable=self.render,
                console=self._console,
                auto_refresh=False,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()

    # ---- output -------------------------------------------------------------------------
    def emit(self, text: str) -> None:
        """A line that stays (above the live area on a terminal)."""
        if self._console is not None:
            self._console.print(Text.from_ansi(text), soft_wrap=True)
        else:
            self.stream.write((text if self.tty else strip_ansi(text)) + "\n")
            self.stream.flush()

    def _refresh(self, force: bool = False) -> None:
        if self._live is None:
            return
        now = self.clock()
        if force or now - self._last_refresh >= REFRESH_EVERY_S:
            self._last_refresh = now
            self._live.refresh()

    def status_line(self) -> str:
        total = len(self.hosts_started)
        hosts = f"  [{len(self.hosts_done)}/{total} hosts]" if total else ""
        where = f"{self.play} > {self.task}" if self.task else self.play
        return f"[{self._elapsed()}] {where}{hosts}"

    def render(self) -> RenderableType:
        """The live area: the status line, then a row per busy host (and part)."""
        if not (self.play or self.task):
            return Text("")
        rows = Table.grid(padding=(0, 1))
        rows.add_column(no_wrap=True)
        rows.add_column(no_wrap=True)
        rows.add_column(overflow="ellipsis", no_wrap=True)
        now = self.clock()
        for host, since in self.hosts_started.items():
            if host in self.hosts_done:
                continue
            busy = fmt_duration(now - since)
            mine = [m for (h, _), m in self.meters.items() if h == host]
            if not mine and now - since < SHOW_RUNNING_AFTER_S:
                continue
            if not mine:
                rows.add_row(Text(f"  {host}"), Text("running"), Text(busy))
            for m in mine:
                if m.sized:
                    done = min(m.done or 0, m.total or 0)
                    bar = ProgressBar(total=m.total, completed=done, width=BAR_WIDTH)
                    rows.add_row(Text(f"  {m.label}"), bar, Text(f"{m.phase} {m.numbers()}".strip()))
                else:
                    rows.add_row(Text(f"  {m.label}"), Text(busy), Text(m.note or "running"))
        return Group(Text(self.status_line(), overflow="ellipsis", no_wrap=True), rows)

    def tick(self) -> None:
        """About once a second while ansible runs: the elapsed time, and plain heartbeats."""
        if self._live is not None:
            self._refresh(force=True)
            return
        if self.tty or self.listing:
            return
        now = self.clock()
        for host, since in self.hosts_started.items():
            if host in self.hosts_done or now - since < NOTE_EVERY_LONG_S:
                continue
            last = self._printed.get((self.task_uuid, host, ""))
            if last is None or now - last[0] >= NOTE_EVERY_LONG_S:
                self._printed[(self.task_uuid, host, "")] = (now, "")
                self.emit(f"  {host}: still running ({fmt_duration(now - since)})")

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
            self._console = None
        self.stream.flush()

    # ---- events ------------------------------------------------------------------------
    def __call__(self, event: dict[str, Any]) -> None:
        kind = str(event.get("event") or "")
        data = event.get("event_data") or {}
        if self.verbosity >= 2 and event.get("stdout") and kind not in ("verbose", "error"):
            self.emit(event["stdout"].rstrip("\r\n"))
        if kind not in ("verbose", "error", "warning", "deprecated"):
            self._in_error = False
        handler = getattr(self, "_on_" + kind, None)
        if handler is not None:
            handler(data, event)
        self._refresh()

    def _elapsed(self) -> str:
        return fmt_duration(self.clock() - self.started)

    def _on_playbook_on_play_start(self, data: dict, event: dict) -> None:
        self.play = str(data.get("name") or data.get("pattern") or "")
        self.task = ""
        self.hosts_started.clear()
        self.hosts_done.clear()
        self.meters.clear()
        if not self.listing:
            self.emit(f"[{self._elapsed()}] PLAY {self.play}")

    def _on_playbook_on_task_start(self, data: dict, event: dict) -> None:
        self.task = str(data.get("name") or data.get("task") or "")
        self.task_uuid = str(data.get("uuid") or data.get("task_uuid") or "")
        self.task_started = self.clock()
        self.hosts_started.clear()
        self.hosts_done.clear()
        self.meters.clear()
        if not self.tty and self.verbosity < 2 and not self.listing:
            self.emit(f"[{self._elapsed()}] TASK {self.task}")
        self._refresh(force=True)

    def _on_runner_on_start(self, data: dict, event: dict) -> None:
        if data.get("host"):
            self.hosts_started.setdefault(str(data["host"]), self.clock())

    def _result(self, data: dict, status: str) -> None:
        host = str(data.get("host") or "?")
        self.hosts_started.setdefault(host, self.clock())
        self.hosts_done.add(host)
        for key in [k for k in self.meters if k[0] == host]:
            del self.meters[key]
        res = data.get("res") if isinstance(data.get("res"), dict) else {}
        task = str(data.get("task") or self.task)
        duration = float(data.get("duration") or 0.0)
        if status in ("failed", "unreachable"):
            msg, _ = plain_failure(res, unreachable=status == "unreachable")
            self.emit(f"  {status.upper()}  {host}  {task}: {msg.splitlines()[0] if msg else ''}")
        elif self.verbosity == 1:
            self.emit(f"  {status:<9} {host}  {task} ({fmt_duration(duration)})")
        action = str(data.get("resolved_action") or data.get("task_action") or "")
        # A loop's final result only repeats its items ("All items completed"): they were shown.
        if status == "ok" and action in DEBUG_ACTIONS and "results" not in res and self.verbosity < 2:
            self._debug(host, res)
        note = progress_note(res)
        if note:
            self._plain_note(host, "", note, force=True)

    def _debug(self, host: str, res: dict[str, Any]) -> None:
        """A debug task's output: its msg, or the variables it was asked to show (`var:`)."""
        if "msg" in res:
            self._message(host, res["msg"])
            return
        for key, value in res.items():
            if key.startswith("_ansible") or key in ("changed", "failed", "sparkfleet_progress"):
                continue
            text = value if isinstance(value, str) else json.dumps(value, indent=2, default=str)
            lines = text.splitlines()
            if len(lines) > DEBUG_MAX_LINES:
                lines = [*lines[:DEBUG_MAX_LINES], f"… ({len(lines) - DEBUG_MAX_LINES} more lines)"]
            self._message(host, [f"{key}: {lines[0] if lines else ''}", *lines[1:]])

    def _message(self, host: str, msg: Any) -> None:
        text = _text(msg) if isinstance(msg, str | list) else repr(msg)
        lines = strip_ansi(text).splitlines() or [""]
        self.emit(f"  {host}: {lines[0]}")
        for line in lines[1:]:
            self.emit(f"  {' ' * len(host)}  {line}")

    def _on_runner_on_ok(self, data: dict, event: dict) -> None:
        res = data.get("res") if isinstance(data.get("res"), dict) else {}
        self._result(data, "changed" if res.get("changed") else "ok")

    def _on_runner_on_failed(self, data: dict, event: dict) -> None:
        self._result(data, "ignored" if data.get("ignore_errors") else "failed")

    def _on_runner_on_skipped(self, data: dict, event: dict) -> None:
        self._result(data, "skipped")

    def _on_runner_on_unreachable(self, data: dict, event: dict) -> None:
        self._result(data, "unreachable")

    def _item(self, data: dict, status: str) -> None:
        res = data.get("res") if isinstance(data.get("res"), dict) else {}
        host = str(data.get("host") or "?")
        if status == "ok" and res.get("changed"):
            status = "changed"
        if self.verbosity == 1:
            self.emit(f"    {status:<9} {host}  item {_item_label(res)}")
        action = str(data.get("resolved_action") or data.get("task_action") or "")
        if status in ("ok", "changed") and action in DEBUG_ACTIONS and self.verbosity < 2:
            self._debug(host, {k: v for k, v in res.items() if k not in ("item", "ansible_loop_var")})
        note = progress_note(res)
        if note:
            self._plain_note(host, "", note, force=True)

    def _on_runner_item_on_ok(self, data: dict, event: dict) -> None:
        self._item(data, "ok")

    def _on_runner_item_on_failed(self, data: dict, event: dict) -> None:
        self._item(data, "failed")

    def _on_runner_item_on_skipped(self, data: dict, event: dict) -> None:
        self._item(data, "skipped")

    def _progress(self, host: str, res: dict[str, Any], note: str, *, force: bool = False) -> None:
        """A long step's report: its meters (the live area), or throttled plain lines (the last
        report of a step, `finished`, always)."""
        self.hosts_started.setdefault(host, self.clock())
        meters = meters_from(host, res, note)
        for part, meter in meters.items():
            self.meters[(host, part)] = meter
        self._refresh(force=True)  # a step reports at most every second or so: show each report
        if not self.tty:
            for part, meter in meters.items():
                self._plain_note(host, part, meter.line(), force=force)

    def _plain_note(self, host: str, part: str, line: str, *, force: bool = False) -> None:
        """Without a terminal: a progress line per host (and part) at most every few seconds."""
        if self.tty or not line:
            return
        key = (self.task_uuid, host, part)
        now = self.clock()
        last = self._printed.get(key)
        every = NOTE_EVERY_S if now - self.task_started < 60 else NOTE_EVERY_LONG_S
        if last is not None and line == last[1] and (force or now - last[0] < NOTE_EVERY_LONG_S):
            return  # the same words again (a step's final line repeats its last poll)
        if force or last is None or now - last[0] >= every:
            self._printed[key] = (now, line)
            who = f"{host} → {part}" if part else host
            self.emit(f"  {who}: {line}")

    def _on_runner_retry(self, data: dict, event: dict) -> None:
        res = data.get("res") if isinstance(data.get("res"), dict) else {}
        host = str(data.get("host") or "?")
        note = progress_note(res, polling=True)
        attempts, retries = res.get("attempts"), res.get("retries")
        count = f"attempt {attempts}/{retries}" if attempts and retries else "retrying"
        self._progress(host, res, f"{note} ({count})" if note else f"waiting ({count})")

    def _on_runner_on_async_poll(self, data: dict, event: dict) -> None:
        res = data.get("res") if isinstance(data.get("res"), dict) else {}
        host = str(data.get("host") or "?")
        note = progress_note(res, polling=True)
        if not note or res.get("sparkfleet_progress") is None:
            waited = fmt_duration(self.clock() - self.task_started)
            note = f"{note} ({waited})" if note else f"still running ({waited})"
        self._progress(host, res, note, force=res.get("finished") == 1)

    def _on_runner_on_file_diff(self, data: dict, event: dict) -> None:
        if self.show_diff and self.verbosity < 2 and event.get("stdout"):
            self.emit(event["stdout"].rstrip("\r\n"))

    def _on_playbook_on_no_hosts_matched(self, data: dict, event: dict) -> None:
        self.emit(f"  no hosts matched in play {self.play}")

    def _verbose(self, data: dict, event: dict) -> None:
        text = strip_ansi(str(event.get("stdout") or ""))
        for line in text.splitlines():
            head = line.lstrip()
            if head.startswith("[ERROR]"):
                self._in_error = True
            show = (
                self.listing
                or self.verbosity >= 2
                or self._in_error
                or head.startswith("[WARNING]")
                or (self.verbosity >= 1 and head.startswith("[DEPRECATION"))
            )
            if show:
                self.emit(line)

    _on_verbose = _verbose
    _on_error = _verbose
    _on_warning = _verbose
    _on_deprecated = _verbose

    def _on_playbook_on_stats(self, data: dict, event: dict) -> None:
        self.meters.clear()
        self.hosts_started.clear()
        self.play = self.task = ""
        self._refresh(force=True)

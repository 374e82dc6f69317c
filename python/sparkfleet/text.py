"""Turn ansible-runner events into what a person reads: a live line, notes, the recap.

On a TTY one status line (elapsed, play, task, hosts done/total, the latest progress note) is
rewritten in place; anything worth keeping (plays, failures, debug messages, warnings, diffs,
`-v` result lines) is printed above it. Without a TTY (CI logs) everything is plain lines.
Roles report progress of long steps through task results: see docs/cli.md "Progress".
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from sparkfleet.runner import Failure, RunResult

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
DEBUG_ACTIONS = {"debug", "ansible.builtin.debug", "ansible.legacy.debug"}
GENERIC_MSGS = ("non-zero return code", "MODULE FAILURE", "One or more items failed", "All items completed")
# Without a TTY a repeating progress note (a polling task) is printed at most this often per host.
NOTE_EVERY_S = 5.0  # plain (non-TTY) progress lines per host, during a task's first minute
NOTE_EVERY_LONG_S = 30.0  # and after it: a 30-minute build is ~60 lines, not 360
DEBUG_MAX_LINES = 40
CENSORED_MSG = "output hidden (no_log: true)"


def strip_ansi(text: str) -> str:
    return ANSI_RE.sub("", text).replace("\r", "")


def fmt_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    total = int(seconds)
    if total < 3600:
        return f"{total // 60}m{total % 60:02d}s"
    return f"{total // 3600}h{total % 3600 // 60:02d}m"


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return "\n".join(_text(v) for v in value)
    return str(value)


def shorten(text: str, max_lines: int = 8, width: int = 200) -> str:
    """The end of a long output (where errors are), each line cut to `width`."""
    lines = [line.rstrip() for line in strip_ansi(text).strip("\n").splitlines()]
    lines = [line if len(line) <= width else line[: width - 1] + "…" for line in lines]
    if len(lines) > max_lines:
        dropped = len(lines) - max_lines
        lines = [f"… ({dropped} earlier line{'s' if dropped > 1 else ''})", *lines[-max_lines:]]
    return "\n".join(lines)


def _item_label(item: dict[str, Any]) -> str:
    label = item.get("_ansible_item_label", item.get("item", "?"))
    text = label if isinstance(label, str) else repr(label)
    return text if len(text) <= 60 else text[:59] + "…"


def _detail(res: dict[str, Any], generic: bool) -> str:
    for key in ("stderr", "module_stderr"):
        if _text(res.get(key)).strip():
            return shorten(_text(res[key]))
    if generic:
        for key in ("module_stdout", "stdout"):
            if _text(res.get(key)).strip():
                return shorten(_text(res[key]))
    return ""


def plain_failure(res: dict[str, Any], *, unreachable: bool = False) -> tuple[str, str]:
    """(message, detail) of a failed or unreachable result, in the words a person needs."""
    if res.get("censored"):
        return CENSORED_MSG, ""
    # ansible 2.19 prefixes some messages with "Task failed: "; the recap already says so.
    msg = _text(res.get("msg")).strip().removeprefix("Task failed: ")
    if unreachable:
        return (msg or "host unreachable"), ""
    failed_items = [r for r in res.get("results") or [] if isinstance(r, dict) and r.get("failed")]
    if failed_items:
        parts = []
        for item in failed_items[:3]:
            item_msg, _ = plain_failure(item)
            parts.append(f"item {_item_label(item)}: {item_msg}")
        if len(failed_items) > 3:
            parts.append(f"and {len(failed_items) - 3} more failed items")
        first_detail = _detail(failed_items[0], True)
        return "; ".join(parts), first_detail
    generic = not msg or msg.startswith(GENERIC_MSGS)
    rc = res.get("rc")
    if msg.startswith("non-zero return code") and isinstance(rc, int):
        msg = f"command exited with status {rc}"
    elif msg == "Assertion failed" and res.get("assertion"):
        msg = f"assertion failed: {res['assertion']}"
    elif msg.startswith("MODULE FAILURE"):
        msg = "the module crashed on the host"
    return (msg or "task failed"), _detail(res, generic)


def progress_note(res: dict[str, Any], *, polling: bool = False) -> str | None:
    """The progress a result reports: `sparkfleet_progress`, or for polls its msg / last stdout line."""
    note = res.get("sparkfleet_progress")
    if isinstance(note, str) and note.strip():
        return note.strip()
    if not polling:
        return None
    msg = res.get("msg")
    if isinstance(msg, str) and msg.strip() and "\n" not in msg.strip() and len(msg) <= 200:
        return msg.strip()
    lines = [line for line in strip_ansi(_text(res.get("stdout"))).splitlines() if line.strip()]
    return lines[-1].strip()[:200] if lines else None


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
        self.hosts_started: set[str] = set()
        self.hosts_done: set[str] = set()
        self.note = ""
        self._note_printed: dict[tuple[str, str], tuple[float, str]] = {}
        self._in_error = False
        self._line = False

    # ---- output primitives -------------------------------------------------------------
    def _columns(self) -> int:
        return self.width or shutil.get_terminal_size((100, 24)).columns

    def _clear(self) -> None:
        if self._line:
            self.stream.write("\r\x1b[K")
            self._line = False

    def _draw(self) -> None:
        if not self.tty or not (self.play or self.task):
            return
        line = self.status_line()
        cols = max(20, self._columns() - 1)
        if len(line) > cols:
            line = line[: cols - 1] + "…"
        self.stream.write("\r\x1b[K" + line)
        self.stream.flush()
        self._line = True

    def emit(self, text: str) -> None:
        """A line that stays (above the live line on a TTY)."""
        self._clear()
        self.stream.write((text if self.tty else strip_ansi(text)) + "\n")
        self._draw()
        self.stream.flush()

    def status_line(self) -> str:
        elapsed = fmt_duration(self.clock() - self.started)
        total = len(self.hosts_started)
        hosts = f"  [{len(self.hosts_done)}/{total} hosts]" if total else ""
        where = f"{self.play} > {self.task}" if self.task else self.play
        note = f"  {self.note}" if self.note else ""
        return f"[{elapsed}] {where}{hosts}{note}"

    def tick(self) -> None:
        """Refresh the elapsed time while nothing else happens (called about once a second)."""
        if self.tty and self._line:
            self._draw()

    def close(self) -> None:
        self._clear()
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

    def _elapsed(self) -> str:
        return fmt_duration(self.clock() - self.started)

    def _on_playbook_on_play_start(self, data: dict, event: dict) -> None:
        self.play = str(data.get("name") or data.get("pattern") or "")
        self.task = ""
        self.hosts_started.clear()
        self.hosts_done.clear()
        self.note = ""
        self.emit(f"[{self._elapsed()}] PLAY {self.play}")

    def _on_playbook_on_task_start(self, data: dict, event: dict) -> None:
        self.task = str(data.get("name") or data.get("task") or "")
        self.task_uuid = str(data.get("uuid") or data.get("task_uuid") or "")
        self.task_started = self.clock()
        self.hosts_started.clear()
        self.hosts_done.clear()
        self.note = ""
        if self.tty:
            self._draw()
        elif self.verbosity < 2:
            self.emit(f"[{self._elapsed()}] TASK {self.task}")

    def _on_runner_on_start(self, data: dict, event: dict) -> None:
        if data.get("host"):
            self.hosts_started.add(str(data["host"]))
        self._draw()

    def _result(self, data: dict, status: str) -> None:
        host = str(data.get("host") or "?")
        self.hosts_started.add(host)
        self.hosts_done.add(host)
        res = data.get("res") if isinstance(data.get("res"), dict) else {}
        task = str(data.get("task") or self.task)
        duration = float(data.get("duration") or 0.0)
        if status in ("failed", "unreachable"):
            msg, _ = plain_failure(res, unreachable=status == "unreachable")
            self.emit(f"  {status.upper()}  {host}  {task}: {msg.splitlines()[0] if msg else ''}")
        elif self.verbosity >= 1 and self.verbosity < 2:
            self.emit(f"  {status:<9} {host}  {task} ({fmt_duration(duration)})")
        action = str(data.get("resolved_action") or data.get("task_action") or "")
        # A loop's final result only repeats its items ("All items completed"): they were shown.
        if status == "ok" and action in DEBUG_ACTIONS and "results" not in res and self.verbosity < 2:
            self._debug(host, res)
        note = progress_note(res)
        if note:
            self._progress(host, note, force=True)
        self._draw()

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
            self._progress(host, note, force=True)
        self._draw()

    def _on_runner_item_on_ok(self, data: dict, event: dict) -> None:
        self._item(data, "ok")

    def _on_runner_item_on_failed(self, data: dict, event: dict) -> None:
        self._item(data, "failed")

    def _on_runner_item_on_skipped(self, data: dict, event: dict) -> None:
        self._item(data, "skipped")

    def _progress(self, host: str, note: str, *, force: bool = False) -> None:
        """A progress note: in the live line on a TTY, else a throttled plain line."""
        self.note = f"{host}: {note}"
        if self.tty:
            self._draw()
            return
        key = (self.task_uuid, host)
        now = self.clock()
        last = self._note_printed.get(key)
        every = NOTE_EVERY_S if now - self.task_started < 60 else NOTE_EVERY_LONG_S
        if force or last is None or (note != last[1] and now - last[0] >= every):
            self._note_printed[key] = (now, note)
            self.emit(f"  {host}: {note}")

    def _on_runner_retry(self, data: dict, event: dict) -> None:
        res = data.get("res") if isinstance(data.get("res"), dict) else {}
        host = str(data.get("host") or "?")
        note = progress_note(res, polling=True)
        attempts, retries = res.get("attempts"), res.get("retries")
        count = f"attempt {attempts}/{retries}" if attempts and retries else "retrying"
        self._progress(host, f"{note} ({count})" if note else f"waiting ({count})")

    def _on_runner_on_async_poll(self, data: dict, event: dict) -> None:
        res = data.get("res") if isinstance(data.get("res"), dict) else {}
        host = str(data.get("host") or "?")
        waited = fmt_duration(self.clock() - self.task_started)
        note = progress_note(res, polling=True)
        self._progress(host, f"{note} ({waited})" if note else f"still running ({waited})")

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
        self.note = ""
        self._clear()


# ---- the end of a run ----------------------------------------------------------------------


def _display_path(path: str | Path) -> str:
    p = Path(path)
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def render_failure(failure: Failure) -> str:
    if failure.kind == "error":
        lines = [f"ERROR  ansible could not run the playbook: {failure.msg}"]
    elif failure.kind == "interrupted":
        lines = [f"INTERRUPTED  {failure.msg}"]
    else:
        where = f'task "{failure.task}"' + (f' (play "{failure.play}")' if failure.play else "")
        word = "UNREACHABLE" if failure.kind == "unreachable" else "FAILED"
        lines = [f"{word}  {failure.host}  {where}", *(f"  {m}" for m in failure.msg.splitlines())]
        if failure.task_path:
            lines.append(f"  at {_display_path(failure.task_path)}")
    for line in failure.detail.splitlines():
        lines.append(f"    | {line}")
    return "\n".join(lines)


COLUMNS = ("ok", "changed", "failed", "unreachable", "skipped", "rescued", "ignored")


def render_recap(result: RunResult) -> str:
    mode = "  (check mode: nothing was changed)" if result.check else ""
    out = ["", f"RECAP  {_display_path(result.playbook)}{mode}"]
    names = sorted(result.hosts)
    if names:
        hw = max(4, *(len(n) for n in names))
        out.append(f"{'host':<{hw}}  " + "  ".join(f"{c:>{len(c)}}" for c in COLUMNS) + f"  {'time':>8}")
        for name in names:
            stats = result.hosts[name]
            cells = "  ".join(f"{getattr(stats, c):>{len(c)}}" for c in COLUMNS)
            out.append(f"{name:<{hw}}  {cells}  {fmt_duration(stats.elapsed):>8}")
    else:
        out.append("no host ran a task")
    if result.failures:
        out.append("")
        out.extend(render_failure(f) for f in result.failures)
    slow = [t for t in result.slowest_tasks[:3] if t.seconds >= 1.0]
    if slow:
        out.append("")
        out.append("slowest: " + "; ".join(f"{t.task} ({t.host}, {fmt_duration(t.seconds)})" for t in slow))
    out.append("")
    out.append(f"result: {result.status} (exit {result.exit_code}) in {fmt_duration(result.elapsed)}")
    out.append(f"artifacts: {result.artifacts_dir}")
    return "\n".join(out) + "\n"

"""The words a person reads: a failed result in plain language, progress notes, durations and
sizes, and the recap at the end of a run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkfleet.collection import TEXT_FORMAT

if TYPE_CHECKING:
    from sparkfleet.runner import Failure, RunResult

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
GENERIC_MSGS = ("non-zero return code", "MODULE FAILURE", "One or more items failed", "All items completed")
CENSORED_MSG = "output hidden (no_log: true)"


def strip_ansi(text: str) -> str:
    return ANSI_RE.sub("", text).replace("\r", "")


# durations and byte counts written as the roles write them (plugins/module_utils/text_format.py)
fmt_duration = TEXT_FORMAT.duration
fmt_bytes = TEXT_FORMAT.size


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
    elif failure.kind == "locked":
        first, *rest = failure.msg.splitlines() or [""]
        lines = [f"LOCKED  {first}", *(f"  {line}" for line in rest)]
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
    lock = result.lock
    if lock is not None and (lock.outcome in ("taken_over", "broken") or lock.notes):
        out.append("")
        if lock.outcome in ("taken_over", "broken"):
            out.append(f"lock: {lock.message}")
        out.extend(f"lock: {note}" for note in lock.notes)
    slow = [t for t in result.slowest_tasks[:3] if t.seconds >= 1.0]
    if slow:
        out.append("")
        out.append("slowest: " + "; ".join(f"{t.task} ({t.host}, {fmt_duration(t.seconds)})" for t in slow))
    out.append("")
    out.append(f"result: {result.status} (exit {result.exit_code}) in {fmt_duration(result.elapsed)}")
    out.append(f"artifacts: {result.artifacts_dir}")
    return "\n".join(out) + "\n"

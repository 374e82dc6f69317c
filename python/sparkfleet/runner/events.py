"""ansible-runner events → what the recap and `--json` say: per-host stats, failures, task
timings, ansible's own error text, and the roles' set_stats data (artifact_data)."""

from __future__ import annotations

from typing import Any

from sparkfleet import text as _text
from sparkfleet.runner.result import (
    STATUS_BY_EXIT,
    Failure,
    HostStats,
    RunResult,
    TaskTiming,
    exit_code_for,
)

_RESULT_EVENTS = {"runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable"}


class Collector:
    """Reduces ansible-runner events to per-host stats, failures and task timings."""

    def __init__(self) -> None:
        self.stats: dict[str, dict[str, int]] | None = None
        self.counts: dict[str, HostStats] = {}
        self.failures: dict[str, Failure] = {}
        self.error_lines: list[str] = []
        self.task_times: dict[str, TaskTiming] = {}
        self.seen: set[str] = set()
        self.play = ""
        self.task = ""
        self.data: dict[str, Any] = {}

    def feed(self, event: dict[str, Any]) -> None:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        host = data.get("host")
        if kind == "playbook_on_stats":
            self.stats = {
                key: dict(data.get(key) or {})
                for key in ("ok", "changed", "failures", "dark", "skipped", "rescued", "ignored", "processed")
            }
            # set_stats data with per_host: false (ansible-runner passes only the run-wide part)
            artifact = data.get("artifact_data")
            if isinstance(artifact, dict):
                self.data = artifact
        elif kind == "playbook_on_play_start":
            self.play, self.task = str(data.get("name") or ""), ""
        elif kind == "playbook_on_task_start":
            self.task = str(data.get("name") or data.get("task") or "")
        elif kind == "runner_on_start" and host:
            self.seen.add(host)
        elif kind in _RESULT_EVENTS and host:
            self._result(kind, host, data)
        elif kind in ("verbose", "error"):
            self._verbose(event.get("stdout") or "")

    def _result(self, kind: str, host: str, data: dict[str, Any]) -> None:
        counts = self.counts.setdefault(host, HostStats())
        duration = float(data.get("duration") or 0.0)
        counts.elapsed += duration
        res = data.get("res") if isinstance(data.get("res"), dict) else {}
        if kind == "runner_on_ok":
            counts.ok += 1
            counts.changed += bool(res.get("changed"))
        elif kind == "runner_on_skipped":
            counts.skipped += 1
        elif kind == "runner_on_failed":
            if data.get("ignore_errors"):
                counts.ignored += 1
            else:
                counts.failed += 1
                self.failures[host] = self._failure("failed", host, data, res)
        else:
            counts.unreachable += 1
            self.failures[host] = self._failure("unreachable", host, data, res)
        uuid = str(data.get("task_uuid") or "")
        timing = self.task_times.get(uuid)
        if timing is None or duration > timing.seconds:
            self.task_times[uuid] = TaskTiming(
                play=str(data.get("play") or ""),
                task=str(data.get("task") or ""),
                host=host,
                seconds=duration,
            )

    @staticmethod
    def _failure(kind: str, host: str, data: dict[str, Any], res: dict[str, Any]) -> Failure:
        msg, detail = _text.plain_failure(res, unreachable=kind == "unreachable")
        rc = res.get("rc")
        return Failure(
            kind=kind,
            host=host,
            play=str(data.get("play") or ""),
            task=str(data.get("task") or ""),
            action=str(data.get("resolved_action") or data.get("task_action") or ""),
            msg=msg,
            detail=detail,
            rc=rc if isinstance(rc, int) and not isinstance(rc, bool) else None,
            task_path=str(data.get("task_path") or ""),
        )

    def _verbose(self, text: str) -> None:
        for line in _text.strip_ansi(text).splitlines():
            if line.startswith("[ERROR]:") or (self.error_lines and len(self.error_lines) < 40):
                self.error_lines.append(line.rstrip())

    def hosts(self) -> dict[str, HostStats]:
        if self.stats is None:  # ansible was stopped before its recap
            return {name: self.counts.get(name, HostStats()) for name in self.seen | set(self.counts)}
        names = set(self.counts)
        for per_host in self.stats.values():
            names.update(per_host)
        out = {}
        for name in names:
            seen = self.counts.get(name, HostStats())
            out[name] = HostStats(
                ok=self.stats["ok"].get(name, 0),
                changed=self.stats["changed"].get(name, 0),
                failed=self.stats["failures"].get(name, 0),
                unreachable=self.stats["dark"].get(name, 0),
                skipped=self.stats["skipped"].get(name, 0),
                rescued=self.stats["rescued"].get(name, 0),
                ignored=self.stats["ignored"].get(name, 0),
                elapsed=seen.elapsed,
            )
        return out

    def result_failures(
        self, hosts: dict[str, HostStats], rc: int | None, interrupted: bool = False
    ) -> list[Failure]:
        # A failure that a rescue block caught does not count: keep hosts the recap says failed.
        out = [
            f
            for name, f in sorted(self.failures.items())
            if (f.kind == "failed" and hosts.get(name, HostStats()).failed)
            or (f.kind == "unreachable" and hosts.get(name, HostStats()).unreachable)
        ]
        if interrupted:
            where = f'during task "{self.task}"' if self.task else "before the first task"
            out.append(
                Failure(
                    kind="interrupted",
                    host=None,
                    play=self.play,
                    task=self.task,
                    action="",
                    msg=f"interrupted {where}; ansible was stopped",
                )
            )
        elif self.error_lines and rc not in (0, None) and not out:
            first = self.error_lines[0].removeprefix("[ERROR]:").strip()
            rest = "\n".join(line for line in self.error_lines[1:] if line.strip())
            out.append(Failure(kind="error", host=None, play="", task="", action="", msg=first, detail=rest))
        return out

    def slowest(self, n: int = 10) -> list[TaskTiming]:
        return sorted(self.task_times.values(), key=lambda t: t.seconds, reverse=True)[:n]

    def result(self, *, playbook: str, rc: int | None, interrupted: bool, **fields: Any) -> RunResult:
        hosts = self.hosts()
        exit_code = exit_code_for(hosts, rc, interrupted)
        return RunResult(
            playbook=playbook,
            status=STATUS_BY_EXIT[exit_code],
            rc=rc,
            exit_code=exit_code,
            hosts=hosts,
            failures=self.result_failures(hosts, rc, interrupted),
            slowest_tasks=self.slowest(),
            data=self.data,
            **fields,
        )

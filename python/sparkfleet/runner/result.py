"""What a run leaves behind: per-host stats, failures, timings, the `--json` document, exit codes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_ID = "sparkfleet.run-result"
SCHEMA_VERSION = "1.2"
SCHEMA_FILE = Path(__file__).resolve().parent.parent / "schema" / "run-result.schema.json"

EXIT_OK = 0
EXIT_ERROR = 1  # ansible could not run the playbook at all (syntax, inventory, no hosts matched)
EXIT_FAILED = 2
EXIT_UNREACHABLE = 4
EXIT_LOCKED = 75  # another run holds the cluster lock (BSD's EX_TEMPFAIL: try again later)
EXIT_INTERRUPTED = 130

STATUS_BY_EXIT = {
    EXIT_OK: "successful",
    EXIT_ERROR: "error",
    EXIT_FAILED: "failed",
    EXIT_UNREACHABLE: "unreachable",
    EXIT_LOCKED: "locked",
    EXIT_INTERRUPTED: "interrupted",
}


class RunnerError(RuntimeError):
    """The run could not be started (no project, missing playbook or inventory)."""


@dataclass
class HostStats:
    """One host's recap, with ansible's meaning: `ok` counts changed results too."""

    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0
    elapsed: float = 0.0  # seconds spent in tasks on this host

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "changed": self.changed,
            "failed": self.failed,
            "unreachable": self.unreachable,
            "skipped": self.skipped,
            "rescued": self.rescued,
            "ignored": self.ignored,
            "elapsed": round(self.elapsed, 3),
        }


@dataclass
class Failure:
    """What stopped a host (failed, unreachable) or the whole run (error, interrupted: host None)."""

    kind: str  # "failed" | "unreachable" | "error" | "interrupted" | "locked" (host: the head)
    host: str | None
    play: str
    task: str
    action: str
    msg: str
    detail: str = ""  # stderr / module_stderr / stdout, shortened
    rc: int | None = None
    task_path: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "host": self.host,
            "play": self.play,
            "task": self.task,
            "action": self.action,
            "msg": self.msg,
            "detail": self.detail,
            "rc": self.rc,
            "task_path": self.task_path,
        }


@dataclass
class TaskTiming:
    play: str
    task: str
    host: str  # the slowest host of this task
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"play": self.play, "task": self.task, "host": self.host, "seconds": round(self.seconds, 3)}


@dataclass
class RunResult:
    playbook: str
    status: str  # successful | failed | unreachable | error | interrupted | locked
    rc: int | None  # ansible-playbook's own exit status (254 when it had to be killed; None: not run)
    exit_code: int  # 0 ok, 1 error, 2 failed hosts, 4 unreachable, 75 locked, 130 interrupted
    hosts: dict[str, HostStats]
    failures: list[Failure]
    elapsed: float
    artifacts_dir: Path
    started: str = ""  # ISO 8601, UTC
    check: bool = False
    inventories: list[str] = field(default_factory=list)
    slowest_tasks: list[TaskTiming] = field(default_factory=list)
    # What the roles reported for machines with set_stats (engine_status, host_status, clocks,
    # verify, pins, ...): ansible-runner's artifact_data. Empty when nothing was reported.
    data: dict[str, Any] = field(default_factory=dict)
    # The cluster lock of a changing run (runner.lock.LockOutcome); None when the run took none.
    lock: Any = None

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        """The `--json` document (docs/json-schema.md, schema/run-result.schema.json)."""
        return {
            "schema": SCHEMA_ID,
            "schema_version": SCHEMA_VERSION,
            "playbook": self.playbook,
            "inventories": list(self.inventories),
            "check": self.check,
            "status": self.status,
            "exit_code": self.exit_code,
            "rc": self.rc,
            "started": self.started,
            "elapsed": round(self.elapsed, 3),
            "artifacts_dir": str(self.artifacts_dir),
            "hosts": {name: stats.to_dict() for name, stats in sorted(self.hosts.items())},
            "failures": [f.to_dict() for f in self.failures],
            "slowest_tasks": [t.to_dict() for t in self.slowest_tasks],
            "data": self.data,
            "lock": self.lock.to_dict() if self.lock is not None else None,
        }


def exit_code_for(hosts: dict[str, HostStats], rc: int | None, interrupted: bool) -> int:
    if interrupted:
        return EXIT_INTERRUPTED
    if any(h.unreachable for h in hosts.values()):
        return EXIT_UNREACHABLE
    if any(h.failed for h in hosts.values()) or rc == EXIT_FAILED:
        return EXIT_FAILED
    return EXIT_OK if rc == 0 else EXIT_ERROR

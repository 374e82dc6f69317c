"""Run one playbook through ansible-runner and reduce its events to a `RunResult`.

Every run gets a fresh private data dir under the runs root (default `<project>/.cache/runs/`,
env `SPARKFLEET_RUNS_DIR`), named `<UTC timestamp>-<verb>`; only the newest `SPARKFLEET_KEEP_RUNS`
(default 20) are kept. ansible-runner is told not to write `env/*` files, and extravars whose name
looks secret never reach the artifacts: see docs/cli.md "Secrets".
"""

from __future__ import annotations

import configparser
import contextlib
import datetime as dt
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkfleet import progress as _progress

SCHEMA_ID = "sparkfleet.run-result"
SCHEMA_VERSION = "1.0"
SCHEMA_FILE = Path(__file__).resolve().parent / "schema" / "run-result.schema.json"

EXIT_OK = 0
EXIT_ERROR = 1  # ansible could not run the playbook at all (syntax, inventory, no hosts matched)
EXIT_FAILED = 2
EXIT_UNREACHABLE = 4
EXIT_INTERRUPTED = 130

STATUS_BY_EXIT = {
    EXIT_OK: "successful",
    EXIT_ERROR: "error",
    EXIT_FAILED: "failed",
    EXIT_UNREACHABLE: "unreachable",
    EXIT_INTERRUPTED: "interrupted",
}

DEFAULT_KEEP_RUNS = 20
# After the first Ctrl-C ansible gets this long to stop by itself before it is killed.
INTERRUPT_GRACE_S = 10.0
# Extravars whose name matches are kept out of the artifacts. Broad on purpose: a false positive
# only means the variable travels in the in-memory file instead of the command line.
SECRET_NAME_RE = re.compile(r"token|key|passw|secret|credential|cred", re.IGNORECASE)
# Environment variables are matched on how secrets are conventionally named (HF_TOKEN,
# OPENAI_API_KEY, VAULT_PASSWORD), not ANSIBLE_HOST_KEY_CHECKING and the like.
SECRET_ENV_RE = re.compile(r"(TOKEN|PASSWORD|PASSWD|PASSPHRASE|SECRET|CREDENTIALS?|_KEY)$", re.IGNORECASE)
_NOT_SECRET_VALUES = {"true", "false", "yes", "no", "none", "null"}
REDACTED = "<redacted>"
_RUN_DIR_RE = re.compile(r"^\d{8}T\d{6}Z")


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

    kind: str  # "failed" | "unreachable" | "error" | "interrupted"
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
    status: str  # successful | failed | unreachable | error | interrupted
    rc: int | None  # ansible-playbook's own exit status (254 when it had to be killed)
    exit_code: int  # 0 ok, 1 error, 2 failed hosts, 4 unreachable, 130 interrupted
    hosts: dict[str, HostStats]
    failures: list[Failure]
    elapsed: float
    artifacts_dir: Path
    started: str = ""  # ISO 8601, UTC
    check: bool = False
    inventories: list[str] = field(default_factory=list)
    slowest_tasks: list[TaskTiming] = field(default_factory=list)

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
        }


# ---- project and paths ---------------------------------------------------------------------


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


def _resolve(path: str | Path, project: Path, what: str) -> str:
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


# ---- secrets -------------------------------------------------------------------------------


def split_secrets(extravars: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    public: dict[str, Any] = {}
    secret: dict[str, Any] = {}
    for key, value in (extravars or {}).items():
        (secret if SECRET_NAME_RE.search(str(key)) else public)[key] = value
    return public, secret


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)
    elif value is not None and not isinstance(value, bool):
        yield str(value)


def secret_values(secret_vars: dict[str, Any], env: dict[str, str]) -> list[str]:
    values = set(_strings(secret_vars))
    values.update(v for k, v in env.items() if SECRET_ENV_RE.search(k))
    # Very short or boolean-like values would redact unrelated text all over the artifacts.
    return sorted(
        (v for v in values if len(v) >= 6 and v.lower() not in _NOT_SECRET_VALUES), key=len, reverse=True
    )


def _memory_dir() -> str | None:
    for candidate in ("/dev/shm", os.environ.get("XDG_RUNTIME_DIR")):
        if candidate and os.path.isdir(candidate) and os.access(candidate, os.W_OK):
            return candidate
    return None


@contextlib.contextmanager
def secret_vars_file(secret_vars: dict[str, Any]) -> Iterator[str | None]:
    """A 0600 JSON file in a 0700 dir in memory (/dev/shm) for `-e @file`, removed afterwards."""
    if not secret_vars:
        yield None
        return
    tmp = tempfile.mkdtemp(prefix="sparkfleet-secrets-", dir=_memory_dir())
    path = os.path.join(tmp, "extravars.json")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(secret_vars, fh)
        yield path
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def scrub_command_file(artifacts: Path, values: list[str]) -> None:
    """ansible-runner records the full environment in artifacts/command; blank the secret ones."""
    path = artifacts / "command"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    env = data.get("env") or {}
    for key in env:
        if SECRET_ENV_RE.search(key):
            env[key] = REDACTED
    data["command"] = [_redact_text(str(arg), values) for arg in data.get("command") or []]
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def _redact_text(text: str, values: list[str]) -> str:
    for value in values:
        text = text.replace(value, REDACTED)
    return text


def redact_tree(root: Path, values: list[str]) -> None:
    """Safety net after the run: a secret value a task printed anyway is blanked in the artifacts."""
    if not values:
        return
    needles = []
    for value in values:
        needles.append((value.encode(), REDACTED.encode()))
        escaped = json.dumps(value)[1:-1].encode()
        if escaped != value.encode():
            needles.append((escaped, REDACTED.encode()))
    for path in root.rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        new = data
        for needle, repl in needles:
            new = new.replace(needle, repl)
        if new != data:
            path.write_bytes(new)


# ---- Ctrl-C --------------------------------------------------------------------------------


def _ansible_children() -> list[int]:
    """Our ansible-playbook child processes (Linux /proc; empty elsewhere)."""
    me = os.getpid()
    found = []
    for pid, (ppid, _start) in _proc_table().items():
        if ppid != me:
            continue
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as fh:
            if b"ansible-playbook" in fh.read():
                found.append(pid)
    return found


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, start time) of every live process (Linux /proc; empty elsewhere)."""
    table: dict[int, tuple[int, int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
            fields = stat[stat.rindex(b")") + 2 :].split()
            if fields[0] != b"Z":
                table[int(entry)] = (int(fields[1]), int(fields[19]))
        except (OSError, ValueError, IndexError):
            continue
    return table


def _descendants(root: int) -> dict[int, int]:
    """pid -> start time of every live process below `root`."""
    table = _proc_table()
    below: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, (ppid, _) in table.items() if ppid in frontier} - below
        below |= frontier
    return {pid: table[pid][1] for pid in below}


class Interrupt:
    """First Ctrl-C: ask ansible to stop (SIGINT to its process group). Second, or after a grace
    period: tell ansible-runner to cancel, which kills the group."""

    def __init__(self, grace: float = INTERRUPT_GRACE_S, tick: Callable[[], None] | None = None) -> None:
        self.grace = grace
        self.tick = tick
        self.count = 0
        self.first_at: float | None = None
        self.forwarded = False
        self.tree: dict[int, int] = {}  # what ran below ansible at the first Ctrl-C: pid -> start time
        self._saved: dict[int, Any] = {}

    @property
    def interrupted(self) -> bool:
        return self.count > 0

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._saved[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()

    def _handle(self, signum: int, frame: object) -> None:
        self.count += 1
        if self.count == 1:
            self.first_at = time.monotonic()
            children = _ansible_children()
            # What runs below ansible, read before it is signalled: once a worker dies of the SIGINT its
            # task processes are re-parented (to init) and would no longer be found below ansible.
            for pid in children:
                self.tree.update(_descendants(pid))
            for pid in children:
                with contextlib.suppress(OSError):
                    if os.getpgid(pid) == pid:
                        os.killpg(pid, signal.SIGINT)
                    else:
                        os.kill(pid, signal.SIGINT)
                    self.forwarded = True

    def reap(self) -> list[int]:
        """After ansible ended: stop what it left running below it (the same pids, not reused ones).
        mitogen's task processes ignore SIGINT (inherited from its workers) and outlive ansible."""
        table = _proc_table()
        left = [pid for pid, start in self.tree.items() if pid in table and table[pid][1] == start]
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        return left

    def cancel(self) -> bool:
        """ansible-runner's cancel_callback: called about once a second while ansible runs."""
        if self.tick is not None:
            with contextlib.suppress(Exception):
                self.tick()
        if not self.interrupted:
            return False
        if not self.forwarded or self.count > 1:
            return True
        return self.first_at is not None and time.monotonic() - self.first_at > self.grace


# ---- events → result -----------------------------------------------------------------------

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

    def feed(self, event: dict[str, Any]) -> None:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        host = data.get("host")
        if kind == "playbook_on_stats":
            self.stats = {
                key: dict(data.get(key) or {})
                for key in ("ok", "changed", "failures", "dark", "skipped", "rescued", "ignored", "processed")
            }
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
        msg, detail = _progress.plain_failure(res, unreachable=kind == "unreachable")
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
        for line in _progress.strip_ansi(text).splitlines():
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
            **fields,
        )


def exit_code_for(hosts: dict[str, HostStats], rc: int | None, interrupted: bool) -> int:
    if interrupted:
        return EXIT_INTERRUPTED
    if any(h.unreachable for h in hosts.values()):
        return EXIT_UNREACHABLE
    if any(h.failed for h in hosts.values()) or rc == EXIT_FAILED:
        return EXIT_FAILED
    return EXIT_OK if rc == 0 else EXIT_ERROR


# ---- the run -------------------------------------------------------------------------------


def _cfg_host_key_checking(cfg: Path) -> str:
    parser = configparser.ConfigParser(interpolation=None)
    with contextlib.suppress(configparser.Error, OSError):
        parser.read(cfg)
    return parser.get("defaults", "host_key_checking", fallback="True")


def runner_env(project: Path) -> dict[str, str]:
    cfg = project / "ansible.cfg"
    bindir = str(Path(sys.executable).parent)
    env = {
        "ANSIBLE_CONFIG": str(cfg),
        # ansible-playbook from the same virtualenv as this package, whatever PATH says.
        "PATH": os.pathsep.join([bindir, os.environ.get("PATH", "")]),
        "PYTHONUNBUFFERED": "1",
    }
    # ansible-runner turns host key checking off unless told otherwise; keep ansible.cfg's choice.
    if "ANSIBLE_HOST_KEY_CHECKING" not in os.environ:
        env["ANSIBLE_HOST_KEY_CHECKING"] = _cfg_host_key_checking(cfg)
    env.update(strategy_env(os.environ.get("SPARKFLEET_STRATEGY", "")))
    return env


def fact_cache_env(inventories: list[Path]) -> dict[str, str]:
    """One fact cache per set of inventories. ansible.cfg's jsonfile cache is keyed by host name
    only: two clusters whose hosts are both called spark1 (two labs, or tp2 and tp3 fleets run
    from one controller) would read each other's facts. An ANSIBLE_CACHE_PLUGIN_CONNECTION of the
    caller's own is kept."""
    if os.environ.get("ANSIBLE_CACHE_PLUGIN_CONNECTION"):
        return {}
    key = hashlib.sha256("\n".join(str(Path(i).resolve()) for i in inventories).encode()).hexdigest()[:16]
    base = (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sparkfleet" / "facts-by-inventory"
    )
    return {"ANSIBLE_CACHE_PLUGIN_CONNECTION": str(base / key)}


STRATEGIES = ("linear", "mitogen")


def strategy_env(name: str) -> dict[str, str]:
    """SPARKFLEET_STRATEGY: unset = ansible.cfg's `sparkfleet` strategy (mitogen when installed, else
    linear); `mitogen` = the same, but refuse to run without mitogen; `linear` = ansible's own, one
    Python per task and node (README, "Speed")."""
    if name == "":
        return {}
    if name == "linear":
        return {"ANSIBLE_STRATEGY": "linear"}
    if name != "mitogen":
        choices = ", ".join(STRATEGIES)
        raise RunnerError(f"SPARKFLEET_STRATEGY={name!r}: use one of {choices} (or leave it unset)")
    try:
        import ansible_mitogen  # noqa: F401 - only whether it is there
    except ImportError as exc:
        raise RunnerError(
            "SPARKFLEET_STRATEGY=mitogen needs the mitogen package: `make venv` installs it from "
            "requirements/lock.txt, or unset SPARKFLEET_STRATEGY"
        ) from exc
    return {"ANSIBLE_STRATEGY": "sparkfleet"}


def _fanout(handlers: list[tuple[Callable[[dict], None] | None, str]]) -> Callable[[dict], bool]:
    """One ansible-runner event handler calling each of ours. A display or user callback that
    raises must not abort a running playbook: it is reported once and the run goes on."""
    warned: set[str] = set()
    live = [(fn, label) for fn, label in handlers if fn is not None]

    def handle(event: dict) -> bool:
        for fn, label in live:
            try:
                fn(event)
            except Exception as exc:
                if label not in warned:
                    warned.add(label)
                    print(f"sparkfleet: {label} raised {exc!r}; the run goes on", file=sys.stderr)
        return True  # ansible-runner keeps the event in artifacts/job_events

    return handle


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


def run_playbook(
    playbook: str | Path,
    inventories: list[str | Path],
    *,
    check: bool = False,
    diff: bool = False,
    limit: str | None = None,
    tags: str | None = None,
    skip_tags: str | None = None,
    extravars: dict | None = None,
    verbosity: int = 0,
    on_event: Callable[[dict], None] | None = None,
    project_dir: Path | None = None,
    quiet: bool = False,
) -> RunResult:
    """Run `playbook` against `inventories` (layered in order, as repeated `-i`) and wait.

    Unless `quiet`, live progress and the recap go to stdout. `on_event` receives every raw
    ansible-runner event. Ctrl-C (SIGINT/SIGTERM, main thread only) stops ansible: the result then
    has exit_code 130. Raises RunnerError when the run cannot start.
    """
    import ansible_runner

    project = find_project(project_dir)
    book = _resolve(playbook, project, "playbook")
    if not inventories:
        raise RunnerError("no inventory given (-i INVENTORY)")
    invs = [_resolve(inv, project, "inventory") for inv in inventories]
    now = dt.datetime.now(dt.UTC)
    private = new_run_dir(project, book, now)
    artifacts = private / "artifacts"

    public_vars, secret_vars = split_secrets(extravars)
    envvars = {**runner_env(project), **fact_cache_env(invs)}
    secrets = secret_values(secret_vars, {**os.environ, **envvars})
    display = None if quiet else _progress.Progress(sys.stdout, verbosity=verbosity, show_diff=diff)
    collector = Collector()

    def status_handler(data: dict, runner_config: object = None) -> None:
        # 'running' comes right after ansible-runner wrote artifacts/command, before ansible starts.
        if data.get("status") == "running":
            scrub_command_file(artifacts, secrets)

    interrupt = Interrupt(tick=display.tick if display is not None else None)
    started = time.monotonic()
    runner = None
    interrupt.install()
    try:
        with secret_vars_file(secret_vars) as secret_file:
            cmdline = [
                *(["--check"] if check else []),
                *(["--diff"] if diff else []),
                *(["-e", f"@{secret_file}"] if secret_file else []),
            ]
            runner = ansible_runner.run(
                private_data_dir=str(private),
                artifact_dir=str(private),
                ident="artifacts",
                project_dir=str(project),
                playbook=book,
                inventory=invs,
                limit=limit or None,
                tags=tags or None,
                skip_tags=skip_tags or None,
                extravars=public_vars or None,
                verbosity=verbosity or None,
                cmdline=shlex.join(cmdline) if cmdline else None,
                envvars=envvars,
                suppress_env_files=True,
                quiet=True,
                # Not "jsonfile": ansible-runner would then point the fact cache into this run's
                # artifacts and override ansible.cfg's shared cache (no-op re-runs need it).
                fact_cache_type="ansible.cfg",
                rotate_artifacts=0,
                event_handler=_fanout(
                    [
                        (collector.feed, "result collector"),
                        (display, "progress display"),
                        (on_event, "on_event"),
                    ]
                ),
                status_handler=status_handler,
                cancel_callback=interrupt.cancel,
            )
    finally:
        interrupt.restore()
        interrupt.reap()
        if display is not None:
            display.close()
        scrub_command_file(artifacts, secrets)
        redact_tree(private, secrets)

    interrupted = interrupt.interrupted or bool(runner is not None and runner.canceled)
    result = collector.result(
        playbook=book,
        rc=runner.rc if runner is not None else None,
        interrupted=interrupted,
        elapsed=time.monotonic() - started,
        artifacts_dir=artifacts,
        started=now.isoformat(timespec="seconds"),
        check=check,
        inventories=invs,
    )
    with contextlib.suppress(OSError):
        (artifacts / "sparkfleet-result.json").write_text(json.dumps(result.to_dict(), indent=2))
    if display is not None:
        sys.stdout.write(_progress.render_recap(result))
        sys.stdout.flush()
    return result

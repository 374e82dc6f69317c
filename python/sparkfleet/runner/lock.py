"""The cluster lock: a run that can change anything holds a flock on the head for as long as it
lives (`<sparkfleet_state_dir>/lock`, its record in `lock.json` beside it).

The flock is held by a process on the head (`lock_holder`), started through one connection that
the run keeps open: the controller sends a heartbeat line every HEARTBEAT_S and the release line
at the end. When the controller dies (kill -9, lost link) that process exits and the kernel frees
the flock; the record it leaves lets the next run say whose run is gone. A second changing run
is refused (EXIT_LOCKED) with the holder's name; `break_lock` stops the holder and takes over.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os
import queue
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from sparkfleet import __version__
from sparkfleet.runner.head import HeadConnection
from sparkfleet.runner.result import RunnerError

HOLDER_SOURCE = Path(__file__).resolve().parent / "lock_holder.py"
READY = "SPARKFLEET-LOCK-READY"
RELEASE = b"SPARKFLEET-LOCK-RELEASE\n"
HEARTBEAT_S = 10.0
RETAKE_S = 10.0
RELEASE_WAIT_S = 10.0
EXIT_BUSY = 75  # lock_holder.EXIT_BUSY

# The bootstrap the head runs: say READY (after sudo has read its password), read the holder's
# source (its length is the first argument) from stdin, run it. Short, because sudo logs it.
BOOTSTRAP = (
    "import os,sys\n"
    f"print({READY!r},flush=True)\n"
    "n=int(sys.argv.pop(1));c=b''\n"
    "while len(c)<n:\n"
    " d=os.read(0,n-len(c))\n"
    " if not d:sys.exit(3)\n"
    " c+=d\n"
    "exec(compile(c,'sparkfleet-lock-holder','exec'),{'__name__':'__main__'})\n"
)


NO_HEAD = "no cluster lock: the inventory has no `head` group (not a sparkfleet cluster), so nothing to lock"


class LockError(RunnerError):
    """The lock could not be taken for a reason other than another run holding it."""


@dataclass
class LockRequest:
    """A changing run asks for the lock. `verb` is what the record says the run is doing."""

    verb: str
    break_lock: bool = False


@dataclass
class LockOutcome:
    """What happened to the lock in this run (`lock` of the --json document)."""

    outcome: str  # taken | taken_over | broken | refused | none (no head group: not a cluster)
    head: str | None
    path: str | None
    holder: dict[str, Any] | None = None  # refused: who holds it; taken_over / broken: whose it was
    notes: list[str] = field(default_factory=list)  # lost and taken again during the run, ...

    @property
    def message(self) -> str:
        if self.outcome == "none":
            return NO_HEAD
        where = f"the cluster lock on {self.head} ({self.path})"
        if self.outcome == "refused":
            return f"{where} is held by {describe_holder(self.holder)}"
        if self.outcome == "taken_over":
            return f"taking over {where} from {describe_holder(self.holder)}, whose run is gone"
        if self.outcome == "broken":
            return f"broke {where}, held by {describe_holder(self.holder)}"
        return f"took {where}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "head": self.head,
            "path": self.path,
            "holder": self.holder,
            "message": self.message,
            "notes": list(self.notes),
        }


def describe_holder(record: dict[str, Any] | None) -> str:
    """`alice@laptop (pid 4242, `sparkfleet up`, since 2026-12-02 19:40:03 UTC, 5m ago)`."""
    if not record:
        return "an unknown run (it left no record)"
    if "unreadable" in record:
        return f"an unknown run (its record is unreadable: {record['unreadable']})"
    who = f"{record.get('user') or '?'}@{record.get('controller') or '?'}"
    parts = [f"pid {record['pid']}" if record.get("pid") else "", f"`sparkfleet {record.get('verb') or '?'}`"]
    since = record.get("started") or record.get("taken")
    if since:
        parts.append(f"since {_when(since)}")
    if record.get("head_hostname") and record.get("holder_pid"):
        parts.append(f"holder pid {record['holder_pid']} on {record['head_hostname']}")
    return f"{who} ({', '.join(p for p in parts if p)})"


def _when(iso: str) -> str:
    try:
        then = dt.datetime.fromisoformat(iso)
    except ValueError:
        return iso
    age = max(0, int((dt.datetime.now(dt.UTC) - then).total_seconds()))
    ago = f"{age // 60}m{age % 60:02d}s" if age < 3600 else f"{age // 3600}h{age % 3600 // 60:02d}m"
    return f"{then.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC, {ago} ago"


def _process_started() -> str | None:
    """This process's start time (UTC, ISO 8601) from /proc, where there is one."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat[stat.rfind(")") + 2 :].split()[19])
        stats = Path("/proc/stat").read_text().splitlines()
        btime = next(int(line.split()[1]) for line in stats if line.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    started = btime + ticks / os.sysconf("SC_CLK_TCK")
    return dt.datetime.fromtimestamp(int(started), dt.UTC).isoformat()


def run_record(verb: str, playbook: str, started: dt.datetime) -> dict[str, Any]:
    """What the lock's record says about this run (no secrets: it is readable on the head)."""
    return {
        "run_id": uuid.uuid4().hex,
        "user": getpass.getuser(),
        "controller": socket.gethostname(),
        "pid": os.getpid(),
        "pid_started": _process_started(),
        "verb": verb,
        "playbook": playbook,
        "started": started.isoformat(timespec="seconds"),
        "sparkfleet_version": __version__,
    }


class _Holder:
    """One connection to the head running lock_holder."""

    def __init__(self, conn: HeadConnection, mode: str, record: dict[str, Any]) -> None:
        self.conn = conn
        source = HOLDER_SOURCE.read_bytes()
        argv = [conn.python, "-c", BOOTSTRAP, str(len(source)), conn.state_dir, mode, json.dumps(record)]
        self.events: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        self._write_lock = threading.Lock()
        try:
            # A session of its own: the terminal's Ctrl-C goes to ansible, not to the lock's
            # connection (the lock is held until the run has stopped). When this process dies,
            # the pipe closes and the holder on the head lets go.
            self.proc = subprocess.Popen(
                conn.command(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise LockError(f"cannot start the lock's connection to {conn.describe()}: {exc}") from exc
        self._readers = [
            threading.Thread(target=self._read, args=args, daemon=True)
            for args in (
                (self.proc.stdout, self.events.put, True),
                (self.proc.stderr, self.stderr.append, False),
            )
        ]
        for reader in self._readers:
            reader.start()
        self.source = source

    @staticmethod
    def _read(stream: IO[bytes] | None, sink: Callable[[Any], None], end: bool) -> None:
        try:
            for raw in stream or ():
                sink(raw.decode("utf-8", "replace").rstrip("\n"))
        except (OSError, ValueError):
            pass
        if end:
            sink(None)

    def write(self, data: bytes) -> bool:
        with self._write_lock:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
            except (OSError, ValueError):
                return False
        return True

    def next_line(self, deadline: float) -> str | None:
        """The next stdout line; None at end of output or when the deadline passes."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                return self.events.get(timeout=min(left, 0.2))
            except queue.Empty:
                if self._sudo_refused():
                    return None

    def _sudo_refused(self) -> bool:
        # sudo -S with a wrong password asks again, reading stdin: stop at its first complaint.
        return self.conn.become_password is not None and any("try again" in line for line in self.stderr)

    def handshake(self) -> dict[str, Any]:
        """Start the holder: sudo's password, READY, the source; its first event."""
        deadline = time.monotonic() + self.conn.connect_timeout + 30
        if self.conn.become_password is not None and not self.conn.root:
            self.write(self.conn.become_password.encode() + b"\n")
        line = self.next_line(deadline)
        while line is not None and line != READY:
            line = self.next_line(deadline)
        if line != READY:
            raise LockError(self._stop_and_say_why())
        self.write(self.source)
        while True:
            line = self.next_line(deadline)
            if line is None:
                raise LockError(self._stop_and_say_why())
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and "event" in event:
                return event

    def _stop_and_say_why(self) -> str:
        conn = self.conn
        waited = self.proc.poll() is None  # still running: it did not answer in time
        self.kill()
        for reader in self._readers:  # all of stderr, now that the process has ended
            reader.join(timeout=2)
        err = "\n".join(line for line in self.stderr if line.strip())[-2000:]
        rc = self.proc.poll()
        head = conn.describe()
        if self._sudo_refused():
            return f"sudo on {head} refused the become password (-K / --become-password-file)"
        if "password is required" in err or "a terminal is required" in err:
            return (
                f"sudo on {head} asks for a password: give it with -K (--ask-become-pass) or "
                "--become-password-file (the API: become_password=...)"
            )
        if rc == 255 and not conn.local:
            return f"cannot reach the head {head} by ssh to take the cluster lock: {err or 'ssh exited 255'}"
        if waited:
            return f"the lock's holder on {head} did not answer within {conn.connect_timeout + 30}s: {err}"
        return f"cannot take the cluster lock on {head} (exit {rc}): {err or 'no output'}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.wait(5)

    def wait(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        with self._write_lock:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
            except OSError:
                pass


def _gone_why(holder: _Holder) -> str | None:
    """Why the holder said it stopped, if it said so before its connection closed."""
    for line in reversed([x for x in list(holder.events.queue) if x]):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == "gone":
            return str(event.get("why"))
    return None


class ClusterLock:
    """Take the lock (`acquire`), keep it with heartbeats, take it again if the head went away
    during the run (a reboot), and let it go (`release`)."""

    def __init__(
        self, conn: HeadConnection, record: dict[str, Any], notify: Callable[[str], None] | None = None
    ) -> None:
        self.conn = conn
        self.record = record
        self.notify = notify or (lambda _msg: None)
        self.outcome: LockOutcome | None = None
        self._holder: _Holder | None = None
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None
        self._mutex = threading.Lock()  # the keeper's new holder vs. release at the run's end

    def acquire(self, break_lock: bool = False) -> LockOutcome:
        holder = _Holder(self.conn, "break" if break_lock else "take", self.record)
        try:
            event = holder.handshake()
        except BaseException:  # Ctrl-C while connecting: no holder may outlive this
            holder.kill()
            raise
        outcome = self._outcome(event)
        if outcome.outcome == "refused" or event.get("event") != "held":
            holder.wait(5)
            if event.get("event") == "error":
                raise LockError(f"cannot take the cluster lock on {self.conn.describe()}: {event.get('msg')}")
        else:
            self._holder = holder
            self._keeper = threading.Thread(target=self._keep, name="sparkfleet-lock", daemon=True)
            self._keeper.start()
        self.outcome = outcome
        return outcome

    def _outcome(self, event: dict[str, Any]) -> LockOutcome:
        kind = event.get("event")
        head, path = self.conn.name, self.conn.lock_path
        if kind == "busy":
            return LockOutcome("refused", head, path, holder=event.get("holder"))
        if kind == "held" and event.get("broke"):
            return LockOutcome("broken", head, path, holder=event.get("broken"))
        previous = event.get("previous")
        if previous and previous.get("run_id") != self.record["run_id"]:
            return LockOutcome("taken_over", head, path, holder=previous)
        return LockOutcome("taken", head, path)

    def _note(self, msg: str) -> None:
        if self.outcome is not None:
            self.outcome.notes.append(msg)
        self.notify(f"lock: {msg}")

    def _keep(self) -> None:
        """Heartbeats; when the holder is gone before the run's end, take the lock again."""
        while not self._stop.wait(HEARTBEAT_S):
            holder = self._holder
            if holder is not None and holder.write(b"\n") and holder.proc.poll() is None:
                continue
            if holder is not None:
                holder.wait(1)
                for reader in holder._readers:  # its last words ("gone", and why) are read
                    reader.join(timeout=2)
                why = _gone_why(holder) or "the connection to the head closed"
                self._holder = None
                self._note(f"lost the cluster lock on {self.conn.name} ({why}); taking it again")
            if not self._retake():
                return

    def _retake(self) -> bool:
        """Try again until the run ends; False when another run holds it now (stop trying)."""
        while not self._stop.is_set():
            try:
                holder = _Holder(self.conn, "take", self.record)
                event = holder.handshake()
            except LockError:
                if self._stop.wait(RETAKE_S):
                    return False
                continue
            if event.get("event") == "held":
                with self._mutex:
                    ended = self._stop.is_set()
                    if not ended:
                        self._holder = holder
                if ended:  # the run ended while the lock was being taken again
                    _let_go(holder)
                    return False
                self._note(f"took the cluster lock on {self.conn.name} ({self.conn.lock_path}) again")
                return True
            holder.wait(5)
            if event.get("event") == "busy":
                other = describe_holder(event.get("holder"))
                self._note(f"now held by {other}; this run goes on without the lock")
                return False
            if self._stop.wait(RETAKE_S):
                return False
        return False

    def release(self) -> None:
        with self._mutex:
            self._stop.set()
        if self._keeper is not None:
            self._keeper.join(timeout=RELEASE_WAIT_S)
        with self._mutex:
            holder, self._holder = self._holder, None
        if holder is not None:
            _let_go(holder)


def _let_go(holder: _Holder) -> None:
    """The release line, then wait (a while) for the holder to say it removed its record."""
    if holder.write(RELEASE):
        deadline = time.monotonic() + RELEASE_WAIT_S
        line = holder.next_line(deadline)
        while line is not None and "released" not in line:
            line = holder.next_line(deadline)
    holder.wait(RELEASE_WAIT_S)

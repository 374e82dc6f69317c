"""The cluster lock's holder: the process on the head that holds the flock for one run.

This file runs ON THE HEAD, under the head's own python3 (standard library only; nodes run 3.11
-3.13, as for plugins/module_utils):
the controller (`sparkfleet.runner.lock`) starts a tiny bootstrap over SSH (or locally), which
prints READY, reads this source from stdin and runs it as `__main__`. Arguments: the state
directory, `take` or `break`, and the run's record (JSON) to write beside the lock.

It takes `<state_dir>/lock` with flock(LOCK_EX | LOCK_NB) and writes `<state_dir>/lock.json`
(the run's record, plus this process's pid, start time and boot id). Then it waits on stdin:

- the line `SPARKFLEET-LOCK-RELEASE`: the run ended; the record is removed, the process exits;
- end of input (the controller died, or its SSH connection closed): the process exits and the
  kernel releases the flock; the record stays, so the next run can say whose run is gone;
- no byte for IDLE_S seconds (the controller sends a heartbeat line every few seconds; a link
  that died without closing the connection sends nothing): the same as end of input;
- SIGTERM / SIGHUP (`--break-lock` of another run, or the session ending): the same.

A `break` first writes `<state_dir>/lock.breaking` (its own record, pid, start time and boot id) and
removes it once it holds the flock (or gave up). While that names a live process, a `take` that gets the
flock lets it go again and answers `busy` with the breaker's record: the run whose holder was just
stopped, taking its lock again, must not win the race against the run that stopped it.

One JSON line per event on stdout: `busy` (exit 75: someone holds it; their record), `held`
(the previous record, if one was left, and the record of the run that was broken), `released`,
`gone` (why the holder stopped without a release), `error` (exit 1).
"""

import contextlib
import datetime
import fcntl
import json
import os
import select
import signal
import socket
import sys
import time

RELEASE = b"SPARKFLEET-LOCK-RELEASE"
IDLE_S = 120.0
BREAK_WAIT_S = 10.0
EXIT_BUSY = 75


def say(**event):
    try:
        sys.stdout.write(json.dumps(event, sort_keys=True) + "\n")
        sys.stdout.flush()
    except OSError:
        pass  # the controller is gone: nobody to tell


def proc_start(pid):
    """Start time of a process in clock ticks since boot (/proc/<pid>/stat field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return None


def utc_now():
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()


def read_record(path):
    try:
        with open(path) as fh:
            record = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return {"unreadable": str(exc)}
    return record if isinstance(record, dict) else {"unreadable": "not a JSON object"}


def write_record(path, record):
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w") as fh:
        json.dump(record, fh, sort_keys=True)
        fh.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def try_lock(fd):
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def holders_of(path):
    """Processes that have the lock file open (what holds the flock when no record names it)."""
    try:
        target = os.stat(path)
    except OSError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        fd_dir = f"/proc/{entry}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                found.append(int(entry))
                break
    return found


def alive(record):
    """The pid a record names, while it is still that process (same boot, same start); else None."""
    pid = record.get("holder_pid") if isinstance(record, dict) else None
    same = isinstance(pid, int) and record.get("boot_id") == boot_id()
    return pid if same and proc_start(pid) == record.get("holder_start") else None


def break_holder(fd, path, record):
    """Stop the process that holds the lock; True once the flock is ours."""
    pid = alive(record)
    pids = [pid] if pid is not None else []
    if not pids:
        pids = holders_of(path)
    deadline = time.monotonic() + BREAK_WAIT_S
    sig = signal.SIGTERM
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    while time.monotonic() < deadline:
        if try_lock(fd):
            return True
        if sig == signal.SIGTERM and time.monotonic() > deadline - BREAK_WAIT_S / 2:
            sig = signal.SIGKILL
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        time.sleep(0.1)
    return try_lock(fd)


def unmark(breaking_path):
    """Remove this process's break marker (never another breaker's)."""
    if (read_record(breaking_path) or {}).get("holder_pid") == os.getpid():
        with contextlib.suppress(OSError):
            os.unlink(breaking_path)


class Gone(Exception):
    pass


def on_signal(signum, frame):
    raise Gone(f"signal {signum}")


def wait_for_release(info_path, record):
    """Heartbeats until the release line; why the holder stopped otherwise."""
    buf = b""
    while True:
        ready, _, _ = select.select([0], [], [], IDLE_S)
        if not ready:
            return f"no heartbeat from the controller for {IDLE_S:.0f}s"
        data = os.read(0, 4096)
        if not data:
            return "the controller's connection closed"
        buf = (buf + data)[-4 * len(RELEASE) :]
        if RELEASE in buf:
            current = read_record(info_path) or {}
            if current.get("run_id") == record.get("run_id"):
                os.unlink(info_path)
            return None


class Refused(Exception):
    """The lock was not taken: the event already said why; the exit code."""


def acquire(fd, path, mode, record):
    """Take the flock (a `break` stops its holder first): (the broken run's record or None, whether one was
    broken, the break mark to remove once this run's record is written, or None)."""
    info_path, breaking_path = path + ".json", path + ".breaking"
    if try_lock(fd):
        breaker = read_record(breaking_path)
        if mode != "break" and alive(breaker) is not None:  # a break is under way: the breaker's flock
            fcntl.flock(fd, fcntl.LOCK_UN)
            say(event="busy", holder=breaker)
            raise Refused(EXIT_BUSY)
        return None, False, None
    holder = read_record(info_path)
    if mode != "break":
        say(event="busy", holder=holder)
        raise Refused(EXIT_BUSY)
    mark = dict(record, holder_pid=os.getpid(), holder_start=proc_start(os.getpid()), boot_id=boot_id())
    try:
        write_record(breaking_path, mark)
    except OSError as exc:
        say(event="error", msg=f"cannot write {breaking_path}: {exc}")
        raise Refused(1) from exc
    if not break_holder(fd, path, holder):
        unmark(breaking_path)
        say(event="error", msg=f"the holder of {path} did not stop within {BREAK_WAIT_S:.0f}s")
        raise Refused(1)
    return holder, True, breaking_path


def main(argv):
    state_dir, mode, record = argv[0], argv[1], json.loads(argv[2])
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        os.makedirs(state_dir, 0o755, exist_ok=True)
        path = os.path.join(state_dir, "lock")
        info_path = path + ".json"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        say(event="error", msg=f"cannot open the lock in {state_dir}: {exc}")
        return 1
    try:
        broken, broke, mark = acquire(fd, path, mode, record)
    except Refused as exc:
        return exc.args[0]
    previous = None if broke else read_record(info_path)
    record.update(
        holder_pid=os.getpid(),
        holder_start=proc_start(os.getpid()),
        boot_id=boot_id(),
        head_hostname=socket.gethostname(),
        taken=utc_now(),
    )
    try:
        write_record(info_path, record)
    except OSError as exc:
        say(event="error", msg=f"cannot write {info_path}: {exc}")
        return 1
    finally:
        if mark:
            unmark(mark)
    say(event="held", previous=previous, broke=broke, broken=broken, record=record)
    try:
        why = wait_for_release(info_path, record)
    except Gone as exc:
        why = f"stopped by {exc}"
    if why is None:
        say(event="released")
    else:
        say(event="gone", why=why)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

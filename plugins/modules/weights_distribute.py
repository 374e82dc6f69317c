#!/usr/bin/python
# Head -> workers over the fabric: parallel streams (tcp, rsyncd or rsync over ssh) to every worker at once.
from __future__ import annotations

DOCUMENTATION = r"""
module: weights_distribute
short_description: Copy snapshot files from the head to all workers at once, over the fabric addresses
description:
  - For every worker, the files it lacks are spread over streams (C(streams_per_address) per
    fabric address of the worker, so both rails of a cable carry data) and all streams of all workers
    run at the same time.
  - Every transport keeps a cut-off file as a part in C(.rsync-partial) beside its final path and resumes
    from it (tcp sends the rest, rsync's delta transfer uses the part as basis); finished files are skipped
    (size + mtime).
    The source is the head's plain snapshot of hard links, so no hub-cache symlink reaches a worker.
  - Workers need no internet; they only receive over SSH from the head.
  - Writes a progress file (bytes, rate, ETA) for the role's wait action.
  - Why not C(ansible.posix.synchronize) - it runs one rsync per host and task, one stream over one address;
    this copies to all workers at once over several streams per fabric address, with progress.
options:
  src: {type: path, required: true, description: the head's snapshot directory}
  dest: {type: path, required: true, description: the workers' snapshot directory}
  targets:
    type: list
    elements: dict
    required: true
    description: "[{host, user, addresses, files: [{path, size}]}]"
  ssh_key: {type: path, description: private key the head uses toward the workers}
  ssh_options: {type: list, elements: str, default: [], description: more ssh -o options}
  streams_per_address: {type: int, default: 1, description: rsync processes per fabric address}
  rsync: {type: str, default: rsync, description: rsync binary}
  ssh: {type: str, default: ssh, description: ssh binary}
  transport:
    type: str
    choices: [ssh, rsyncd, tcp]
    default: ssh
    description:
      - ssh = rsync over ssh.
      - rsyncd = for this copy, an rsync daemon started through ssh on each worker's fabric address
        (a one-time secret sent on stdin), without ssh's encryption cost.
      - tcp = for this copy, a small Python receiver started through ssh on each worker's fabric
        address (a one-time secret sent on stdin); the head sends each file with sendfile(2) from
        where the worker's part in C(.rsync-partial) ends, the worker renames the whole file into
        place with the head's mtime. No checksums on the way (the role verifies every file after).
  rsyncd_port: {type: int, default: 8730, description: first port of the per-address daemons or receivers}
  python: {type: str, default: python3, description: the workers' Python 3 (transport tcp)}
  status_file: {type: path, description: progress file}
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: Copy the snapshot to the workers over the fabric, in the background
  sparkfleet.cluster.weights_distribute:
    src: /srv/sparkfleet/models/snapshot
    dest: /srv/sparkfleet/models/snapshot
    targets:
      - host: spark2
        user: spark
        addresses: [10.12.1.2, 10.12.2.2]
        files: [{path: config.json, size: 1523}]
    status_file: /srv/sparkfleet/models/.sparkfleet/progress-copy.json
  async: 86400
  poll: 0
  register: copy_job
"""

RETURN = r"""
copied:
  description: Host to the files sent to it (or to be sent, in check mode).
  type: dict
  returned: always
bytes:
  description: Bytes of the files sent.
  type: int
  returned: always
rate_bps:
  description: Bytes per second over all streams.
  type: int
  returned: when files were copied
streams:
  description: How many streams ran.
  type: int
  returned: when files were copied
"""

import contextlib
import os
import re
import secrets
import shlex
import socket
import subprocess
import tempfile
import threading
import time
import typing

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils.text_format import size as human
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_main import WeightsError, run_module
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_progress import Progress

PROGRESS2 = re.compile(r"^\s*([\d,]+)\s+\d+%")


def split_streams(files: list[dict], n: int) -> list[list[dict]]:
    """Largest file first onto the least loaded stream: streams end at about the same time."""
    streams: list[list[dict]] = [[] for _ in range(max(1, n))]
    load = [0] * len(streams)
    for f in sorted(files, key=lambda f: (-int(f["size"]), f["path"])):
        i = load.index(min(load))
        streams[i].append(f)
        load[i] += int(f["size"])
    return [s for s in streams if s]


def ssh_command(key: str | None, options: list[str], binary: str = "ssh") -> str:
    cmd = [binary, "-T", "-x", "-o", "BatchMode=yes", "-o", "Compression=no"]
    if key:
        cmd += ["-i", os.path.expanduser(key), "-o", "IdentitiesOnly=yes"]
    for opt in options:
        cmd += ["-o", opt]
    return shlex.join(cmd)


class Stream:
    def __init__(
        self, host: str, address: str, files: list[dict], argv: list[str], *, listfile: str, env=None
    ):
        self.env = env
        self.host = host
        self.address = address
        self.files = files
        self.argv = argv
        self.listfile = listfile
        self.bytes_done = 0
        self.sent_files: list[str] = []
        self.stderr = ""
        self.proc: subprocess.Popen | None = None
        self.rc: int | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env)
        threading.Thread(target=self._read_out, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read_out(self) -> None:
        buf = b""
        assert self.proc and self.proc.stdout
        while True:
            chunk = (
                self.proc.stdout.read1(65536)
                if hasattr(self.proc.stdout, "read1")
                else self.proc.stdout.read(1)
            )
            if not chunk:
                break
            buf += chunk
            parts = re.split(rb"[\r\n]", buf)
            buf = parts.pop()
            for raw in parts:
                self._line(raw.decode(errors="replace"))
        if buf:
            self._line(buf.decode(errors="replace"))

    def _line(self, line: str) -> None:
        if line.startswith("SF "):
            bits = line.split(" ", 2)
            if len(bits) == 3 and bits[1].startswith(("<f", ">f")):
                self.sent_files.append(bits[2])
            return
        m = PROGRESS2.match(line)
        if m:
            self.bytes_done = int(m.group(1).replace(",", ""))

    def _read_err(self) -> None:
        assert self.proc and self.proc.stderr
        data = self.proc.stderr.read()
        self.stderr = data.decode(errors="replace")[-4000:]

    def failure(self) -> str:
        return f"rsync exit {self.rc}: {_last_line(self.stderr)}"


# Run on a worker through ssh: an rsync daemon bound to one fabric address, for this copy only.
# The secret comes on stdin (never on a command line); the daemon ends when the head closes stdin.
DAEMON = r"""
umask 077
d=$(mktemp -d)
IFS= read -r secret
printf 'sparkfleet:%s\n' "$secret" > "$d/secrets"
printf '%s\n' 'use chroot = no' 'max connections = 64' 'reverse lookup = no' "lock file = $d/lock" \
  '[sparkfleet]' \
  '  path = {dest}' '  read only = no' '  auth users = sparkfleet' "  secrets file = $d/secrets" \
  '  strict modes = yes' > "$d/rsyncd.conf"
# as root rsyncd would switch to nobody; as anyone else it must not try to switch at all
if [ "$(id -u)" -eq 0 ]; then printf '%s\n' '  uid = 0' '  gid = 0' >> "$d/rsyncd.conf"; fi
{rsync} --daemon --no-detach --config="$d/rsyncd.conf" --address={address} --port={port} &
pid=$!
echo started
cat > /dev/null
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
rm -rf "$d"
"""


class Daemon:
    """An rsync daemon on a worker's fabric address, reached without ssh's encryption cost.

    Made in two steps so that the ssh sessions of every address start at once: the constructor starts
    ssh and sends the secret, `started()` waits for the script's word, `wait_ready()` for the port."""

    what = "an rsync daemon"  # for messages
    says_why_on_stdout = False  # the script's own refusal comes on stdout (else ssh's or sh's on stderr)

    def __init__(self, host: str, user: str, address: str, *, port: int, dest: str, ssh: str, rsync: str):
        script = DAEMON.format(dest=dest.rstrip("/"), rsync=rsync, address=shlex.quote(address), port=port)
        self._spawn(host, user, address, port, ssh=ssh, remote=f"sh -c {shlex.quote(script)}")

    def _spawn(self, host: str, user: str, address: str, port: int, *, ssh: str, remote: str) -> None:
        """ssh to the worker's fabric address running `remote`, and the one-time secret on its stdin."""
        self.host, self.address, self.port = host, address, port
        self.secret = secrets.token_hex(16)
        who = f"{user}@{address}" if user else address
        self.proc = subprocess.Popen(
            [*shlex.split(ssh), who, remote],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdin
        with contextlib.suppress(BrokenPipeError):  # ssh already gone: started() reports its error
            self.proc.stdin.write(self.secret + "\n")
            self.proc.stdin.flush()

    def started(self) -> None:
        assert self.proc.stdout
        line = self.proc.stdout.readline().strip()
        if line != "started":
            err = self.proc.stderr.read() if self.proc.stderr else ""
            why = (line or _last_line(err)) if self.says_why_on_stdout else (_last_line(err) or line)
            raise WeightsError(f"{self.host}: could not start {self.what} on {self.address}: {why}")

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"rsync://sparkfleet@{host}:{self.port}/sparkfleet/"

    def wait_ready(self, timeout: float = 20) -> None:
        """Until the daemon greets on its port (`@RSYNCD: <protocol>`); a wrong secret or module shows
        in the copy's own rsync error, with the worker and address."""
        deadline = time.monotonic() + timeout
        why = ""
        while True:
            try:
                with socket.create_connection((self.address, self.port), timeout=5) as conn:
                    conn.settimeout(5)
                    greeting = conn.recv(64)
                if greeting.startswith(b"@RSYNCD:"):
                    return
                why = f"it answered {greeting[:30]!r}, not an rsync greeting"
            except OSError as exc:
                why = str(exc)
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise WeightsError(
                    f"{self.host}: the rsync daemon on {self.address}:{self.port} did not answer: {why}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


# Run on a worker through ssh (transport tcp): a receiver bound to one fabric address, for this copy only.
# Per connection: the one-time secret (it came on the receiver's stdin, never on a command line), then per
# file "<size> <mtime_ns> <path>"; it answers SKIP (there, same size and mtime), FROM <n> (the bytes its part
# in <dir>/.rsync-partial/ already has: the head sends the rest) or ERR <why>; after the bytes, OK once the
# part is renamed to its final path with the head's mtime, or ERR. It ends when the head closes stdin.
TCP_RECEIVER = r"""
import hmac, os, socket, sys, threading
address, port, dest = sys.argv[1], int(sys.argv[2]), sys.argv[3]
secret = sys.stdin.readline().strip().encode()
srv = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    srv.bind((address, port)); srv.listen(64)
except OSError as exc:
    print(f"cannot listen on {address}:{port}: {exc}", flush=True); sys.exit(1)
parts, lock = set(), threading.Lock()
def where(rel):
    bits = rel.split("/")
    if rel.startswith("/") or any(b in ("", ".", "..") for b in bits):
        raise ValueError(f"refused path {rel!r}")
    final = os.path.join(dest, *bits)
    pdir = os.path.join(os.path.dirname(final), ".rsync-partial")
    return final, pdir, os.path.join(pdir, bits[-1])
def drain(f, left):
    while left:
        b = f.read(min(left, 1 << 20))
        if not b: return
        left -= len(b)
def serve(conn):
    f = conn.makefile("rb")
    if not hmac.compare_digest(f.readline().strip(), secret): return
    while True:
        line = f.readline()
        if not line: return
        size, mtime, rel = line.decode().rstrip("\n").split(" ", 2)
        size, mtime = int(size), int(mtime)
        try:
            final, pdir, part = where(rel)
            try:
                st = os.stat(final)
                if st.st_size == size and st.st_mtime_ns // 10**9 == mtime // 10**9:
                    conn.sendall(b"SKIP\n"); continue
            except FileNotFoundError:
                pass
            os.makedirs(pdir, exist_ok=True)
            with lock: parts.add(pdir)
            have = os.path.getsize(part) if os.path.exists(part) else 0
            out = open(part, "r+b" if 0 < have <= size else "wb")
        except (OSError, ValueError) as exc:
            conn.sendall(f"ERR {exc}\n".encode()); return
        have = have if 0 < have <= size else 0
        out.seek(have); out.truncate()
        conn.sendall(f"FROM {have}\n".encode())
        left, err = size - have, None
        with out:
            while left:
                b = f.read(min(left, 1 << 20))
                if not b: return  # the head went away: the part stays for the next run
                left -= len(b)
                try:
                    out.write(b)
                except OSError as exc:
                    err = f'write failed on "{final}": {exc.strerror} ({exc.errno})'
                    drain(f, left); break
        if err is None:
            try:
                os.utime(part, ns=(mtime, mtime)); os.replace(part, final)
            except OSError as exc:
                err = f"{final}: {exc}"
        conn.sendall(f"ERR {err}\n".encode() if err else b"OK\n")
        if err: return
def accept():
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
threading.Thread(target=accept, daemon=True).start()
print("started", flush=True)
sys.stdin.read()
for d in sorted(parts, reverse=True):
    try: os.rmdir(d)
    except OSError: pass
"""


class TcpReceiver(Daemon):
    """Transport tcp: TCP_RECEIVER on a worker's fabric address, started through ssh like the rsync daemon."""

    what = "a receiver"
    says_why_on_stdout = True  # "cannot listen on ..."

    def __init__(self, host: str, user: str, address: str, *, port: int, dest: str, ssh: str, python: str):
        remote = shlex.join([python, "-c", TCP_RECEIVER, address, str(port), dest.rstrip("/")])
        self._spawn(host, user, address, port, ssh=ssh, remote=remote)

    def wait_ready(self, timeout: float = 20) -> None:
        """Ready once started() has read the receiver's word: it prints it after listen()."""


class TcpStream:
    """Transport tcp, head side: one connection, the files one after another by sendfile(2), each from
    where the worker's part ends. The thread stands in for Stream's process (poll, wait, rc)."""

    CHUNK = 64 << 20

    def __init__(self, host: str, address: str, files: list[dict], *, src: str, receiver: TcpReceiver):
        self.host, self.address, self.files = host, address, files
        self.src, self.receiver = src, receiver
        self.listfile = ""
        self.bytes_done = 0
        self.sent_files: list[str] = []
        self.stderr = ""
        self.rc: int | None = None
        self.proc = self
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def poll(self) -> int | None:
        return None if self._thread.is_alive() else self.rc

    def wait(self) -> int | None:
        self._thread.join()
        return self.rc

    def failure(self) -> str:
        return _last_line(self.stderr)

    def _run(self) -> None:
        try:
            self._send()
            self.rc = 0
        except (OSError, ValueError, WeightsError) as exc:
            self.stderr = str(exc)
            self.rc = 1

    def _send(self) -> None:
        r = self.receiver
        with socket.create_connection((r.address, r.port), timeout=300) as conn:
            replies = conn.makefile("rb")
            conn.sendall(r.secret.encode() + b"\n")
            for f in self.files:
                path = os.path.join(self.src, f["path"])
                with open(path, "rb") as fh:
                    st = os.fstat(fh.fileno())
                    conn.sendall(f"{st.st_size} {st.st_mtime_ns} {f['path']}\n".encode())
                    answer = replies.readline().decode().strip()
                    if answer == "SKIP":
                        self.bytes_done += st.st_size
                        continue
                    if not answer.startswith("FROM "):
                        raise WeightsError(
                            answer.removeprefix("ERR ") or "the receiver closed the connection"
                        )
                    offset = int(answer.split()[1])
                    self.bytes_done += offset
                    while offset < st.st_size:
                        sent = conn.sendfile(fh, offset, min(self.CHUNK, st.st_size - offset))
                        if not sent:
                            raise WeightsError(f"{f['path']} ended early on the head")
                        offset += sent
                        self.bytes_done += sent
                answer = replies.readline().decode().strip()
                if answer != "OK":
                    raise WeightsError(answer.removeprefix("ERR ") or "the receiver closed the connection")
                self.sent_files.append(f["path"])


ENOSPC = re.compile(r'write failed on "([^"]+)": No space left on device')


def disk_full(stderr: str, dest: str) -> str | None:
    """The file rsync could not write for lack of space (relative to `dest`), None when it was not that."""
    if "No space left on device" not in stderr:
        return None
    m = ENOSPC.search(stderr)
    if not m:
        return "?"
    path = m.group(1)
    prefix = dest.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def run(params: dict, check_mode: bool = False) -> dict:  # noqa: PLR0912 - plan, start, watch, report: one pipeline
    src = params["src"].rstrip("/") + "/"
    dest = params["dest"].rstrip("/") + "/"
    targets = params["targets"]
    plan = []
    for t in targets:
        files = [f for f in t.get("files") or []]
        addrs = [a for a in t.get("addresses") or [] if a]
        if files and not addrs:
            raise WeightsError(f"{t['host']}: no fabric address to copy to (sparkfleet_plan.interfaces)")
        for f in files:
            if not os.path.isfile(os.path.join(src, f["path"])):
                raise WeightsError(f"{src}{f['path']} is not on the head: verify the head's snapshot first")
        plan.append((t, files, addrs))
    total = sum(int(f["size"]) for _, files, _ in plan for f in files)
    todo = {t["host"]: [f["path"] for f in files] for t, files, _ in plan if files}
    if not todo:
        return {"changed": False, "copied": {}, "bytes": 0, "msg": "every worker has every file"}
    if check_mode:
        return {
            "changed": True,
            "copied": todo,
            "bytes": total,
            "msg": f"would copy {human(total)} to {', '.join(sorted(todo))}",
        }
    ssh = ssh_command(params.get("ssh_key"), params.get("ssh_options") or [], params.get("ssh") or "ssh")
    streams: list = []
    daemons: dict[tuple[str, str], Daemon] = {}
    tmpdir = tempfile.mkdtemp(prefix="sparkfleet-distribute-")
    per_addr = max(1, params.get("streams_per_address") or 1)
    try:
        for t, files, addrs in plan:
            if not files:
                continue
            for i, chunk in enumerate(split_streams(files, len(addrs) * per_addr)):
                where = Where(t["host"], t.get("user") or "", addrs[i % len(addrs)], src, dest, ssh)
                streams.append(
                    _stream(params, where, chunk, os.path.join(tmpdir, f"{t['host']}-{i}.list"), daemons)
                )
        for d in daemons.values():  # every ssh session is already under way: this waits for the slowest
            d.started()
        for d in daemons.values():
            d.wait_ready()
        return _copy(params, streams, total, todo, tmpdir)
    finally:
        for d in daemons.values():
            d.stop()


class Where(typing.NamedTuple):
    """One stream's worker, user, fabric address, both ends' directories and the ssh command."""

    host: str
    user: str
    address: str
    src: str
    dest: str
    ssh: str


def _stream(params: dict, w: Where, chunk: list[dict], listfile: str, daemons: dict):
    """The stream of `chunk` to one fabric address in the chosen transport; a worker address's receiver (rsync
    daemon or tcp receiver) is started once, on the next free port, and shared by that address's streams."""
    transport = params.get("transport") or "ssh"
    rsync = params.get("rsync") or "rsync"
    key = (w.host, w.address)
    port = int(params.get("rsyncd_port") or 8730) + len(daemons)
    if transport == "tcp":
        if key not in daemons:
            python = params.get("python") or "python3"
            daemons[key] = TcpReceiver(
                w.host, w.user, w.address, port=port, dest=w.dest, ssh=w.ssh, python=python
            )
        return TcpStream(w.host, w.address, chunk, src=w.src, receiver=daemons[key])
    with open(listfile, "w") as fh:
        fh.write("".join(f["path"] + "\n" for f in chunk))
    argv = [rsync, "-t", "--partial", "--partial-dir=.rsync-partial", f"--files-from={listfile}"]
    argv += ["--info=progress2", "--no-inc-recursive", "--out-format=SF %i %n"]
    if transport == "rsyncd":
        if key not in daemons:
            daemons[key] = Daemon(w.host, w.user, w.address, port=port, dest=w.dest, ssh=w.ssh, rsync=rsync)
        env = dict(os.environ, RSYNC_PASSWORD=daemons[key].secret)
        return Stream(w.host, w.address, chunk, [*argv, w.src, daemons[key].url], listfile=listfile, env=env)
    host = f"[{w.address}]" if ":" in w.address else w.address
    who = f"{w.user}@{host}" if w.user else host
    return Stream(w.host, w.address, chunk, [*argv, "-e", w.ssh, w.src, f"{who}:{w.dest}"], listfile=listfile)


def per_worker(streams: list, sizes: dict[str, int], samples: dict[str, list], now: float) -> dict:
    """Each worker's part of the copy: bytes done of its total, its rate over the last 30 s, ETA."""
    out = {}
    for host, total in sizes.items():
        done = min(total, sum(s.bytes_done for s in streams if s.host == host))
        seen = [x for x in samples.get(host, []) if now - x[0] <= 30] + [(now, done)]
        samples[host] = seen
        t0, d0 = seen[0]
        rate = (done - d0) / (now - t0) if now - t0 >= 0.5 else 0.0
        left = total - done
        eta = round(left / rate) if rate > 0 and left else (0 if not left else None)
        out[host] = {"done_bytes": done, "total_bytes": total, "rate_bps": round(rate), "eta_s": eta}
    return out


def _copy(params: dict, streams: list, total: int, todo: dict, tmpdir: str) -> dict:
    progress = Progress(params.get("status_file"), "copy", total, sum(len(f) for f in todo.values()))
    n = len(streams)
    progress.detail = (
        f"{n} {params.get('transport') or 'ssh'} stream{'s' if n != 1 else ''} to {', '.join(sorted(todo))}"
    )
    sizes: dict[str, int] = {}
    for s in streams:
        sizes[s.host] = sizes.get(s.host, 0) + sum(int(f["size"]) for f in s.files)
    samples: dict[str, list] = {}
    progress.parts = per_worker(streams, sizes, samples, time.monotonic())
    progress.maybe_write(force=True)
    start = time.monotonic()
    for s in streams:
        s.start()
    while any(s.proc and s.proc.poll() is None for s in streams):
        progress.parts = per_worker(streams, sizes, samples, time.monotonic())
        progress.set_done(min(total, sum(s.bytes_done for s in streams)))
        progress.files_done = sum(len(s.sent_files) for s in streams)
        progress.maybe_write()
        time.sleep(0.5)
    for s in streams:
        assert s.proc
        s.rc = s.proc.wait()
    time.sleep(0.1)  # let the reader threads drain
    elapsed = time.monotonic() - start
    failed = [s for s in streams if s.rc != 0]
    for s in streams:
        with contextlib.suppress(OSError):
            os.unlink(s.listfile)
    with contextlib.suppress(OSError):
        os.rmdir(tmpdir)
    progress.files_done = sum(len(s.sent_files) for s in streams)
    progress.parts = per_worker(streams, sizes, samples, time.monotonic())
    if not failed:  # rsync's own count can end short of the sizes (files already there): all are there now
        for part in progress.parts.values():
            part.update(done_bytes=part["total_bytes"], eta_s=0)
    progress.set_done(total if not failed else progress.done)
    progress.maybe_write(force=True, state="failed" if failed else "done")
    copied: dict[str, list[str]] = {}
    for s in streams:
        copied.setdefault(s.host, []).extend(s.sent_files)
    if failed:
        full = {}
        for s in failed:
            path = disk_full(s.stderr, params["dest"])
            if path is not None:
                full.setdefault(s.host, path)
        if full:
            raise WeightsError(
                "; ".join(
                    f"{host}: the disk is full at {params['dest'].rstrip('/')} (No space left on device "
                    f"while writing {path})"
                    for host, path in sorted(full.items())
                )
                + ": free space there and run `sparkfleet weights` again. The files copied so far are kept;"
                " a file cut off stays in .rsync-partial, never at its final path; the next run resumes it",
                {"copied": copied, "disk_full": full},
            )
        why = "; ".join(f"{s.host} via {s.address}: {s.failure()}" for s in failed)
        raise WeightsError(
            f"copy to workers failed ({why}); finished files are kept and parts resume on the next run",
            {"copied": copied},
        )
    rate = total / elapsed if elapsed > 0 else 0
    return {
        "changed": True,
        "copied": copied,
        "bytes": total,
        "elapsed_s": round(elapsed, 2),
        "rate_bps": round(rate),
        "streams": len(streams),
        "msg": (
            f"copied {human(total)} to {', '.join(sorted(todo))} in {elapsed:.1f} s "
            f"({human(rate)}/s, {len(streams)} streams)"
        ),
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "src": {"type": "path", "required": True},
            "dest": {"type": "path", "required": True},
            "targets": {"type": "list", "elements": "dict", "required": True},
            "ssh_key": {"type": "path"},
            "ssh_options": {"type": "list", "elements": "str", "default": []},
            "streams_per_address": {"type": "int", "default": 1},
            "rsync": {"type": "str", "default": "rsync"},
            "ssh": {"type": "str", "default": "ssh"},
            "transport": {"type": "str", "choices": ["ssh", "rsyncd", "tcp"], "default": "ssh"},
            "rsyncd_port": {"type": "int", "default": 8730},
            "python": {"type": "str", "default": "python3"},
            "status_file": {"type": "path"},
        },
        supports_check_mode=True,
    )
    run_module(module, run)


if __name__ == "__main__":
    main()

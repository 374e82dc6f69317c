#!/usr/bin/python
# Head -> workers over the fabric: parallel rsync streams to every worker at once.
from __future__ import annotations

DOCUMENTATION = r"""
module: weights_distribute
short_description: Copy snapshot files from the head to all workers at once, over the fabric addresses
description:
  - For every worker, the files it lacks are spread over rsync streams (C(streams_per_address) per
    fabric address of the worker, so both rails of a cable carry data) and all streams of all workers
    run at the same time.
  - rsync runs with C(--partial --partial-dir=.rsync-partial), so a cut-off file resumes from its part
    (rsync's delta transfer uses the part as basis), finished files are skipped (size + mtime).
    The source is the head's plain snapshot of hard links, so no hub-cache symlink reaches a worker.
  - Workers need no internet; they only receive over SSH from the head.
  - Writes a progress file (bytes, rate, ETA) for the role's wait action.
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
    choices: [ssh, rsyncd]
    default: ssh
    description: >-
      ssh = rsync over ssh; rsyncd = for this copy, an rsync daemon started through ssh on each
      worker's fabric address (a one-time secret sent on stdin), without ssh's encryption cost
  rsyncd_port: {type: int, default: 8730, description: first port of the per-address daemons}
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
  description: How many rsync streams ran.
  type: int
  returned: when files were copied
"""

import contextlib
import os
import re
import secrets
import shlex
import subprocess
import tempfile
import threading
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights import (
    Progress,
    WeightsError,
    human,
    run_module,
)

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
    """An rsync daemon on a worker's fabric address, reached without ssh's encryption cost."""

    def __init__(self, host: str, user: str, address: str, *, port: int, dest: str, ssh: str, rsync: str):
        self.host, self.address, self.port = host, address, port
        self.secret = secrets.token_hex(16)
        script = DAEMON.format(dest=dest.rstrip("/"), rsync=rsync, address=shlex.quote(address), port=port)
        who = f"{user}@{address}" if user else address
        self.proc = subprocess.Popen(
            [*shlex.split(ssh), who, f"sh -c {shlex.quote(script)}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(self.secret + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().strip()
        if line != "started":
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise WeightsError(
                f"{host}: could not start an rsync daemon on {address}: {_last_line(err) or line}"
            )

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"rsync://sparkfleet@{host}:{self.port}/sparkfleet/"

    def wait_ready(self, rsync: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        env = dict(os.environ, RSYNC_PASSWORD=self.secret)
        while True:
            probe = subprocess.run(
                [rsync, "--list-only", self.url], env=env, capture_output=True, text=True, check=False
            )
            if probe.returncode == 0:
                return
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise WeightsError(
                    f"{self.host}: the rsync daemon on {self.address}:{self.port} did not answer: "
                    f"{_last_line(probe.stderr)}"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


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
    rsync = params.get("rsync") or "rsync"
    transport = params.get("transport") or "ssh"
    streams: list[Stream] = []
    daemons: dict[tuple[str, str], Daemon] = {}
    tmpdir = tempfile.mkdtemp(prefix="sparkfleet-distribute-")
    per_addr = max(1, params.get("streams_per_address") or 1)
    port = int(params.get("rsyncd_port") or 8730)
    try:
        for t, files, addrs in plan:
            if not files:
                continue
            for i, chunk in enumerate(split_streams(files, len(addrs) * per_addr)):
                address = addrs[i % len(addrs)]
                listfile = os.path.join(tmpdir, f"{t['host']}-{i}.list")
                with open(listfile, "w") as fh:
                    fh.write("".join(f["path"] + "\n" for f in chunk))
                argv = [rsync, "-t", "--partial", "--partial-dir=.rsync-partial", f"--files-from={listfile}"]
                argv += ["--info=progress2", "--no-inc-recursive", "--out-format=SF %i %n"]
                if transport == "rsyncd":
                    key = (t["host"], address)
                    if key not in daemons:
                        user = t.get("user", "")
                        daemons[key] = Daemon(
                            t["host"],
                            user,
                            address,
                            port=port + len(daemons),
                            dest=dest,
                            ssh=ssh,
                            rsync=rsync,
                        )
                    env = dict(os.environ, RSYNC_PASSWORD=daemons[key].secret)
                    streams.append(
                        Stream(
                            t["host"],
                            address,
                            chunk,
                            [*argv, src, daemons[key].url],
                            listfile=listfile,
                            env=env,
                        )
                    )
                else:
                    who = f"{t['user']}@{address}" if t.get("user") else address
                    if ":" in address:
                        who = f"{t['user']}@[{address}]" if t.get("user") else f"[{address}]"
                    streams.append(
                        Stream(
                            t["host"],
                            address,
                            chunk,
                            [*argv, "-e", ssh, src, f"{who}:{dest}"],
                            listfile=listfile,
                        )
                    )
        for d in daemons.values():
            d.wait_ready(rsync)
        return _copy(params, streams, total, todo, tmpdir)
    finally:
        for d in daemons.values():
            d.stop()


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
    progress.detail = f"{len(streams)} rsync streams to {', '.join(sorted(todo))}"
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
        why = "; ".join(
            f"{s.host} via {s.address}: rsync exit {s.rc}: {_last_line(s.stderr)}" for s in failed
        )
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
            "transport": {"type": "str", "choices": ["ssh", "rsyncd"], "default": "ssh"},
            "rsyncd_port": {"type": "int", "default": 8730},
            "status_file": {"type": "path"},
        },
        supports_check_mode=True,
    )
    run_module(module, run)


if __name__ == "__main__":
    main()

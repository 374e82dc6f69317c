"""Weights benchmarks, each a ratio of two measurements taken side by side in one run.

1. parallel verify vs `sha256sum` over the same files (page cache warmed for both first);
2. cached re-verify (stat cache hit) vs full verify of the same files;
3. distribution head -> two workers (the role's rsync streams over the fabric) vs the raw speed of
   the same links (plain TCP to both workers at once, same bytes), on a running TP3 lab named by
   SPARKFLEET_LAB (its fabric and SSH trust converged). Without one, 3 is reported as not run.
Sizes: SPARKFLEET_BENCH_MB (default 512) of data in 8 files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import lab_from_env

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit"))


def _utils():
    import test_weights_support as support

    return support.utils


def _make_files(where: Path, total_mb: int, count: int = 8) -> list[dict]:
    where.mkdir(parents=True, exist_ok=True)
    per = max(1, total_mb // count) << 20
    files = []
    block = os.urandom(1 << 20)
    for i in range(count):
        path = where / f"model-{i + 1:05d}-of-{count:05d}.bin"
        with path.open("wb") as fh:
            for _ in range(per >> 20):
                fh.write(block)
                block = block[1:] + block[:1]
        files.append({"path": path.name, "size": path.stat().st_size})
    return files


def _warm(where: Path) -> None:
    for p in sorted(where.iterdir()):
        with p.open("rb") as fh:
            while fh.read(8 << 20):
                pass


def bench_verify(tmp: Path, total_mb: int) -> list[dict]:
    utils = _utils()
    data = tmp / "files"
    files = _make_files(data, total_mb)
    _warm(data)
    start = time.perf_counter()
    out = subprocess.run(
        ["sha256sum", *[f["path"] for f in files]], cwd=data, capture_output=True, text=True, check=True
    )
    baseline = time.perf_counter() - start
    sums = {line.split()[1]: line.split()[0] for line in out.stdout.splitlines()}
    manifest = [dict(f, sha256=sums[f["path"]]) for f in files]
    cache_file = tmp / "cache.json"
    start = time.perf_counter()
    res = utils.verify_files(str(data), manifest, utils.StatCache(str(cache_file)), workers=0, full=True)
    full = time.perf_counter() - start
    assert not res["bad"] and not res["missing"] and len(res["ok"]) == len(files)
    start = time.perf_counter()
    utils.verify_files(str(data), manifest, utils.StatCache(None), workers=1, full=True)
    one_core = time.perf_counter() - start
    cache = utils.StatCache(str(cache_file))
    cache.entries = {}
    for rel, sha in res["ok"].items():
        cache.put(rel, os.stat(data / rel), sha)
    cache.save()
    start = time.perf_counter()
    again = utils.verify_files(str(data), manifest, utils.StatCache(str(cache_file)), workers=0)
    cached = time.perf_counter() - start
    assert again["hashed_bytes"] == 0 and len(again["ok"]) == len(files)
    mb = sum(f["size"] for f in files) / 1e6
    cores = os.cpu_count()
    return [
        {
            "name": "verify: parallel vs sha256sum",
            "baseline": baseline,
            "candidate": full,
            "unit": "s",
            "ratio": baseline / full,
            "how": f"{mb:.0f} MB in {len(files)} files, warm page cache; sha256sum (one process) vs "
            f"model_weights_verify hashing on {cores} cores, same files, back to back",
        },
        {
            "name": "verify: every core vs one core (same code)",
            "baseline": one_core,
            "candidate": full,
            "unit": "s",
            "ratio": one_core / full,
            "how": f"same {mb:.0f} MB; model_weights_verify with 1 thread vs {cores} threads: the parallel "
            "part alone (the sha256sum row also counts hashlib's faster SHA-256)",
        },
        {
            "name": "verify: cached re-verify vs full verify",
            "baseline": full,
            "candidate": cached,
            "unit": "s",
            "ratio": full / max(cached, 1e-6),
            "how": f"same {mb:.0f} MB; full hash vs stat cache hit (size, mtime, ctime, inode unchanged)",
        },
    ]


# ---- distribution on a lab --------------------------------------------------------------------
# The raw side of every copy row: the same files, read from the head's disk, sent over the same fabric
# addresses with the same number of TCP connections (one per rsync stream, files split the same way),
# written to the same destination directory on each worker; nothing else (no checksums, no resume, no
# encryption). RECEIVER runs on a worker (one per fabric address, as the worker's user), SENDER on the head.
RECEIVER = r"""
import os, socket, sys, threading
addr, port, dest, conns = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((addr, port)); s.listen(conns); s.settimeout(120)
total = [0]
def take(c):
    f = c.makefile("rb")
    while True:
        head = f.readline()
        if not head:
            c.sendall(b"done"); c.close(); break  # every byte written: the sender's clock stops
        name, size = head.decode().rsplit(" ", 1); left = int(size)
        with open(os.path.join(dest, name) if dest else os.devnull, "wb") as out:
            while left:
                b = f.read(min(left, 1 << 20))
                if not b: raise SystemExit(f"{name}: connection closed {left} bytes short")
                if dest: out.write(b)
                left -= len(b); total[0] += len(b)
print("listening", flush=True)
ts = []
for _ in range(conns):
    c, _ = s.accept(); t = threading.Thread(target=take, args=(c,)); t.start(); ts.append(t)
[t.join() for t in ts]
print(total[0])
"""
SENDER = r"""
import json, os, socket, sys, threading, time
src, streams = sys.argv[1], json.loads(sys.argv[2])  # [[addr, port, [file, ...]], ...]
def send(addr, port, files):
    c = socket.create_connection((addr, port), timeout=120)
    for name in files:
        with open(os.path.join(src, name), "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            c.sendall(f"{name} {size}\n".encode()); c.sendfile(fh)
    c.shutdown(socket.SHUT_WR)
    if c.recv(16) != b"done": raise SystemExit(f"{addr}: the receiver did not finish")
    c.close()
ts = [threading.Thread(target=send, args=tuple(s)) for s in streams]
t0 = time.perf_counter(); [t.start() for t in ts]; [t.join() for t in ts]
print(time.perf_counter() - t0)
"""
HARNESS = r"""
import importlib.util, json, sys, time, types
# the collection's module_utils, copied below ansible_collections/ (namespace packages); the node has no
# ansible: the module's AnsibleModule import gets a stand-in (run() never uses it)
sys.path.insert(0, "/var/tmp/sparkfleet-bench")
for name in ("ansible", "ansible.module_utils"):
    sys.modules.setdefault(name, types.ModuleType(name))
basic = types.ModuleType("ansible.module_utils.basic"); basic.AnsibleModule = object
sys.modules["ansible.module_utils.basic"] = basic
spec = importlib.util.spec_from_file_location("dist", "/var/tmp/sparkfleet-bench/weights_distribute.py")
dist = importlib.util.module_from_spec(spec); spec.loader.exec_module(dist)
params = json.loads(open(sys.argv[1]).read())
t0 = time.perf_counter(); out = dist.run(params)
print(json.dumps({"elapsed": time.perf_counter() - t0, "data_s": out["elapsed_s"], "bytes": out["bytes"]}))
"""
BENCH_DIR = "/var/tmp/sparkfleet-bench"
UTILS_DIR = f"{BENCH_DIR}/ansible_collections/sparkfleet/cluster/plugins/module_utils"
SRC = "/srv/sparkfleet/bench-src"
DST = "/srv/sparkfleet/bench-dst"
# (row name, module parameters): every transport and stream count tried; the role's default is the
# fastest of these in this bench (roles/model_weights/README.md, "Copy head -> workers")
CANDIDATES = [
    ("rsync over ssh (AES-GCM), 1 stream per address", {"transport": "ssh", "streams_per_address": 1}),
    ("rsync over ssh (AES-GCM), 2 streams per address", {"transport": "ssh", "streams_per_address": 2}),
    ("rsyncd, 1 stream per address", {"transport": "rsyncd", "streams_per_address": 1}),
    ("rsyncd, 2 streams per address", {"transport": "rsyncd", "streams_per_address": 2}),
    ("tcp (sendfile, resumable), 1 stream per address", {"transport": "tcp", "streams_per_address": 1}),
    ("tcp (sendfile, resumable), 2 streams per address", {"transport": "tcp", "streams_per_address": 2}),
]


@dataclass
class Copy:
    """What every copy row shares: the lab, its nodes, the workers' fabric addresses, the files."""

    lab: object
    head: str
    workers: list[str]
    addrs: dict[str, list[str]]
    files: list[dict]


def _fabric_addresses(lab, head: str, workers: list[str]) -> dict[str, list[str]]:
    """Each worker's addresses on the subnets it shares with the head (the cable to the head)."""
    head_out = lab.exec(head, "ip", "-4", "-o", "addr", "show")
    heads = [ln.split()[3] for ln in head_out.splitlines() if ln.split()[1] != "lo"]
    nets = {h.rsplit(".", 1)[0] for h in heads if not h.startswith("10.250.")}
    addrs = {}
    for w in workers:
        out = lab.exec(w, "ip", "-4", "-o", "addr", "show")
        mine = [ln.split()[3].split("/")[0] for ln in out.splitlines() if ln.split()[1] != "lo"]
        addrs[w] = [a for a in mine if a.rsplit(".", 1)[0] in nets]
    return addrs


def _seconds(values) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def _fresh_dest(lab, workers: list[str]) -> None:
    for w in workers:
        lab.exec(w, "sh", "-c", f"sudo rm -rf {DST} && sudo mkdir -p {DST} && sudo chown spark {DST}")


def _check_dest(lab, workers: list[str], files: list[dict], what: str) -> None:
    """Every file whole on every worker (a row that lost bytes measures nothing)."""
    want = sorted(f"{f['path']} {f['size']}" for f in files)
    for w in workers:
        out = lab.exec(w, "sh", "-c", f"cd {DST} && stat -c '%n %s' *")
        if sorted(out.splitlines()) != want:
            raise RuntimeError(f"{what}: {w} did not get every file whole: {out!r}")


def _raw(c: Copy, streams_per_address: int, *, to_disk: bool) -> float:
    lab, head, workers, addrs, files = c.lab, c.head, c.workers, c.addrs, c.files
    dist = _dist_module()
    procs, plan, port = [], [], 5990
    for w in workers:
        chunks = dist.split_streams(files, len(addrs[w]) * streams_per_address)
        for i, a in enumerate(addrs[w]):
            mine = [chunk for j, chunk in enumerate(chunks) if j % len(addrs[w]) == i]
            if not mine:
                continue
            argv = ["python3", "-c", RECEIVER, a, str(port), DST if to_disk else "", str(len(mine))]
            p = subprocess.Popen(
                ["docker", "exec", "-u", "spark", lab.container(w), *argv], stdout=subprocess.PIPE, text=True
            )
            assert p.stdout
            if p.stdout.readline().strip() != "listening":
                raise RuntimeError(f"raw receiver on {w} {a}:{port} did not start")
            procs.append(p)
            plan += [[a, port, [f["path"] for f in chunk]] for chunk in mine]
    elapsed = float(lab.exec(head, "python3", "-c", SENDER, SRC, json.dumps(plan)).strip())
    got = sum(int(p.communicate(timeout=120)[0].strip()) for p in procs)
    if got != sum(f["size"] for f in files) * len(workers):
        raise RuntimeError(f"raw TCP: the workers received {got} bytes, not every file")
    return elapsed


def _dist_module():
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    from test_weights_support import load_module

    return load_module("weights_distribute")


def _candidate(c: Copy, extra: dict) -> dict:
    lab, head, workers, addrs, files = c.lab, c.head, c.workers, c.addrs, c.files
    params = {
        "src": SRC,
        "dest": DST,
        "targets": [{"host": w, "user": "spark", "addresses": addrs[w], "files": files} for w in workers],
        "ssh_options": [
            "StrictHostKeyChecking=no",
            "UserKnownHostsFile=/dev/null",
            "Ciphers=aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com",
        ],
        **extra,
    }
    lab.exec(head, "sh", "-c", f"cat > {BENCH_DIR}/params.json <<'EOF'\n{json.dumps(params)}\nEOF")
    out = lab.exec(head, "python3", "-c", HARNESS, f"{BENCH_DIR}/params.json", user="spark")
    return json.loads(out.strip().splitlines()[-1])


def bench_distribute(total_mb: int) -> list[dict]:
    lab = lab_from_env("tp3")
    if lab is None:
        return []
    head, *workers = lab.hosts
    addrs = _fabric_addresses(lab, head, workers)
    if not all(addrs.values()):
        return []
    count = 8
    size = (total_mb << 20) // count
    files = [{"path": f"f{i}", "size": size} for i in range(count)]
    lab.exec(head, "sh", "-c", f"sudo mkdir -p {SRC} && sudo chown spark {SRC}")
    for f in files:
        lab.exec(
            head, "sh", "-c", f"test -s {SRC}/{f['path']} || head -c {size} /dev/urandom > {SRC}/{f['path']}"
        )
    lab.exec(head, "sh", "-c", f"cat {SRC}/* > /dev/null")  # the head's page cache warm for every row
    lab.exec(head, "mkdir", "-p", UTILS_DIR)
    copies = [(f, f"{UTILS_DIR}/{f.name}") for f in sorted((ROOT / "plugins/module_utils").glob("*.py"))]
    module = ROOT / "plugins/modules/weights_distribute.py"
    copies.append((module, f"{BENCH_DIR}/{module.name}"))
    for f, dest in copies:
        subprocess.run(["docker", "cp", str(f), f"{lab.container(head)}:{dest}"], check=True)
    lab.exec(head, "chown", "-R", "spark", BENCH_DIR)
    total = size * count * len(workers)
    c = Copy(lab, head, workers, addrs, files)
    n_addr = sum(len(a) for a in addrs.values())
    where = f"lab {lab.name}: {total / 1e6:.0f} MB, {count} files to each of {len(workers)} workers at once"
    repeat = max(1, int(os.environ.get("SPARKFLEET_BENCH_REPEAT", "3")))
    rows = []
    try:
        _fresh_dest(lab, workers)
        mem = _raw(c, 1, to_disk=False)
        _fresh_dest(lab, workers)
        disk = _raw(c, 1, to_disk=True)
        _check_dest(lab, workers, files, "raw TCP")
        rows.append(
            {
                "name": "copy: raw TCP to the worker's disk vs to memory",
                "baseline": mem,
                "candidate": disk,
                "unit": "s",
                "ratio": mem / disk,
                "how": f"{where}; plain TCP, one connection per fabric address ({n_addr}), the head's "
                "files by sendfile; received into /dev/null vs written to the destination directory: what "
                "the disk costs",
            }
        )
        for name, extra in CANDIDATES:
            # each candidate right after its own raw run, `repeat` times: the two sides see the same load
            # on this machine; the best of each side is kept (other load only ever slows a run down)
            streams = extra["streams_per_address"]
            raws, runs = [], []
            for _ in range(repeat):
                _fresh_dest(lab, workers)
                raws.append(_raw(c, streams, to_disk=True))
                _fresh_dest(lab, workers)
                runs.append(_candidate(c, extra))
                _check_dest(lab, workers, files, name)
            raw, best = min(raws), min(runs, key=lambda r: r["data_s"])
            rows.append(
                {
                    "name": f"copy: {name} vs raw TCP",
                    "baseline": raw,
                    "candidate": best["data_s"],
                    "unit": "s",
                    "ratio": raw / best["data_s"],
                    "how": f"{where}; same files, fabric addresses, {streams * n_addr} connections and "
                    "destination directory both sides, each side's clock from its first connection to the "
                    "last file written on the workers; the receivers (raw: started before its clock; "
                    "candidate: ssh, daemon or receiver start) are outside both clocks: candidate "
                    f"end to end {best['elapsed']:.2f} s; best of {repeat} runs each side "
                    f"(raw {_seconds(raws)}, candidate {_seconds(r['data_s'] for r in runs)}); "
                    "1.0 = raw TCP speed",
                }
            )
    finally:
        for w in workers:
            lab.exec(w, "sudo", "rm", "-rf", DST, check=False)
        lab.exec(head, "sudo", "rm", "-rf", SRC, BENCH_DIR, check=False)
    return rows


def run() -> list[dict]:
    total_mb = int(os.environ.get("SPARKFLEET_BENCH_MB", "512"))
    tmp = Path(tempfile.mkdtemp(prefix="sparkfleet-bench-weights-"))
    try:
        rows = bench_verify(tmp, total_mb)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows += bench_distribute(total_mb)
    if len(rows) == 3:
        print("   copy benchmark not run: it needs a converged TP3 lab named by SPARKFLEET_LAB", flush=True)
    return rows

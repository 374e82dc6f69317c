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
RECEIVER = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(4); s.settimeout(120)
c, _ = s.accept(); n = 0
while True:
    b = c.recv(1 << 20)
    if not b: break
    n += len(b)
print(n)
"""
SENDER = r"""
import socket, sys, threading, time
targets = [(a, int(p)) for a, p in (t.split(":") for t in sys.argv[2:])]
size = int(sys.argv[1]); block = b"\0" * (1 << 20)
def send(addr):
    c = socket.create_connection(addr, timeout=120); left = size
    while left:
        n = min(len(block), left); c.sendall(block[:n]); left -= n
    c.close()
ts = [threading.Thread(target=send, args=(t,)) for t in targets]
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
print(json.dumps({"elapsed": time.perf_counter() - t0, "bytes": out["bytes"]}))
"""
UTILS_DIR = "/var/tmp/sparkfleet-bench/ansible_collections/sparkfleet/cluster/plugins/module_utils"


def bench_distribute(total_mb: int) -> list[dict]:
    lab = lab_from_env("tp3")
    if lab is None:
        return []
    # fabric addresses: the head's rails toward each worker (the same as sparkfleet_plan's)
    head, *workers = lab.hosts
    addrs = {}
    for w in workers:
        out = lab.exec(w, "ip", "-4", "-o", "addr", "show")
        mine = [ln.split()[3].split("/")[0] for ln in out.splitlines() if ln.split()[1] != "lo"]
        head_out = lab.exec(head, "ip", "-4", "-o", "addr", "show")
        heads = [ln.split()[3] for ln in head_out.splitlines() if ln.split()[1] != "lo"]
        nets = {h.rsplit(".", 1)[0] for h in heads if not h.startswith("10.250.")}
        addrs[w] = [a for a in mine if a.rsplit(".", 1)[0] in nets]
    if not all(addrs.values()):
        return []
    per_worker = total_mb << 20
    src = "/srv/sparkfleet/bench-src"
    dst = "/srv/sparkfleet/bench-dst"
    count = 8
    size = per_worker // count
    lab.exec(head, "sh", "-c", f"sudo mkdir -p {src} && sudo chown spark {src}")
    for i in range(count):
        lab.exec(head, "sh", "-c", f"test -s {src}/f{i} || head -c {size} /dev/urandom > {src}/f{i}")
    for w in workers:
        lab.exec(w, "sh", "-c", f"sudo rm -rf {dst} && sudo mkdir -p {dst} && sudo chown spark {dst}")
    # raw: plain TCP from the head to one fabric address of each worker, the same bytes, at once
    procs = []
    targets = []
    for w in workers:
        addr = addrs[w][0]
        procs.append(
            subprocess.Popen(
                ["docker", "exec", lab.container(w), "python3", "-c", RECEIVER, addr, "5999"],
                stdout=subprocess.PIPE,
                text=True,
            )
        )
        targets.append(f"{addr}:5999")
    time.sleep(1.0)
    raw = float(lab.exec(head, "python3", "-c", SENDER, str(per_worker), *targets).strip())
    for p in procs:
        p.wait(timeout=60)
    # candidate: the role's distribution module, run on the head with the same files and links
    lab.exec(head, "mkdir", "-p", UTILS_DIR)
    copies = [(f, f"{UTILS_DIR}/{f.name}") for f in sorted((ROOT / "plugins/module_utils").glob("*.py"))]
    module = ROOT / "plugins/modules/weights_distribute.py"
    copies.append((module, f"/var/tmp/sparkfleet-bench/{module.name}"))
    for f, dest in copies:
        subprocess.run(["docker", "cp", str(f), f"{lab.container(head)}:{dest}"], check=True)
    params = {
        "src": src,
        "dest": dst,
        "targets": [
            {
                "host": w,
                "user": "spark",
                "addresses": addrs[w],
                "files": [{"path": f"f{i}", "size": size} for i in range(count)],
            }
            for w in workers
        ],
        "ssh_options": ["StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null"],
        "streams_per_address": 1,
        "transport": os.environ.get("SPARKFLEET_BENCH_TRANSPORT", "rsyncd"),
    }
    lab.exec(
        head, "sh", "-c", f"cat > /var/tmp/sparkfleet-bench/params.json <<'EOF'\n{json.dumps(params)}\nEOF"
    )
    harness = lab.exec(head, "python3", "-c", HARNESS, "/var/tmp/sparkfleet-bench/params.json", user="spark")
    res = json.loads(harness.strip().splitlines()[-1])
    for w in workers:
        lab.exec(w, "sudo", "rm", "-rf", dst)
    lab.exec(head, "sudo", "rm", "-rf", src, "/var/tmp/sparkfleet-bench")
    total = per_worker * len(workers)
    return [
        {
            "name": "copy: two workers vs raw link speed",
            "baseline": raw,
            "candidate": res["elapsed"],
            "unit": "s",
            "ratio": raw / res["elapsed"],
            "how": f"lab {lab.name}: {total / 1e6:.0f} MB to {len(workers)} workers; plain TCP on one fabric "
            f"address per worker at once vs model_weights_distribute ({params['transport']}, 1 stream per "
            "fabric address, "
            f"{sum(len(a) for a in addrs.values())} streams); ratio 1.0 = link speed",
        }
    ]


def run() -> list[dict]:
    total_mb = int(os.environ.get("SPARKFLEET_BENCH_MB", "512"))
    tmp = Path(tempfile.mkdtemp(prefix="sparkfleet-bench-weights-"))
    try:
        rows = bench_verify(tmp, total_mb)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows += bench_distribute(min(total_mb, 256))
    if len(rows) == 2:
        print("   copy benchmark not run: it needs a converged TP3 lab named by SPARKFLEET_LAB", flush=True)
    return rows

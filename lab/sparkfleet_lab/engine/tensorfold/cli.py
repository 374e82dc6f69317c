"""`tensorfold serve <snapshot> --tp N --rank R --master IP --master-port P ...` (the stand-in).

The command shape is TensorFold's as sparkfleet runs it (SPEC.md "Engine run"); only rank 0 gets
--host/--port and serves the API. Exit codes: 0 stopped, 2 bad configuration or weights,
3 the cluster failed (refused join, lost rank 0).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import __version__, cluster, weights
from .server import EFFORT_LEVELS, CacheDir, Engine, EngineConfig, build

NCCL_VARS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "NCCL_SOCKET_IFNAME",
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_SUBNET_AWARE_ROUTING",
    "NCCL_CROSS_NIC",
    "NCCL_IB_SUBNET_PREFIX_LEN",
    "HF_HUB_OFFLINE",
)


class Stop(Exception):
    """SIGTERM/SIGINT: leave the serving loop and shut down cleanly."""


def _effort(value: str) -> int:
    if value in EFFORT_LEVELS:
        return EFFORT_LEVELS[value]
    try:
        level = int(value)
    except ValueError:
        level = 0
    if not 1 <= level <= 100:
        raise argparse.ArgumentTypeError(f"{value!r}: expected {', '.join(EFFORT_LEVELS)} or 1-100")
    return level


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tensorfold", description="TensorFold stand-in engine (sparkfleet lab)")
    ap.add_argument("--version", action="version", version=f"tensorfold-standin {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run one tensor-parallel rank")
    s.add_argument("snapshot", type=Path, help="weights snapshot directory (read-only)")
    s.add_argument("--tp", type=int, required=True, help="tensor-parallel size")
    s.add_argument("--rank", type=int, required=True)
    s.add_argument("--master", required=True, help="rank 0's management address (rendezvous)")
    s.add_argument("--master-port", type=int, required=True)
    s.add_argument("--host", help="API bind address (rank 0 only)")
    s.add_argument("--port", type=int, help="API port (rank 0 only)")
    s.add_argument("--served-model-name")
    s.add_argument("--api-key-file", type=Path, help="accepted bearer keys, one per line")
    s.add_argument("--max-model-len", type=int, default=1 << 20)
    s.add_argument("--max-num-seqs", type=int, default=4, help="concurrent requests")
    s.add_argument("--kv-pool-tokens", type=int, default=0, help="KV pool size in tokens (0: engine default)")
    s.add_argument("--default-temperature", type=float, default=1.0)
    s.add_argument("--default-top-p", type=float, default=1.0)
    s.add_argument("--default-top-k", type=int, default=-1)
    s.add_argument("--default-thinking", choices=("on", "off"), default="off")
    s.add_argument("--default-reasoning-effort", type=_effort, default=75)
    s.add_argument("--prefix-cache-dir", type=Path)
    s.add_argument("--prefix-cache-gib", type=float, default=0)
    s.add_argument("--spill-dir", type=Path)
    s.add_argument("--spill-gib", type=float, default=0)
    s.add_argument("--rank-file", type=Path, help="this rank's prebuilt tensor file (TP3 releases)")
    s.add_argument("--chat-template", type=Path, help="a chat template file replacing the snapshot's")
    s.add_argument(
        "--weights-exclude", action="append", default=[], help="glob of per-rank files to leave out"
    )
    s.add_argument("--join-timeout", type=float, default=1800, help="seconds a worker waits for rank 0")
    return ap


def _log_for(rank: int):
    def log(msg: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        print(f"{stamp} tensorfold[rank {rank}] {msg}", file=sys.stderr, flush=True)

    return log


def _check_args(args: argparse.Namespace) -> str | None:
    rules = [
        (not 1 <= args.tp <= 16, f"--tp {args.tp}: expected 1-16"),
        (not 0 <= args.rank < args.tp, f"--rank {args.rank} is not a rank of --tp {args.tp}"),
        (args.rank == 0 and args.port is None, "rank 0 serves the API: --port is required"),
        (
            args.rank != 0 and (args.port, args.host) != (None, None),
            "only rank 0 serves the API (--host/--port)",
        ),
        (
            bool(args.prefix_cache_dir) and args.prefix_cache_gib <= 0,
            "--prefix-cache-dir needs --prefix-cache-gib > 0",
        ),
        (bool(args.spill_dir) and args.spill_gib <= 0, "--spill-dir needs --spill-gib > 0"),
    ]
    return next((why for bad, why in rules if bad), None)


def _keys(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    keys = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    if not keys:
        raise ValueError(f"{path} has no keys (one per line)")
    return keys


@dataclass
class Loaded:
    keys: list[str]
    snapshot: weights.Snapshot
    caches: list[CacheDir]
    fabric: cluster.Fabric | None


def _log_environment(args: argparse.Namespace, log) -> None:
    env = {k: os.environ[k] for k in NCCL_VARS if k in os.environ}
    log(
        f"tensorfold-standin {__version__}: rank {args.rank} of {args.tp}, "
        f"master {args.master}:{args.master_port}"
    )
    log(f"environment {env}")
    if env.get("MASTER_ADDR") and env["MASTER_ADDR"] != args.master:
        log(f"warning: MASTER_ADDR={env['MASTER_ADDR']} differs from --master {args.master}")
    ifname = env.get("NCCL_SOCKET_IFNAME")
    if ifname and not Path("/sys/class/net", ifname).exists():
        log(f"warning: NCCL_SOCKET_IFNAME={ifname} is not an interface of this host")


def _load(args: argparse.Namespace, log) -> Loaded:
    """Everything a rank needs before it joins: keys, weights, caches, fabric addresses."""
    keys = _keys(args.api_key_file) if args.api_key_file else []
    if args.rank == 0 and not keys and args.host not in (None, "127.0.0.1", "::1", "localhost"):
        log(f"warning: serving on {args.host} without an API key")
    start = time.monotonic()
    snap = weights.load(args.snapshot, exclude=args.weights_exclude)
    log(f"weights {args.snapshot}: {len(snap.files)} files, {snap.total_bytes} bytes, {snap.tensors} tensors")
    log(f"weights digest {snap.digest} ({time.monotonic() - start:.1f} s)")
    if args.rank_file:
        header = weights.safetensors_header(args.rank_file)
        log(f"rank file {args.rank_file}: {len(header) - ('__metadata__' in header)} tensors")
    if args.chat_template:
        digest = hashlib.sha256(args.chat_template.read_bytes()).hexdigest()
        log(f"chat template {args.chat_template} (sha256 {digest[:12]})")
    caches = []
    if args.prefix_cache_dir:
        caches.append(CacheDir("prefix-cache", args.prefix_cache_dir, args.prefix_cache_gib))
    if args.spill_dir:
        caches.append(CacheDir("spill", args.spill_dir, args.spill_gib))
    for c in caches:
        log(f"{c.kind} {c.path}: {c.limit / (1 << 30):g} GiB, start {c.starts} on this directory")
    fabric = None
    if args.tp > 1:
        fabric = cluster.Fabric.parse(os.environ.get("SPARKFLEET_FABRIC"), args.rank, args.tp)
    return Loaded(keys=keys, snapshot=snap, caches=caches, fabric=fabric)


def _serve_worker(args: argparse.Namespace, loaded: Loaded, log) -> int:
    assert loaded.fabric is not None
    cfg = cluster.WorkerConfig(
        rank=args.rank,
        tp=args.tp,
        master=args.master,
        master_port=args.master_port,
        fabric=loaded.fabric,
        digest=loaded.snapshot.digest,
        join_timeout=args.join_timeout,
    )
    try:
        return cluster.run_worker(cfg, log, threading.Event())
    except cluster.ClusterError as exc:
        log(f"error: {exc}")
        return 3
    except Stop as sig:
        log(f"{sig}: stopping")
        return 0


def _serve_rank0(args: argparse.Namespace, loaded: Loaded, log) -> int:
    coordinator = None
    httpd = None
    try:
        if loaded.fabric is not None:
            coordinator = cluster.Coordinator(
                tp=args.tp,
                master=args.master,
                master_port=args.master_port,
                fabric=loaded.fabric,
                digest=loaded.snapshot.digest,
                log=log,
            )
            coordinator.start()
        cfg = EngineConfig(
            served_model_name=args.served_model_name or args.snapshot.name,
            tp=args.tp,
            keys=loaded.keys,
            max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs,
            default_thinking=args.default_thinking == "on",
            default_effort=args.default_reasoning_effort,
            default_temperature=args.default_temperature,
            default_top_p=args.default_top_p,
            default_top_k=args.default_top_k,
            weights_digest=loaded.snapshot.digest,
            version=__version__,
            caches=loaded.caches,
        )
        host = args.host or "127.0.0.1"
        httpd = build(Engine(cfg, coordinator, log), host, args.port)
        threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
        auth = "key required" if loaded.keys else "no key"
        log(
            f"API on http://{host}:{args.port}/v1: model {cfg.served_model_name}, {auth}, "
            f"{args.max_num_seqs} at once"
        )
        if coordinator is not None:
            log("serving once every rank joined")
            while not coordinator.wait_formed(timeout=60):
                log(coordinator.health()[1])
        log("ready")
        threading.Event().wait()
    except Stop as sig:
        log(f"{sig}: stopping (rank 0 first, then the workers)")
    except cluster.ClusterError as exc:
        log(f"error: {exc}")
        return 3
    except OSError as exc:
        log(f"error: cannot serve on {args.host}:{args.port}: {exc}")
        return 2
    finally:
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if coordinator is not None:
            coordinator.stop()
    return 0


def serve(args: argparse.Namespace) -> int:
    log = _log_for(args.rank)
    problem = _check_args(args)
    if problem:
        log(f"error: {problem}")
        return 2
    _log_environment(args, log)

    def on_signal(signum, _frame):
        raise Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        loaded = _load(args, log)
    except (OSError, ValueError, weights.WeightsError, cluster.ClusterError, RuntimeError) as exc:
        log(f"error: {exc}")
        return 2
    except Stop as sig:
        log(f"{sig} while loading")
        return 0
    if args.rank == 0:
        return _serve_rank0(args, loaded, log)
    return _serve_worker(args, loaded, log)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "serve":
        return serve(args)
    return 2

"""`tensorfold serve` of the deepseek_v41 family on CUDA, in the real order (sfxnz/TensorFold cli.py cmd_serve
and _serve_cuda, families/deepseek_v41 cuda_engine and engine.py), each step the double's own code:

 1. (0.6.6+) API keys configured; a non-loopback server without one prints a warning.
 2. The model directory, its config.json and the family's option and config checks (refusals: ValueError).
 3. `[tensorfold] loading <name>: DeepSeek-V4.1-Flash (deepseek_v41) on CUDA, rank R of N`.
 4. The rendezvous at --master:--master-port (cluster.py); then the admission line
    `[tensorfold] CUDA rank R startup estimate ...`; then the ranks compare their settings.
 5. The weights read and the lab's load time spent: `[tensorfold] rank R of N: L layers and DSpark,
    G GiB of weights in S s`; then the kernels, built or found in TORCH_EXTENSIONS_DIR (the warm-up);
    every rank waits for all.
 6. Rank R > 0: `[tensorfold] rank R ready in S s, following rank 0`, then follows rank 0.
    Rank 0: its port opens, `[tensorfold] serving <name> at http://H:P/v1 on CUDA, rank 0 of N (...)`.
SPARKFLEET_LAB_ENGINE_LOAD_S (the lab's knob, default 3) is the time step 5 takes at least, so the port
stays closed for a while as the real one's does for minutes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import auth, cluster, family, kernels, prompt_cache, server, versions, weights
from ._build import ENGINE

GIB = 1 << 30
LOAD_ENV = "SPARKFLEET_LAB_ENGINE_LOAD_S"
LOAD_DEFAULT_S = 3.0


def log(line: str) -> None:
    print(line, flush=True)


def load_seconds(environ=os.environ) -> float:
    raw = environ.get(LOAD_ENV, "")
    try:
        return max(0.0, float(raw)) if raw else LOAD_DEFAULT_S
    except ValueError:
        raise ValueError(f"{LOAD_ENV}={raw}: a number of seconds") from None


def budget_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    """Admission's budget on a unified-memory Spark: MemAvailable less max(4 GiB, MemTotal / 10)."""
    values = {}
    for line in meminfo.read_text().splitlines():
        name, _, rest = line.partition(":")
        values[name] = int(rest.split()[0]) * 1024
    total, available = values.get("MemTotal", 0), values.get("MemAvailable", 0)
    return max(0, available - max(4 * GIB, total // 10))


def generation_sampling(model_dir: Path, args) -> dict[str, float]:
    """generation_config.json, then the command line's sampling values (what the serving line shows)."""
    path = model_dir / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    out = {k: config[k] for k in ("temperature", "top_k", "top_p", "min_p") if config.get(k) is not None}
    if config.get("do_sample") is False:
        out["temperature"] = 0.0
    for key in ("temperature", "top_p", "top_k", "min_p"):
        if getattr(args, key) is not None:
            out[key] = getattr(args, key)
    return out


def nccl_interfaces(environ=os.environ, sys_net: Path = Path("/sys/class/net")) -> None:
    """NCCL's bootstrap finds no interface NCCL_SOCKET_IFNAME names: its init fails (a traceback, exit 1).

    NCCL reads the variable as a comma-separated list of name prefixes, `=` before the list for exact
    names, `^` for names to leave out."""
    raw = environ.get("NCCL_SOCKET_IFNAME", "").strip()
    if not raw:
        return
    exclude, exact = raw.startswith("^"), False
    spec = raw[1:] if exclude else raw
    if spec.startswith("="):
        exact, spec = True, spec[1:]
    wanted = [w for w in spec.split(",") if w]
    names = sorted(p.name for p in sys_net.iterdir()) if sys_net.is_dir() else []

    def hit(name: str) -> bool:
        return any(name == w if exact else name.startswith(w) for w in wanted)

    found = [n for n in names if hit(n) != exclude and (not exclude or n != "lo")]
    if not found:
        log(f"NCCL WARN Bootstrap : no socket interface found (NCCL_SOCKET_IFNAME={raw})")
        raise RuntimeError("NCCL error 5: invalid usage (run with NCCL_DEBUG=WARN for details)")


def name_priority(args, ids: list[str]) -> frozenset[str]:
    out = set()
    for item in getattr(args, "name_priority", None) or []:
        model_id, eq, level = str(item).partition("=")
        if not eq or level != "background" or model_id not in ids:
            raise ValueError(
                f"--name-priority {item}: ID=background, with ID this server's --name or one of its --alias"
            )
        out.add(model_id)
    return frozenset(out)


def precheck(argv: list[str], version: str, config: dict | None = None):
    """A `tensorfold ...` command line (without the program name) through every check of engine `version`
    that needs no peer and no files: the parser (SystemExit 2 with argparse's message), then the family's
    refusals (ValueError, or SystemExit with the message for a junk --parallel). `config` stands for the
    model's config.json (default: a deepseek_v41 EXL3 checkpoint with the native 1,048,576-token window).
    For tests that render the roles' argv; -> the parsed arguments."""
    from . import cli_args

    v = versions.get(version)
    args = cli_args.parser_of(version).parse_args(argv)
    if args.command != "serve":
        raise ValueError(f"{args.command}: not a serve command line")
    config = config or {
        "model_type": family.MODEL_TYPE,
        "max_position_embeddings": 1 << 20,
        "quantization_config": {"quant_method": "exl3"},
    }
    family.check_config(config)
    family.check_options(args, v)
    native = family.native_context(config)
    context = native if args.context is None else int(args.context)
    if context < 0 or (native and context > native):
        raise ValueError(f"--context {context}: 0 to this model's {native}-token window")
    family.check_ranks(args, v)
    family.engine_policy(args, v, family.parallel(args.parallel))
    ids = [args.name or Path(args.model).name, *[a.strip() for a in args.alias if a.strip()]]
    if v.name_priority:
        name_priority(args, ids)
    return args  # the key file's rules need the file itself: cmd_serve checks them


def cmd_serve(args) -> int:
    v = versions.get(ENGINE)
    store = auth.configure(args) if v.api_keys else None
    model_dir = family.model_dir_of(args.model)
    config = family.read_config(model_dir)
    family.check_config(config)
    family.check_options(args, v)
    native = family.native_context(config)
    context = native if args.context is None else int(args.context)
    if context < 0:
        raise ValueError("--context must be 0 or a positive token count")
    if native and context > native:
        raise ValueError(f"--context {context} exceeds this model's {native}-token window")
    note = family.startup_note(v)
    if note:
        log(note)
    return _serve_cuda(args, v, model_dir=model_dir, config=config, window=context or native, store=store)


@dataclass
class Rank:
    """One rank's start: what it was given and what it found."""

    args: object
    v: versions.Version
    model_dir: Path
    config: dict
    window: int
    store: auth.KeyStore | None
    started: float
    served: str
    ids: list[str]
    where: str
    lanes: int
    background: frozenset[str]
    policy: family.Policy
    stop: threading.Event = field(default_factory=threading.Event)
    failure: str | None = None
    knobs: prompt_cache.Knobs | None = None
    snap: weights.Snapshot | None = None
    disk: prompt_cache.DiskTier | None = None

    @property
    def capacity(self) -> int:
        return self.window + family.MAX_ROWS

    @property
    def layers(self) -> int:
        return int((self.config.get("text_config") or self.config).get("num_hidden_layers") or 0)

    def survey(self) -> dict:
        """The TF_DSV41_* knobs and the weights' headers; -> what this rank tells the others."""
        args = self.args
        try:
            self.knobs = prompt_cache.Knobs.read(os.environ, self.lanes)
            self.snap = weights.load(self.model_dir, read=False)
        except (ValueError, OSError, weights.WeightsError) as exc:
            self.failure = f"{type(exc).__name__}: {exc}"
        layout = self.snap.layout if self.snap else ""
        mine = family.settings(
            start_error=self.failure is not None,
            policy=self.policy,
            capacity=self.capacity,
            layers=self.layers,
            world=args.tp,
            layout=layout,
        )
        build = f"{self.v.key}|{layout}|{self.capacity}|{self.policy}|{args.rank}"
        if self.knobs is not None and self.knobs.disk is not None:
            digest = hashlib.sha256(build.encode()).hexdigest()[:16]
            self.disk = prompt_cache.DiskTier(
                self.knobs.disk, digest, self.knobs.disk_bytes, self.knobs.disk_min
            )
        spare = [self.knobs.cache_bytes, self.knobs.entries] if self.knobs else [0, 0]
        return {"settings": mine, "spare": spare, "disk": self.disk.keys() if self.disk else []}


def _serve_cuda(args, v: versions.Version, *, model_dir: Path, config: dict, window: int, store) -> int:
    family.check_ranks(args, v)
    started = time.perf_counter()
    lanes = family.parallel(args.parallel)
    served = args.name or model_dir.name
    ids = [served, *[a.strip() for a in args.alias if a.strip()]]
    background = name_priority(args, ids) if v.name_priority else frozenset()
    where = f", rank {args.rank} of {args.tp}" if args.tp > 1 else ""
    log(f"[tensorfold] loading {served}: {family.TITLE} ({family.MODEL_TYPE}) on CUDA{where}")
    policy = family.engine_policy(args, v, lanes)
    rank = Rank(
        args, v, model_dir, config, window, store, started, served, ids, where, lanes, background, policy
    )
    timeout = cluster.rendezvous_timeout()
    load_seconds()
    kernels.seconds()  # a bad lab knob fails before the rendezvous
    hello = rank.survey()
    if args.rank != 0:
        worker = cluster.Worker(
            rank=args.rank, world=args.tp, master=args.master, port=args.master_port, log=log, timeout=timeout
        )
        agreed = worker.join(hello, rank.stop)
        agreed["table"] = {int(r): s for r, s in agreed["table"].items()}
        nccl_interfaces()
        kept = _agree_and_load(rank, agreed)
        worker.loaded(rank.stop)
        log(f"[tensorfold] rank {args.rank} ready in {time.perf_counter() - started:.1f}s, following rank 0")
        worker.follow(
            lambda msg: server.apply(kept, msg), lambda msg: kept.flush() if msg.get("flush") else None
        )
        return 0
    coordinator = cluster.Coordinator(world=args.tp, port=args.master_port, log=log, timeout=timeout)
    coordinator.start()
    try:
        joins = coordinator.wait_joined(rank.stop)
        spares = [hello["spare"], *(j["spare"] for j in joins.values())]
        common = set(hello["disk"]).intersection(*(set(j["disk"]) for j in joins.values()))
        agreed = {
            "table": {0: hello["settings"], **{r: j["settings"] for r, j in joins.items()}},
            "spare": [min(s[0] for s in spares), min(s[1] for s in spares)],
            "disk": sorted(common),
        }
        coordinator.broadcast({"op": "settings", **agreed})
        nccl_interfaces()
        kept = _agree_and_load(rank, agreed)
        coordinator.barrier("loading", rank.stop)
        return _serve_http(rank, kept, coordinator)
    finally:
        coordinator.stop({"flush": True})


def _agree_and_load(rank: Rank, agreed: dict) -> prompt_cache.Kept:
    """The admission line, the ranks' agreement, then the weights, kernels and load time."""
    args, knobs = rank.args, rank.knobs
    arena = (knobs.cache_bytes if knobs else 0) / GIB
    weights_gib = sum(f["size"] for f in rank.snap.files) / GIB if rank.snap else 0.0
    estimate = weights_gib / args.tp + rank.capacity * prompt_cache.BYTES_PER_TOKEN / GIB + arena
    try:
        budget = budget_bytes() / GIB
    except (OSError, ValueError):
        budget = estimate
    log(
        f"[tensorfold] CUDA rank {args.rank} startup estimate {estimate:.2f} GiB within {budget:.2f} GiB; "
        f"native {family.native_context(rank.config)}, allocated prompt/reply window {rank.window}, "
        f"cache slots {rank.capacity}"
    )
    table = agreed["table"]
    if rank.failure is not None:
        raise ValueError(
            f"the TF_DSV41_* variables or the weights could not be read on this rank: {rank.failure}"
        )
    broken = [r for r in sorted(table) if table[r][0]]
    if broken:
        raise ValueError(
            f"the TF_DSV41_* variables or the weights could not be read on rank {broken[0]}; see its log"
        )
    family.agree(table)
    cache_bytes, entries = agreed["spare"]
    if args.rank == 0 and knobs is not None and (cache_bytes, entries) != (knobs.cache_bytes, knobs.entries):
        log(
            f"[tensorfold] other conversations' prompts are kept in {cache_bytes / GIB:.1f} GiB, "
            f"{entries} at most: the smallest TF_DSV41_CACHE_* values of the ranks"
        )
    if rank.disk is not None:
        rank.disk.keep_only(set(agreed["disk"]))
    kept = prompt_cache.Kept(cache_bytes, entries, rank.disk)
    t0 = time.perf_counter()
    snap = weights.load(rank.model_dir)
    left = load_seconds() - (time.perf_counter() - t0)
    if left > 0 and rank.stop.wait(left):
        raise KeyboardInterrupt
    drafts = " and DSpark" if rank.policy.dspark else ""
    log(
        f"[tensorfold] rank {args.rank} of {args.tp}: {rank.layers} layers{drafts}, "
        f"{snap.total_bytes / GIB / args.tp:.2f} GiB of weights in {time.perf_counter() - t0:.1f} s"
    )
    kernels.ensure(rank.stop)  # the warm-up's first kernel calls: built now when the cache is empty
    return kept


def _serve_http(rank: Rank, kept: prompt_cache.Kept, coordinator: cluster.Coordinator) -> int:
    args, v = rank.args, rank.v
    shown_sampling = generation_sampling(rank.model_dir, args)
    settings = server.Settings(
        version=v,
        ids=rank.ids,
        window=rank.window,
        max_tokens=int(args.max_tokens),
        thinking=bool(args.thinking),
        effort=args.reasoning_effort,
        thinking_budget=int(args.thinking_budget),
        sampling={**v.sampling, **shown_sampling},
        lanes=rank.lanes,
        drafts=rank.policy.drafts,
        serial_only=bool(args.no_drafts),
        world=args.tp,
        background_ids=rank.background,
    )
    app = server.App(settings, kept, coordinator, rank.store, log)
    httpd = server.build(app, args.host, int(args.port))
    if float(shown_sampling.get("temperature", 1.0)) <= 0:
        shown = "greedy"
    else:
        shown = ", ".join(f"{k} {val}" for k, val in shown_sampling.items())
    log(
        f"[tensorfold] serving {rank.served} at http://{args.host}:{args.port}/v1 on CUDA{rank.where} "
        f"(sampling: {shown}; drafts: {'off' if args.no_drafts else 'on'}; prompts: bf16 activations; "
        f"context: {rank.window}; loaded in {time.perf_counter() - rank.started:.1f}s)"
    )

    def terminate(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    try:
        with rank.store.signals() if rank.store is not None else contextlib.nullcontext():
            httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
        kept.flush()
    return 0

"""Run the stand-in engine's ranks as local processes on loopback (tests and benchmarks).

Each rank gets its own loopback "fabric" addresses (127.0.1R.x), so the data plane really binds
and connects per peer as it does between Sparks; nothing leaves the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def make_snapshot(root: Path, shards: int = 2, tensor_bytes: int = 4096, salt: str = "") -> Path:
    """A small but well-formed safetensors snapshot (index, config, shards)."""
    root.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        tensor = f"layers.{i}.weight"
        header = {tensor: {"dtype": "U8", "shape": [tensor_bytes], "data_offsets": [0, tensor_bytes]}}
        raw = json.dumps(header).encode()
        data = (f"{salt}{i}".encode() * tensor_bytes)[:tensor_bytes]
        (root / name).write_bytes(struct.pack("<Q", len(raw)) + raw + data)
        weight_map[tensor] = name
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps({"model_type": "standin"}))
    return root


@dataclass
class Rank:
    rank: int
    proc: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class LocalCluster:
    """`tp` ranks of `tensorfold serve` on loopback; rank 0's API on 127.0.0.1:`port`."""

    tp: int
    snapshots: list[Path]  # one per rank (the same directory for all is fine)
    workdir: Path
    model: str = "standin-model"
    key_file: Path | None = None
    extra: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    python: str = sys.executable
    port: int = 0
    master_port: int = 0
    data_port: int = 0
    ranks: dict[int, Rank] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.port = self.port or free_port()
        self.master_port = self.master_port or free_port()
        self.data_port = self.data_port or free_port()
        self.workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fabric(self, rank: int) -> dict:
        """Rank 0 <-> rank r over 127.0.1r.1 <-> 127.0.1r.(r+1)."""
        if rank == 0:
            peers = {
                str(r): {"local": f"127.0.{10 + r}.1", "peer": f"127.0.{10 + r}.{r + 1}"}
                for r in range(1, self.tp)
            }
        else:
            peers = {"0": {"local": f"127.0.{10 + rank}.{rank + 1}", "peer": f"127.0.{10 + rank}.1"}}
        return {"port": self.data_port, "peers": peers}

    def argv(self, rank: int) -> list[str]:
        argv = [self.python, "-m", "tensorfold", "serve", str(self.snapshots[rank]), "--tp", str(self.tp)]
        argv += ["--rank", str(rank), "--master", "127.0.0.1", "--master-port", str(self.master_port)]
        if rank == 0:
            argv += ["--host", "127.0.0.1", "--port", str(self.port), "--served-model-name", self.model]
            if self.key_file:
                argv += ["--api-key-file", str(self.key_file)]
        return argv + self.extra

    def start_rank(self, rank: int, fabric: dict | None = None, extra: list[str] | None = None) -> Rank:
        env = {
            **os.environ,
            "PYTHONPATH": str(HERE),
            "SPARKFLEET_FABRIC": json.dumps(fabric or self.fabric(rank)),
        }
        env.update(self.env)
        log = self.workdir / f"rank{rank}.log"
        with log.open("ab") as fh:
            proc = subprocess.Popen(
                self.argv(rank) + (extra or []), env=env, stdout=fh, stderr=subprocess.STDOUT
            )
        self.ranks[rank] = Rank(rank, proc, log)
        return self.ranks[rank]

    def start(self, ready_timeout: float = 30) -> LocalCluster:
        for rank in range(1, self.tp):  # workers first, as sparkfleet starts them
            self.start_rank(rank)
        self.start_rank(0)
        if ready_timeout:
            self.wait_ready(ready_timeout)
        return self

    def health(self) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:  # noqa: S310 - loopback
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")
        except OSError as exc:
            return 0, {"error": str(exc)}

    def wait_ready(self, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            status, doc = self.health()
            if status == 200:
                return doc
            for r in self.ranks.values():
                if r.proc.poll() is not None and r.rank == 0:
                    raise RuntimeError(f"rank 0 exited {r.proc.returncode}:\n{r.output()}")
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- rank {r.rank}\n{r.output()}" for r in self.ranks.values())
                raise TimeoutError(f"not ready after {timeout} s: {status} {doc}\n{logs}")
            time.sleep(0.1)

    def kill(self, rank: int, sig: int = signal.SIGKILL) -> int:
        r = self.ranks[rank]
        r.proc.send_signal(sig)
        return r.proc.wait(timeout=30)

    def stop(self) -> dict[int, int | None]:
        codes: dict[int, int | None] = {}
        order = [0, *range(1, self.tp)]  # rank 0 first, then the workers
        head = self.ranks.get(0)
        # a running rank 0 tells its workers on the way down: give them time to act on it (on a busy
        # machine that can take a while) before they are sent a signal of their own
        grace = 10.0 if head is not None and head.proc.poll() is None else 0.0
        for rank in order:
            r = self.ranks.get(rank)
            if r is None:
                continue
            if rank and grace and r.proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    r.proc.wait(timeout=grace)
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
                try:
                    r.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    r.proc.kill()
                    r.proc.wait()
            codes[rank] = r.proc.returncode
        return codes

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

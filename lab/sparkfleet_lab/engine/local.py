"""Run the engine double's ranks as local processes on loopback (unit tests, benchmarks).

Each rank is `python -m tensorfold serve <snapshot> --tp N --rank R --master 127.0.0.1 --master-port P
--name M --no-update-check ...` with rank 0 adding `--host 127.0.0.1 --port P --max-tokens N`, the argv a
real recipe gives each rank, run from a version's tree (engine.materialize). Workers start first.
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

from sparkfleet_lab import engine as engine_repo
from sparkfleet_lab import ports


def free_port(host: str = "0.0.0.0") -> int:  # noqa: S104 - a probe bind; rank 0's rendezvous binds 0.0.0.0
    """A TCP port free on `host`, below the ephemeral range (sparkfleet_lab/ports.py says why)."""
    return ports.free_port(socket.SOCK_STREAM, host)


def make_snapshot(
    root: Path, shards: int = 2, tensor_bytes: int = 4096, salt: str = "", config: dict | None = None
) -> Path:
    """A small but well-formed deepseek_v41 snapshot (index, config, shards, tokenizer files)."""
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
    cfg = {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "num_hidden_layers": 4,
        "max_position_embeddings": 1048576,
        "quantization_config": {"quant_method": "exl3", "bits": 2.9},
        **(config or {}),
    }
    (root / "config.json").write_text(json.dumps(cfg))
    (root / "tokenizer.json").write_text(json.dumps({"version": "1.0"}))
    (root / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 1048576}))
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
    """`tp` ranks of `tensorfold serve` (engine `version`) on loopback; rank 0's API on 127.0.0.1:`port`."""

    tp: int
    snapshots: list[Path]  # one per rank (the same directory for all is fine)
    workdir: Path
    version: str = engine_repo.DEFAULT_VERSION
    model: str = "standin-model"
    key_file: Path | None = None
    extra: list[str] = field(default_factory=list)  # every rank
    rank0: list[str] = field(default_factory=list)  # rank 0 only
    env: dict[str, str] = field(default_factory=dict)
    load_s: float = 0.2  # SPARKFLEET_LAB_ENGINE_LOAD_S
    jit_s: float = 0.2  # SPARKFLEET_LAB_ENGINE_JIT_S
    python: str = sys.executable
    port: int = 0
    master_port: int = 0
    ranks: dict[int, Rank] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.port = self.port or free_port()
        self.master_port = self.master_port or free_port()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.source = engine_repo.materialize(self.version, self.workdir / f"engine-{self.version}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self, rank: int) -> list[str]:
        argv = [self.python, "-m", "tensorfold", "serve", str(self.snapshots[rank])]
        argv += ["--tp", str(self.tp), "--rank", str(rank), "--master", "127.0.0.1"]
        argv += [
            "--master-port",
            str(self.master_port),
            "--name",
            self.model,
            "--no-update-check",
            *self.extra,
        ]
        if rank == 0:
            argv += ["--host", "127.0.0.1", "--port", str(self.port), "--max-tokens", "4096", *self.rank0]
            if self.key_file:
                argv += ["--api-key-file", str(self.key_file)]
        return argv

    def environment(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("TF_DSV41_", "TENSORFOLD_", "SPARKFLEET_LAB_"))
        }
        env.update(
            PYTHONPATH=str(self.source),
            PYTHONUNBUFFERED="1",
            TORCH_EXTENSIONS_DIR=str(self.workdir / "tf" / "torch_extensions"),
            SPARKFLEET_LAB_ENGINE_LOAD_S=str(self.load_s),
            SPARKFLEET_LAB_ENGINE_JIT_S=str(self.jit_s),
        )
        env.update(self.env)
        return env

    def start_rank(
        self, rank: int, extra: list[str] | None = None, env: dict[str, str] | None = None
    ) -> Rank:
        log = self.workdir / f"rank{rank}.log"
        with log.open("ab") as fh:
            proc = subprocess.Popen(
                self.argv(rank) + (extra or []),
                env={**self.environment(), **(env or {})},
                stdout=fh,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
            )
        self.ranks[rank] = Rank(rank, proc, log)
        return self.ranks[rank]

    def start(self, ready_timeout: float = 60) -> LocalCluster:
        for rank in range(self.tp - 1, 0, -1):  # workers first, rank 0 last, as the recipes start them
            self.start_rank(rank)
        self.start_rank(0)
        if ready_timeout:
            self.wait_ready(ready_timeout)
        return self

    def health(self) -> tuple[int, dict]:
        """(status, body) of /health; (0, {"error": ...}) while the port is closed."""
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:  # noqa: S310 - loopback
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")
        except OSError as exc:
            return 0, {"error": str(exc)}

    def logs(self) -> str:
        return "\n".join(
            f"--- rank {r.rank} (exit {r.proc.poll()})\n{r.output()}" for r in self.ranks.values()
        )

    def wait_ready(self, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            status, doc = self.health()
            if status == 200:
                return doc
            dead = [r for r in self.ranks.values() if r.proc.poll() is not None]
            if dead:
                raise RuntimeError(f"rank {dead[0].rank} exited {dead[0].proc.returncode}:\n{self.logs()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not ready after {timeout} s: {status} {doc}\n{self.logs()}")
            time.sleep(0.1)

    def kill(self, rank: int, sig: int = signal.SIGKILL) -> int:
        r = self.ranks[rank]
        r.proc.send_signal(sig)
        return r.proc.wait(timeout=30)

    def stop(self) -> dict[int, int | None]:
        """Rank 0 first (SIGTERM); the workers get 10 s to follow it down before a signal of their own."""
        codes: dict[int, int | None] = {}
        head = self.ranks.get(0)
        grace = 10.0 if head is not None and head.proc.poll() is None else 0.0
        for rank in [0, *range(1, self.tp)]:
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

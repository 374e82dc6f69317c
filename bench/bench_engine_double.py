"""The engine double's start with an empty kernel cache against a warm one, side by side in one run.

Real: the first start of an engine commit JIT-builds the family's CUDA extensions into the host cache
mounted at /cache/tf (~3 min to serving) and later starts find them (~1 min). The double reproduces
"slower when the cache is empty" with its own default costs (SPARKFLEET_LAB_ENGINE_JIT_S, _LOAD_S):
two local TP2 clusters of engine 0.6.6 on loopback, the same TORCH_EXTENSIONS_DIR, the first one cold.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from sparkfleet_lab.engine.local import LocalCluster, make_snapshot
from sparkfleet_lab.engine.tensorfold import kernels, serve


def _ready(root: Path, name: str, snap: Path, cache: Path) -> float:
    cluster = LocalCluster(
        2,
        [snap] * 2,
        root / name,
        load_s=serve.LOAD_DEFAULT_S,
        jit_s=kernels.JIT_DEFAULT_S,
        env={"TORCH_EXTENSIONS_DIR": str(cache)},
    )
    start = time.monotonic()
    try:
        cluster.start(ready_timeout=120)
        return time.monotonic() - start
    finally:
        cluster.stop()


def run() -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="bench-engine-double-") as tmp:
        root = Path(tmp)
        snap = make_snapshot(root / "snap", shards=4, tensor_bytes=1 << 20)
        cache = root / "tf" / "torch_extensions"
        cold = _ready(root, "cold", snap, cache)
        warm = _ready(root, "warm", snap, cache)
    return [
        {
            "name": "engine double TP2: start to /health 200, empty kernel cache vs warm",
            "baseline": cold,
            "candidate": warm,
            "unit": "s",
            "ratio": cold / warm if warm else float("inf"),
            "how": "two local ranks of engine 0.6.6 (the double's default load and kernel-build costs), "
            "workers first, until /health answers 200; first with an empty TORCH_EXTENSIONS_DIR, then again",
        }
    ]

"""The first start's kernel builds, kept in TORCH_EXTENSIONS_DIR.

Real: the deepseek_v41 family JIT-compiles four CUDA extensions at its first start on the GPU, into
TORCH_EXTENSIONS_DIR (recipes mount a host cache per engine commit at /cache/tf); a start with the
cache empty took ~3 min, a warm one ~1 min (sfxnz/DeepSeek-V4.1-Flash-EXL3-TensorFold-2x-DGX-Spark
README @ 13a26f7f, Gotchas). Torch keys a build by its sources and takes a lock file while it builds.

The double builds nothing: a "build" costs SPARKFLEET_LAB_ENGINE_JIT_S seconds (the lab's own knob) and
leaves an entry (a small JSON file, not a library) keyed by this engine's sources; a warm start finds
every entry and costs nothing. Without TORCH_EXTENSIONS_DIR torch's default (~/.cache/torch_extensions)
is used, as torch does.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
from pathlib import Path

# the four extensions' names, from the family's C++ sources (families/deepseek_v41/cuda/*.cpp, cuda/exl3)
EXTENSIONS = ("dsv41_gemv", "dsv41_l2warm", "dsv41_engram_io", "exl3_experts")
JIT_ENV = "SPARKFLEET_LAB_ENGINE_JIT_S"  # the lab's knob: seconds all four builds take together
JIT_DEFAULT_S = 4.0
HERE = Path(__file__).resolve().parent


def cache_dir(environ=os.environ) -> Path:
    found = environ.get("TORCH_EXTENSIONS_DIR")
    return Path(found) if found else Path.home() / ".cache" / "torch_extensions"


def source_key() -> str:
    """A hash of this engine's sources: another engine commit misses the cache, as torch's keys do."""
    h = hashlib.sha256()
    for path in sorted(HERE.rglob("*.py")):
        h.update(path.relative_to(HERE).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def seconds(environ=os.environ) -> float:
    raw = environ.get(JIT_ENV, "")
    try:
        return max(0.0, float(raw)) if raw else JIT_DEFAULT_S
    except ValueError:
        raise ValueError(f"{JIT_ENV}={raw}: a number of seconds") from None


def ensure(stop: threading.Event, environ=os.environ) -> list[str]:
    """Load the four extensions, building those missing; -> the names built now."""
    root = cache_dir(environ)
    key = source_key()
    each = seconds(environ) / len(EXTENSIONS)
    built = []
    for name in EXTENSIONS:
        folder = root / f"{name}_{key}"
        folder.mkdir(parents=True, exist_ok=True)
        entry = folder / "build.json"
        with (folder / "lock").open("a") as lock:  # another rank on this host waits for the build
            fcntl.flock(lock, fcntl.LOCK_EX)
            if entry.is_file():
                continue
            if stop.wait(each):
                raise KeyboardInterrupt
            tmp = folder / f".build.{os.getpid()}.partial"
            tmp.write_text(json.dumps({"extension": name, "sources": key, "double": True}) + "\n")
            tmp.replace(entry)
            built.append(name)
    return built

"""Shared helpers of the weights tests (imported by the test_weights_* modules; no tests here).

- load_module(name): a module of the collection (plugins/modules/<name>.py) imported in-process
  (tests/conftest.py puts the checkout's collection on sys.path).
- Hub: the lab's HF stand-in (models.generate + hfserver.build_server) on 127.0.0.1, driven by
  the real huggingface_hub of the controller's venv.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "model_weights"
ENGRAM_PATTERNS = [
    "model-00047-of-00048.safetensors",
    "model-00048-of-00048.safetensors",
    "model.safetensors.index.json",
    "config.json",
]


def load_module(name: str):
    return importlib.import_module(f"ansible_collections.sparkfleet.cluster.plugins.modules.{name}")


@dataclass
class Hub:
    data_dir: Path
    server: object
    pins: dict
    topology: str

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def repos(self, engram: bool = True) -> list[dict]:
        out = [
            {
                "name": "model",
                "repo": self.pins["model"]["repo"],
                "revision": self.pins["model"]["revision"],
                "dir": "",
                "allow_patterns": [],
            }
        ]
        if engram:
            out.append(
                {
                    "name": "engram",
                    "repo": self.pins["engram"]["repo"],
                    "revision": self.pins["engram"]["revision"],
                    "dir": "engram",
                    "allow_patterns": ENGRAM_PATTERNS,
                }
            )
        return out

    def settings(self, **values) -> None:
        path = self.data_dir / "hf" / "_settings.json"
        path.write_text(json.dumps(values))

    def requests(self) -> list[dict]:
        return self.server.request_log()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_hub(data_dir: Path, topology: str = "tp2", size_mb: int = 8) -> Hub:
    from sparkfleet_lab.hub import hfserver, models

    pins = models.generate(data_dir, topology, size_mb)
    server = hfserver.build_server(data_dir, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return Hub(data_dir=data_dir, server=server, pins=pins, topology=topology)


RUNNER = """
import json, sys
sys.path.insert(0, {tests!r})
import test_weights_support as s
mod = s.load_module({name!r})
params = json.loads(open({params!r}).read())
try:
    out = mod.run(params, {check})
    print(json.dumps({{"ok": True, "result": out}}))
except Exception as exc:
    print(json.dumps({{"ok": False, "error": str(exc)}}))
"""


def module_process(name: str, params: dict, tmp: Path, check: bool = False) -> subprocess.Popen:
    """Run a module's run() in a child process (so a test can kill it mid-work)."""
    pfile = tmp / f"{name}-params.json"
    pfile.write_text(json.dumps(params))
    code = RUNNER.format(tests=str(Path(__file__).parent), name=name, params=str(pfile), check=check)
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )

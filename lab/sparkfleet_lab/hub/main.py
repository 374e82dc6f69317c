"""The lab hub: the lab's stand-in for the internet, one process tree in one container.

- Hugging Face API + the wheel directory `/wheels/` (port 8080): `hfserver.build_server`
- a Docker registry (port 5000): Debian's `docker-registry` (the distribution project's registry)
- `git daemon` (port 9418): the stand-in engine's repository under /srv/git
Runs inside the hub container on its Python (stdlib only). If any service dies, the hub exits
non-zero so `docker ps` shows it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

REGISTRY_CONFIG = """\
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 0.0.0.0:{port}
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", type=Path, default=Path("/srv/hub"))
    ap.add_argument("--hf-port", type=int, default=8080)
    ap.add_argument("--registry-port", type=int, default=5000)
    ap.add_argument("--git-port", type=int, default=9418)
    args = ap.parse_args(argv)

    from sparkfleet_lab.hub.hfserver import build_server

    (args.data / "registry").mkdir(parents=True, exist_ok=True)
    cfg = Path("/tmp/registry.yml")
    cfg.write_text(REGISTRY_CONFIG.format(root=args.data / "registry", port=args.registry_port))
    procs = {
        "registry": subprocess.Popen(["docker-registry", "serve", str(cfg)]),
        "git": subprocess.Popen(
            [
                "git",
                "daemon",
                "--reuseaddr",
                "--export-all",
                f"--base-path={args.data / 'git'}",
                "--listen=0.0.0.0",
                f"--port={args.git_port}",
                str(args.data / "git"),
            ]
        ),
    }
    server = build_server(args.data, "0.0.0.0", args.hf_port)  # noqa: S104 - the lab's internal network
    threading.Thread(target=server.serve_forever, name="hf", daemon=True).start()
    print(f"hub: hf :{args.hf_port}, registry :{args.registry_port}, git :{args.git_port}", flush=True)
    while True:
        for name, proc in procs.items():
            if proc.poll() is not None:
                print(f"hub: {name} exited with {proc.returncode}", file=sys.stderr, flush=True)
                server.shutdown()
                return 1
        time.sleep(1)


if __name__ == "__main__":
    raise SystemExit(main())

"""The `sparkfleet` command as an admin runs it against the lab (a subprocess, plain output, wide lines):
shared by the lab tests that drive the CLI from outside (test_lock.py, test_chaos.py)."""

from __future__ import annotations

import os
import subprocess
import sys


def command(lab, *argv: str) -> list[str]:
    """`sparkfleet <verb> -i <each lab inventory> <rest>`; a verb may be two words ("clocks set")."""
    verb, *rest = argv
    cmd = [sys.executable, "-m", "sparkfleet", *verb.split()]
    for inv in lab.inventories:
        cmd += ["-i", str(inv)]
    return cmd + rest


def env() -> dict[str, str]:
    return os.environ | {"COLUMNS": "200"}


def sparkfleet(lab, *argv: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(lab, *argv),
        cwd=lab.project_dir,
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )

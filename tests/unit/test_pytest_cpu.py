"""scripts/pytest_cpu.py, the per-test CPU plugin: a real pytest run with it on, of two tests of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TESTS = """
import subprocess, sys

def test_burns_in_a_child():
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)

def test_burns_here():
    sum(i * i for i in range(3_000_000))
"""


def run(tmp_path: Path, out: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_burn.py").write_text(TESTS)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "scripts"), "SPARKFLEET_PYTEST_CPU": out}
    env.pop("SPARKFLEET_LAB", None)
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "pytest_cpu", "-p", "no:cacheprovider", "test_burn.py"]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)


def test_each_test_gets_its_own_and_its_childrens_cpu(tmp_path: Path) -> None:
    out = tmp_path / "cpu"
    proc = run(tmp_path, str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = {r["id"]: r for f in out.glob("*.jsonl") for r in map(json.loads, f.read_text().splitlines())}
    child, here = records["test_burn.py::test_burns_in_a_child"], records["test_burn.py::test_burns_here"]
    assert child["children"] > 0.05 and child["children"] > child["self"], child
    assert here["self"] > 0.05 and here["children"] < 0.05, here
    assert child["containers"] == here["containers"] == 0.0 and child["lab"] is None  # no lab: none read
    table = subprocess.run(
        [sys.executable, str(ROOT / "scripts/pytest_cpu.py"), str(out)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert table.splitlines()[1].endswith("  -  test_burn.py") and " 2 " in table.splitlines()[1], table


def test_off_unless_a_directory_is_given(tmp_path: Path) -> None:
    proc = run(tmp_path, "")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not list(tmp_path.rglob("*.jsonl"))

"""Preflight's parse of each rank's command line (plugins/module_utils/engine_flags.py) against the engine's:
the same command lines through the lab's double of each engine version (whose flags are the real ones,
tests/unit/test_engine_double_parser.py) give the same verdict and argparse's same words."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.sparkfleet.cluster.plugins.module_utils.engine_flags import (
    argv_problem,
    command_line_problems,
)
from sparkfleet_lab import engine as engine_repo

ROOT = Path(__file__).resolve().parents[2]


CASES = [
    ("0.6.6", ["--bogus"]),
    ("0.6.6", ["--tp", "3"]),
    ("0.6.4", ["--tp", "4"]),
    ("0.6.4", ["--rank", "2"]),
    ("tp3-recipe", ["--tp", "4"]),
    ("0.6.4", ["--api-key-file", "/k"]),
    ("0.6.6", ["--served-model-name", "x"]),
    ("0.6.6", ["--vision-"]),
    ("0.6.6", ["--port", "eighty"]),
    ("0.6.6", ["--kv-dtype", "fp3"]),
    ("0.6.6", ["--top-k"]),
    ("0.6.6", ["--thinking=yes"]),
    ("0.6.6", ["--cont", "65536", "--no-thinking", "--alias", "a"]),  # accepted: prefix, off flag, append
    ("tp3-recipe", ["--tp", "3", "--rank", "2", "--master", "10.0.0.1"]),  # accepted
    ("0.6.4", ["--reasoning-effort", "max"]),
]


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine-trees")
    return {v: engine_repo.materialize(v, root / v) for v in engine_repo.BRANCHES}


@pytest.mark.parametrize(("version", "args"), CASES)
def test_preflight_and_the_engine_give_the_same_verdict_in_the_same_words(trees, tmp_path, version, args):
    proc = subprocess.run(
        [sys.executable, "-m", "tensorfold", "serve", str(tmp_path), *args],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(trees[version]), "PATH": "/usr/bin:/bin"},
        timeout=60,
        check=False,
    )
    mine = argv_problem(version, [str(tmp_path), *args])
    if proc.returncode == 2:
        assert mine == proc.stderr.strip().splitlines()[-1], proc.stderr
    else:  # the double went past its parser (and refused the empty model directory, exit 1)
        assert mine is None, (mine, proc.stderr)


def profiles() -> dict:
    text = (ROOT / "roles/engine_service/vars/main.yml").read_text()
    return yaml.safe_load(text)["__engine_service_builtin_profiles"]


ENDPOINT = {"host": "127.0.0.1", "port": 8000, "name": "deepseek-v4.1-flash", "master_port": 29571}


def test_the_built_in_profiles_with_their_own_settings_parse():
    for name, profile in profiles().items():
        values = {k: v for k, v in profile["settings"].items() if not isinstance(v, (dict, list))}
        for ranks in profile["tp_sizes"]:
            assert command_line_problems(profile, values, [], ranks, ENDPOINT) == [], name


def test_an_extra_argument_the_engine_refuses_names_engine_service_extra_args():
    profile = profiles()["dsv41-fork-0.6.6"]
    (msg,) = command_line_problems(profile, {}, ["--kv-dtype", "fp3"], 2, ENDPOINT)
    assert msg.startswith("engine_service_extra_args: the engine of this profile (tensorfold 0.6.6)")
    assert "of every rank" in msg and "argument --kv-dtype: invalid choice: 'fp3'" in msg


def test_a_setting_the_engine_refuses_names_its_variable():
    profile = profiles()["dsv41-fork-0.6.4"]
    (msg,) = command_line_problems(profile, {"reasoning_effort": "max"}, [], 2, ENDPOINT)
    assert msg.startswith("engine_service_thinking.effort: ") and "invalid choice: 'max'" in msg, msg


def test_a_flag_only_rank_0_gets_is_refused_for_rank_0_alone():
    profile = profiles()["dsv41-fork-0.6.4"]  # 0.6.4 has no --api-key-file
    (msg,) = command_line_problems(profile, {}, [], 2, {**ENDPOINT, "api_key_required": True})
    assert "the command line of rank 0 " in msg and "unrecognized arguments: --api-key-file" in msg, msg

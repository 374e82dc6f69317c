"""The engine double's `tensorfold serve` parser against tables transcribed from the real parser.

The tables (plugins/module_utils/engine_flags.py, where preflight parses each rank's command line with them)
are transcribed by hand from sfxnz/TensorFold src/tensorfold/cli_args.py at
2258b00d1bbd74cae23d227f6cf41de946e49451 (engine 0.6.4) and at
dc971a2c47b9d29622e0b7f69b0708418694d700 (0.6.6): every serve flag in the real order, with its action,
type, choices and default. The TP3 recipe's engine is not public: its table is 0.6.6's with --tp 1,2,3
and --rank 0-2 (the documented assumption). A missing, extra or changed flag fails here.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from ansible_collections.sparkfleet.cluster.plugins.module_utils.engine_flags import BOOL, SERVE_FLAGS
from sparkfleet_lab import engine as engine_repo
from sparkfleet_lab.engine.tensorfold import cli_args

REAL = SERVE_FLAGS  # (flag, action, type, choices, default), transcribed from the real parsers
ACTIONS = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "_AppendAction": "append",
    "BooleanOptionalAction": BOOL,
}


def table(version: str) -> list[tuple]:
    serve = cli_args.serve_parser(cli_args.parser_of(version))
    out = []
    for a in serve._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        name = a.option_strings[0] if a.option_strings else a.dest
        choices = tuple(a.choices) if a.choices is not None else None
        out.append((name, ACTIONS.get(type(a).__name__, type(a).__name__), a.type, choices, a.default))
    return out


@pytest.mark.parametrize("version", sorted(REAL))
def test_serve_flags_are_the_real_parsers(version):
    mine, real = table(version), REAL[version]
    assert [f[0] for f in mine] == [f[0] for f in real], "flag names or their order differ"
    for got, want in zip(mine, real, strict=True):
        assert got == want, f"{want[0]}: double {got}, real {want}"


def test_versions_differ_where_the_real_ones_do():
    assert {f[0] for f in REAL["0.6.6"]} - {f[0] for f in REAL["0.6.4"]} == {
        "--name-priority",
        "--api-key",
        "--api-key-file",
        "--metrics-open",
    }


def test_subcommands_and_version_flag():
    parser = cli_args.parser_of("0.6.4")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == {"serve", "pull", "models", "update", "info", "plan"}
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--version"])
    assert exc.value.code == 0


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        (["serve", "/m", "--cont", "65538"], "context", 65538),  # argparse prefix matching stays on
        (["serve", "/m", "--master-p", "29571"], "master_port", 29571),
        (["serve", "/m", "--no-thinking"], "thinking", False),
        (["serve", "/m", "--alias", "a", "--alias", "b"], "alias", ["a", "b"]),
    ],
)
def test_parsing_as_the_real_parser_parses(argv, dest, value):
    assert getattr(cli_args.parser_of("0.6.6").parse_args(argv), dest) == value


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine-trees")
    return {v: engine_repo.materialize(v, root / v) for v in engine_repo.BRANCHES}


def tensorfold(trees, version: str, *args: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(trees[version]), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "tensorfold", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("version", "args", "message"),
    [
        ("0.6.6", ["--bogus"], "tensorfold: error: unrecognized arguments: --bogus"),
        ("0.6.6", ["--tp", "3"], "argument --tp: invalid choice: 3"),
        ("0.6.4", ["--tp", "4"], "argument --tp: invalid choice: 4"),
        ("0.6.4", ["--rank", "2"], "argument --rank: invalid choice: 2"),
        ("tp3-recipe", ["--tp", "4"], "argument --tp: invalid choice: 4"),
        ("0.6.4", ["--api-key-file", "/k"], "unrecognized arguments: --api-key-file /k"),
        ("0.6.4", ["--metrics-open"], "unrecognized arguments: --metrics-open"),
        ("0.6.6", ["--served-model-name", "x"], "unrecognized arguments: --served-model-name x"),
        ("0.6.6", ["--default-temperature", "1"], "unrecognized arguments: --default-temperature 1"),
        ("0.6.6", ["--max-num-seqs", "4"], "unrecognized arguments: --max-num-seqs 4"),
        ("0.6.6", ["--vision-"], "ambiguous option: --vision- could match"),
        ("0.6.6", ["--port", "eighty"], "argument --port: invalid int value: 'eighty'"),
    ],
)
def test_bad_command_lines_exit_2_with_argparse_s_message(trees, tmp_path, version, args, message):
    proc = tensorfold(trees, version, "serve", str(tmp_path), *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert proc.stdout == ""


def test_version_of_each_tree(trees):
    assert tensorfold(trees, "0.6.4", "--version").stdout.strip() == "tensorfold 0.6.4"
    assert tensorfold(trees, "0.6.6", "--version").stdout.strip() == "tensorfold 0.6.6"
    assert tensorfold(trees, "tp3-recipe", "--version").stdout.strip() == "tensorfold 0.6.6+tp3recipe"

"""engine_args: a rank's new command line through the engine's own parser (the lab's double of
TensorFold, whose cli_args.build_parser(handlers) has the real name, signature and flags), before a restart.

`docker run --rm --network none --entrypoint python3 IMAGE ARGS...` is played by a one-line stand-in that runs
the entrypoint with ARGS on this machine's Python, where the double's package is installed (the lab tests run
the real docker and the double's image: tests/roles/test_engine_service.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_engine_modules import run_module

PARSER = "sparkfleet_lab.engine.tensorfold.cli_args:build_parser"
ARGV = ["tensorfold", "serve", "/weights", "--tp", "2", "--rank", "0", "--master", "10.0.0.1"]


@pytest.fixture
def docker(tmp_path: Path) -> str:
    """`docker run --rm --network none --entrypoint PY IMAGE ARG...` -> `PY ARG...` (PY: this Python)."""
    fake = tmp_path / "docker"
    fake.write_text(
        "#!/bin/sh\n"
        '[ "$1 $2 $3 $4 $5" = "run --rm --network none --entrypoint" ] || { echo "no: $*" >&2; exit 125; }\n'
        f'shift 7; exec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    return str(fake)


def parse(docker: str, argv: list[str], parser: str = PARSER) -> dict:
    return run_module("engine_args", {"image": "sha256:ab", "argv": argv, "docker": docker, "parser": parser})


def test_a_command_line_the_engine_takes_is_ok(docker):
    out = parse(docker, ARGV)
    assert (out["state"], out["exit_code"], out["changed"]) == ("ok", 0, False), out


def test_a_value_the_engine_refuses_is_named_in_argparses_words(docker):
    out = parse(docker, [*ARGV, "--kv-dtype", "fp3"])
    assert out["state"] == "refused" and out["exit_code"] == 2, out
    assert "rc" not in out and not out.get("failed")  # a refusal is the answer: Ansible fails a non-zero rc
    assert out["problem"].startswith("tensorfold serve: error: argument --kv-dtype: invalid choice: 'fp3'")


def test_an_unknown_flag_is_refused(docker):
    out = parse(docker, [*ARGV, "--no-such-flag"])
    assert out["state"] == "refused" and "unrecognized arguments: --no-such-flag" in out["problem"], out


def test_a_parser_the_image_does_not_have_is_unchecked_never_ok(docker):
    out = parse(docker, ARGV, parser="tensorfold_missing.cli_args:build_parser")
    assert out["state"] == "unchecked" and out["exit_code"] == 3, out
    assert "cannot build the engine's parser" in out["problem"] and "ModuleNotFoundError" in out["problem"]


def test_docker_refusing_the_container_is_unchecked_with_its_words(tmp_path):
    fake = tmp_path / "docker"
    refusal = "docker: Error response from daemon: No such image: sha256:ab"
    fake.write_text(f"#!/bin/sh\necho '{refusal}' >&2; exit 125\n")
    fake.chmod(0o755)
    out = parse(str(fake), ARGV)
    assert out["state"] == "unchecked" and out["exit_code"] == 125, out
    assert "No such image" in out["problem"]


def test_a_command_that_is_not_tensorfolds_is_not_parsed(docker):
    out = parse(docker, ["vllm", "serve", "/weights"])
    assert out["state"] == "unchecked" and out["exit_code"] is None, out
    assert "is not tensorfold's" in out["problem"]

"""The deepseek_v41 family's startup refusals, one rank at a time (they all come before or at the rendezvous).

A refusal prints `tensorfold: <message>` on stderr and exits 1 (the real cli.main); a command line the
family accepts gets as far as the rendezvous, which here times out after 0.5 s (a traceback, exit 1).
"""

from __future__ import annotations

import re

import pytest
from test_engine_double_support import make_snapshot, port, rank_alone, tree

WORKER = ["--tp", "2", "--rank", "1", "--master", "127.0.0.1"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("startup")
    return {
        "snap": make_snapshot(root / "snap"),
        "trees": {v: tree(v, root / "trees") for v in ("0.6.4", "0.6.6", "tp3-recipe")},
        "root": root,
    }


def run(env, version: str, *args: str, snap=None, environ=None):
    return rank_alone(
        env["trees"][version], snap or env["snap"], *args, "--master-port", str(port()), env=environ
    )


def refused(proc, message: str) -> None:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("tensorfold: ")]
    assert lines and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def accepted(proc) -> None:
    """Through every check: the rank waits at the rendezvous (timed out here)."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" in proc.stderr and "rendezvous" in proc.stderr, proc.stderr
    assert not [ln for ln in proc.stderr.splitlines() if ln.startswith("tensorfold: ")], proc.stderr
    assert "[tensorfold] loading " in proc.stdout


@pytest.mark.parametrize(
    ("version", "args", "message"),
    [
        ("0.6.6", ["--tp", "1"], "runs on exactly 2 GPUs"),
        ("0.6.4", ["--tp", "1"], "runs on exactly 2 GPUs"),
        (
            "0.6.6",
            ["--tp", "4", "--rank", "1", "--master", "h"],
            "--tp 4: DeepSeek-V4.1-Flash runs on one or two",
        ),
        ("tp3-recipe", [*WORKER], "runs on exactly 3 GPUs"),
        ("0.6.6", ["--tp", "2", "--rank", "1"], "--tp 2 needs --master"),
        ("0.6.6", ["--tp", "1", "--rank", "1"], "--rank 1 needs --tp"),
        ("0.6.6", [*WORKER, "--drafter", "someone/draft-model"], "a separate draft model (--drafter)"),
        ("0.6.6", [*WORKER, "--prefill-fp8"], "--prefill-fp8: DeepSeek-V4.1-Flash has no FP8 prompt kernels"),
        ("0.6.6", [*WORKER, "--mtp-drafts", "6"], "--mtp-drafts 6: DeepSeek-V4.1-Flash takes 0"),
        ("0.6.6", [*WORKER, "--mtp-drafts", "-1"], "--mtp-drafts -1"),
        ("0.6.6", [*WORKER, "--mtp-confidence", "1.5"], "--mtp-confidence is a probability"),
        ("0.6.6", [*WORKER, "--parallel", "5"], "--parallel 5: DeepSeek-V4.1-Flash decodes 1 to 4"),
        ("tp3-recipe", ["--tp", "3", "--rank", "1", "--master", "h", "--parallel", "17"], "1 to 16"),
        ("0.6.6", [*WORKER, "--kv-dtype", "int8"], "bf16 KV cache, not --kv-dtype int8"),
        ("0.6.6", [*WORKER, "--vision"], "--vision: DeepSeek-V4.1-Flash has no image tower"),
        ("0.6.6", [*WORKER, "--vision-urls"], "--vision-urls needs --vision"),
        ("0.6.6", [*WORKER, "--ssd-experts", "8"], "--ssd-experts"),
        ("0.6.6", [*WORKER, "--ple-on-ssd"], "--ple-on-ssd"),
        ("0.6.6", [*WORKER, "--backend", "mlx"], "runs on NVIDIA GPUs only"),
        ("0.6.6", [*WORKER, "--decode-share", "-0.5"], "--decode-share is 0"),
        (
            "0.6.6",
            [*WORKER, "--context", "2000000"],
            "--context 2000000 exceeds this model's 1048576-token window",
        ),
        ("0.6.6", [*WORKER, "--context", "-1"], "--context must be 0 or a positive"),
        ("0.6.6", [*WORKER, "--name-priority", "other=background"], "--name-priority other=background"),
    ],
)
def test_the_family_refuses(env, version, args, message):
    refused(run(env, version, *args), message)


def test_a_junk_parallel_value_exits_1_with_the_reason(env):
    proc = run(env, "0.6.6", *WORKER, "--parallel", "lots")
    assert proc.returncode == 1 and "--parallel takes a number or auto, not 'lots'" in proc.stderr


@pytest.mark.parametrize(
    ("version", "args"),
    [
        ("0.6.6", WORKER),
        ("0.6.4", WORKER),
        ("tp3-recipe", ["--tp", "3", "--rank", "2", "--master", "127.0.0.1", "--parallel", "16"]),
        ("0.6.6", [*WORKER, "--no-prefill-fp8", "--mtp-drafts", "0", "--parallel", "4", "--drafter", "none"]),
        ("0.6.6", [*WORKER, "--mtp-drafts", "5", "--mtp-confidence", "0.15", "--decode-share", "0.5"]),
        ("0.6.6", [*WORKER, "--no-drafts", "--context", "65538", "--thinking-budget", "100"]),
        ("0.6.6", [*WORKER, "--name", "m", "--alias", "a", "--name-priority", "a=background"]),
    ],
)
def test_the_family_accepts(env, version, args):
    accepted(run(env, version, *args))


def test_a_missing_model_directory_or_wrong_family(env, tmp_path):
    refused(run(env, "0.6.6", *WORKER, snap=tmp_path / "nowhere"), "is neither a directory nor")
    other = make_snapshot(tmp_path / "llama", config={"model_type": "llama"})
    refused(run(env, "0.6.6", *WORKER, snap=other), "no model family here serves model_type 'llama'")
    fp16 = make_snapshot(tmp_path / "fp16", config={"quantization_config": {}})
    refused(run(env, "0.6.6", *WORKER, snap=fp16), "reads EXL3 routed experts")


def test_the_refusal_comes_after_the_loading_line_where_the_real_one_does(env):
    proc = run(env, "0.6.6", "--tp", "1")  # cuda_engine's check: after the loading line
    assert proc.stdout.splitlines()[-1].startswith("[tensorfold] loading snap: DeepSeek-V4.1-Flash")
    before = run(env, "0.6.6", *WORKER, "--kv-dtype", "int4")  # serve_options: before anything loads
    assert "[tensorfold] loading" not in before.stdout


def test_the_rendezvous_wait_is_a_traceback_naming_the_store(env):
    proc = run(env, "0.6.6", *WORKER)
    assert re.search(r"timed out after \d+ s reaching the rendezvous store at 127\.0\.0\.1:\d+", proc.stderr)
    head = run(env, "0.6.6", "--tp", "2", "--rank", "0", "--master", "127.0.0.1")
    assert head.returncode == 1 and "1/2 ranks joined, rank(s) 1 did not" in head.stderr


# ---- API keys at startup (0.6.6+) -------------------------------------------------------------


def key_file(path, text: str, mode: int = 0o600):
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    ("text", "mode", "message"),
    [
        ("k1\n", 0o640, "must be a regular file that other users cannot read; chmod 600"),
        ("k1\n", 0o604, "must be a regular file that other users cannot read"),
        ("# only a comment\n\n", 0o600, "API key file has no keys"),
        ("bad label!: k1\n", 0o600, "API key label"),
        ("two words\n", 0o600, "nonempty text without whitespace"),
    ],
)
def test_key_file_rules(env, tmp_path, text, mode, message):
    keys = key_file(tmp_path / "keys", text, mode)
    refused(run(env, "0.6.6", *WORKER, "--api-key-file", str(keys)), message)


def test_a_key_file_that_cannot_be_opened(env, tmp_path):
    refused(run(env, "0.6.6", *WORKER, "--api-key-file", str(tmp_path / "none")), "cannot be opened safely")
    (tmp_path / "dir").mkdir()
    refused(run(env, "0.6.6", *WORKER, "--api-key-file", str(tmp_path / "dir")), "API key file")


def test_a_good_key_file_passes_and_the_open_server_warning(env, tmp_path):
    keys = key_file(tmp_path / "keys", "# sparkfleet\nadmin: k-1\nk-2\n")
    accepted(run(env, "0.6.6", *WORKER, "--api-key-file", str(keys)))
    warn = "[tensorfold] warning: non-loopback server has no API key; requests are open"
    anywhere = "0.0.0.0"  # noqa: S104 - a command line's --host, never bound here
    assert warn in run(env, "0.6.6", *WORKER, "--host", anywhere).stdout
    assert warn not in run(env, "0.6.6", *WORKER, "--host", anywhere, "--api-key-file", str(keys)).stdout
    assert (
        warn
        not in run(env, "0.6.6", *WORKER, "--host", anywhere, environ={"TENSORFOLD_API_KEY": "a,b"}).stdout
    )
    assert warn not in run(env, "0.6.6", *WORKER, "--host", "localhost").stdout
    assert warn not in run(env, "0.6.4", *WORKER, "--host", anywhere).stdout  # 0.6.4 has no keys at all


# ---- precheck: the same checks for a rendered command line (no process, no files) ------------------


def test_precheck_parses_and_refuses_as_a_start_does():
    from sparkfleet_lab.engine.tensorfold import serve

    base = [
        "serve",
        "/snap/abc",
        "--tp",
        "2",
        "--rank",
        "1",
        "--master",
        "10.12.1.1",
        "--master-port",
        "29551",
    ]
    args = serve.precheck([*base, "--name", "m", "--context", "65538", "--no-thinking"], "0.6.6")
    assert (args.tp, args.rank, args.context, args.thinking) == (2, 1, 65538, False)
    with pytest.raises(SystemExit) as exc:
        serve.precheck([*base, "--served-model-name", "m"], "0.6.6")
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        serve.precheck([*base, "--api-key-file", "/k"], "0.6.4")
    with pytest.raises(ValueError, match="exactly 3 GPUs"):
        serve.precheck(base, "tp3-recipe")
    with pytest.raises(ValueError, match="--mtp-drafts 9"):
        serve.precheck([*base, "--mtp-drafts", "9"], "0.6.6")
    with pytest.raises(ValueError, match="model_type 'llama'"):
        serve.precheck(base, "0.6.6", config={"model_type": "llama"})

"""engine_service's modules against the engine double of each built-in profile's version (processes on
loopback): verify with the profile's checks, readiness while the port is closed and after, the ranks' own log
lines (ready, fatal) read as the real ones look; the API key, caches and node-state helpers, run the way
Ansible runs them (JSON in, JSON out: their main() in this process, tests/unit/module_runner.py; one run of
each module is the module file run as a process of its own)."""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import module_runner
import pytest
import yaml
from ansible_collections.sparkfleet.cluster.plugins.module_utils import engine_logs as logs_mod
from ansible_collections.sparkfleet.cluster.plugins.modules import engine_api as api
from ansible_collections.sparkfleet.cluster.plugins.modules import engine_cache as cache_mod
from ansible_collections.sparkfleet.cluster.plugins.modules import engine_node as node_mod
from sparkfleet_lab.engine.local import LocalCluster, make_snapshot

ROOT = Path(__file__).resolve().parents[2]
PROFILES = yaml.safe_load((ROOT / "roles/engine_service/vars/main.yml").read_text())[
    "__engine_service_builtin_profiles"
]
RULES = PROFILES["dsv41-fork-0.6.6"]["ready"]
KEY = "sk-modules-0123456789abcdef"


def run_module(name: str, args: dict, check_mode: bool = False, real: bool = False) -> dict:
    """A module's result, its arguments as Ansible passes them (real: the module file's own process)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return module_runner.run(name, {**args, "_ansible_check_mode": check_mode}, env, real=real)


def key_file(root: Path) -> Path:
    keys = root / "keys"
    keys.write_text(f"# test\nverify: {KEY}\n")
    keys.chmod(0o600)  # the real engine refuses a key file others can read
    return keys


@pytest.fixture(scope="module")
def snap(tmp_path_factory) -> Path:
    return make_snapshot(tmp_path_factory.mktemp("snap") / "s")


@pytest.fixture(scope="module")
def tp3(tmp_path_factory, snap):
    """The TP3 recipe's engine: its card accepts forced tool calls and enforced JSON schemas."""
    root = tmp_path_factory.mktemp("tp3")
    keys = key_file(root)
    cluster = LocalCluster(3, [snap] * 3, root / "run", version="tp3-recipe", key_file=keys, model="m-1")
    cluster.start()
    yield cluster, keys
    cluster.stop()


@pytest.fixture(scope="module")
def fork066(tmp_path_factory, snap):
    """The deepseek_v41 fork at 0.6.6, TP2, with a key: what the TP2 profile runs."""
    root = tmp_path_factory.mktemp("fork066")
    keys = key_file(root)
    cluster = LocalCluster(2, [snap] * 2, root / "run", version="0.6.6", key_file=keys, model="m-1")
    cluster.start()
    yield cluster, keys
    cluster.stop()


# ---- verify, per profile ------------------------------------------------------------------------


def test_the_tp3_profiles_checks_pass_against_its_engine(tp3):
    cluster, keys = tp3
    checks = PROFILES["tp3-recipe"]["verify"]
    out = run_module("engine_api", {"action": "verify", "url": cluster.url, "model": "m-1",
                                    "api_key_file": str(keys), "checks": checks}, real=True)  # fmt: skip
    assert out["failed_checks"] == [], out["table"]
    assert (
        [c["name"] for c in out["checks"]]
        == checks
        == ["models", "auth", "chat", "stream", "tool", "json_schema"]
    )
    assert all(c["latency_ms"] > 0 for c in out["checks"])
    assert out["table"][-1] == "6/6 checks passed"
    assert KEY not in json.dumps(out)


def test_the_fork_profiles_checks_pass_and_its_refusals_are_checked(fork066):
    cluster, keys = fork066
    checks = PROFILES["dsv41-fork-0.6.6"]["verify"]
    out = run_module("engine_api", {"action": "verify", "url": cluster.url, "model": "m-1",
                                    "api_key_file": str(keys), "checks": checks})  # fmt: skip
    assert out["failed_checks"] == [], out["table"]
    by = {c["name"]: c for c in out["checks"]}
    assert by["tool_refused"]["result"].startswith("HTTP 400") and by["auth"]["result"].startswith("HTTP 401")
    # the forced tool call and the JSON-schema output themselves fail against this engine: it refuses them
    args = {"action": "verify", "url": cluster.url, "model": "m-1", "api_key_file": str(keys)}
    strict = run_module("engine_api", {**args, "checks": ["tool", "json_schema"]})
    assert strict["failed_checks"] == ["tool", "json_schema"]
    assert "400" in strict["checks"][0]["detail"]


def test_refusal_checks_fail_against_an_engine_that_accepts(tp3):
    cluster, keys = tp3
    args = {"action": "verify", "url": cluster.url, "model": "m-1", "api_key_file": str(keys)}
    out = run_module("engine_api", {**args, "checks": ["tool_refused", "json_schema_refused"]})
    assert out["failed_checks"] == ["tool_refused", "json_schema_refused"]
    assert "says it refuses" in out["checks"][0]["detail"]


def test_verify_fails_without_the_key(fork066):
    cluster, _keys = fork066
    nokey = run_module("engine_api", {"action": "verify", "url": cluster.url, "model": "m-1",
                                      "checks": ["models", "chat"]})  # fmt: skip
    assert nokey["failed_checks"] == ["models", "chat"]
    assert "401" in nokey["checks"][1]["detail"]


def test_auth_fails_on_an_open_api(tmp_path, snap):
    with LocalCluster(2, [snap] * 2, tmp_path / "run", version="0.6.6", model="m-1") as cluster:
        cluster.start()
        out = run_module(
            "engine_api", {"action": "verify", "url": cluster.url, "model": "m-1", "checks": ["auth"]}
        )
    assert out["failed_checks"] == ["auth"] and "answers without the key" in out["checks"][0]["detail"]


def test_the_064_engine_passes_its_profiles_checks_without_a_key(tmp_path, snap):
    checks = PROFILES["dsv41-fork-0.6.4"]["verify"]
    assert "auth" not in checks
    with LocalCluster(2, [snap] * 2, tmp_path / "run", version="0.6.4", model="m-1") as cluster:
        cluster.start()
        out = run_module(
            "engine_api", {"action": "verify", "url": cluster.url, "model": "m-1", "checks": checks}
        )
    assert out["failed_checks"] == [], out["table"]


class Liar(BaseHTTPRequestHandler):
    """An OpenAI-looking server that answers wrongly in every way verify checks."""

    def log_message(self, *args) -> None:
        pass

    def _send(self, doc: dict, status: int = 200, sse: bool = False) -> None:
        body = (
            (b"data: " + json.dumps(doc).encode() + b"\n\ndata: [DONE]\n\n")
            if sse
            else json.dumps(doc).encode()
        )
        self.send_response(status)
        self.send_header("Content-Type", "text/event-stream" if sse else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send({"ok": True})
        else:
            self._send({"data": [{"id": "m"}]})

    def do_POST(self) -> None:
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if req.get("stream"):
            self._send({"choices": [{"delta": {"content": "144"}}]}, sse=True)  # one piece: not streamed
        elif req.get("tools"):
            call = {"function": {"name": "get_weather", "arguments": json.dumps({"city": 7})}}
            self._send({"choices": [{"message": {"content": None, "tool_calls": [call]}}]})
        elif req.get("response_format"):
            self._send({"choices": [{"message": {"content": '{"answer": "323"}'}}]})
        else:
            self._send({"choices": [{"message": {"content": "323", "reasoning_content": "thinking anyway"}}]})


def test_verify_catches_wrong_answers():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Liar)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = api.Client(f"http://127.0.0.1:{server.server_port}", "k" * 20, 5)
        checks = api.verify(client, "m", list(api.CHECKS))
    finally:
        server.shutdown()
    by = {c["name"]: c for c in checks}
    assert by["models"]["ok"]
    assert not by["auth"]["ok"] and "without the key" in by["auth"]["detail"]
    assert not by["chat"]["ok"] and "thinking was not off" in by["chat"]["detail"]
    assert not by["stream"]["ok"] and "one piece" in by["stream"]["detail"]
    assert not by["tool"]["ok"] and "$.city" in by["tool"]["detail"] and "unit" in by["tool"]["detail"]
    assert not by["json_schema"]["ok"] and "is not integer" in by["json_schema"]["detail"]
    assert not by["tool_refused"]["ok"] and not by["json_schema_refused"]["ok"]
    assert api.table(checks)[-1] == "1/8 checks passed"


@pytest.mark.parametrize(
    ("value", "schema", "errors"),
    [
        ({"a": 1}, {"type": "object", "required": ["a", "b"]}, 1),
        ({"a": 1, "z": 2}, {"type": "object", "properties": {"a": {}}, "additionalProperties": False}, 1),
        (True, {"type": "integer"}, 1),
        (3, {"type": "integer", "minimum": 4}, 1),
        ("x", {"type": "string", "enum": ["a", "b"]}, 1),
        ([1, "2"], {"type": "array", "items": {"type": "integer"}}, 1),
        ({"a": [1]}, {"type": "object", "properties": {"a": {"type": "array"}}}, 0),
        (None, {"type": ["string", "null"]}, 0),
    ],
)
def test_schema_errors(value, schema, errors):
    assert len(api.schema_errors(value, schema)) == errors


# ---- readiness: the port is closed while the ranks load ----------------------------------------


def fake_docker(tmp_path: Path, log: Path, state: Path) -> str:
    """A docker CLI for one container: `inspect` prints the state file, `logs` the rank's log file (the
    engine double's real output), as `docker logs` does."""
    script = tmp_path / "docker"
    script.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            case "$1" in
              inspect) cat {state} ;;
              logs) if [ "$2" = --tail ]; then tail -n "$3" {log}; else cat {log}; fi ;;
              *) exit 1 ;;
            esac
            """
        )
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_wait_says_loading_while_the_port_is_closed_then_ready_with_the_serving_line(tmp_path, snap):
    with LocalCluster(2, [snap] * 2, tmp_path / "run", version="0.6.6", load_s=8, model="m-1") as cluster:
        cluster.start(ready_timeout=0)
        state = tmp_path / "state.json"
        started = time.strftime("%Y-%m-%dT%H:%M:%S.000000001Z", time.gmtime(time.time() - 185))
        state.write_text(json.dumps({"Running": True, "Status": "running", "StartedAt": started}))
        rank0 = api.Rank0(fake_docker(tmp_path, cluster.ranks[0].log, state), "eng", None, RULES, 15)
        client = api.Client(cluster.url, None, 5)
        deadline = time.monotonic() + 30
        loading = api.wait(client, "m-1", wait_s=0.5, interval_s=0.2, rank0=rank0)
        while "[tensorfold]" not in loading["sparkfleet_progress"] and time.monotonic() < deadline:
            loading = api.wait(client, "m-1", wait_s=0.5, interval_s=0.2, rank0=rank0)  # until rank 0 logs
        assert not loading["ready"] and not loading["fatal"] and loading["state"] == "loading"
        assert loading["sparkfleet_progress"].startswith(
            "loading, 3 min of the ~15 the first start takes: [tensorfold] "
        )
        ready = api.wait(client, "m-1", wait_s=60, interval_s=0.3, rank0=rank0)
        assert ready["ready"] and "[tensorfold] serving m-1 at http://127.0.0.1:" in ready["detail"]


def test_a_stopped_rank_0_ends_the_wait_with_the_engines_own_message(tmp_path, snap):
    with LocalCluster(2, [snap] * 2, tmp_path / "run", version="0.6.6", model="m-1") as cluster:
        rank = cluster.start_rank(0, extra=["--bogus"])
        assert rank.proc.wait(timeout=30) == 2
        state = tmp_path / "state.json"
        state.write_text(json.dumps({"Running": False, "Status": "exited", "ExitCode": 2}))
        rank0 = api.Rank0(fake_docker(tmp_path, rank.log, state), "eng", None, RULES, 15)
        out = api.wait(api.Client(cluster.url, None, 2), "m-1", wait_s=5, interval_s=0.2, rank0=rank0)
    assert out["fatal"] and out["detail"].startswith("rank 0's container eng is exited (exit 2): ")
    assert out["detail"].endswith(
        "tensorfold: error: unrecognized arguments: --bogus"
    )  # argparse's own words


def test_wait_on_nothing_listening_is_down_not_fatal():
    state = api.wait(api.Client("http://127.0.0.1:9", None, 1), "x", wait_s=0.5, interval_s=0.2)
    assert state["state"] == "down" and not state["fatal"] and not state["ready"]


@pytest.mark.parametrize(("wait_s", "interval_s"), [(0.5, 0.2), (0.3, 2.0)])
def test_a_wait_that_does_not_end_lasts_its_wait_s_also_below_one_interval(wait_s, interval_s):
    # engine_service's ready wait is timeout / poll calls of wait_s = poll each: a call that returned after
    # one probe when wait_s < interval_s (a poll of 1 s against the 2 s interval) ended the wait early
    start = time.monotonic()
    state = api.wait(api.Client("http://127.0.0.1:9", None, 1), "x", wait_s=wait_s, interval_s=interval_s)
    assert state["waited_s"] >= wait_s and time.monotonic() - start >= wait_s


def test_probe_wants_ok_true_and_the_model(fork066):
    cluster, _keys = fork066
    good = api.probe(api.Client(cluster.url, KEY, 5), "m-1")
    assert (
        good["ready"] and good["state"] == "ok" and good["health"] == {"status": "ok"}
    )  # keys on: no counters
    other = api.probe(api.Client(cluster.url, KEY, 5), "m-2")
    assert not other["ready"] and "not 'm-2'" in other["detail"]
    nokey = api.probe(api.Client(cluster.url, None, 5), "m-1")
    assert nokey["state"] == "unauthorized" and "A valid API key is required" in nokey["detail"]


# ---- the ranks' own log lines --------------------------------------------------------------------

# The real lines (the sfxnz recipe @ f8ab7587 :
# evidence/s2-run-sh-ec28f35/bootB/rank0-full.log, bootB/gate/startup.txt).
REAL_RANK0 = """\
[tensorfold] loading deepseek-ai/DeepSeek-V4.1-Flash: DeepSeek-V4.1-Flash (deepseek_v41) on CUDA, rank 0 of 2
NCCL WARN Spectrum-X (SPCX) NCCL plugin is not supported on device:rocep1s0f1, skipping ..
[tensorfold] CUDA rank 0 startup estimate 78.46 GiB within 99.59 GiB; native 1048576, allocated prompt/reply window 65538, cache slots 65544
[tensorfold] rank 0 of 2: 40 layers and DSpark, 73.22 GiB of weights in 29.4 s
[tensorfold] serving deepseek-ai/DeepSeek-V4.1-Flash at http://0.0.0.0:8000/v1 on CUDA, rank 0 of 2 (sampling: ; drafts: on; prompts: bf16 activations; context: 65538; loaded in 45.7s)
[tensorfold] done req-0123456789ab prompt=16 cached=0 thinking=False tokens=2 sha=0123456789ab finish=stop tok/s=13.6
"""  # noqa: E501 - real log lines
REAL_RANK1 = "[tensorfold] rank 1 ready in 51.6s, following rank 0\n"


def test_the_real_lines_read_as_serving_following_loading():
    rules = logs_mod.Patterns(RULES)
    lines = REAL_RANK0.splitlines()
    head = logs_mod.summarize(lines, rules, rank=0, running=True)
    assert head["phase"] == "serving" and head["ready"].startswith("[tensorfold] serving deepseek-ai/")
    assert head["last"].startswith("[tensorfold] done req-")
    loading = logs_mod.summarize(lines[:3], rules, rank=0, running=True)
    assert loading["phase"] == "loading" and "startup estimate" in loading["last"]
    worker = logs_mod.summarize(REAL_RANK1.splitlines(), rules, rank=1, running=True)
    assert worker["phase"] == "following"
    stopped = logs_mod.summarize(lines, rules, rank=0, running=False)
    assert stopped["phase"] == "stopped" and not stopped["fatal"]


def test_a_traceback_reads_as_its_exception_line():
    lines = [
        "[tensorfold] loading m: DeepSeek-V4.1-Flash (deepseek_v41) on CUDA, rank 1 of 2",
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3/dist-packages/tensorfold/serve.py", line 9, in agree',
        "    raise RuntimeError(",
        "RuntimeError: the ranks were started with different settings (context rank 0 65538, rank 1 1048576)",
    ]
    out = logs_mod.summarize(lines, logs_mod.Patterns(RULES), rank=1, running=False)
    assert out["phase"] == "failed" and out["fatal"].startswith("RuntimeError: the ranks were started")
    refusal = [
        "tensorfold: --mtp-drafts 9: DeepSeek-V4.1-Flash takes 0 (serial decoding) to 5 drafts a round"
    ]
    assert logs_mod.summarize(refusal, logs_mod.Patterns(RULES), rank=0, running=False)["fatal"] == refusal[0]


def test_seconds_since_docker_stamps():
    assert logs_mod.seconds_since("2026-10-17T00:00:10.123456789Z", now=1792195270.0) == pytest.approx(
        59.9, abs=0.2
    )
    assert logs_mod.seconds_since("0001-01-01T00:00:00Z") is None and logs_mod.seconds_since("") is None


# ---- API key ----------------------------------------------------------------------------------


def test_api_key_is_generated_once_labelled_private_and_never_returned(tmp_path):
    key_path = tmp_path / "api" / "keys"
    creds = tmp_path / "home" / "ds1017" / "api" / "credentials.env"
    args = {"path": str(key_path), "owner": pwd_name(), "group": grp_name(), "credentials_file": str(creds),
            "credentials_owner": pwd_name(), "credentials_group": grp_name()}  # fmt: skip
    check = run_module("engine_api_key", args, check_mode=True)
    assert check["changed"] and not key_path.exists()
    first = run_module("engine_api_key", args, real=True)  # the module file run as a process of its own
    assert first["changed"] and first["generated"]
    line = next(ln for ln in key_path.read_text().splitlines() if not ln.startswith("#"))
    label, _, key = line.partition(": ")
    assert label == "sparkfleet" and len(key) > 40 and key not in json.dumps(first)
    assert key_path.stat().st_mode & 0o777 == 0o600 and key_path.parent.stat().st_mode & 0o777 == 0o700
    assert creds.read_text().splitlines()[-1] == f"SPARK_API_KEY={key}"
    assert creds.stat().st_mode & 0o777 == 0o600 and creds.parent.stat().st_mode & 0o777 == 0o700
    again = run_module("engine_api_key", args)
    assert not again["changed"] and not again["generated"] and again["fingerprint"] == first["fingerprint"]
    assert key in key_path.read_text()  # kept, never replaced
    key_path.chmod(0o644)
    fixed = run_module("engine_api_key", args)
    assert fixed["changed"] and not fixed["generated"] and key_path.stat().st_mode & 0o777 == 0o600
    bad = run_module("engine_api_key", {**args, "path": str(tmp_path / "other"), "label": "no spaces"})
    assert bad["failed"] and "label" in bad["msg"]


def test_the_generated_key_file_is_one_the_engine_reads(tmp_path, snap):
    keys = tmp_path / "api" / "keys"
    run_module("engine_api_key", {"path": str(keys), "owner": pwd_name(), "group": grp_name()})
    key = keys.read_text().splitlines()[-1].split(": ", 1)[1]
    with LocalCluster(
        2, [snap] * 2, tmp_path / "run", version="0.6.6", key_file=keys, model="m-1"
    ) as cluster:
        cluster.start()
        assert api.probe(api.Client(cluster.url, key, 5), "m-1")["ready"]
        log = cluster.ranks[0].output()
    assert key not in log


def pwd_name() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def grp_name() -> str:
    import grp

    return grp.getgrgid(os.getgid()).gr_name


# ---- caches -----------------------------------------------------------------------------------


def test_cache_dirs_are_made_kept_and_checked_for_space(tmp_path):
    caches = [{"name": "prompt-disk", "path": str(tmp_path / "prompt"), "size_gib": 0.001}]
    out = run_module("engine_cache", {"caches": caches, "owner": pwd_name()}, real=True)  # its own process
    assert out["changed"] and (tmp_path / "prompt").is_dir()
    (tmp_path / "prompt" / "entry").write_text("cached")
    again = run_module("engine_cache", {"caches": caches, "owner": pwd_name()})
    assert not again["changed"] and (tmp_path / "prompt" / "entry").exists()
    huge = [{"name": "spill", "path": str(tmp_path / "spill"), "size_gib": 1 << 20}]
    too_big = run_module("engine_cache", {"caches": huge, "owner": pwd_name()}, check_mode=True)
    assert too_big["failed"] and "GiB short" in too_big["msg"] and not (tmp_path / "spill").exists()


def test_engine_nodes_cache_read_is_engine_caches_own_check(tmp_path):
    """engine_service skips its cache task when the start's read (engine_node's `caches`) finds every
    directory there and every size possible: in each state that read and the module's check mode agree."""
    ok = [{"name": "prompt-disk", "path": str(tmp_path / "prompt"), "size_gib": 0.001}]
    huge = [{"name": "spill", "path": str(tmp_path / "spill"), "size_gib": 1 << 20}]
    for caches in (ok, huge):
        for made in (False, True):
            if made:
                (tmp_path / Path(caches[0]["path"]).name).mkdir(exist_ok=True)
            read = run_module("engine_node", {"name": "x", "docker": "no-docker-here", "caches": caches})[
                "caches"
            ]
            dry = run_module("engine_cache", {"caches": caches, "owner": pwd_name()}, check_mode=True)
            assert [e["created"] for e in read["report"]] == [not made]
            assert bool(dry["changed"]) == (not made) and bool(dry.get("failed")) == bool(read["problems"])
            assert read["problems"] == ([dry["msg"]] if dry.get("failed") else [])
    bad = run_module(
        "engine_node", {"name": "x", "docker": "no-docker-here", "caches": [{"name": "c", "path": "rel"}]}
    )
    assert "size_gib must be a number" in bad["caches"]["error"]


def test_shortfall_counts_what_the_cache_already_holds():
    gib = cache_mod.GIB
    assert cache_mod.shortfall(10, used=8 * gib, free=2 * gib) == 0
    assert cache_mod.shortfall(10, used=0, free=2 * gib) == 8 * gib


# ---- node state helpers -----------------------------------------------------------------------


def test_node_parsers():
    unit = node_mod.parse_unit("LoadState=loaded\nActiveState=failed\nSubState=failed\nExecMainStatus=3\n")
    assert unit["exists"] and unit["active"] == "failed" and unit["exit_status"] == 3
    assert not node_mod.parse_unit("LoadState=not-found\n")["exists"]
    doc = {"State": {"Running": False, "Status": "exited", "ExitCode": 137, "OOMKilled": True},
           "Config": {"Labels": {"io.sparkfleet.engine.managed": "true"}}, "Image": "sha256:1"}  # fmt: skip
    c = node_mod.parse_container(doc, "io.sparkfleet.engine.managed")
    assert c["managed"] and c["exit_code"] == 137 and c["oom_killed"] and c["running_s"] is None
    assert not node_mod.parse_container({**doc, "Config": {"Labels": {}}}, "io.sparkfleet.engine.managed")[
        "managed"
    ]
    running = {**doc, "State": {"Running": True, "Status": "running", "StartedAt": "2026-10-17T00:00:00Z"}}
    assert node_mod.parse_container(running, "io.sparkfleet.engine.managed")["running_s"] > 0
    limits = "Max locked memory         8388608              8388608              bytes\n"
    assert node_mod.memlock_limit(limits) == 8388608
    assert node_mod.memlock_limit(limits.replace("8388608 ", "unlimited ")) == -1
    assert node_mod.bounding_caps("CapBnd:\t00000000a80425fb\n") == []  # Docker's default set
    assert "IPC_LOCK" in node_mod.bounding_caps(f"CapBnd:\t{1 << 14:016x}\n")


def test_weights_paths_prefer_overrides_then_the_record():
    record = {"snapshot": "/m/snapshot", "rank": {"path": "/m/rank/rank1.safetensors"}, "chat_template": None}
    assert node_mod.weights_paths(record, {}) == {
        "dir": "/m/snapshot",
        "rank_file": "/m/rank/rank1.safetensors",
        "chat_template": "",
    }
    assert node_mod.weights_paths(record, {"dir": "/other"})["dir"] == "/other"
    assert node_mod.weights_paths(None, {}) == {"dir": "", "rank_file": "", "chat_template": ""}

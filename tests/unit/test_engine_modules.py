"""engine_service's modules: verify/readiness against the stand-in on loopback, and a broken server;
the API key, caches, unit files and node-state helpers, run the way Ansible runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from ansible_collections.sparkfleet.cluster.plugins.modules import engine_api as api
from ansible_collections.sparkfleet.cluster.plugins.modules import engine_cache as cache_mod
from ansible_collections.sparkfleet.cluster.plugins.modules import engine_node as node_mod
from sparkfleet_lab.engine.local import LocalCluster, make_snapshot

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "plugins/modules"


KEY = "sk-modules-0123456789abcdef"


def run_module(name: str, args: dict, check_mode: bool = False) -> dict:
    """Run a module file as Ansible does: JSON args on stdin, JSON result on stdout."""
    payload = {"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check_mode}}
    proc = subprocess.run(
        [sys.executable, str(LIB / f"{name}.py")],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    """The engine double as the TP3 recipe's engine (its card: forced tool calls, enforced JSON schemas),
    with a key file: every verify check has something to pass. (The 0.6.x family refuses those two with
    a 400: tests/unit/test_engine_double_api.py.)"""
    root = tmp_path_factory.mktemp("tp2")
    keys = root / "keys"
    keys.write_text(f"{KEY}\n")
    keys.chmod(0o600)  # the real engine refuses a key file others can read
    snap = make_snapshot(root / "snap")
    cluster = LocalCluster(3, [snap] * 3, root / "run", version="tp3-recipe", key_file=keys, model="m-1")
    cluster.start()
    yield cluster, keys
    cluster.stop()


# ---- verify / probe / wait against the stand-in ---------------------------------------------


def test_verify_passes_every_check_against_the_standin(tp2):
    cluster, keys = tp2
    out = run_module("engine_api", {"action": "verify", "url": cluster.url, "model": "m-1",
                                               "api_key_file": str(keys)})  # fmt: skip
    assert out["failed_checks"] == [], out["table"]
    assert [c["name"] for c in out["checks"]] == ["models", "chat", "stream", "tool", "json_schema"]
    assert all(c["latency_ms"] > 0 for c in out["checks"])
    assert out["table"][-1] == "5/5 checks passed"
    assert KEY not in json.dumps(out)


def test_verify_fails_without_the_key_and_with_another_model(tp2):
    cluster, keys = tp2
    nokey = run_module("engine_api", {"action": "verify", "url": cluster.url, "model": "m-1"})
    assert set(nokey["failed_checks"]) == {"models", "chat", "stream", "tool", "json_schema"}
    assert "401" in nokey["checks"][1]["detail"]
    other = run_module("engine_api", {"action": "verify", "url": cluster.url, "model": "m-2",
                                                 "api_key_file": str(keys)})  # fmt: skip
    # the real server does not refuse another model id (it answers as --name): only /v1/models shows it
    assert other["failed_checks"] == ["models"]


def test_probe_says_ready_and_wait_returns_at_once(tp2):
    cluster, _keys = tp2
    client = api.Client(cluster.url, KEY, 5)
    state = api.probe(client, "m-1")
    assert state["ready"] and state["state"] == "ok" and state["models"] == ["m-1"]
    waited = api.wait(client, "m-1", wait_s=10, interval_s=0.2)
    assert waited["ready"] and waited["waited_s"] < 2 and "ready" in waited["sparkfleet_progress"]


def test_wait_sees_a_closed_port_while_the_ranks_load_then_ready(tmp_path):
    # the real server opens its port only once loaded: "down" (not answering) is not fatal
    snap = make_snapshot(tmp_path / "snap")
    with LocalCluster(2, [snap] * 2, tmp_path / "run", load_s=4) as cluster:
        cluster.start(ready_timeout=0)
        client = api.Client(cluster.url, None, 5)
        state = api.wait(client, "standin-model", wait_s=1.5, interval_s=0.3)
        assert not state["ready"] and not state["fatal"] and state["state"] == "down"
        assert api.wait(client, "standin-model", wait_s=60, interval_s=0.3)["ready"]


def test_wait_on_nothing_listening_is_down_not_fatal():
    state = api.wait(api.Client("http://127.0.0.1:9", None, 1), "x", wait_s=0.5, interval_s=0.2)
    assert state["state"] == "down" and not state["fatal"] and not state["ready"]


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
            self._send({"status": "ok"})
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
        checks = api.verify(
            api.Client(f"http://127.0.0.1:{server.server_port}", None, 5), "m", list(api.CHECKS)
        )
    finally:
        server.shutdown()
    by = {c["name"]: c for c in checks}
    assert by["models"]["ok"]
    assert not by["chat"]["ok"] and "thinking was not off" in by["chat"]["detail"]
    assert not by["stream"]["ok"] and "one piece" in by["stream"]["detail"]
    assert not by["tool"]["ok"] and "$.city" in by["tool"]["detail"] and "unit" in by["tool"]["detail"]
    assert not by["json_schema"]["ok"] and "is not integer" in by["json_schema"]["detail"]
    assert api.table(checks)[-1] == "1/5 checks passed"


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


# ---- API key ----------------------------------------------------------------------------------


def test_api_key_is_generated_once_private_and_never_returned(tmp_path):
    key_file = tmp_path / "api" / "keys"
    creds = tmp_path / "home" / "ds1017" / "api" / "credentials.env"
    args = {"path": str(key_file), "owner": pwd_name(), "group": grp_name(), "credentials_file": str(creds),
            "credentials_owner": pwd_name(), "credentials_group": grp_name()}  # fmt: skip
    check = run_module("engine_api_key", args, check_mode=True)
    assert check["changed"] and not key_file.exists()
    first = run_module("engine_api_key", args)
    assert first["changed"] and first["generated"]
    key = next(ln for ln in key_file.read_text().splitlines() if not ln.startswith("#"))
    assert len(key) > 40 and key not in json.dumps(first)
    assert key_file.stat().st_mode & 0o777 == 0o600 and key_file.parent.stat().st_mode & 0o777 == 0o700
    assert creds.read_text().splitlines()[-1] == f"SPARK_API_KEY={key}"
    assert creds.stat().st_mode & 0o777 == 0o600 and creds.parent.stat().st_mode & 0o777 == 0o700
    again = run_module("engine_api_key", args)
    assert not again["changed"] and not again["generated"] and again["fingerprint"] == first["fingerprint"]
    assert key in key_file.read_text()  # kept, never replaced
    key_file.chmod(0o644)
    fixed = run_module("engine_api_key", args)
    assert fixed["changed"] and not fixed["generated"] and key_file.stat().st_mode & 0o777 == 0o600


def pwd_name() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def grp_name() -> str:
    import grp

    return grp.getgrgid(os.getgid()).gr_name


# ---- caches -----------------------------------------------------------------------------------


def test_cache_dirs_are_made_kept_and_checked_for_space(tmp_path):
    caches = [{"name": "prefix-cache", "path": str(tmp_path / "prefix"), "size_gib": 0.001}]
    out = run_module("engine_cache", {"caches": caches, "owner": pwd_name()})
    assert out["changed"] and (tmp_path / "prefix").is_dir()
    (tmp_path / "prefix" / "entry").write_text("cached")
    again = run_module("engine_cache", {"caches": caches, "owner": pwd_name()})
    assert not again["changed"] and (tmp_path / "prefix" / "entry").exists()
    huge = [{"name": "spill", "path": str(tmp_path / "spill"), "size_gib": 1 << 20}]
    too_big = run_module("engine_cache", {"caches": huge, "owner": pwd_name()}, check_mode=True)
    assert too_big["failed"] and "GiB short" in too_big["msg"] and not (tmp_path / "spill").exists()


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
    assert c["managed"] and c["exit_code"] == 137 and c["oom_killed"]
    assert not node_mod.parse_container({**doc, "Config": {"Labels": {}}}, "io.sparkfleet.engine.managed")[
        "managed"
    ]
    limits = "Max locked memory         8388608              8388608              bytes\n"
    assert node_mod.memlock_limit(limits) == 8388608
    assert node_mod.memlock_limit(limits.replace("8388608 ", "unlimited ")) == -1
    assert node_mod.bounding_caps("CapBnd:\t00000000a80425fb\n") == []  # Docker's default set
    assert "IPC_LOCK" in node_mod.bounding_caps(f"CapBnd:\t{1 << 14:016x}\n")
    assert "IPC_LOCK" not in node_mod.bounding_caps("CapBnd:\t00000000a80425fb\n")


def test_weights_paths_prefer_overrides_then_the_record():
    record = {"snapshot": "/m/snapshot", "rank": {"path": "/m/rank/rank1.safetensors"}, "chat_template": None}
    assert node_mod.weights_paths(record, {}) == {
        "dir": "/m/snapshot",
        "rank_file": "/m/rank/rank1.safetensors",
        "chat_template": "",
    }
    assert node_mod.weights_paths(record, {"dir": "/other"})["dir"] == "/other"
    assert node_mod.weights_paths(None, {}) == {"dir": "", "rank_file": "", "chat_template": ""}

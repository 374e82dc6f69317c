"""The stand-in engine: ranks as real processes on loopback, the API, faults, the repo it ships in."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from fractions import Fraction
from pathlib import Path

import jsonschema
import pytest
from sparkfleet_lab import engine as engine_repo
from sparkfleet_lab.engine.local import LocalCluster, make_snapshot
from sparkfleet_lab.engine.tensorfold import model, weights

KEY = "sk-unit-0123456789abcdef"
PY313 = Path("/root/.pyenv/versions/3.13.0/bin/python3.13")


def call(url: str, path: str, body: dict | bytes | None = None, key: str | None = KEY, timeout: float = 10):
    """(status, parsed JSON or raw text) of one request."""
    data = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(  # noqa: S310 - http to loopback only
        url + path, data=data, headers=headers, method="POST" if data is not None else "GET"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback
            raw = resp.read().decode()
            status = resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read().decode(), exc.code
    try:
        return status, json.loads(raw)
    except json.JSONDecodeError:
        return status, raw


def chat(content: str, **extra) -> dict:
    return {"model": "standin-model", "messages": [{"role": "user", "content": content}], **extra}


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 2},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}, "explanation": {"type": "string", "maxLength": 40}},
    "required": ["answer", "explanation"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tp3(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp3")
    snap = make_snapshot(root / "snap")
    keys = root / "keys"
    keys.write_text(f"# sparkfleet\n{KEY}\n")
    keys.chmod(0o600)
    cluster = LocalCluster(3, [snap] * 3, root / "run", key_file=keys)
    cluster.start()
    yield cluster
    cluster.stop()


# ---- the toy model ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expr", "value"),
    [
        ("What is 17\u00d719?", "17\u00d719", 323),
        ("Compute 17 * 19 and reply with only the number.", "17 * 19", 323),
        ("what's (3+4)*2 \u2212 1 please", "(3+4)*2 \u2212 1", 13),
        ("2^10", "2^10", 1024),
        ("7 / 2", "7 / 2", Fraction(7, 2)),
    ],
)
def test_arithmetic_is_exact(text, expr, value):
    assert model.find_arithmetic(text) == (expr, Fraction(value))


def test_no_arithmetic_in_plain_text():
    assert model.find_arithmetic("Why is the sky blue?") is None
    assert model.find_arithmetic("divide by zero: 1/0") is None


@pytest.mark.parametrize(
    "schema",
    [
        ANSWER_SCHEMA,
        WEATHER["function"]["parameters"],
        {"type": "array", "items": {"type": "number", "exclusiveMinimum": 5}, "minItems": 2},
        {"anyOf": [{"type": "null"}, {"type": "string"}]},
        {"$defs": {"p": {"type": "object", "properties": {"x": {"const": 3}}}}, "$ref": "#/$defs/p"},
        {"allOf": [{"properties": {"a": {"type": "boolean"}}}, {"properties": {"b": {"type": "string"}}}]},
        {
            "type": "object",
            "properties": {"id": {"type": "string", "format": "uuid"}, "n": {"type": ["integer", "null"]}},
        },
        {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
    ],
)
def test_schema_instances_validate(schema):
    value = model.schema_instance(schema, model.Hints(words=["Paris", "Lyon"], number=Fraction(323)))
    jsonschema.validate(value, schema)


def test_schema_instance_uses_the_arithmetic_answer():
    value = model.schema_instance(ANSWER_SCHEMA, model.Hints(number=Fraction(323)))
    assert value["answer"] == 323


def test_unsatisfiable_number_bounds_raise():
    with pytest.raises(model.SchemaError):
        model.schema_instance({"type": "integer", "minimum": 5, "maximum": 4})


def test_thinking_only_when_on():
    msgs = [{"role": "user", "content": "17\u00d719"}]
    assert model.generate(msgs, thinking=False, effort=75).reasoning is None
    assert "323" in model.generate(msgs, thinking=True, effort=75).reasoning


# ---- weights ---------------------------------------------------------------------------------


def test_digest_is_stable_and_sees_one_byte(tmp_path):
    a = make_snapshot(tmp_path / "a")
    b = make_snapshot(tmp_path / "b")
    assert weights.load(a).digest == weights.load(b).digest
    (b / ".cache").mkdir()
    (b / ".cache" / "meta").write_text("per-node metadata is not part of the weights")
    assert weights.load(b).digest == weights.load(a).digest
    shard = b / "model-00002-of-00002.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 1
    shard.write_bytes(bytes(raw))
    assert weights.load(b).digest != weights.load(a).digest


def test_truncated_shard_and_missing_shard_are_refused(tmp_path):
    snap = make_snapshot(tmp_path / "s")
    shard = snap / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(weights.WeightsError, match="past the file"):
        weights.load(snap)
    shard.unlink()
    with pytest.raises(weights.WeightsError, match="missing"):
        weights.load(snap)


# ---- the API on a TP3 cluster ------------------------------------------------------------------


def test_health_lists_every_rank_over_its_fabric_address(tp3):
    status, doc = call(tp3.url, "/health", key=None)
    assert status == 200, doc
    assert doc["status"] == "ok" and doc["tp"] == 3
    assert [(r["rank"], r["state"]) for r in doc["ranks"]] == [(0, "ok"), (1, "ok"), (2, "ok")]
    assert [r.get("address") for r in doc["ranks"][1:]] == ["127.0.11.2", "127.0.12.3"]
    assert doc["weights_digest"].startswith("sha256:")


def test_models_lists_the_served_name(tp3):
    status, doc = call(tp3.url, "/v1/models")
    assert status == 200
    assert [m["id"] for m in doc["data"]] == ["standin-model"]


def test_chat_answers_17_times_19_without_thinking(tp3):
    status, doc = call(
        tp3.url, "/v1/chat/completions", chat("What is 17\u00d719? Reply with only the number.")
    )
    assert status == 200, doc
    msg = doc["choices"][0]["message"]
    assert msg["content"].strip() == "323"
    assert "reasoning_content" not in msg
    assert doc["usage"]["completion_tokens"] >= 1


def test_thinking_on_by_effort(tp3):
    status, doc = call(tp3.url, "/v1/chat/completions", chat("17*19", reasoning_effort="high"))
    assert status == 200
    assert "323" in doc["choices"][0]["message"]["reasoning_content"]
    _, off = call(
        tp3.url, "/v1/chat/completions", chat("17*19", chat_template_kwargs={"enable_thinking": False})
    )
    assert "reasoning_content" not in off["choices"][0]["message"]


def _sse(url: str, body: dict) -> list:
    req = urllib.request.Request(  # noqa: S310 - http to loopback only
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    events = []
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback
        assert resp.headers["Content-Type"] == "text/event-stream"
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data: "):
                payload = line[6:]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_streaming_sends_pieces_then_done(tp3):
    events = _sse(
        tp3.url, chat("Please compute 17 x 19.", stream=True, stream_options={"include_usage": True})
    )
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if e["choices"]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert "323" in text
    assert len(chunks) > 3  # really streamed in pieces
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert events[-2]["usage"]["total_tokens"] > 0


def test_forced_tool_call_matches_the_schema(tp3):
    body = chat("What is the weather in Paris?", tools=[WEATHER], tool_choice="required")
    status, doc = call(tp3.url, "/v1/chat/completions", body)
    assert status == 200, doc
    choice = doc["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (tool_call,) = choice["message"]["tool_calls"]
    assert tool_call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(tool_call["function"]["arguments"]), WEATHER["function"]["parameters"])


def test_structured_output_matches_the_schema(tp3):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True}}
    status, doc = call(tp3.url, "/v1/chat/completions", chat("What is 17*19?", response_format=fmt))
    assert status == 200, doc
    value = json.loads(doc["choices"][0]["message"]["content"])
    jsonschema.validate(value, ANSWER_SCHEMA)
    assert value["answer"] == 323


@pytest.mark.parametrize("key", [None, "sk-wrong"])
def test_api_needs_the_key(tp3, key):
    assert call(tp3.url, "/v1/models", key=key)[0] == 401
    assert call(tp3.url, "/v1/chat/completions", chat("17*19"), key=key)[0] == 401


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{not json", 400),
        (b"[]", 400),
        ({"model": "standin-model"}, 400),
        ({"model": "standin-model", "messages": [{"role": "wizard", "content": "x"}]}, 400),
        ({"model": "another-model", "messages": [{"role": "user", "content": "x"}]}, 404),
        (chat("x", tool_choice="required"), 400),
        (chat("x", temperature="hot"), 400),
        (chat("x", max_tokens=0), 400),
        (chat("x", reasoning_effort="extreme"), 400),
        (chat("x", response_format={"type": "yaml"}), 400),
        (chat("x", tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), 400),
    ],
)
def test_malformed_requests_get_an_error_and_the_server_keeps_serving(tp3, body, status):
    got, doc = call(tp3.url, "/v1/chat/completions", body)
    assert got == status, doc
    assert doc["error"]["message"]
    ok, doc = call(tp3.url, "/v1/chat/completions", chat("17*19"))
    assert ok == 200 and "323" in doc["choices"][0]["message"]["content"]


def test_the_key_is_never_logged(tp3):
    call(tp3.url, "/v1/chat/completions", chat("hello"))
    for rank in tp3.ranks.values():
        assert KEY not in rank.output()


# ---- rendezvous and faults ---------------------------------------------------------------------


def test_rank0_serves_only_after_every_rank_joined(tmp_path):
    snap = make_snapshot(tmp_path / "snap")
    with LocalCluster(3, [snap] * 3, tmp_path / "run") as cluster:
        cluster.start_rank(1)
        cluster.start_rank(0)
        deadline = time.monotonic() + 10
        while "joined" not in cluster.ranks[1].output() and time.monotonic() < deadline:
            time.sleep(0.1)
        status, doc = cluster.health()
        assert status == 503 and doc["status"] == "starting"
        assert "[2]" in doc["detail"]
        assert call(cluster.url, "/v1/chat/completions", chat("17*19"), key=None)[0] == 503
        cluster.start_rank(2)
        assert cluster.wait_ready(20)["status"] == "ok"


def test_a_dead_worker_fails_requests_cleanly_and_health_names_it(tmp_path):
    snap = make_snapshot(tmp_path / "snap")
    with LocalCluster(2, [snap] * 2, tmp_path / "run") as cluster:
        cluster.start()
        assert call(cluster.url, "/v1/chat/completions", chat("17*19"), key=None)[0] == 200
        cluster.kill(1)
        deadline = time.monotonic() + 10
        while cluster.health()[0] == 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        status, doc = cluster.health()
        assert status == 503 and doc["status"] == "degraded"
        assert "rank 1" in doc["detail"] and doc["ranks"][1]["state"] == "lost"
        status, err = call(cluster.url, "/v1/chat/completions", chat("17*19"), key=None)
        assert status == 503 and "rank 1" in err["error"]["message"]
        assert cluster.ranks[0].proc.poll() is None  # rank 0 keeps serving errors
        # A formed cluster takes no new member: the restarted rank is refused and says why.
        rejoin = cluster.start_rank(1)
        assert rejoin.proc.wait(timeout=20) == 3
        assert "formed cluster" in rejoin.output()


def test_worker_exits_when_rank0_dies(tmp_path):
    snap = make_snapshot(tmp_path / "snap")
    with LocalCluster(2, [snap] * 2, tmp_path / "run") as cluster:
        cluster.start()
        cluster.kill(0)
        assert cluster.ranks[1].proc.wait(timeout=20) == 3
        assert "lost rank 0" in cluster.ranks[1].output()


def test_stop_rank0_first_shuts_the_workers_down(tmp_path):
    snap = make_snapshot(tmp_path / "snap")
    cluster = LocalCluster(3, [snap] * 3, tmp_path / "run").start()
    codes = cluster.stop()
    assert codes == {0: 0, 1: 0, 2: 0}
    assert "shut the cluster down" in cluster.ranks[2].output()


def test_different_weights_are_refused_at_the_rendezvous(tmp_path):
    good = make_snapshot(tmp_path / "good")
    other = make_snapshot(tmp_path / "other", salt="x")
    with LocalCluster(2, [good, other], tmp_path / "run") as cluster:
        cluster.start(ready_timeout=0)
        assert cluster.ranks[1].proc.wait(timeout=20) == 3
        assert "weights manifest digest" in cluster.ranks[1].output()
        status, doc = cluster.health()
        assert status == 503 and "weights manifest digest" in doc["detail"]


def test_data_plane_must_come_from_the_fabric_address(tmp_path):
    snap = make_snapshot(tmp_path / "snap")
    with LocalCluster(2, [snap] * 2, tmp_path / "run") as cluster:
        wrong = cluster.fabric(1)
        wrong["peers"]["0"]["local"] = "127.0.99.9"  # not the address rank 0 expects for rank 1
        cluster.start_rank(1, fabric=wrong)
        cluster.start_rank(0)
        assert cluster.ranks[1].proc.wait(timeout=20) == 3
        assert "not its fabric address" in cluster.ranks[0].output()


def test_bad_configuration_exits_2_with_the_reason(tmp_path):
    snap = make_snapshot(tmp_path / "snap")
    cluster = LocalCluster(2, [snap] * 2, tmp_path / "run")
    rank = cluster.start_rank(1, fabric={"port": 1, "peers": {"5": {"local": "a", "peer": "b"}}})
    assert rank.proc.wait(timeout=20) == 2
    assert "SPARKFLEET_FABRIC names peers [5]" in rank.output()
    empty = tmp_path / "empty"
    empty.mkdir()
    cluster.snapshots = [empty, empty]
    rank = cluster.start_rank(1)
    assert rank.proc.wait(timeout=20) == 2
    assert "no .safetensors" in rank.output()


def test_prefix_cache_survives_a_restart(tmp_path):
    snap = make_snapshot(tmp_path / "snap")
    cache = tmp_path / "prefix-cache"
    cache.mkdir()
    extra = ["--prefix-cache-dir", str(cache), "--prefix-cache-gib", "1"]
    body = chat("A long document about the fabric, asked twice.")
    with LocalCluster(2, [snap] * 2, tmp_path / "run1", extra=extra).start() as cluster:
        first = call(cluster.url, "/v1/chat/completions", body, key=None)[1]
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    with LocalCluster(2, [snap] * 2, tmp_path / "run2", extra=extra).start() as cluster:
        again = call(cluster.url, "/v1/chat/completions", body, key=None)[1]
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == again["usage"]["prompt_tokens"]
        caches = cluster.health()[1]["caches"]
        assert caches[0]["kind"] == "prefix-cache" and caches[0]["starts"] >= 3  # two ranks x two starts


@pytest.mark.skipif(not PY313.exists(), reason="no Python 3.13 here (the lab image's Python)")
def test_runs_on_python_313(tmp_path):
    snap = make_snapshot(tmp_path / "snap")
    with LocalCluster(2, [snap] * 2, tmp_path / "run", python=str(PY313)).start() as cluster:
        assert (
            "323"
            in call(cluster.url, "/v1/chat/completions", chat("17*19"), key=None)[1]["choices"][0]["message"][
                "content"
            ]
        )


# ---- the repository the lab serves -------------------------------------------------------------


def test_make_repo_is_deterministic_and_add_commit_moves_the_pin(tmp_path):
    a = engine_repo.make_repo(tmp_path / "a")
    b = engine_repo.make_repo(tmp_path / "b")
    assert a == b and len(a["commit"]) == 40
    assert engine_repo.make_repo(tmp_path / "a") == a  # idempotent
    bare = tmp_path / "a" / a["repo"]
    assert (bare / "git-daemon-export-ok").exists()
    files = subprocess.run(
        ["git", "ls-tree", "-r", "--format=%(objectmode) %(path)", a["commit"]],
        cwd=bare,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert "100755 bin/tensorfold" in files and "100644 Dockerfile" in files
    assert not any("__pycache__" in f or "local.py" in f for f in files)
    second = engine_repo.add_commit(tmp_path / "a")
    assert second != a["commit"]
    init = subprocess.run(
        ["git", "show", f"{second}:tensorfold/__init__.py"],
        cwd=bare,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert '__version__ = "0.1.0+1"' in init
    assert engine_repo.add_commit(tmp_path / "b") == second  # deterministic too


def test_dockerfile_takes_the_base_image_as_a_build_arg():
    text = (Path(engine_repo.__file__).parent / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}" in text

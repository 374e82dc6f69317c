"""The engine double's HTTP surface: API keys (0.6.6+, none on 0.6.4), the family's request rules per
version, streaming, the done and access lines, the prompt cache and its disk tier."""

from __future__ import annotations

import json
import os

import pytest
from test_engine_double_support import LINES, LocalCluster, call, chat, make_snapshot, sse, until, wait_line

KEY = "sk-file-0123456789abcdef"
ENV_KEYS = ("sk-env-1", "sk-env-2")
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city", "unit"],
        },
    },
}
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
UNAUTHORIZED = {
    "error": {
        "message": "A valid API key is required",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
}


@pytest.fixture(scope="module")
def snap(tmp_path_factory):
    return make_snapshot(tmp_path_factory.mktemp("snap") / "snap")


@pytest.fixture(scope="module")
def open066(snap, tmp_path_factory):
    """0.6.6 as the TP2 recipe runs it: --no-thinking, no key."""
    run = tmp_path_factory.mktemp("open066")
    cluster = LocalCluster(2, [snap] * 2, run, extra=["--no-thinking"], rank0=["--alias", "other-id"])
    yield cluster.start()
    cluster.stop()


@pytest.fixture(scope="module")
def keyed(snap, tmp_path_factory):
    run = tmp_path_factory.mktemp("keyed")
    keys = run / "keys"
    keys.write_text(f"# sparkfleet\nadmin: {KEY}\n")
    keys.chmod(0o600)
    env = {"TENSORFOLD_API_KEY": ",".join(ENV_KEYS)}
    cluster = LocalCluster(2, [snap] * 2, run / "run", key_file=keys, env=env)
    yield cluster.start()
    cluster.stop()


@pytest.fixture(scope="module")
def old064(snap, tmp_path_factory):
    run = tmp_path_factory.mktemp("old064")
    cluster = LocalCluster(2, [snap] * 2, run, version="0.6.4", env={"TENSORFOLD_API_KEY": "ignored"})
    yield cluster.start()
    cluster.stop()


@pytest.fixture(scope="module")
def tp3(snap, tmp_path_factory):
    run = tmp_path_factory.mktemp("tp3")
    cluster = LocalCluster(3, [snap] * 3, run, version="tp3-recipe")
    yield cluster.start()
    cluster.stop()


# ---- API keys ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/v1/models", "/models", "/v1/chat/completions", "/metrics", "/v1/anything"]
)
def test_gated_paths_answer_the_real_401(keyed, path):
    body = chat("17*19") if path.endswith("completions") else None
    status, doc, headers = call(keyed.url, path, body)
    assert status == 401 and doc == UNAUTHORIZED
    assert headers["WWW-Authenticate"] == "Bearer" and headers["Content-Type"] == "application/json"
    assert headers["Connection"] == "close"


def test_anthropic_routes_get_their_own_401_body(keyed):
    status, doc, _ = call(keyed.url, "/v1/messages", {"messages": []})
    assert status == 401
    assert doc == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "A valid API key is required"},
    }


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": f"Bearer {KEY}"},
        {"Authorization": f"bearer {KEY}"},
        {"x-api-key": KEY},
        {"Authorization": f"Bearer {ENV_KEYS[0]}"},
        {"x-api-key": ENV_KEYS[1]},
    ],
)
def test_both_header_forms_and_every_key_source(keyed, headers):
    assert call(keyed.url, "/v1/models", headers=headers)[0] == 200


@pytest.mark.parametrize(
    "headers",
    [{"Authorization": "Bearer sk-wrong"}, {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}],
)
def test_wrong_keys_are_refused(keyed, headers):
    assert call(keyed.url, "/v1/models", headers=headers)[0] == 401


def test_health_is_never_gated_and_says_only_ok_with_keys_on(keyed):
    status, doc, _ = call(keyed.url, "/health")
    assert (status, doc) == (200, {"status": "ok"})


def test_the_access_line_names_the_key_label_never_the_key(keyed):
    call(keyed.url, "/v1/models", key=KEY)
    call(keyed.url, "/v1/models", key=ENV_KEYS[0])
    call(keyed.url, "/v1/models")
    out = keyed.ranks[0].output()
    access = [m for ln in out.splitlines() if (m := LINES["access"].match(ln))]
    labels = [m.group(4) for m in access if m.group(2) == "/v1/models"]
    assert " key=admin" in labels and " key=env-1" in labels and " key=unauthenticated" in labels
    assert all(k not in out for k in (KEY, *ENV_KEYS))


def test_the_key_file_is_read_again_when_it_changes(snap, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("first-key\n")
    keys.chmod(0o600)
    with LocalCluster(2, [snap] * 2, tmp_path / "run", key_file=keys).start() as cluster:
        assert call(cluster.url, "/v1/models", key="first-key")[0] == 200
        keys.write_text("rotated: second-key\n")
        until(lambda: call(cluster.url, "/v1/models", key="second-key")[0] == 200, "the new key to work")
        assert call(cluster.url, "/v1/models", key="first-key")[0] == 401
        keys.chmod(0o644)  # a file that no longer passes closes every gated route
        until(lambda: call(cluster.url, "/v1/models", key="second-key")[0] == 401, "the routes to close")
        wait_line(cluster.ranks[0], r"API key file reload refused; authenticated routes remain closed")
        assert call(cluster.url, "/health")[0] == 200
        keys.chmod(0o600)
        until(lambda: call(cluster.url, "/v1/models", key="second-key")[0] == 200, "the routes to open again")


def test_metrics_open_lets_metrics_through(snap, tmp_path):
    with LocalCluster(
        2, [snap] * 2, tmp_path / "run", rank0=["--api-key", "k", "--metrics-open"]
    ).start() as c:
        status, text, _ = call(c.url, "/metrics")
        assert status == 200 and "tensorfold_requests_total 0" in text
        assert call(c.url, "/v1/models")[0] == 401
        assert call(c.url, "/v1/models", key="k")[0] == 200


def test_0_6_4_has_no_keys_and_the_full_health_body(old064):
    assert call(old064.url, "/v1/models")[0] == 200  # TENSORFOLD_API_KEY means nothing to 0.6.4
    assert call(old064.url, "/v1/models", key="anything")[0] == 200
    status, doc, _ = call(old064.url, "/health")
    assert status == 200 and doc["ok"] is True and doc["backend"] == "tensorfold"


# ---- the deepseek_v41 family's requests (0.6.x) -------------------------------------------------


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (
            {
                "model": "standin-model",
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            },
            "images",
        ),
        (
            chat(
                "x", response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
            ),
            "response_format",
        ),
        (chat("x", response_format={"type": "json_object"}), "response_format"),
        (chat("x", guided_json=SCHEMA), "guided_json"),
        (chat("x", structured_outputs={"json": SCHEMA}), "structured_outputs"),
        (chat("x", logprobs=True), "logprobs"),
        (chat("x", top_logprobs=2), "logprobs"),
        (chat("x", tools=[WEATHER], tool_choice="required"), "tool_choice"),
        (
            chat("x", tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}),
            "tool_choice",
        ),
        (chat("x", thinking_budget=100), "thinking_budget"),
        (chat("x", n=2), "n"),
        (chat("x", reasoning_effort="extreme"), "reasoning_effort"),
        (chat("x", chat_template_kwargs=[]), "chat_template_kwargs"),
        (chat("x", temperature="hot"), "temperature"),
        (b"{not json", "not JSON"),
        (b"[]", "JSON object"),
    ],
)
def test_the_family_refuses_with_400_and_keeps_serving(open066, body, says):
    status, doc, _ = call(open066.url, "/v1/chat/completions", body)
    assert (
        status == 400 and says in doc["error"]["message"] and doc["error"]["type"] == "invalid_request_error"
    )
    status, doc, _ = call(
        open066.url, "/v1/chat/completions", chat("What is 17*19? Reply with only the number.")
    )
    assert status == 200 and doc["choices"][0]["message"]["content"] == "323"


def test_tools_run_with_auto_and_arrive_whole(open066):
    status, doc, _ = call(
        open066.url, "/v1/chat/completions", chat("What is the weather in Paris?", tools=[WEATHER])
    )
    assert status == 200, doc
    choice = doc["choices"][0]
    assert (
        choice["finish_reason"] == "tool_calls"
        and choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    )
    status, doc, _ = call(
        open066.url, "/v1/chat/completions", chat("Hello there", tools=[WEATHER], tool_choice="none")
    )
    assert status == 200 and "tool_calls" not in doc["choices"][0]["message"]


@pytest.mark.parametrize(
    ("extra", "thinking"),
    [
        ({}, False),  # the server's --no-thinking
        ({"reasoning_effort": "low"}, True),  # an effort name turns thinking on
        ({"reasoning_effort": 40}, True),
        ({"reasoning_effort": "none"}, False),
        ({"reasoning_effort": "high", "chat_template_kwargs": {"thinking": False}}, False),
        ({"chat_template_kwargs": {"enable_thinking": True}}, True),
        ({"chat_template_kwargs": {"thinking": True}}, True),
        ({"thinking": True}, False),  # no top-level "thinking" field at 0.6.x
    ],
)
def test_thinking_controls(open066, extra, thinking):
    status, doc, _ = call(open066.url, "/v1/chat/completions", chat("What is 17*19?", **extra))
    assert status == 200, doc
    assert ("reasoning_content" in doc["choices"][0]["message"]) is thinking


def test_model_ids_and_reply_model(open066):
    body = chat("17*19")
    for asked, named in (("other-id", "other-id"), ("unknown-model", "standin-model")):
        status, doc, _ = call(open066.url, "/v1/chat/completions", {**body, "model": asked})
        assert status == 200 and doc["model"] == named


def test_a_non_streamed_reply_and_its_lines(open066):
    status, doc, _ = call(open066.url, "/v1/chat/completions", chat("Compute 17 x 19.", max_tokens=64))
    assert status == 200
    assert set(doc) == {"id", "object", "created", "model", "choices", "usage", "tensorfold"}
    assert doc["id"].startswith("chatcmpl-") and doc["object"] == "chat.completion"
    assert doc["usage"]["total_tokens"] == doc["usage"]["prompt_tokens"] + doc["usage"]["completion_tokens"]
    assert set(doc["usage"]) >= {"prompt_tokens_details", "completion_tokens_details"}
    out = open066.ranks[0].output().splitlines()
    done = [ln for ln in out if ln.startswith("[tensorfold] done ")]
    assert done and all(LINES["done"].match(ln) for ln in done), done
    assert any(LINES["access"].match(ln) and '"POST /v1/chat/completions HTTP/1.1" 200 -' in ln for ln in out)
    assert not any('"GET /health HTTP/1.1" 200' in ln for ln in out)  # polled 200s are not logged


def test_max_tokens_cuts_the_reply(open066):
    status, doc, _ = call(
        open066.url, "/v1/chat/completions", chat("Tell me about the fabric cables", max_tokens=3)
    )
    assert status == 200 and doc["choices"][0]["finish_reason"] == "length"
    assert doc["usage"]["completion_tokens"] <= 3 + 2


def test_a_streamed_reply(open066):
    events = sse(open066.url, chat("Please compute 17 x 19.", stream=True))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert "323" in text and len(chunks) > 3
    end = chunks[-1]
    assert end["choices"][0]["finish_reason"] == "stop" and "usage" in end and "tensorfold" in end
    events = sse(open066.url, chat("17*19", stream=True, stream_options={"include_usage": True}))
    assert events[-2]["choices"] == [] and events[-2]["usage"]["total_tokens"] > 0
    assert "usage" not in events[-3]


def test_completions_and_404s(open066):
    status, doc, _ = call(open066.url, "/v1/completions", {"prompt": "17*19 ="})
    assert status == 200 and doc["object"] == "text_completion" and "323" in doc["choices"][0]["text"]
    assert call(open066.url, "/v1/nothing", {"x": 1})[:2] == (404, {"error": "not found"})
    assert call(open066.url, "/nothing")[:2] == (404, {"error": "not found"})


def test_a_prompt_longer_than_the_window_is_refused(snap, tmp_path):
    with LocalCluster(2, [snap] * 2, tmp_path / "run", extra=["--context", "8"]).start() as cluster:
        status, doc, _ = call(cluster.url, "/v1/chat/completions", chat("one two three four five six seven"))
        assert status == 400 and doc["error"]["code"] == "context_length_exceeded"
        assert doc["error"]["message"].startswith("This server's maximum context length is 8 tokens.")


def test_thinking_requests_are_refused_on_a_thinking_budget_server(snap, tmp_path):
    with LocalCluster(2, [snap] * 2, tmp_path / "run", extra=["--thinking-budget", "64"]).start() as cluster:
        assert call(cluster.url, "/v1/chat/completions", chat("17*19"))[0] == 400  # thinking is on by default
        body = chat("17*19", chat_template_kwargs={"thinking": False})
        assert call(cluster.url, "/v1/chat/completions", body)[0] == 200


# ---- the TP3 recipe's engine (its card's API; an assumption) -------------------------------------


def test_tp3_recipe_forces_tool_calls_and_enforces_json_schemas(tp3):
    status, doc, _ = call(
        tp3.url, "/v1/chat/completions", chat("Weather in Paris?", tools=[WEATHER], tool_choice="required")
    )
    assert status == 200, doc
    args = json.loads(doc["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])
    assert set(args) == {"city", "unit"} and args["unit"] in ("c", "f")
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    status, doc, _ = call(tp3.url, "/v1/chat/completions", chat("What is 17*19?", response_format=fmt))
    assert status == 200 and json.loads(doc["choices"][0]["message"]["content"]) == {"answer": 323}


def test_tp3_recipe_thinking_is_on_by_default_and_a_thinking_field_turns_it_off(tp3):
    assert (
        "reasoning_content"
        in call(tp3.url, "/v1/chat/completions", chat("17*19"))[1]["choices"][0]["message"]
    )
    doc = call(tp3.url, "/v1/chat/completions", chat("17*19", thinking=False))[1]
    assert "reasoning_content" not in doc["choices"][0]["message"]
    assert call(tp3.url, "/v1/chat/completions", chat("17*19", reasoning_effort="minimal"))[0] == 200
    assert call(tp3.url, "/v1/chat/completions", chat("17*19", n=2))[0] == 400


# ---- the prompt cache and the disk tier ------------------------------------------------------------


def test_a_repeated_prompt_resumes_from_its_kept_state(snap, tmp_path):
    with LocalCluster(2, [snap] * 2, tmp_path / "run").start() as cluster:
        body = chat("A long document about the fabric, asked twice.")
        first = call(cluster.url, "/v1/chat/completions", body)[1]["usage"]
        again = call(cluster.url, "/v1/chat/completions", body)[1]["usage"]
        assert first["prompt_tokens_details"]["cached_tokens"] == 0
        assert again["prompt_tokens_details"]["cached_tokens"] == again["prompt_tokens"] - 1
        follow = {**body, "messages": [*body["messages"], {"role": "assistant", "content": "ok"}]}
        follow["messages"].append({"role": "user", "content": "and again?"})
        later = call(cluster.url, "/v1/chat/completions", follow)[1]["usage"]
        assert later["prompt_tokens_details"]["cached_tokens"] == first["prompt_tokens"] - 1
        assert (
            cluster.health()[1]["cached_tokens_total"]
            == again["prompt_tokens"] - 1 + first["prompt_tokens"] - 1
        )
        serial = call(cluster.url, "/v1/chat/completions", {**body, "draft": False})[1]["usage"]
        assert serial["prompt_tokens_details"]["cached_tokens"] == 0  # "draft": false is the serial reference


@pytest.mark.parametrize(
    ("extra", "env"),
    [([], {"TF_DSV41_CACHE_ENTRIES": "0"}), ([], {"TF_DSV41_CACHE_GIB": "0"}), (["--no-drafts"], {})],
)
def test_nothing_is_kept_without_room_or_drafting(snap, tmp_path, extra, env):
    with LocalCluster(2, [snap] * 2, tmp_path / "run", extra=extra, env=env).start() as cluster:
        body = chat("A long document about the fabric, asked twice.")
        call(cluster.url, "/v1/chat/completions", body)
        again = call(cluster.url, "/v1/chat/completions", body)[1]["usage"]
        assert again["prompt_tokens_details"]["cached_tokens"] == 0


def test_the_disk_tier_takes_evicted_states_bounded_and_across_a_restart(snap, tmp_path):
    disk = tmp_path / "kvdisk"
    disk.mkdir()
    env = {"TF_DSV41_DISK": str(disk), "TF_DSV41_DISK_MIN": "1", "TF_DSV41_CACHE_ENTRIES": "1"}
    prompts = [chat(f"Document number {i} about the fabric and its cables") for i in range(6)]
    bound = 100 * 890 / (1 << 30)  # room for about 100 tokens of kept state
    env["TF_DSV41_DISK_GIB"] = f"{bound:.12f}"
    with LocalCluster(2, [snap] * 2, tmp_path / "run1", env=env).start() as cluster:
        for body in prompts:
            assert call(cluster.url, "/v1/chat/completions", body)[0] == 200
        sizes = {}  # every rank writes its own, in step: one directory each (a hash of its build)
        for f in disk.glob("dsv41-*/*.kept"):
            sizes.setdefault(f.parent, 0)
            sizes[f.parent] += f.stat().st_size
        assert len(sizes) == 2 and all(total <= bound * (1 << 30) for total in sizes.values())
    # stopping wrote the kept state too; a new start finds the entries both ranks hold
    with LocalCluster(2, [snap] * 2, tmp_path / "run2", env=env).start() as cluster:
        again = call(cluster.url, "/v1/chat/completions", prompts[-1])[1]["usage"]
        assert again["prompt_tokens_details"]["cached_tokens"] == again["prompt_tokens"] - 1


def test_the_disk_tier_skips_small_states(snap, tmp_path):
    disk = tmp_path / "kvdisk"
    disk.mkdir()
    env = {"TF_DSV41_DISK": str(disk), "TF_DSV41_CACHE_ENTRIES": "1"}  # TF_DSV41_DISK_MIN: 2048 tokens
    with LocalCluster(2, [snap] * 2, tmp_path / "run", env=env).start() as cluster:
        for i in range(3):
            call(cluster.url, "/v1/chat/completions", chat(f"short prompt {i}"))
    assert not list(disk.glob("dsv41-*/*.kept"))
    assert os.listdir(disk)  # the build's directories exist

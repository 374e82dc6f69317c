"""The engine double's toy model (answers a client can check) and its weights reading."""

from __future__ import annotations

from fractions import Fraction

import jsonschema
import pytest
from sparkfleet_lab.engine.local import make_snapshot
from sparkfleet_lab.engine.tensorfold import model, weights

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


def test_layout_sees_sizes_and_headers_not_bytes(tmp_path):
    a = weights.load(make_snapshot(tmp_path / "a"), read=False)
    salted = weights.load(make_snapshot(tmp_path / "b", salt="x"))
    bigger = weights.load(make_snapshot(tmp_path / "c", tensor_bytes=8192), read=False)
    assert a.layout == salted.layout and a.digest == "" and salted.digest.startswith("sha256:")
    assert bigger.layout != a.layout


def test_a_prompt_renders_so_a_repeated_prefix_is_a_token_prefix():
    turn = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 17x19?"}]
    first = model.render(turn, [], thinking=False)
    longer = model.render(
        [*turn, {"role": "assistant", "content": "323"}, {"role": "user", "content": "Why?"}], [], False
    )
    assert longer[: len(first) - 1] == first[:-1]
    assert first[-2:] == [model.ASSISTANT, "</think>"] and model.render(turn, [], True)[-1] == "<think>"


def test_auto_tool_choice_calls_a_tool_its_user_names():
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    msgs = [{"role": "user", "content": "What is the weather in Lyon?"}]
    assert model.generate(msgs, thinking=False, effort=75, tools=[tool], tool_choice="auto").tool_calls
    assert not model.generate(msgs, thinking=False, effort=75, tools=[tool], tool_choice="none").tool_calls
    other = [{"role": "user", "content": "Hello"}]
    assert not model.generate(other, thinking=False, effort=75, tools=[tool], tool_choice=None).tool_calls

# A JSON schema subset, enough to check a tool call's arguments and a structured output: type, enum, const,
# properties, required, additionalProperties, items, string lengths and number bounds. What a value breaks,
# one line per problem. Used by engine_checks (verify). Standard library only.
from __future__ import annotations

import json

JSON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _type_ok(value: object, kind: str) -> bool:
    if isinstance(value, bool):
        return kind == "boolean"
    if kind == "integer":
        return isinstance(value, int)
    if kind == "number":
        return isinstance(value, int | float)
    return kind in JSON_TYPES and isinstance(value, JSON_TYPES[kind])


def _object_errors(value: dict, schema: dict, path: str) -> list[str]:
    props = schema.get("properties") or {}
    errs = [f"{path}: missing {k!r}" for k in schema.get("required", []) if k not in value]
    if schema.get("additionalProperties") is False:
        errs += [f"{path}: unexpected {k!r}" for k in value if k not in props]
    for k, sub in props.items():
        if k in value and isinstance(sub, dict):
            errs += schema_errors(value[k], sub, f"{path}.{k}")
    return errs


def _bound_errors(value: object, schema: dict, path: str) -> list[str]:
    errs = []
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            errs.append(f"{path}: shorter than {schema['minLength']}")
        if len(value) > schema.get("maxLength", len(value)):
            errs.append(f"{path}: longer than {schema['maxLength']}")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if value < schema.get("minimum", value):
            errs.append(f"{path}: {value} < {schema['minimum']}")
        if value > schema.get("maximum", value):
            errs.append(f"{path}: {value} > {schema['maximum']}")
    return errs


def schema_errors(value: object, schema: dict, path: str = "$") -> list[str]:
    """What in `value` breaks `schema` (type, enum, const, properties, required, items, bounds)."""
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind else []
    if kinds and not any(_type_ok(value, k) for k in kinds):
        return [f"{path}: {json.dumps(value)[:40]} is not {'/'.join(kinds)}"]
    errs: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        errs.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        errs.append(f"{path}: {value!r} is not {schema['const']!r}")
    if isinstance(value, dict):
        errs += _object_errors(value, schema, path)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errs += schema_errors(item, schema["items"], f"{path}[{i}]")
    return errs + _bound_errors(value, schema, path)

"""A small, deterministic JSON value that satisfies a JSON Schema: the structured output's answer.

The subset pydantic and the openai SDK emit: ``type`` (one or a list), ``properties`` /
``required``, ``items`` / ``minItems``, ``enum``, ``const``, ``default``, ``anyOf`` / ``oneOf``
/ ``allOf``, ``$ref`` into ``$defs`` (or ``definitions``), string lengths and number bounds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

_MAX_DEPTH: Final = 32
_SAMPLE_STRING: Final = "Paris"


def instance(schema: object) -> Any:  # noqa: ANN401 - any JSON value
    """A value valid against ``schema`` (the first choice wherever the schema offers several).

    Args:
        schema: A JSON Schema (``true`` or an empty object accept anything: ``{}`` is given).

    Returns:
        The value.
    """
    root = schema if isinstance(schema, Mapping) else {}
    return _value(root, root, 0)


def _resolve(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return schema
    target: object = root
    for part in ref[2:].split("/"):
        target = target.get(part) if isinstance(target, Mapping) else None
    return target if isinstance(target, Mapping) else {}


def _value(  # noqa: PLR0911 - one answer per kind of schema
    schema: Mapping[str, Any], root: Mapping[str, Any], depth: int
) -> Any:  # noqa: ANN401 - any JSON value
    schema = _resolve(schema, root)
    if depth > _MAX_DEPTH:
        return None
    if "const" in schema:
        return schema["const"]
    if "default" in schema:
        return schema["default"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return _value(_first_not_null(options, root), root, depth + 1)
    every = schema.get("allOf")
    if isinstance(every, list) and every:
        merged: dict[str, Any] = {}
        for part in every:
            if isinstance(part, Mapping):
                merged.update(_resolve(part, root))
        return _value(merged, root, depth + 1)
    return _typed(schema, _kind(schema), root, depth)


def _first_not_null(options: list[Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    schemas = [_resolve(option, root) for option in options if isinstance(option, Mapping)]
    for option in schemas:
        if option.get("type") != "null":
            return option
    return schemas[0] if schemas else {}


def _kind(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((item for item in kind if item != "null"), "null")
    if isinstance(kind, str):
        return kind
    return "object" if "properties" in schema else "array" if "items" in schema else "object"


def _typed(schema: Mapping[str, Any], kind: str, root: Mapping[str, Any], depth: int) -> Any:  # noqa: ANN401 - any JSON value
    if kind == "object":
        properties = schema.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        required = schema.get("required")
        names = required if isinstance(required, list) else []
        return {
            str(name): _value(_schema_of(properties.get(name)), root, depth + 1) for name in names
        }
    if kind == "array":
        count = schema.get("minItems")
        items = _schema_of(schema.get("items"))
        return [
            _value(items, root, depth + 1) for _ in range(count if isinstance(count, int) else 0)
        ]
    if kind == "string":
        return _string(schema)
    if kind in {"integer", "number"}:
        return _number(schema, kind)
    if kind == "boolean":
        return True
    return None


def _schema_of(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _string(schema: Mapping[str, Any]) -> str:
    shortest, longest = schema.get("minLength"), schema.get("maxLength")
    text = _SAMPLE_STRING
    if isinstance(shortest, int) and len(text) < shortest:
        text += "s" * (shortest - len(text))
    if isinstance(longest, int):
        text = text[:longest]
    return text


def _number(schema: Mapping[str, Any], kind: str) -> int | float:
    value: float = 1
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    if isinstance(low, (int, float)) and value <= low:
        value = low + 1 if "exclusiveMinimum" in schema else low
    if isinstance(high, (int, float)) and value >= high:
        value = high - 1 if "exclusiveMaximum" in schema else high
    return int(value) if kind == "integer" else float(value)

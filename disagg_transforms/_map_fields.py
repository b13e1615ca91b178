"""Typed readers for the client fields the Responses and Messages mappers carry to a leg.

Each reader takes the client body and a key, returns ``None`` when the key is absent or
``null`` (vLLM treats both as "not set", and the generate leg must not invent a server
default), and raises :class:`~disagg_transforms.errors.RequestError` naming ``$.<key>`` and the
bad value otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from disagg_transforms import _wire as w
from disagg_transforms._describe import describe
from disagg_transforms.errors import RequestError


def refuse(value: object, why: str, *, at: str) -> RequestError:
    """The error for the field at ``at`` that cannot be served (``why``: what it needed)."""
    msg = f"{at}: {why}, got {describe(value)}"
    return RequestError(msg, param=at)


def client_object(body: object) -> Mapping[str, Any]:
    """Check that the client body is a JSON object with string keys."""
    if not isinstance(body, Mapping):
        raise refuse(body, "expected a JSON object as the request body", at="$")
    for key in body:
        if not isinstance(key, str):
            raise refuse(key, "expected string keys", at="$")
    return body


def _typed(
    body: Mapping[str, Any], key: str, path: str | None, kinds: tuple[type, ...], what: str
) -> Any:  # noqa: ANN401 - the callers narrow the value to the kinds they asked for
    value = body.get(key)
    # bool is an int to Python but not a number to JSON.
    if value is not None and (
        not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)
    ):
        raise refuse(value, f"expected {what}", at=path or f"$.{key}")
    return value


def number(body: Mapping[str, Any], key: str) -> float | int | None:
    """A JSON number."""
    value: float | int | None = _typed(body, key, None, (int, float), "a number")
    return value


def integer(body: Mapping[str, Any], key: str) -> int | None:
    """A JSON integer; a whole-number float such as ``20.0`` is read as 20, as vLLM does."""
    value = number(body, key)
    if isinstance(value, float):
        if not value.is_integer():
            raise refuse(value, "expected an integer", at=f"$.{key}")
        return int(value)
    return value


def boolean(body: Mapping[str, Any], key: str) -> bool | None:
    """A JSON boolean."""
    value: bool | None = _typed(body, key, None, (bool,), "a boolean")
    return value


def string(body: Mapping[str, Any], key: str, path: str | None = None) -> str | None:
    """A JSON string."""
    value: str | None = _typed(body, key, path, (str,), "a string")
    return value


def obj(body: Mapping[str, Any], key: str, path: str | None = None) -> Mapping[str, Any] | None:
    """A JSON object."""
    value: Mapping[str, Any] | None = _typed(body, key, path, (Mapping,), "an object")
    return value


def array(body: Mapping[str, Any], key: str) -> list[Any] | None:
    """A JSON array."""
    value: list[Any] | None = _typed(body, key, None, (list,), "an array")
    return value


def string_list(body: Mapping[str, Any], key: str) -> list[str] | None:
    """A string or an array of strings, as a list (vLLM turns a lone string into a list)."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise refuse(value, "expected a string or an array of strings", at=f"$.{key}")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise refuse(item, "expected a string", at=f"$.{key}[{index}]")
    return list(value)


def copy_scalars(
    body: Mapping[str, Any],
    sampling: dict[str, Any],
    *,
    numbers: tuple[str, ...] = (),
    integers: tuple[str, ...] = (),
    booleans: tuple[str, ...] = (),
) -> None:
    """Copy the set, well-typed scalar fields named by kind into ``sampling`` under their name."""
    for key in numbers:
        if (n := number(body, key)) is not None:
            sampling[key] = n
    for key in integers:
        if (i := integer(body, key)) is not None:
            sampling[key] = i
    for key in booleans:
        if (b := boolean(body, key)) is not None:
            sampling[key] = b


def chat_function_tool(
    name: object,
    path: str,
    *,
    description: object = None,
    parameters: object = None,
    extra: Mapping[str, object] | None = None,
) -> dict[str, Any]:
    """A chat ``{type: "function", function: {...}}`` tool, with nulls left out."""
    if not isinstance(name, str) or not name:
        raise refuse(name, "expected a non-empty function name", at=f"{path}.name")
    fields = {w.DESCRIPTION: description, w.PARAMETERS: parameters, **(extra or {})}
    function = {w.NAME: name} | {key: value for key, value in fields.items() if value is not None}
    return {w.TYPE: w.FUNCTION, w.FUNCTION: function}


def named_tool_choice(name: object, path: str) -> dict[str, Any]:
    """The chat form of a tool choice that names one function."""
    if not isinstance(name, str) or not name:
        raise refuse(name, "expected the name of a function", at=f"{path}.name")
    return {w.TYPE: w.FUNCTION, w.FUNCTION: {w.NAME: name}}


def parse_context(
    *,
    tools: list[dict[str, Any]] | None,
    tool_choice: object,
    parallel_tool_calls: bool | None,
    chat_template_kwargs: Mapping[str, Any] | None,
) -> dict[str, Any] | None:
    """A ``parse_context`` in the chat shape with vLLM's chat defaults, or ``None`` when empty.

    ``tool_choice`` becomes ``"auto"`` when tools are present and it is unset (vLLM's chat
    default); nulls and an empty tool list are left out.
    """
    context: dict[str, Any] = {}
    if tools:
        context[w.TOOLS] = tools
        if tool_choice is None:
            tool_choice = w.TOOL_CHOICE_AUTO
    if tool_choice is not None:
        context[w.TOOL_CHOICE] = tool_choice
    if parallel_tool_calls is not None:
        context[w.PARALLEL_TOOL_CALLS] = parallel_tool_calls
    if chat_template_kwargs:
        context[w.CHAT_TEMPLATE_KWARGS] = dict(chat_template_kwargs)
    return context or None


def tool_objects(body: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]] | None:
    """The client's ``tools`` as ``($.tools[i], tool)`` pairs, each checked to be an object."""
    tools = array(body, w.TOOLS)
    if tools is None:
        return None
    pairs = []
    for index, tool in enumerate(tools):
        path = f"$.tools[{index}]"
        if not isinstance(tool, Mapping):
            raise refuse(tool, "expected a tool object", at=path)
        pairs.append((path, tool))
    return pairs


def json_schema_output(fmt: Mapping[str, Any], path: str) -> dict[str, Any]:
    """``structured_outputs`` for a ``{type: "json_schema", schema}`` format at ``path``."""
    schema = obj(fmt, w.SCHEMA, f"{path}.schema")
    if schema is None:
        raise refuse(None, "a json_schema format needs a schema", at=f"{path}.schema")
    return {w.JSON_KEY: schema}


LEG_KEYS = frozenset(
    {
        w.MODEL,
        w.STREAM,
        w.STREAM_OPTIONS,
        w.REQUEST_ID,
        w.CACHE_SALT,
        w.PRIORITY,
        w.RETURN_TOKEN_IDS,
        w.KV_TRANSFER_PARAMS,
        w.EC_TRANSFER_PARAMS,
    }
)
"""Keys the leg builder carries itself: neither mapped nor dropped by a mapper."""


def leftover_keys(body: Mapping[str, Any], consumed: frozenset[str]) -> tuple[str, ...]:
    """The body's keys, in body order, that no rule consumed: the ``dropped`` list."""
    return tuple(key for key in body if key not in consumed)

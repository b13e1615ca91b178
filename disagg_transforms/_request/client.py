"""The client's request, read once: its route, its checked body, and what it gives a generate leg.

Every leg of a request is built from one :class:`ClientRequest`: the client API's mapper and
the caps run here, once per request, however many legs (prefill, encode, decode) are built from
it (``docs/architecture.md``, "The request flow").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeAlias

import msgspec

from disagg_transforms._config import (
    AUTO_MODE,
    DERENDER_MODE,
    TEXT_MODE,
    DecodeParams,
    EncodeParams,
    OutputMode,
    PrefillParams,
)
from disagg_transforms._request.caps import CAP_KEYS, sampling_caps
from disagg_transforms._request.chat import map_chat_request, read_chat_view
from disagg_transforms._request.completions import map_completions_request
from disagg_transforms._request.fields import asks_for_tools
from disagg_transforms._request.mapping import ClientMapper, ClientMapping
from disagg_transforms._request.messages import map_messages_request, read_messages_view
from disagg_transforms._request.responses import map_responses_request, read_responses_view
from disagg_transforms._routes import GENERATE_ROUTE, Route, detect_route, leg_route
from disagg_transforms._wire import keys as w
from disagg_transforms._wire import limits as _limits
from disagg_transforms._wire import validate as _validate
from disagg_transforms._wire.describe import describe
from disagg_transforms._wire.limits import Limits
from disagg_transforms._wire.validate import MAPPINGS, refuse
from disagg_transforms.errors import RequestError

__all__ = (
    "CLIENT_MAPPERS",
    "ClientRequest",
    "chosen_output_mode",
    "client_caps",
    "decode_output_mode",
    "own_output_mode",
    "read_client_request",
)

LegParams: TypeAlias = EncodeParams | PrefillParams | DecodeParams

CLIENT_MAPPERS: Mapping[Route, ClientMapper | None] = {
    Route.CHAT_COMPLETIONS: map_chat_request,
    Route.COMPLETIONS: map_completions_request,
    Route.RESPONSES: map_responses_request,
    Route.MESSAGES: map_messages_request,
    Route.GENERATE: None,  # a generate client's body is already a generate leg
}
"""The one table a generate leg picks a client's field mapper from, one row per route."""

# Each API's typed view: its common body's mapping and caps from its view, else None (the
# mapper and the caps read it). docs/performance.md, "Typed views of the client's body".
_VIEWS: Mapping[
    Route, Callable[[Mapping[str, Any]], tuple[ClientMapping, dict[str, Any]] | None]
] = {
    Route.CHAT_COMPLETIONS: read_chat_view,
    Route.RESPONSES: read_responses_view,
    Route.MESSAGES: read_messages_view,
}

# Each chat-template route: its conversation's key and the key of a system prompt that opens it.
_CONVERSATIONS: Mapping[Route, tuple[str, str | None]] = {
    Route.CHAT_COMPLETIONS: (w.MESSAGES, None),
    Route.MESSAGES: (w.MESSAGES, w.SYSTEM),
    Route.RESPONSES: (w.INPUT, w.INSTRUCTIONS),
}
_EMPTY_CONVERSATION = (
    "expected at least one message: vLLM cannot apply the chat template to an empty conversation"
)


class ClientRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A client's request, read once: what every leg builder of the request reads."""

    body: Mapping[str, Any]
    """The client's body: a JSON object within the limits (never mutated)."""
    path: str
    """The path the client called."""
    route: Route
    """The client's route (its API)."""
    mapping: ClientMapping | None = None
    """What the client's fields give a generate leg (its API's mapper); ``None`` for a generate
    client, or when no leg of the request speaks the generate route."""
    caps: Mapping[str, Any] | None = None
    """The ``sampling_params`` fields the client's cap gives a generate leg
    (:func:`client_caps`); ``None`` when they were not read (no leg speaks the generate route)."""
    generate: bool = False
    """A leg of the request speaks the generate route."""
    output_mode: OutputMode | None = None
    """The ``output_mode`` the decode leg asks for, chosen for this request
    (:func:`chosen_output_mode`); ``None`` unless decode is a generate leg."""


def client_caps(body: Mapping[str, Any], route: Route) -> dict[str, Any]:
    """The ``sampling_params`` a generate leg takes from the client's cap and ``min_tokens``.

    For a generate client, its whole ``sampling_params`` with a top-level cap moved in; for a
    client of another API, its cap and ``min_tokens`` alone (``docs/request-legs.md``, "Caps
    and errors").
    """
    if route is Route.GENERATE:
        return sampling_caps(body, route)
    return sampling_caps({k: body[k] for k in CAP_KEYS if k in body}, route)


def read_client_request(
    client_body: object,
    client_path: object,
    *,
    limits: Limits,
    steps: Iterable[LegParams],
    every_field: bool = False,
) -> ClientRequest:
    """Read the client's request once for every leg built from it.

    Args:
        client_body: the client's body (a mapping; the bytes path hands its raw members).
        client_path: the path the client called.
        limits: the bounds on the body.
        steps: the params of each leg built from the request. When a leg speaks the generate
            route, the client's fields are mapped, its cap read and decode's ``output_mode``
            chosen now, so what that route refuses is refused before any leg.
        every_field: also read what every route of the client's API checks (``stream``, the
            mapper's types and ranges, the cap) when no leg speaks the generate route: the
            exchange refuses it before its first worker call.

    Raises:
        RequestError: the body is not a JSON object, is past a limit, or holds a field a leg
            refuses or a bad cap; ``client_path`` is not a str.
    """
    body = _validate.mapping(client_body, "$")
    _limits.check_client_body(body, limits)
    path = _checked_path(client_path)
    route = detect_route(path)
    generate = False
    decode = None  # the decode step, when it is a generate leg
    for params in steps:
        if leg_route(params.use_openai_format, route) is GENERATE_ROUTE:
            generate = True
            decode = params if isinstance(params, DecodeParams) else decode
    if every_field:
        _validate.typed(body, w.STREAM, bool)
    if not (generate or every_field):
        return ClientRequest(body=body, path=path, route=route)
    view = _VIEWS.get(route) if generate else None
    read = None if view is None else view(body)
    if read is None:
        mapper = CLIENT_MAPPERS[route]
        mapping = None if mapper is None else mapper(body, generate_leg=generate)
    else:
        mapping = read[0]
    mode = None if decode is None else _output_mode(body, route, decode, mapping)
    caps = client_caps(body, route) if read is None else read[1]
    if every_field:
        _check_conversation(body, route)
    return ClientRequest(
        body=body,
        path=path,
        route=route,
        mapping=mapping,
        caps=caps,
        generate=generate,
        output_mode=mode,
    )


def _check_conversation(body: Mapping[str, Any], route: Route) -> None:
    """Refuse a conversation vLLM refuses before its render (``docs/exchange.md``).

    The conversation (chat and Messages ``messages``, Responses ``input``), when sent, is a list
    of objects (Responses: or a string); each item's ``content``, when sent, a string or a list
    (null too on chat's assistant and on a Responses item without a role, a reasoning item).
    An empty one is refused unless a system prompt opens it, as vLLM's chat template refuses an
    empty conversation. A missing one is the render's to refuse.
    """
    if route not in _CONVERSATIONS:
        return
    key, opening = _CONVERSATIONS[route]
    items = body.get(key)
    if items is None or (route is Route.RESPONSES and isinstance(items, str)):
        return
    if not isinstance(items, list):
        raise refuse(items, "expected an array of messages", at=f"$.{key}")
    if not items and (opening is None or body.get(opening) is None):
        raise refuse(items, _EMPTY_CONVERSATION, at=f"$.{key}")
    for index, item in enumerate(items):
        # The common message passes on its first test; a path is written only for a refusal.
        content = item.get(w.CONTENT, "") if isinstance(item, dict) else None
        if type(content) is str or type(content) is list:
            continue
        _refuse_message(item, route, f"$.{key}[{index}]")


def _refuse_message(item: object, route: Route, at: str) -> None:
    """Refuse a conversation item that is no object, or whose ``content`` vLLM refuses."""
    if not isinstance(item, MAPPINGS):
        raise refuse(item, "expected a message object", at=at)
    content = item.get(w.CONTENT, "")
    if isinstance(content, (str, list)):
        return
    # vLLM takes null on chat's assistant message and on a Responses item that is no message
    # (a reasoning item).
    role = item.get(w.ROLE)
    nullable = role is None if route is Route.RESPONSES else role == w.ASSISTANT
    if content is not None or not nullable:
        why = "expected a string or an array of content parts"
        raise refuse(content, why, at=f"{at}.{w.CONTENT}")


def _checked_path(client_path: object) -> str:
    if not isinstance(client_path, str):
        msg = f"client_path: expected the client's request path, got {describe(client_path)}"
        raise RequestError(msg, param="client_path")
    return client_path


def own_output_mode(body: Mapping[str, Any], route: Route) -> OutputMode | None:
    """A generate client's own ``output_mode``; ``None`` when it sent none (or is on another API).

    A generate client speaks the leg's own wire format: its mode is kept, the step's applies
    only when it sent none (``docs/routes-and-config.md``, "output_mode").

    Raises:
        RequestError: the value is not ``"tokens"``, ``"text"`` or ``"derender"``.
    """
    if route is not Route.GENERATE:
        return None
    value = body.get(w.OUTPUT_MODE)
    if value is None:
        return None
    mode = _CLIENT_MODES.get(value) if isinstance(value, str) else None
    if mode is not None:
        return mode
    param = f"$.{w.OUTPUT_MODE}"
    msg = f'{param}: expected "tokens", "text" or "derender", got {describe(value)}'
    raise RequestError(msg, param=param)


# The modes a generate client may ask for itself (auto is a step's setting, never on the wire).
# A table, not OutputMode(value): the enum's own lookup by value costs a Python call or two.
_CLIENT_MODES = {mode.value: mode for mode in OutputMode if mode is not OutputMode.AUTO}


def _output_mode(
    body: Mapping[str, Any], route: Route, params: DecodeParams, mapping: ClientMapping | None
) -> OutputMode:
    """The decode leg's mode: a generate client's own, else the step's for this request.

    A client of another API (its body mapped) has no mode of its own and asks for tools in its
    mapped ``parse_context``; a generate client (no mapping) in its own.
    """
    if mapping is not None:
        return chosen_output_mode(params, mapping.parse_context)
    own = own_output_mode(body, route)
    if own is not None:
        return own
    return chosen_output_mode(params, _validate.obj(body, w.PARSE_CONTEXT))


def chosen_output_mode(params: DecodeParams, tools_context: Mapping[str, Any] | None) -> OutputMode:
    """The decode leg's ``output_mode`` for this request (``docs/routes-and-config.md``).

    ``auto`` is ``derender`` when the client asks for tools, else ``text``; a text step refuses
    a client that asks for tools (the worker's tool parser runs only in derender), rather than
    answer it with its tools dropped.
    """
    mode = params.output_mode
    wants_tools = asks_for_tools(tools_context)
    if mode is AUTO_MODE:
        return DERENDER_MODE if wants_tools else TEXT_MODE
    if mode is TEXT_MODE and wants_tools:
        param = f"$.{w.TOOLS}"
        msg = (
            f'{param}: the request asks for tools, but the decode step\'s output_mode is "text", '
            "which cannot return tool calls; configure the decode step with output_mode: auto "
            "(or derender)"
        )
        raise RequestError(msg, param=param)
    return mode


def decode_output_mode(
    client_body: Mapping[str, Any], *, client_path: str, params: DecodeParams
) -> OutputMode:
    """The ``output_mode`` a generate decode leg asks the worker for, for this client request.

    A generate client's own ``output_mode`` when it sent one; else the step's own mode, or for
    ``auto`` the one chosen for the request (``derender`` when the client asks for tools, else
    ``text``): what :attr:`GenerateDecodeLeg.output_mode` holds.

    Raises:
        RequestError: the body is not a JSON object, asks for tools of a ``text`` step, or is
            a generate client's with an ``output_mode`` vLLM does not have.
    """
    body = _validate.client_object(client_body)
    route = detect_route(_checked_path(client_path))
    mapper = CLIENT_MAPPERS[route]
    mapping = None if mapper is None else mapper(body)
    return _output_mode(body, route, params, mapping)

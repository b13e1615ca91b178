"""The client's request, read once: its route, its checked body, and what it gives a generate leg.

Every leg of a request is built from one :class:`ClientRequest`: the client API's mapper and
the caps run here, once per request, however many legs (prefill, encode, decode) are built from
it (``docs/architecture.md``, "The request flow").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias

import msgspec

from disagg_transforms._config import DecodeParams, EncodeParams, OutputMode, PrefillParams
from disagg_transforms._request.caps import CAP_KEYS, sampling_caps
from disagg_transforms._request.chat import map_chat_request
from disagg_transforms._request.completions import map_completions_request
from disagg_transforms._request.fields import asks_for_tools
from disagg_transforms._request.mapping import ClientMapper, ClientMapping
from disagg_transforms._request.messages import map_messages_request
from disagg_transforms._request.responses import map_responses_request
from disagg_transforms._routes import Route, detect_route, leg_route
from disagg_transforms._wire import keys as w
from disagg_transforms._wire import limits as _limits
from disagg_transforms._wire import validate as _validate
from disagg_transforms._wire.describe import describe
from disagg_transforms._wire.limits import Limits
from disagg_transforms.errors import RequestError

__all__ = (
    "CLIENT_MAPPERS",
    "ClientRequest",
    "chosen_output_mode",
    "client_caps",
    "decode_output_mode",
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
        if leg_route(params.use_openai_format, route) is Route.GENERATE:
            generate = True
            decode = params if isinstance(params, DecodeParams) else decode
    if every_field:
        _validate.typed(body, w.STREAM, bool)
    request = ClientRequest(body=body, path=path, route=route)
    if not (generate or every_field):
        return request
    mapper = CLIENT_MAPPERS[route]
    mapping = None if mapper is None else mapper(body, generate_leg=generate)
    mode = None if decode is None else chosen_output_mode(decode, _tools_context(body, mapping))
    return msgspec.structs.replace(
        request, mapping=mapping, caps=client_caps(body, route), generate=generate, output_mode=mode
    )


def _checked_path(client_path: object) -> str:
    if not isinstance(client_path, str):
        msg = f"client_path: expected the client's request path, got {describe(client_path)}"
        raise RequestError(msg, param="client_path")
    return client_path


def _tools_context(
    body: Mapping[str, Any], mapping: ClientMapping | None
) -> Mapping[str, Any] | None:
    """Where the client asks for tools: its mapped ``parse_context`` (a generate client's own)."""
    return _validate.obj(body, w.PARSE_CONTEXT) if mapping is None else mapping.parse_context


def chosen_output_mode(params: DecodeParams, tools_context: Mapping[str, Any] | None) -> OutputMode:
    """The decode leg's ``output_mode`` for this request (``docs/routes-and-config.md``).

    ``auto`` is ``derender`` when the client asks for tools, else ``text``; a text step refuses
    a client that asks for tools (the worker's tool parser runs only in derender), rather than
    answer it with its tools dropped.
    """
    mode = params.output_mode
    wants_tools = asks_for_tools(tools_context)
    if mode is OutputMode.AUTO:
        return OutputMode.DERENDER if wants_tools else OutputMode.TEXT
    if mode is OutputMode.TEXT and wants_tools:
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

    The step's own mode, or for ``auto`` the one chosen for the request (``derender`` when the
    client asks for tools, else ``text``): what :attr:`GenerateDecodeLeg.output_mode` holds.

    Raises:
        RequestError: the body is not a JSON object, or asks for tools of a ``text`` step.
    """
    body = _validate.client_object(client_body)
    mapper = CLIENT_MAPPERS[detect_route(_checked_path(client_path))]
    mapping = None if mapper is None else mapper(body)
    return chosen_output_mode(params, _tools_context(body, mapping))

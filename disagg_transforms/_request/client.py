"""The client's request, read once: its route, its checked body, and what it gives a generate leg.

Every leg of a request is built from one :class:`ClientRequest`: the client API's mapper and
the caps run here, once per request, however many legs (prefill, encode, decode) are built from
it (``docs/architecture.md``, "The request flow").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from disagg_transforms._request.caps import TOP_LEVEL_CAPS, apply_sampling_caps
from disagg_transforms._request.chat import map_chat_request
from disagg_transforms._request.completions import map_completions_request
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

__all__ = ("CLIENT_MAPPERS", "ClientRequest", "client_caps", "read_client_request")

CLIENT_MAPPERS: Mapping[Route, ClientMapper | None] = {
    Route.CHAT_COMPLETIONS: map_chat_request,
    Route.COMPLETIONS: map_completions_request,
    Route.RESPONSES: map_responses_request,
    Route.MESSAGES: map_messages_request,
    Route.GENERATE: None,  # a generate client's body is already a generate leg
}
"""The one table a generate leg picks a client's field mapper from, one row per route."""

# What the caps read: a generate client's own sampling_params too (another client's is an
# unknown key, dropped).
_CAP_KEYS = (*TOP_LEVEL_CAPS, w.MIN_TOKENS)
_GENERATE_CAP_KEYS = (*_CAP_KEYS, w.SAMPLING_PARAMS)


class ClientRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A client's request, read once: what every leg builder of the request reads."""

    body: Mapping[str, Any]
    """The client's body: a JSON object within the limits (never mutated)."""
    path: str
    """The path the client called."""
    route: Route
    """The client's route (its API)."""
    mapping: ClientMapping | None
    """What the client's fields give a generate leg (its API's mapper); ``None`` for a generate
    client, or when no leg of the request speaks the generate route."""
    caps: Mapping[str, Any] | None
    """The ``sampling_params`` fields the client's cap gives a generate leg
    (:func:`client_caps`); ``None`` when no leg speaks the generate route."""


def client_caps(body: Mapping[str, Any], route: Route) -> dict[str, Any]:
    """The ``sampling_params`` a generate leg takes from the client's cap and ``min_tokens``.

    For a generate client, its whole ``sampling_params`` with a top-level cap moved in; for a
    client of another API, its cap and ``min_tokens`` alone (``docs/request-legs.md``, "Caps
    and errors").
    """
    keys = _GENERATE_CAP_KEYS if route is Route.GENERATE else _CAP_KEYS
    caps = {k: body[k] for k in keys if k in body}
    sampling: dict[str, Any] = apply_sampling_caps(caps, route)[w.SAMPLING_PARAMS]
    return sampling


def read_client_request(
    client_body: object, client_path: object, *, limits: Limits, leg_formats: Iterable[bool]
) -> ClientRequest:
    """Read the client's request once for every leg built from it.

    Args:
        client_body: the client's body (a mapping; the bytes path hands its raw members).
        client_path: the path the client called.
        limits: the bounds on the body.
        leg_formats: the ``use_openai_format`` of each leg built from the request. When a leg
            speaks the generate route, the client's fields are mapped and its cap read now, so
            what that route refuses is refused before any leg.

    Raises:
        RequestError: the body is not a JSON object, is past a limit, or (``generate``) holds a
            field the generate route refuses or a bad cap; ``client_path`` is not a str.
    """
    body = _validate.mapping(client_body, "$")
    _limits.check_client_body(body, limits)
    if not isinstance(client_path, str):
        msg = f"client_path: expected the client's request path, got {describe(client_path)}"
        raise RequestError(msg, param="client_path")
    route = detect_route(client_path)
    if all(leg_route(openai, route) is not Route.GENERATE for openai in leg_formats):
        return ClientRequest(body=body, path=client_path, route=route, mapping=None, caps=None)
    mapper = CLIENT_MAPPERS[route]
    return ClientRequest(
        body=body,
        path=client_path,
        route=route,
        mapping=None if mapper is None else mapper(body),
        caps=client_caps(body, route),
    )

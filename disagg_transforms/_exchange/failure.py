"""Error bodies in each client API's own shape; the one place the exchange writes them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from disagg_transforms._routes import Route
from disagg_transforms._wire import keys as w

__all__ = ("error_body", "in_stream_error")

# Anthropic's error types by status (its API reference); any 5xx is `api_error`.
_ANTHROPIC_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}
# vLLM's exception-class style `type` names, used when the worker gave none.
_OPENAI_TYPES: Mapping[int, str] = {
    400: "BadRequestError",
    404: "NotFoundError",
    413: "RequestTooLargeError",
    429: "RateLimitError",
    502: "BadGatewayError",
}


def _anthropic_type(status: int) -> str:
    if status >= 500:
        return "api_error"
    return _ANTHROPIC_TYPES.get(status, "invalid_request_error")


def _openai_error(status: int, message: str, param: str | None, error_type: str | None) -> Any:  # noqa: ANN401 - a JSON object
    kind = (
        error_type
        or _OPENAI_TYPES.get(status)
        or ("InternalServerError" if status >= 500 else "BadRequestError")
    )
    return {w.MESSAGE: message, w.TYPE: kind, w.PARAM: param, w.CODE: status}


def error_body(
    client_route: Route,
    status: int,
    message: str,
    *,
    param: str | None = None,
    error_type: str | None = None,
) -> bytes:
    """The JSON error body a client of ``client_route`` reads for ``status``."""
    if client_route is Route.MESSAGES:
        error = {w.TYPE: _anthropic_type(status), w.MESSAGE: message}
        return orjson.dumps({w.TYPE: w.ERROR, w.ERROR: error})
    return orjson.dumps({w.ERROR: _openai_error(status, message, param, error_type)})


def in_stream_error(client_route: Route, message: str, *, sequence_number: int) -> bytes:
    """The event that ends a client's stream after a failure, in its API's framing.

    Chat, completions and generate: ``data: {"error": ...}`` then ``data: [DONE]`` (as vLLM
    sends it); Responses: an ``error`` event numbered after the ones sent; Anthropic: an
    ``error`` event.
    """
    status = 502
    if client_route is Route.MESSAGES:
        payload = orjson.dumps(
            {w.TYPE: w.ERROR, w.ERROR: {w.TYPE: _anthropic_type(status), w.MESSAGE: message}}
        )
        return b"event: error\ndata: " + payload + b"\n\n"
    if client_route is Route.RESPONSES:
        event = {
            w.TYPE: w.ERROR,
            w.CODE: _OPENAI_TYPES[status],
            w.MESSAGE: message,
            w.PARAM: None,
            w.SEQUENCE_NUMBER: sequence_number,
        }
        return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"
    payload = orjson.dumps({w.ERROR: _openai_error(status, message, None, None)})
    return b"data: " + payload + b"\n\ndata: [DONE]\n\n"

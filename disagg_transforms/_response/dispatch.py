"""The client's route picks its envelope: one entry point per shape (wrap, single frame, stream).

An exchange knows the client's route, the leg's mode and whether either side streams; these
three functions spare it a table of its own. Each takes the same arguments as the per-API
functions it dispatches to (see ``docs/envelopes.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from disagg_transforms._config import OutputMode
from disagg_transforms._response.chat import (
    ChatStreamConverter,
    single_frame_chat_stream,
    wrap_chat_completion,
)
from disagg_transforms._response.messages import (
    AnthropicStreamConverter,
    single_frame_anthropic_stream,
    wrap_anthropic_message,
)
from disagg_transforms._response.options import EnvelopeOptions
from disagg_transforms._response.responses import (
    ResponsesStreamConverter,
    single_frame_responses_stream,
    wrap_responses_response,
)
from disagg_transforms._routes import Route
from disagg_transforms._wire.describe import describe
from disagg_transforms.errors import ConfigError

__all__ = (
    "ENVELOPE_ROUTES",
    "StreamConverter",
    "single_frame_stream",
    "stream_converter",
    "wrap_envelope",
)

StreamConverter = ChatStreamConverter | ResponsesStreamConverter | AnthropicStreamConverter
"""What :func:`stream_converter` returns: each has ``feed``, ``close``, ``error_event`` and
``plain_chunk``."""


def _no_envelope(client_route: object) -> ConfigError:
    names = ", ".join(route.value for route in ENVELOPE_ROUTES)
    msg = (
        f"client_route: the generate answer is rebuilt only for {names} clients, got "
        f"{describe(client_route)}; a completions or generate client keeps its own route"
    )
    return ConfigError(msg, param="client_route")


class _Wrap(Protocol):
    def __call__(
        self,
        response: Mapping[str, Any],
        *,
        requested: OutputMode,
        client_body: Mapping[str, Any] | None = None,
        options: EnvelopeOptions | None = None,
    ) -> Any: ...  # noqa: ANN401 - a dict for a wrap, bytes for a single frame


# Every wrap and single frame takes the same arguments: a table per shape is the whole dispatch.
_WRAPS: Mapping[Route, _Wrap] = {
    Route.CHAT_COMPLETIONS: wrap_chat_completion,
    Route.RESPONSES: wrap_responses_response,
    Route.MESSAGES: wrap_anthropic_message,
}
_SINGLE_FRAMES: Mapping[Route, _Wrap] = {
    Route.CHAT_COMPLETIONS: single_frame_chat_stream,
    Route.RESPONSES: single_frame_responses_stream,
    Route.MESSAGES: single_frame_anthropic_stream,
}


ENVELOPE_ROUTES: tuple[Route, ...] = tuple(_WRAPS)
"""The client routes whose envelope is rebuilt from a generate answer (one row in each table)."""


def _pick(table: Mapping[Route, _Wrap], client_route: object) -> _Wrap:
    shape = table.get(client_route) if isinstance(client_route, Route) else None
    if shape is None:
        raise _no_envelope(client_route)
    return shape


def wrap_envelope(
    client_route: Route,
    response: Mapping[str, Any],
    *,
    requested: OutputMode,
    client_body: Mapping[str, Any] | None = None,
    options: EnvelopeOptions | None = None,
) -> dict[str, Any]:
    """The non-streaming envelope of ``client_route``'s API for a generate response.

    :func:`~disagg_transforms.wrap_chat_completion`,
    :func:`~disagg_transforms.wrap_responses_response` or
    :func:`~disagg_transforms.wrap_anthropic_message`, with their errors.

    Raises:
        ConfigError: ``client_route`` is not one of the three (or ``requested`` is tokens).
    """
    wrapped: dict[str, Any] = _pick(_WRAPS, client_route)(
        response, requested=requested, client_body=client_body, options=options
    )
    return wrapped


def single_frame_stream(
    client_route: Route,
    response: Mapping[str, Any],
    *,
    requested: OutputMode,
    client_body: Mapping[str, Any] | None = None,
    options: EnvelopeOptions | None = None,
) -> bytes:
    """The SSE body a streaming client of ``client_route`` gets for a whole generate response.

    :func:`~disagg_transforms.single_frame_chat_stream`,
    :func:`~disagg_transforms.single_frame_responses_stream` or
    :func:`~disagg_transforms.single_frame_anthropic_stream`, with their errors.

    Raises:
        ConfigError: ``client_route`` is not one of the three (or ``requested`` is tokens).
    """
    body: bytes = _pick(_SINGLE_FRAMES, client_route)(
        response, requested=requested, client_body=client_body, options=options
    )
    return body


def stream_converter(
    client_route: Route,
    *,
    requested: OutputMode,
    client_body: Mapping[str, Any] | None = None,
    options: EnvelopeOptions | None = None,
    created: int | None = None,
) -> StreamConverter:
    """The stream converter for a streaming client of ``client_route`` over a streamed leg.

    ``created`` is read by the envelopes that carry one (chat ``created``, Responses
    ``created_at``); a Messages stream has none.

    Raises:
        ConfigError: ``client_route`` is not one of the three, or ``requested`` is not text.
        RequestError, UpstreamContractError: as the converter's constructor.
    """
    if client_route is Route.CHAT_COMPLETIONS:
        return ChatStreamConverter(
            requested=requested, client_body=client_body, options=options, created=created
        )
    if client_route is Route.RESPONSES:
        return ResponsesStreamConverter(
            requested=requested, client_body=client_body, options=options, created=created
        )
    if client_route is Route.MESSAGES:
        return AnthropicStreamConverter(
            requested=requested, client_body=client_body, options=options
        )
    raise _no_envelope(client_route)

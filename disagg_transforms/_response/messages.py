"""Rebuild an Anthropic Messages ``message``, or its event stream, from a generate response.

A router that serves ``/v1/messages`` clients over ``/inference/v1/generate`` hands the worker's
answer to :func:`wrap_anthropic_message`. Content blocks come in vLLM's order: ``thinking``,
``text``, then one ``tool_use`` per tool call. A streaming client gets the same message as
Messages streaming events: :class:`AnthropicStreamConverter` for a streamed text-mode leg,
:func:`single_frame_anthropic_stream` for a derender answer. See ``docs/envelopes.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from disagg_transforms._config import OutputMode
from disagg_transforms._response.generate_stream import (
    PLAIN_SLOT,
    NamedEventConverter,
    cut_at_slots,
    with_text,
)
from disagg_transforms._response.options import (
    DEFAULT_OPTIONS,
    EnvelopeOptions,
    client_mapping,
    envelope_model,
)
from disagg_transforms._response.turn import AssistantTurn, ToolCallOut, read_turn
from disagg_transforms._routes import Route
from disagg_transforms._wire import keys as w
from disagg_transforms._wire import raw as _raw
from disagg_transforms._wire.describe import describe
from disagg_transforms._wire.sse import format_sse_typed_event
from disagg_transforms.envelopes import Usage
from disagg_transforms.errors import UpstreamContractError, error_body

__all__ = (
    "AnthropicStreamConverter",
    "THINKING_SIGNATURE",
    "single_frame_anthropic_events",
    "single_frame_anthropic_stream",
    "wrap_anthropic_message",
)

THINKING_SIGNATURE = ""
"""The ``signature`` of every ``thinking`` block: vLLM has no signing key, so there is nothing
to sign with; the SDK requires the field, and vLLM ignores it when the block comes back."""

# vLLM's finish_reason -> Anthropic stop_reason (vLLM's `stop_reason_map`, plus repetition,
# which ends the turn on purpose as a stop does). Others (abort) leave it null, as vLLM does.
_STOP_REASONS = {
    w.FINISH_STOP: w.END_TURN,
    w.FINISH_REPETITION: w.END_TURN,
    w.FINISH_LENGTH: w.MAX_TOKENS,
    w.FINISH_TOOL_CALLS: w.TOOL_USE,
}


def wrap_anthropic_message(
    response: Mapping[str, Any],
    *,
    requested: OutputMode,
    client_body: Mapping[str, Any] | None = None,
    options: EnvelopeOptions | None = None,
) -> dict[str, Any]:
    """Build an Anthropic ``message`` from a non-streaming generate response.

    Arguments as :func:`wrap_chat_completion`; ``client_body`` is the client's Messages request
    (its ``stop_sequences`` tell a stop sequence from an end of turn) and ``options`` gives the
    ``model``.

    Raises:
        UpstreamContractError: the echo is missing or wrong, the usage is missing, or a tool
            call's arguments are not a JSON object (``tool_use.input`` must be one).
        ConfigError: ``requested`` is ``tokens``.
    """
    turn = read_turn(response, requested)
    if turn.usage is None:
        raise _no_usage()
    message = _message_object(turn, client_body, DEFAULT_OPTIONS if options is None else options)
    # vLLM dumps the message without its nulls (`model_dump(exclude_none=True)`): a stop reason
    # it cannot name, and a stop sequence it does not report, are left out (docs/envelopes.md).
    return {key: value for key, value in message.items() if value is not None}


def _message_object(
    turn: AssistantTurn, client_body: Mapping[str, Any] | None, options: EnvelopeOptions
) -> dict[str, Any]:
    """The ``message`` of a turn: the wrap's and the stream's, one builder."""
    stop_reason, stop_sequence = _stop_reason(turn, client_body)
    return {
        w.ID: f"msg_{turn.base_id}",
        w.TYPE: w.MESSAGE,
        w.ROLE: w.ASSISTANT,
        w.CONTENT: _content_blocks(turn),
        w.MODEL: envelope_model(options, turn.model, client_body),
        w.STOP_REASON: stop_reason,
        w.STOP_SEQUENCE: stop_sequence,
        w.USAGE: _usage(turn.usage),
    }


def _content_blocks(turn: AssistantTurn) -> list[dict[str, Any]]:
    blocks = []
    if turn.reasoning:
        blocks.append(_thinking_block(turn.reasoning))
    # An empty text is no block: the Messages API refuses empty text blocks when a client
    # sends the turn back.
    if turn.content:
        blocks.append(_text_block(turn.content))
    blocks.extend(_tool_use_block(call) for call in turn.tool_calls)
    return blocks


def _thinking_block(thinking: str) -> dict[str, Any]:
    return {w.TYPE: w.THINKING, w.THINKING: thinking, w.SIGNATURE: THINKING_SIGNATURE}


def _text_block(text: str) -> dict[str, Any]:
    return {w.TYPE: w.TEXT, w.TEXT: text}


def _tool_use_block(call: ToolCallOut) -> dict[str, Any]:
    return {w.TYPE: w.TOOL_USE, w.ID: call.id, w.NAME: call.name, w.INPUT: _tool_input(call)}


def _tool_input(call: ToolCallOut) -> dict[str, Any]:
    # msgspec, not orjson: an integer beyond 64 bits stays the integer the model wrote.
    try:
        value = msgspec.json.decode(call.arguments)
    except (msgspec.DecodeError, RecursionError):
        msg = (
            f"{call.path}: tool call arguments are not valid JSON, got {describe(call.arguments)}; "
            "an Anthropic tool_use input must be a JSON object"
        )
        raise UpstreamContractError(msg, param=call.path) from None
    if not isinstance(value, dict):
        msg = (
            f"{call.path}: an Anthropic tool_use input must be a JSON object, got {describe(value)}"
        )
        raise UpstreamContractError(msg, param=call.path)
    return value


def _stop_reason(
    turn: AssistantTurn, client_body: Mapping[str, Any] | None
) -> tuple[str | None, str | None]:
    stop_sequences = client_mapping(client_body).get(w.STOP_SEQUENCES)
    if (
        turn.finish_reason == w.FINISH_STOP
        and isinstance(turn.stop_reason, str)
        and isinstance(stop_sequences, list)
        and turn.stop_reason in stop_sequences
    ):
        return w.STOP_SEQUENCE, turn.stop_reason
    if turn.tool_calls and turn.finish_reason == w.FINISH_STOP:
        # A named tool_choice ends with "stop" in vLLM; Anthropic clients run tools on tool_use.
        return w.TOOL_USE, None
    return _STOP_REASONS.get(turn.finish_reason or ""), None


def _no_usage() -> UpstreamContractError:
    msg = "$.usage: the Messages API needs prompt_tokens and completion_tokens"
    return UpstreamContractError(msg, param="$.usage")


def _usage(usage: Usage | None) -> dict[str, Any]:
    """Anthropic's usage: ``input_tokens`` excludes the cache's counts, as vLLM's does.

    A client adds the three: ``cache_read_input_tokens`` (the cached prompt tokens) and
    ``cache_creation_input_tokens`` (vLLM's ``created_cache_tokens``; 0 where the generate
    route writes none), in vLLM's ``AnthropicUsage`` order, when vLLM reports prompt token
    details. ``None`` (a stream whose leg sent no usage chunk): the counts are unknown, 0.
    """
    if usage is None:
        return {w.INPUT_TOKENS: 0, w.OUTPUT_TOKENS: 0}
    prompt = usage.prompt_tokens
    completion = usage.completion_tokens
    if not isinstance(prompt, int) or not isinstance(completion, int):
        raise _no_usage()
    details = usage.prompt_tokens_details or {}
    cached = _count(details.get(w.CACHED_TOKENS))
    if cached is None:
        return {w.INPUT_TOKENS: prompt, w.OUTPUT_TOKENS: completion}
    # Clamped to the prompt, so that the counts still add up to what the worker read.
    cached = min(max(cached, 0), prompt)
    created = min(max(_count(details.get(w.CREATED_CACHE_TOKENS)) or 0, 0), prompt - cached)
    return {
        w.INPUT_TOKENS: prompt - cached - created,
        w.OUTPUT_TOKENS: completion,
        w.CACHE_CREATION_INPUT_TOKENS: created,
        w.CACHE_READ_INPUT_TOKENS: cached,
    }


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# --------------------------------------------------------------------------------------------
# Streaming: the events of one message, built from the blocks above.

# A block as content_block_start opens it: its text, thinking or input still empty.
_EMPTY_BLOCK: dict[str, dict[str, Any]] = {
    w.TEXT: {w.TEXT: ""},
    w.THINKING: {w.THINKING: "", w.SIGNATURE: ""},
    w.TOOL_USE: {w.INPUT: {}},
}


def single_frame_anthropic_events(
    response: Mapping[str, Any],
    *,
    requested: OutputMode,
    client_body: Mapping[str, Any] | None = None,
    options: EnvelopeOptions | None = None,
) -> list[dict[str, Any]]:
    """The Messages streaming events of a whole (unstreamed) generate answer.

    The response is wrapped by :func:`wrap_anthropic_message` (same arguments, same errors),
    then streamed as Anthropic does: ``message_start`` (the message with no content, no stop
    reason and ``output_tokens: 0``); per content block ``content_block_start`` (empty),
    its deltas (``thinking_delta`` then ``signature_delta``; ``text_delta``;
    ``input_json_delta`` with the input as compact JSON) and ``content_block_stop``; then
    ``message_delta`` (stop reason, stop sequence, the whole usage) and ``message_stop``.
    """
    message = wrap_anthropic_message(
        response, requested=requested, client_body=client_body, options=options
    )
    events = [_message_start(message)]
    for index, block in enumerate(message[w.CONTENT]):
        events.append(_block_start(index, block))
        events.extend(_block_deltas(index, block))
        events.append(_block_stop(index))
    events.extend(_message_end(message))
    return events


def single_frame_anthropic_stream(
    response: Mapping[str, Any],
    *,
    requested: OutputMode,
    client_body: Mapping[str, Any] | None = None,
    options: EnvelopeOptions | None = None,
) -> bytes:
    r"""The SSE body of :func:`single_frame_anthropic_events`: ``event: <type>\ndata: ...``.

    As Anthropic's, the stream has no ``data: [DONE]``: ``message_stop`` ends it.
    """
    events = single_frame_anthropic_events(
        response, requested=requested, client_body=client_body, options=options
    )
    return b"".join(format_sse_typed_event(event[w.TYPE], event) for event in events)


class AnthropicStreamConverter(NamedEventConverter):
    r"""Turns a text-mode generate SSE stream into an Anthropic Messages event stream.

    Feed it the leg's body bytes as they arrive (split anywhere); each call returns the SSE
    bytes to send on (``event: <type>\ndata: <json>``), possibly empty. The first generate
    chunk gives ``message_start`` (its usage from that chunk when the worker sends continuous
    usage, else 0); the first non-empty text delta opens the ``text`` block (index 0; an
    empty answer has no block, as :func:`wrap_anthropic_message` gives none); each non-empty
    text delta is a ``text_delta``; ``[DONE]`` gives ``content_block_stop``,
    ``message_delta`` (stop reason and stop sequence as the non-streaming wrap maps them; the
    whole usage of the leg's usage chunk, ``input_tokens`` and ``cache_read_input_tokens``
    included, which the SDK's accumulator takes over ``message_start``'s; 0 without one) and
    ``message_stop``. The message is built from the same turn as :func:`wrap_anthropic_message`
    builds it; ids come from the worker's ``request_id`` by its rules. No ``[DONE]`` is sent.

    An in-stream ``{"error": ...}`` becomes an Anthropic ``error`` event (its type from the
    worker's status ``code``: ``api_error`` for a 5xx) and ends the client's stream;
    :meth:`error_event` gives the router the same event for its own errors. Output bytes
    depend only on the input bytes, not on how they were split; memory is bounded by
    ``options.max_event_bytes`` plus the answer's text. After an exception the converter is
    spent: discard it.

    Args:
        requested: The leg's ``output_mode``; only ``text`` streams.
        client_body: The client's Messages request (its ``stop_sequences``; its ``model`` is
            the fallback).
        options: How the envelope is built (:class:`EnvelopeOptions`).

    Raises:
        ConfigError: ``requested`` is not ``text``.
        UpstreamContractError: neither the options nor the client body names a model.
    """

    __slots__ = ("_open", "_plain_pieces")

    def __init__(
        self,
        *,
        requested: OutputMode,
        client_body: Mapping[str, Any] | None = None,
        options: EnvelopeOptions | None = None,
    ) -> None:
        super().__init__(
            requested=requested, client_body=client_body, options=options, created=None
        )
        self._open = False  # the text block has started

    def _message(self) -> dict[str, Any]:
        return _message_object(self._turn(), self._client, self._options)

    def _start(self) -> list[dict[str, Any]]:
        return [_message_start(self._message())]

    def _delta(self, text: str, logprobs: list[Any] | None, position: int) -> list[dict[str, Any]]:
        del logprobs, position  # the Messages API has no logprobs
        if not text:
            return []
        events = []
        if not self._open:
            self._open = True
            events.append(_block_start(0, _text_block("")))
            # A plain chunk's text_delta, its text spliced in (_plain_event).
            self._plain_pieces = cut_at_slots(
                self._format(_block_delta(0, w.TEXT_DELTA, w.TEXT, PLAIN_SLOT))
            )
            self._plain = True
        events.append(_block_delta(0, w.TEXT_DELTA, w.TEXT, text))
        return events

    def _plain_event(self, text: str) -> bytes:
        return with_text(self._plain_pieces, text)

    def _end(self) -> list[dict[str, Any]]:
        events = [_block_stop(0)] if self._open else []
        events.extend(_message_end(self._message()))
        return events

    def _error(
        self, message: str, status: int, error_type: str | None, param: str | None
    ) -> list[dict[str, Any]]:
        del param  # Anthropic's error has none
        return [error_body(Route.MESSAGES, status=status, message=message, error_type=error_type)]

    def _format(self, event: dict[str, Any]) -> bytes:
        return format_sse_typed_event(event[w.TYPE], event)


def _message_start(message: dict[str, Any]) -> dict[str, Any]:
    started = {
        **message,
        w.CONTENT: [],
        w.STOP_REASON: None,
        w.STOP_SEQUENCE: None,
        w.USAGE: {**message[w.USAGE], w.OUTPUT_TOKENS: 0},
    }
    return {w.TYPE: w.MESSAGE_START, w.MESSAGE: started}


def _block_start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    empty = {**block, **_EMPTY_BLOCK[block[w.TYPE]]}
    return {w.TYPE: w.CONTENT_BLOCK_START, w.INDEX: index, w.CONTENT_BLOCK: empty}


def _block_deltas(index: int, block: dict[str, Any]) -> list[dict[str, Any]]:
    kind = block[w.TYPE]
    if kind == w.THINKING:
        return [
            _block_delta(index, w.THINKING_DELTA, w.THINKING, block[w.THINKING]),
            _block_delta(index, w.SIGNATURE_DELTA, w.SIGNATURE, block[w.SIGNATURE]),
        ]
    if kind == w.TOOL_USE:
        arguments = _raw.encode(block[w.INPUT]).decode()
        return [_block_delta(index, w.INPUT_JSON_DELTA, w.PARTIAL_JSON, arguments)]
    return [_block_delta(index, w.TEXT_DELTA, w.TEXT, block[w.TEXT])]


def _block_delta(index: int, kind: str, key: str, value: str) -> dict[str, Any]:
    return {w.TYPE: w.CONTENT_BLOCK_DELTA, w.INDEX: index, w.DELTA: {w.TYPE: kind, key: value}}


def _block_stop(index: int) -> dict[str, Any]:
    return {w.TYPE: w.CONTENT_BLOCK_STOP, w.INDEX: index}


def _message_end(message: dict[str, Any]) -> list[dict[str, Any]]:
    # The whole message leaves nulls out; the delta names both, as vLLM's stream does.
    delta = {key: message.get(key) for key in (w.STOP_REASON, w.STOP_SEQUENCE)}
    return [
        {w.TYPE: w.MESSAGE_DELTA, w.DELTA: delta, w.USAGE: message[w.USAGE]},
        {w.TYPE: w.MESSAGE_STOP},
    ]

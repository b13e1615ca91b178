"""Rebuild an OpenAI Responses API ``response`` object, or its event stream, from generate.

A router that serves ``/v1/responses`` clients over ``/inference/v1/generate`` hands the worker's
answer to :func:`wrap_responses_response` and sends the result to the client. The object is
built from an allow-list: nothing of the generate response but the assistant turn, its finish
reason and its usage reaches it. A streaming client gets the same object as Responses
streaming events: :class:`ResponsesStreamConverter` for a streamed text-mode leg,
:func:`single_frame_responses_stream` for a derender answer. See ``docs/envelopes.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

from disagg_transforms._config import OutputMode
from disagg_transforms._response import options as _options
from disagg_transforms._response.choices import choice_path, client_top_logprobs
from disagg_transforms._response.generate_stream import (
    PLAIN_SLOT,
    NamedEventConverter,
    cut_at_slots,
)
from disagg_transforms._response.turn import AssistantTurn, ToolCallOut, read_turn
from disagg_transforms._wire import keys as w
from disagg_transforms._wire.limits import check_depth
from disagg_transforms._wire.sse import encode_event_json, format_sse_typed_event
from disagg_transforms.envelopes import ChatLogprob, ChatTopLogprob, Usage
from disagg_transforms.errors import UpstreamContractError

__all__ = (
    "ResponsesStreamConverter",
    "responses_error_event",
    "single_frame_responses_events",
    "single_frame_responses_stream",
    "wrap_responses_response",
)

# vLLM's SamplingParams reads a temperature below this as greedy and forces top_p to 1.0.
_GREEDY: Final = 1e-5
# Echoed as sent, null when the client left them out (vLLM's request model has no default).
_ECHOED_AS_SENT_AFTER_CAP = (w.MAX_TOOL_CALLS, w.PREVIOUS_RESPONSE_ID, w.PROMPT)
# vLLM's PromptCacheOptions: the request's options less ``prewarm``, its defaults filled in.
_PROMPT_CACHE_DEFAULTS: Final = {w.MODE: "implicit", w.TTL: "30m", w.COMPARISON_RESPONSE_ID: None}


def wrap_responses_response(
    response: Mapping[str, Any],
    *,
    requested: OutputMode,
    client_body: Mapping[str, Any] | None = None,
    options: _options.EnvelopeOptions | None = None,
) -> dict[str, Any]:
    """Build a Responses API ``response`` object from a non-streaming generate response.

    Arguments as :func:`wrap_chat_completion`; ``client_body`` is the client's Responses
    request (its tools, tool choice and settings are echoed as OpenAI echoes them, and its
    ``top_logprobs`` cuts the alternatives: absent 0, ``-1`` all, no client body no cut) and
    ``options`` gives the ``model``, ``clock`` and ``limits``.

    Raises:
        UpstreamContractError: the echo is missing or wrong, or the body breaks the contract.
        ConfigError: ``requested`` is ``tokens``.
        RequestError: the client body nests deeper than ``Limits.max_depth`` (its settings are
            echoed into the response, so they must stay writable), or its ``top_logprobs`` is
            not an integer >= -1.
    """
    turn = read_turn(response, requested)
    built = _options.DEFAULT_OPTIONS if options is None else options
    client = _options.client_mapping(client_body)
    check_depth(client, built.limits.max_depth)
    return _response_object(turn, client, built, client_top_logprobs(client_body))


def _response_object(
    turn: AssistantTurn,
    client: Mapping[str, Any],
    options: _options.EnvelopeOptions,
    top: int | None,
    output: list[Any] | None = None,
) -> dict[str, Any]:
    """The ``response`` object of a turn: the wrap's and the stream's, one builder.

    Keys in the order vLLM's ``ResponsesResponse`` declares its fields (it dumps the model
    whole, nulls included). ``output``: the items a stream sent, which vLLM's final response
    carries instead of the ones the whole answer would build (docs/envelopes.md).
    """
    status, incomplete_details = _status(turn)
    like_032 = _options.writes_like_032(options)
    tools = client.get(w.TOOLS)
    tools = tools if isinstance(tools, list) else []
    parallel = client.get(w.PARALLEL_TOOL_CALLS)
    temperature = _number(client.get(w.TEMPERATURE), 1.0)
    return {
        w.ID: f"resp_{turn.base_id}",
        w.CREATED_AT: _options.envelope_created(options, turn.created),
        w.INCOMPLETE_DETAILS: incomplete_details,
        w.INSTRUCTIONS: client.get(w.INSTRUCTIONS),
        w.METADATA: client.get(w.METADATA),
        w.MODEL: _options.envelope_model(options, turn.model, client),
        w.OBJECT: w.RESPONSE_OBJECT,
        w.OUTPUT: _output_items(turn, top, cut_status=not like_032) if output is None else output,
        # vLLM's own defaults for a request that left them out.
        w.PARALLEL_TOOL_CALLS: parallel if isinstance(parallel, bool) else True,
        w.TEMPERATURE: temperature,
        w.TOOL_CHOICE: _tool_choice(client.get(w.TOOL_CHOICE), tools),
        w.TOOLS: tools,
        w.TOP_P: 1.0 if temperature < _GREEDY else _number(client.get(w.TOP_P), 1.0),
        w.BACKGROUND: _sent_or(client, w.BACKGROUND, default=False),
        w.MAX_OUTPUT_TOKENS: client.get(w.MAX_OUTPUT_TOKENS),
        **{key: client.get(key) for key in _ECHOED_AS_SENT_AFTER_CAP},
        **({} if like_032 else _cache_echo(client)),
        w.REASONING: client.get(w.REASONING),
        **({} if like_032 else {w.SAFETY_IDENTIFIER: client.get(w.SAFETY_IDENTIFIER)}),
        w.SERVICE_TIER: _sent_or(client, w.SERVICE_TIER, default=w.SERVICE_TIER_AUTO),
        w.STATUS: status,
        w.TEXT: client.get(w.TEXT),
        w.TOP_LOGPROBS: _logprobs_asked(client),
        w.TRUNCATION: _sent_or(client, w.TRUNCATION, default=w.TRUNCATION_DISABLED),
        w.USAGE: _usage(turn.usage),
        w.USER: client.get(w.USER),
        # The sampling values the answer ran with: the client's, else SamplingParams' 0.0.
        w.PRESENCE_PENALTY: _number(client.get(w.PRESENCE_PENALTY), 0.0),
        w.FREQUENCY_PENALTY: _number(client.get(w.FREQUENCY_PENALTY), 0.0),
        # vLLM-only: the prompt and output tokens, for enable_response_messages (refused here).
        # Its kv_transfer_params and ec_transfer_params are never written (docs/exchange.md).
        w.INPUT_MESSAGES: None,
        w.OUTPUT_MESSAGES: None,
    }


def _tool_choice(choice: object, tools: list[Any]) -> Any:  # noqa: ANN401 - JSON
    """``tool_choice`` as vLLM's request validator leaves it: ``none`` without tools."""
    if not isinstance(choice, (str, Mapping)):
        choice = w.TOOL_CHOICE_AUTO
    if not tools and choice in (w.TOOL_CHOICE_AUTO, w.TOOL_CHOICE_NONE):
        return w.TOOL_CHOICE_NONE
    return choice


def _cache_echo(client: Mapping[str, Any]) -> dict[str, Any]:
    """The prompt-cache settings vLLM 0.33 echoes (0.32 writes none of them)."""
    return {
        w.PROMPT_CACHE_OPTIONS: _prompt_cache_options(client.get(w.PROMPT_CACHE_OPTIONS)),
        w.PROMPT_CACHE_KEY: client.get(w.PROMPT_CACHE_KEY),
        w.PROMPT_CACHE_RETENTION: _prompt_cache_retention(client.get(w.PROMPT_CACHE_RETENTION)),
    }


def _prompt_cache_options(sent: object) -> Any:  # noqa: ANN401 - JSON
    if not isinstance(sent, Mapping):
        return sent
    return {key: sent.get(key, default) for key, default in _PROMPT_CACHE_DEFAULTS.items()}


def _prompt_cache_retention(sent: object) -> object:
    # vLLM's request validator reads OpenAI's older spelling as the current one.
    return "in_memory" if sent == "in-memory" else sent


def _number(value: object, default: float) -> Any:  # noqa: ANN401 - the client's own number
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _sent_or(client: Mapping[str, Any], key: str, *, default: object) -> Any:  # noqa: ANN401 - JSON
    value = client.get(key)
    return default if value is None else value


def _logprobs_asked(client: Mapping[str, Any]) -> Any:  # noqa: ANN401 - JSON
    """The ``sampling_params.logprobs`` vLLM runs with: ``top_logprobs`` (0 unset) if asked."""
    include = client.get(w.INCLUDE)
    if not isinstance(include, list) or w.INCLUDE_OUTPUT_LOGPROBS not in include:
        return None
    top = client.get(w.TOP_LOGPROBS)
    return 0 if top is None else top


def _status(turn: AssistantTurn) -> tuple[str, dict[str, Any] | None]:
    # vLLM's only incomplete answer: the cap cut it; an abort is "completed" too (its catch-all).
    if turn.finish_reason == w.FINISH_LENGTH:
        return w.STATUS_INCOMPLETE, {w.REASON: w.INCOMPLETE_MAX_OUTPUT_TOKENS}
    return w.STATUS_COMPLETED, None


def _item_status(turn: AssistantTurn) -> str:
    """The status of the item a finish reason ended: vLLM's ``response_item_status``."""
    return w.STATUS_INCOMPLETE if turn.finish_reason == w.FINISH_LENGTH else w.STATUS_COMPLETED


def _output_items(turn: AssistantTurn, top_logprobs: int | None, *, cut_status: bool) -> list[Any]:
    """The items as vLLM's ``build_response_output_items``: only the last one can be cut short.

    ``cut_status``: the item the cap cut is ``incomplete`` (vLLM 0.33; 0.32 writes
    ``completed``).
    """
    items: list[Any] = []
    last = _item_status(turn) if cut_status else w.STATUS_COMPLETED
    if turn.reasoning:
        items.append(_reasoning_item(turn.base_id, turn.reasoning))
    if turn.content is not None and (turn.content or not turn.tool_calls):
        content = None if turn.logprobs is None else turn.logprobs.content
        logprobs = (
            _logprobs(content, top_logprobs, f"{turn.choice_path}.logprobs.content")
            if isinstance(content, list)
            else None
        )
        status = w.STATUS_COMPLETED if turn.tool_calls else last
        items.append(_message_item(turn.base_id, turn.content, logprobs, status))
    count = len(turn.tool_calls)
    items.extend(
        _function_call_item(
            turn.base_id, index, call, last if index == count - 1 else w.STATUS_COMPLETED
        )
        for index, call in enumerate(turn.tool_calls)
    )
    return items


# Each item and part in the field order of the openai SDK model vLLM dumps, nulls included.


def _reasoning_item(base_id: str, text: str) -> dict[str, Any]:
    return {
        w.ID: f"rs_{base_id}",
        w.SUMMARY: [],
        w.TYPE: w.REASONING,
        w.CONTENT: [{w.TEXT: text, w.TYPE: w.REASONING_TEXT}],
        w.ENCRYPTED_CONTENT: None,
        # vLLM leaves a reasoning item's status unset.
        w.STATUS: None,
    }


def _text_part(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {w.ANNOTATIONS: [], w.TEXT: text, w.TYPE: w.OUTPUT_TEXT, w.LOGPROBS: logprobs}


def _message_item(
    base_id: str, text: str, logprobs: list[dict[str, Any]] | None, status: str
) -> dict[str, Any]:
    # An empty text is no part (docs/envelopes.md).
    return _message(f"msg_{base_id}", [_text_part(text, logprobs)] if text else [], status)


def _message(item_id: str, content: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {
        w.ID: item_id,
        w.CONTENT: content,
        w.ROLE: w.ASSISTANT,
        w.STATUS: status,
        w.TYPE: w.MESSAGE,
        w.PHASE: None,
    }


def _function_call_item(base_id: str, index: int, call: ToolCallOut, status: str) -> dict[str, Any]:
    return {
        w.ARGUMENTS: call.arguments,
        w.CALL_ID: call.id,
        w.NAME: call.name,
        w.TYPE: w.FUNCTION_CALL,
        w.ID: f"fc_{base_id}_{index}",
        w.ASYNC: None,
        w.CALLER: None,
        w.NAMESPACE: None,
        w.STATUS: status,
    }


def _logprobs(entries: list[ChatLogprob], top: int | None, path: str) -> list[dict[str, Any]]:
    out = []
    for index, entry in enumerate(entries):
        alternatives = entry.top_logprobs if isinstance(entry.top_logprobs, list) else []
        token = _token_logprob(entry, f"{path}[{index}]")
        token[w.TOP_LOGPROBS] = [
            _token_logprob(alt, f"{path}[{index}].top_logprobs[{rank}]")
            for rank, alt in enumerate(alternatives[:top] if top is not None else alternatives)
        ]
        out.append(token)
    return out


def _token_logprob(entry: ChatLogprob | ChatTopLogprob, path: str) -> dict[str, Any]:
    if entry.logprob is msgspec.UNSET:
        msg = f"{path}.logprob: missing"
        raise UpstreamContractError(msg, param=f"{path}.logprob")
    token_bytes = entry.bytes if isinstance(entry.bytes, list) else []
    return {w.TOKEN: entry.token, w.BYTES: token_bytes, w.LOGPROB: entry.logprob}


def _usage(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    prompt = _count(usage.prompt_tokens)
    completion = _count(usage.completion_tokens)
    total = usage.total_tokens if isinstance(usage.total_tokens, int) else prompt + completion
    prompt_details = usage.prompt_tokens_details or {}
    completion_details = usage.completion_tokens_details or {}
    # vLLM's details, its per-turn lists empty for one generation as vLLM's own are; its
    # cache_write_tokens counts the prompt tokens the worker wrote to its prefix cache, which
    # no generate answer reports: 0 (docs/envelopes.md, the usage row).
    return {
        w.INPUT_TOKENS: prompt,
        w.INPUT_TOKENS_DETAILS: {
            w.CACHED_TOKENS: _count(prompt_details.get(w.CACHED_TOKENS)),
            w.CACHE_WRITE_TOKENS: 0,
            w.INPUT_TOKENS_PER_TURN: [],
            w.CACHED_TOKENS_PER_TURN: [],
        },
        w.OUTPUT_TOKENS: completion,
        w.OUTPUT_TOKENS_DETAILS: {
            w.REASONING_TOKENS: _count(completion_details.get(w.REASONING_TOKENS)),
            w.TOOL_OUTPUT_TOKENS: 0,
            w.OUTPUT_TOKENS_PER_TURN: [],
            w.TOOL_OUTPUT_TOKENS_PER_TURN: [],
        },
        w.TOTAL_TOKENS: total,
    }


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# --------------------------------------------------------------------------------------------
# Streaming: the events of one response, built from the objects above.

_TEXT_EVENTS = {
    w.OUTPUT_TEXT: (w.OUTPUT_TEXT_DELTA, w.OUTPUT_TEXT_DONE),
    w.REASONING_TEXT: (w.REASONING_TEXT_DELTA, w.REASONING_TEXT_DONE),
}


def single_frame_responses_events(
    response: Mapping[str, Any],
    *,
    requested: OutputMode,
    client_body: Mapping[str, Any] | None = None,
    options: _options.EnvelopeOptions | None = None,
) -> list[dict[str, Any]]:
    """The Responses streaming events of a whole (unstreamed) generate answer.

    The response is wrapped by :func:`wrap_responses_response` (same arguments, same errors),
    then streamed as vLLM streams it (a ``reasoning`` item closed with a status, as vLLM's
    stream closes it): ``response.created``, ``response.in_progress``; per output
    item ``response.output_item.added``, its content parts added, one delta with the whole
    text (``response.reasoning_text.delta``, ``response.output_text.delta``) or arguments
    (``response.function_call_arguments.delta``), their ``.done`` events and
    ``response.output_item.done``; then ``response.completed`` with the whole response
    (``response.incomplete`` for an incomplete one, as vLLM 0.33 sends it). ``sequence_number``
    counts from 0.
    """
    whole = wrap_responses_response(
        response, requested=requested, client_body=client_body, options=options
    )
    built = _options.DEFAULT_OPTIONS if options is None else options
    # vLLM's final response holds the items its stream closed, a reasoning item's status set.
    last = len(whole[w.OUTPUT]) - 1
    cut = whole[w.STATUS] == w.STATUS_INCOMPLETE and not _options.writes_like_032(built)
    output = [
        {**item, w.STATUS: w.STATUS_INCOMPLETE if cut and index == last else w.STATUS_COMPLETED}
        if item[w.TYPE] == w.REASONING
        else item
        for index, item in enumerate(whole[w.OUTPUT])
    ]
    final = {**whole, w.OUTPUT: output}
    events = _preamble(final)
    for index, item in enumerate(output):
        events.extend(_opening_events(item, index))
        events.extend(_full_deltas(item, index))
        events.extend(_closing_events(item, index))
    events.append(_terminal_event(final, built))
    return [{**event, w.SEQUENCE_NUMBER: number} for number, event in enumerate(events)]


def single_frame_responses_stream(
    response: Mapping[str, Any],
    *,
    requested: OutputMode,
    client_body: Mapping[str, Any] | None = None,
    options: _options.EnvelopeOptions | None = None,
) -> bytes:
    r"""The SSE body of :func:`single_frame_responses_events`: ``event: <type>\ndata: ...``.

    As OpenAI's, the stream has no ``data: [DONE]``: ``response.completed`` (or
    ``response.incomplete``) ends it.
    """
    events = single_frame_responses_events(
        response, requested=requested, client_body=client_body, options=options
    )
    return b"".join(format_sse_typed_event(event[w.TYPE], event) for event in events)


class ResponsesStreamConverter(NamedEventConverter):
    r"""Turns a text-mode generate SSE stream into a Responses API event stream.

    Feed it the leg's body bytes as they arrive (split anywhere); each call returns the SSE
    bytes to send on (``event: <type>\ndata: <json>``), possibly empty. The first generate
    chunk gives ``response.created`` and ``response.in_progress`` (status ``in_progress``, no
    output); the first choice delta opens the ``message`` item and its ``output_text`` part;
    each non-empty text delta is a ``response.output_text.delta`` (with its ``logprobs`` in
    the streaming shape, cut to the client's ``top_logprobs``); ``[DONE]`` gives the
    ``.done`` events and ``response.completed`` (``response.incomplete`` when the cap cut it,
    as vLLM 0.33) carrying the whole response as :func:`wrap_responses_response` builds it
    from the same turn (its ``usage`` from the leg's usage chunk; ``null`` without one; no
    output item when no text came, as vLLM's final response holds the items its stream sent).
    Ids come from the worker's ``request_id`` by the wrap's rules. ``sequence_number`` counts
    from 0. No ``[DONE]`` is sent.

    An in-stream ``{"error": ...}`` becomes an ``error`` event (``code``: vLLM's error
    ``type``; ``message``; ``param``) and ends the client's stream; :meth:`error_event` gives
    the router the same event for its own errors. Output bytes depend only on the input
    bytes, not on how they were split; memory is bounded by ``options.max_event_bytes`` plus
    the answer's text. After an exception the converter is spent: discard it.

    Args:
        requested: The leg's ``output_mode``; only ``text`` streams.
        client_body: The client's Responses request (its settings are echoed, its
            ``top_logprobs`` cuts the alternatives, its ``model`` is the fallback).
        options: How the envelope is built (:class:`_options.EnvelopeOptions`).
        created: The response's ``created_at`` (Unix seconds); ``None``: ``options.clock()``
            when the converter is made (generate chunks carry no ``created``).

    Raises:
        ConfigError: ``requested`` is not ``text``.
        RequestError: the client's ``top_logprobs`` is not an integer >= -1, or its body nests
            deeper than ``options.limits.max_depth``.
        UpstreamContractError: neither the options nor the client body names a model.
    """

    __slots__ = ("_item", "_place", "_plain_pieces", "_sequence", "_top")

    def __init__(
        self,
        *,
        requested: OutputMode,
        client_body: Mapping[str, Any] | None = None,
        options: _options.EnvelopeOptions | None = None,
        created: int | None = None,
    ) -> None:
        built = _options.DEFAULT_OPTIONS if options is None else options
        super().__init__(
            requested=requested,
            client_body=client_body,
            options=built,
            created=_options.envelope_created(built, created),
        )
        check_depth(_options.client_mapping(client_body), built.limits.max_depth)
        self._top = client_top_logprobs(client_body)
        self._item: dict[str, Any] | None = None  # the message item, once opened
        self._sequence = 0

    def _response(self, output: list[Any] | None = None) -> dict[str, Any]:
        return _response_object(
            self._turn(), _options.client_mapping(self._client), self._options, self._top, output
        )

    def _open(self) -> list[dict[str, Any]]:
        item = self._response()[w.OUTPUT][0]  # text mode: always one message item
        self._item = item
        # Where every text delta goes, built once (set with the item, read only after it).
        self._place = _at(item[w.ID], 0, 0)
        # A plain chunk's delta event, its text and sequence number spliced in (_plain_event).
        plain = _text_delta(self._place, w.OUTPUT_TEXT, PLAIN_SLOT, None)
        plain[w.SEQUENCE_NUMBER] = PLAIN_SLOT
        self._plain_pieces = cut_at_slots(format_sse_typed_event(plain[w.TYPE], plain))
        self._plain = True
        return _opening_events({**item, w.CONTENT: [_text_part("", None)]}, 0)

    def _start(self) -> list[dict[str, Any]]:
        return _preamble(self._response())

    def _delta(self, text: str, logprobs: list[Any] | None, position: int) -> list[dict[str, Any]]:
        entries = (
            None
            if logprobs is None
            else _logprobs(
                msgspec.convert(logprobs, list[ChatLogprob]),
                self._top,
                f"{choice_path(position)}.logprobs.content",
            )
        )
        if not (text or entries):
            return []
        # The item opens at the first text, as vLLM opens it (docs/envelopes.md).
        events = [] if self._item is not None else self._open()
        events.append(_text_delta(self._place, w.OUTPUT_TEXT, text, entries))
        return events

    def _plain_event(self, text: str) -> bytes:
        before, middle, after = self._plain_pieces
        sequence = self._sequence
        self._sequence = sequence + 1
        return b"".join((before, encode_event_json(text), middle, b"%d" % sequence, after))

    def _end(self) -> list[dict[str, Any]]:
        if self._item is None:
            # No text, no item: vLLM's final response carries the items its stream sent.
            return [_terminal_event(self._response(output=[]), self._options)]
        final = self._response()
        return [*_closing_events(final[w.OUTPUT][0], 0), _terminal_event(final, self._options)]

    def _error(
        self, message: str, status: int, error_type: str | None, param: str | None
    ) -> list[dict[str, Any]]:
        return [responses_error_event(message, status=status, error_type=error_type, param=param)]

    def _format(self, event: dict[str, Any]) -> bytes:
        # Numbered in place: every event is a dict built for this one write.
        event[w.SEQUENCE_NUMBER] = self._sequence
        self._sequence += 1
        return format_sse_typed_event(event[w.TYPE], event)


# OpenAI's error codes for a server fault and a refused request (the Responses ``error`` event).
_SERVER_ERROR: Final = "server_error"
_CLIENT_ERROR: Final = "invalid_request_error"
_FIRST_SERVER_STATUS: Final = 500


def responses_error_event(
    message: str, *, status: int, error_type: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """The Responses API's ``error`` event, without its ``sequence_number``.

    ``error_type`` overrides the ``code`` the HTTP ``status`` gives.
    """
    code = error_type or (_SERVER_ERROR if status >= _FIRST_SERVER_STATUS else _CLIENT_ERROR)
    return {w.TYPE: w.ERROR, w.CODE: code, w.MESSAGE: message, w.PARAM: param}


# Each event's keys in the order of the openai SDK's event model, the one vLLM dumps: the
# fields sorted, ``sequence_number`` (numbered in place when sent) before ``type``.
_NUMBERED: Final = 0


def _preamble(response: dict[str, Any]) -> list[dict[str, Any]]:
    started = {
        **response,
        w.STATUS: w.STATUS_IN_PROGRESS,
        w.INCOMPLETE_DETAILS: None,
        w.OUTPUT: [],
        w.USAGE: None,
    }
    return [
        {w.RESPONSE: started, w.SEQUENCE_NUMBER: _NUMBERED, w.TYPE: w.RESPONSE_CREATED},
        {w.RESPONSE: started, w.SEQUENCE_NUMBER: _NUMBERED, w.TYPE: w.RESPONSE_IN_PROGRESS},
    ]


def _item_event(kind: str, item: dict[str, Any], index: int) -> dict[str, Any]:
    return {w.ITEM: item, w.OUTPUT_INDEX: index, w.SEQUENCE_NUMBER: _NUMBERED, w.TYPE: kind}


def _opening_events(item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    opened = {**item, w.STATUS: w.STATUS_IN_PROGRESS}
    parts = item.get(w.CONTENT, [])
    if w.CONTENT in item:
        opened[w.CONTENT] = []
    if item[w.TYPE] == w.FUNCTION_CALL:
        opened[w.ARGUMENTS] = ""
    events = [_item_event(w.OUTPUT_ITEM_ADDED, opened, index)]
    for content_index, part in enumerate(parts):
        empty = {**part, w.TEXT: ""}
        if w.LOGPROBS in part:
            empty[w.LOGPROBS] = []
        events.append(
            _part_event(w.CONTENT_PART_ADDED, _at(item[w.ID], index, content_index), empty)
        )
    return events


def _full_deltas(item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    if item[w.TYPE] == w.FUNCTION_CALL:
        return [
            {
                w.DELTA: item[w.ARGUMENTS],
                w.ITEM_ID: item[w.ID],
                w.OUTPUT_INDEX: index,
                w.SEQUENCE_NUMBER: _NUMBERED,
                w.TYPE: w.FUNCTION_CALL_ARGUMENTS_DELTA,
            }
        ]
    return [
        _text_delta(
            _at(item[w.ID], index, content_index), part[w.TYPE], part[w.TEXT], part.get(w.LOGPROBS)
        )
        for content_index, part in enumerate(item.get(w.CONTENT, []))
    ]


def _closing_events(item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    events = []
    for content_index, part in enumerate(item.get(w.CONTENT, [])):
        at = _at(item[w.ID], index, content_index)
        done = {w.CONTENT_INDEX: content_index, w.ITEM_ID: item[w.ID]}
        if part[w.TYPE] == w.OUTPUT_TEXT:
            # vLLM's done event carries none: the part's own are in content_part.done.
            done[w.LOGPROBS] = []
        done[w.OUTPUT_INDEX] = index
        done[w.SEQUENCE_NUMBER] = _NUMBERED
        done[w.TEXT] = part[w.TEXT]
        done[w.TYPE] = _TEXT_EVENTS[part[w.TYPE]][1]
        events.append(done)
        events.append(_part_event(w.CONTENT_PART_DONE, at, part))
    if item[w.TYPE] == w.FUNCTION_CALL:
        events.append(
            {
                w.ARGUMENTS: item[w.ARGUMENTS],
                w.ITEM_ID: item[w.ID],
                # openai 2.x requires the name (3.x accepts it): both SDKs read the event.
                w.NAME: item[w.NAME],
                w.OUTPUT_INDEX: index,
                w.SEQUENCE_NUMBER: _NUMBERED,
                w.TYPE: w.FUNCTION_CALL_ARGUMENTS_DONE,
            }
        )
    events.append(_item_event(w.OUTPUT_ITEM_DONE, item, index))
    return events


def _at(item_id: str, index: int, content_index: int) -> tuple[int, str, int]:
    """What places an event on a content part: its content index, item id and output index."""
    return (content_index, item_id, index)


def _part_event(kind: str, at: tuple[int, str, int], part: dict[str, Any]) -> dict[str, Any]:
    content_index, item_id, index = at
    return {
        w.CONTENT_INDEX: content_index,
        w.ITEM_ID: item_id,
        w.OUTPUT_INDEX: index,
        w.PART: part,
        w.SEQUENCE_NUMBER: _NUMBERED,
        w.TYPE: kind,
    }


def _text_delta(
    at: tuple[int, str, int], part_type: str, text: str, logprobs: list[dict[str, Any]] | None
) -> dict[str, Any]:
    content_index, item_id, index = at
    event: dict[str, Any] = {w.CONTENT_INDEX: content_index, w.DELTA: text, w.ITEM_ID: item_id}
    if part_type == w.OUTPUT_TEXT:
        event[w.LOGPROBS] = _stream_logprobs(logprobs) if logprobs else []
    event[w.OUTPUT_INDEX] = index
    event[w.SEQUENCE_NUMBER] = _NUMBERED
    event[w.TYPE] = _TEXT_EVENTS[part_type][0]
    return event


def _stream_logprobs(logprobs: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    # The events' logprobs are the object's without the bytes (the SDK's streaming Logprob).
    return [
        {
            w.TOKEN: entry[w.TOKEN],
            w.LOGPROB: entry[w.LOGPROB],
            w.TOP_LOGPROBS: [
                {w.TOKEN: top[w.TOKEN], w.LOGPROB: top[w.LOGPROB]} for top in entry[w.TOP_LOGPROBS]
            ],
        }
        for entry in logprobs or ()
    ]


def _terminal_event(response: dict[str, Any], options: _options.EnvelopeOptions) -> dict[str, Any]:
    # vLLM 0.33 ends an incomplete response's stream with response.incomplete (0.32 with
    # response.completed; docs/envelopes.md).
    incomplete = response[w.STATUS] == w.STATUS_INCOMPLETE and not _options.writes_like_032(options)
    return {
        w.RESPONSE: response,
        w.SEQUENCE_NUMBER: _NUMBERED,
        w.TYPE: w.RESPONSE_INCOMPLETE if incomplete else w.RESPONSE_COMPLETED,
    }

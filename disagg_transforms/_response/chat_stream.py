"""Streaming chat clients over the generate route (``docs/responses.md``).

Two shapes, both ending in ``data: [DONE]``:

- :func:`single_frame_chat_stream` (and :func:`single_frame_chat_chunks`): a derender leg cannot
  stream on vLLM 0.33, so its whole answer becomes a short ``chat.completion.chunk`` stream:
  per choice one chunk with the full delta, then one with its finish reason; a usage-only
  chunk when the client asked.
- :class:`ChatStreamConverter`: a text-mode leg streams; generate SSE bytes go in, split
  anywhere, and ``chat.completion.chunk`` SSE bytes come out, the echo checked on every chunk.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import starmap
from typing import Any, Final

import msgspec
from msgspec import UNSET

from disagg_transforms._config import OutputMode
from disagg_transforms._response.chat import (
    chat_id,
    client_top_logprobs,
    cut_logprobs,
    finish_fields,
    require_text_mode,
)
from disagg_transforms._response.chat_wrap import wrap_chat_completion
from disagg_transforms._response.echo import as_output_mode
from disagg_transforms._response.generate_stream import (
    GenerateStreamReader,
    StreamChoice,
    StreamEvent,
)
from disagg_transforms._response.options import (
    DEFAULT_OPTIONS,
    EnvelopeOptions,
    envelope_created,
    envelope_model,
)
from disagg_transforms._routes import Route
from disagg_transforms._wire import keys as w
from disagg_transforms._wire.sse import DONE_EVENT, encode_event_json, format_sse_event
from disagg_transforms.errors import UpstreamContractError, error_body

__all__ = (
    "ChatStreamConverter",
    "single_frame_chat_chunks",
    "single_frame_chat_stream",
)

# vLLM's error ``type`` per HTTP status (its ``ErrorResponse``); other 4xx: a bad request.


class _ChunkChoice(msgspec.Struct, kw_only=True, gc=False):
    """A ``chat.completion.chunk`` choice, its members in vLLM's order (``UNSET``: left out).

    Encoded by msgspec straight from the struct: faster than a dict per chunk.
    """

    index: int
    delta: dict[str, Any]
    logprobs: Any = None
    finish_reason: str | None = None
    vllm_finish_reason: Any = UNSET
    stop_reason: Any = UNSET


_CHOICES_MEMBER: Final = b',"' + w.CHOICES.encode() + b'":'
_USAGE_MEMBER: Final = b',"' + w.USAGE.encode() + b'":'
_NO_CHOICES: Final = b"[]"
_CHUNK_END: Final = b"}\n\n"


def _finish_pair(value: str, *, passthrough: bool) -> tuple[str | None, Any]:
    # A chunk choice's finish_reason and vllm_finish_reason (UNSET: not mapped, left out).
    fields = finish_fields(value, streaming=True, passthrough=passthrough)
    return fields[w.FINISH_REASON], fields.get(w.VLLM_FINISH_REASON, UNSET)


def _include_usage(client_body: Mapping[str, Any] | None) -> bool:
    untyped: object = client_body  # the client's JSON may be any value
    options = untyped.get(w.STREAM_OPTIONS) if isinstance(untyped, Mapping) else None
    return isinstance(options, Mapping) and options.get(w.INCLUDE_USAGE) is True


def _chunk_head(completion_id: str, created: int, model: str) -> dict[str, Any]:
    return {
        w.ID: completion_id,
        w.OBJECT: w.CHAT_COMPLETION_CHUNK_OBJECT,
        w.CREATED: created,
        w.MODEL: model,
    }


def _delta(message: Mapping[str, Any]) -> dict[str, Any]:
    # A streamed tool call needs its position; the rest of the message moves across whole.
    delta = dict(message)
    tool_calls = delta.get(w.TOOL_CALLS)
    if isinstance(tool_calls, list):
        delta[w.TOOL_CALLS] = [
            {**call, w.INDEX: position} for position, call in enumerate(tool_calls)
        ]
    return delta


def single_frame_chat_chunks(
    response: Mapping[str, Any],
    *,
    requested: OutputMode,
    client_body: Mapping[str, Any] | None = None,
    options: EnvelopeOptions | None = None,
) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a single-frame stream, ``[DONE]`` excluded.

    The response is wrapped by :func:`wrap_chat_completion` (same arguments, same errors), then
    laid out as OpenAI and vLLM stream: per choice, one chunk whose ``delta`` is the whole
    message (``role``, ``content``, ``reasoning``, ``tool_calls`` each with its ``index``)
    with ``finish_reason: null``, then one with an empty delta and the ``finish_reason``
    (the openai SDK's stream helpers finish a tool call's arguments only when a later chunk
    closes it); a usage-only chunk (``choices: []``) follows when the client asked
    ``stream_options.include_usage``.
    """
    completion = wrap_chat_completion(
        response, requested=requested, client_body=client_body, options=options
    )
    head = _chunk_head(completion[w.ID], completion[w.CREATED], completion[w.MODEL])
    chunks = []
    for choice in completion[w.CHOICES]:
        opened = {
            w.INDEX: choice[w.INDEX],
            w.DELTA: _delta(choice[w.MESSAGE]),
            w.LOGPROBS: choice[w.LOGPROBS],
            w.FINISH_REASON: None,
        }
        finished = {key: value for key, value in choice.items() if key != w.MESSAGE}
        finished[w.DELTA] = {}
        finished[w.LOGPROBS] = None  # sent with the delta
        chunks.append({**head, w.CHOICES: [opened]})
        chunks.append({**head, w.CHOICES: [_ordered(finished)]})
    if _include_usage(client_body):
        chunks.append({**head, w.CHOICES: [], w.USAGE: completion.get(w.USAGE)})
    return chunks


def _ordered(choice: dict[str, Any]) -> dict[str, Any]:
    # A chunk choice's keys in vLLM's order: index, delta, then the rest as the wrap gave them.
    return {w.INDEX: choice.pop(w.INDEX), w.DELTA: choice.pop(w.DELTA), **choice}


def single_frame_chat_stream(
    response: Mapping[str, Any],
    *,
    requested: OutputMode,
    client_body: Mapping[str, Any] | None = None,
    options: EnvelopeOptions | None = None,
) -> bytes:
    """The SSE body of a single-frame stream: :func:`single_frame_chat_chunks`, then ``[DONE]``."""
    chunks = single_frame_chat_chunks(
        response, requested=requested, client_body=client_body, options=options
    )
    return b"".join(format_sse_event(chunk) for chunk in chunks) + DONE_EVENT


class ChatStreamConverter:
    """Turns a text-mode generate SSE stream into a ``chat.completion.chunk`` SSE stream.

    Feed it the leg's body bytes as they arrive (split anywhere); each call returns the SSE
    bytes to send on, possibly empty. Per generate chunk one chat chunk comes out: each choice
    gets ``role: "assistant"`` on its first delta, ``content`` is the text delta, ``logprobs``
    are cut to the client's ``top_logprobs``, finish reasons are mapped as in
    :func:`~disagg_transforms.wrap_chat_completion` (``null`` stays: not finished). A
    usage-only generate chunk becomes a usage-only chat chunk; an in-stream ``{"error": ...}``
    event is sent on byte for byte; ``[DONE]`` is sent on. Output bytes depend only on the
    input bytes, not on how they were split.

    Every chunk's ``id`` comes from the first generate chunk's ``request_id`` by the rules of
    :func:`~disagg_transforms.wrap_chat_completion` (so both give one answer one id), its
    ``model`` from ``options.model``, else the client body's ``model``, and its ``created`` is
    ``created``, else ``options.clock()`` when the converter is made (generate chunks carry
    neither a model nor a time).

    Memory per stream is bounded by ``options.max_event_bytes`` (one event) and
    ``options.max_choices`` (choice indices; a choice that appears before a lower index first
    gets the lower ones opened with a role-only delta, as vLLM's chat route sends them). After
    an error the converter is spent: discard it.

    Args:
        requested: The leg's ``output_mode``; only ``text`` streams (vLLM 0.33 refuses derender
            with ``stream: true``, and tokens carry no text).
        client_body: The client's chat request (its ``top_logprobs``, and its ``model`` as
            the fallback).
        options: How the envelope is built (:class:`EnvelopeOptions`).
        created: The ``created`` of every chunk (Unix seconds).

    Raises:
        ConfigError: ``requested`` is not ``text``.
        RequestError: the client's ``top_logprobs`` is not an integer >= -1.
        UpstreamContractError: neither the options nor the client body names a model.
    """

    __slots__ = (
        "_created",
        "_head",
        "_max_choices",
        "_model",
        "_next",
        "_passthrough",
        "_reader",
        "_top",
    )

    def __init__(
        self,
        *,
        requested: OutputMode,
        client_body: Mapping[str, Any] | None = None,
        options: EnvelopeOptions | None = None,
        created: int | None = None,
    ) -> None:
        require_text_mode(as_output_mode(requested), streaming=True)
        built = DEFAULT_OPTIONS if options is None else options
        self._top = client_top_logprobs(client_body)
        self._model = envelope_model(built, None, client_body)
        self._created = envelope_created(built, created)
        self._head: bytes | None = None  # once the first chunk names the request
        self._passthrough = built.vllm_finish_reasons
        self._reader = GenerateStreamReader(max_event_bytes=built.max_event_bytes)
        self._max_choices = built.max_choices
        self._next = 0  # choices 0.._next-1 have had their role delta

    def feed(self, data: bytes) -> bytes:
        """Consume the next bytes of the generate stream; return the chat SSE bytes they complete.

        Raises:
            UpstreamContractError: an event is not JSON, misses its echo or carries another
                ``output_mode``, is malformed (the ``param`` is its JSON path), comes after
                ``[DONE]``, or the stream exceeds a bound.
        """
        read = self._reader.feed(data)
        if len(read) == 1:  # a worker's socket reads usually hold one event: no join to make
            return self._event(*read[0])
        return b"".join(starmap(self._event, read))

    def close(self) -> bytes:
        r"""End the stream; returns what a held final ``\r`` completes (usually ``b""``).

        Raises:
            UpstreamContractError: the stream stopped mid-event or before ``data: [DONE]``
                (the worker or the connection died); the router should end the client's
                stream with :meth:`error_event`.
        """
        return b"".join(starmap(self._event, self._reader.close()))

    def error_event(
        self, message: str, *, status: int = 500, error_type: str | None = None
    ) -> bytes:
        """The chat in-stream error, as vLLM sends it: ``data: {"error": ...}``, ``[DONE]``.

        For the router to end a started stream with. The body is vLLM's ``ErrorResponse``
        (``message``, ``type``, ``param``, ``code``): ``code`` is ``status``, the HTTP status
        the error would have had before the stream started; ``error_type`` overrides the
        type vLLM gives that status (``InternalServerError``, ``BadRequestError``, ...).
        """
        body = error_body(
            Route.CHAT_COMPLETIONS, status=status, message=message, error_type=error_type
        )
        return format_sse_event(body) + DONE_EVENT

    def _first_head(self, event: StreamEvent) -> bytes:
        if not isinstance(event.request_id, str):
            msg = f"$.{w.REQUEST_ID}: the first stream chunk has no request_id"
            raise UpstreamContractError(msg, param=f"$.{w.REQUEST_ID}")
        head = _chunk_head(chat_id(event.request_id), self._created, self._model)
        # The same four members open every chunk: encoded once, "}" cut to splice in the
        # choices (see docs/performance.md).
        self._head = b"data: " + encode_event_json(head)[:-1] + _CHOICES_MEMBER
        return self._head

    def _event(self, payload: bytes, event: StreamEvent | None) -> bytes:
        if event is None:
            return DONE_EVENT
        if event.error is not UNSET:
            return b"data: " + payload + b"\n\n"  # the worker's own error, sent on as is
        head = self._head if self._head is not None else self._first_head(event)
        usage = None if event.usage is UNSET else event.usage
        if not event.choices:
            if usage is None:
                return b""
            return head + _NO_CHOICES + _USAGE_MEMBER + encode_event_json(usage) + _CHUNK_END
        choices = encode_event_json(self._choices(event.choices))
        if usage is None:
            return head + choices + _CHUNK_END
        # Continuous usage stats, as the chat route sends them.
        return head + choices + _USAGE_MEMBER + encode_event_json(usage) + _CHUNK_END

    def _start(self, index: int, path: str) -> list[_ChunkChoice]:
        # Clients (the openai SDK's accumulator among them) expect choice k to appear only
        # after choices 0..k-1, as vLLM's chat route sends them: open the skipped ones first.
        if index >= self._max_choices:
            msg = f"{path}.index: {index} is past the bound of {self._max_choices} choices"
            raise UpstreamContractError(msg, param=f"{path}.index")
        opened = [
            _ChunkChoice(index=skipped, delta={w.ROLE: w.ASSISTANT, w.CONTENT: ""})
            for skipped in range(self._next, index)
        ]
        self._next = index + 1
        return opened

    def _choices(self, choices: list[StreamChoice]) -> list[_ChunkChoice]:
        built = []
        for position, choice in enumerate(choices):
            index = choice.index
            if index < self._next:
                delta = {w.CONTENT: choice.text}
            else:
                built.extend(self._start(index, f"$.{w.CHOICES}[{position}]"))
                delta = {w.ROLE: w.ASSISTANT, w.CONTENT: choice.text}
            built_choice = _ChunkChoice(
                index=index,
                delta=delta,
                stop_reason=None if choice.stop_reason is UNSET else choice.stop_reason,
            )
            if choice.logprobs is not None and choice.logprobs is not UNSET:
                built_choice.logprobs = cut_logprobs(choice.logprobs, self._top)
            finish = choice.finish_reason
            if finish is not None and finish is not UNSET:  # null (not finished yet) stays
                built_choice.finish_reason, built_choice.vllm_finish_reason = _finish_pair(
                    finish, passthrough=self._passthrough
                )
            built.append(built_choice)
        return built

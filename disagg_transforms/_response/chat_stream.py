"""Streaming chat clients over the generate route (SPEC §5.3).

Two shapes, both ending in ``data: [DONE]``:

- :func:`single_frame_chat_stream` (and :func:`single_frame_chat_chunks`): a derender leg cannot
  stream on vLLM 0.33, so its whole answer becomes a short ``chat.completion.chunk`` stream:
  one chunk per choice with the full delta, then a usage-only chunk when the client asked.
- :class:`ChatStreamConverter`: a text-mode leg streams; generate SSE bytes go in, split
  anywhere, and ``chat.completion.chunk`` SSE bytes come out, the echo checked on every chunk.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from msgspec import UNSET

from disagg_transforms._config import OutputMode
from disagg_transforms._response.chat import (
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
from disagg_transforms._wire import keys as w
from disagg_transforms._wire.sse import DEFAULT_MAX_EVENT_BYTES, DONE_EVENT, format_sse_event
from disagg_transforms.errors import UpstreamContractError

__all__ = (
    "ChatStreamConverter",
    "DEFAULT_MAX_CHOICES",
    "DEFAULT_MAX_EVENT_BYTES",
    "single_frame_chat_chunks",
    "single_frame_chat_stream",
)

DEFAULT_MAX_CHOICES: Final = 4096
"""Default bound on the distinct choice indices one stream may carry (the converter's state)."""


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


def single_frame_chat_chunks(  # noqa: PLR0913 - the options of wrap_chat_completion, keyword-only
    response: Mapping[str, Any],
    *,
    requested: OutputMode,
    client_body: Mapping[str, Any] | None = None,
    model: str | None = None,
    clock: Callable[[], float] = time.time,
    vllm_finish_reasons: bool = False,
    reasoning_content: bool = False,
) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a single-frame stream, ``[DONE]`` excluded.

    The response is wrapped by :func:`wrap_chat_completion` (same arguments, same errors), then
    each choice becomes one chunk whose ``delta`` is the whole message (``role``, ``content``,
    ``reasoning``, ``tool_calls`` each with its ``index``) and whose ``finish_reason`` is set;
    a usage-only chunk (``choices: []``) follows when the client asked
    ``stream_options.include_usage``.
    """
    completion = wrap_chat_completion(
        response,
        requested=requested,
        client_body=client_body,
        model=model,
        clock=clock,
        vllm_finish_reasons=vllm_finish_reasons,
        reasoning_content=reasoning_content,
    )
    head = _chunk_head(completion[w.ID], completion[w.CREATED], completion[w.MODEL])
    chunks = []
    for choice in completion[w.CHOICES]:
        fields = {key: value for key, value in choice.items() if key != w.MESSAGE}
        delta = _delta(choice[w.MESSAGE])
        built = {w.INDEX: fields.pop(w.INDEX), w.DELTA: delta, **fields}
        chunks.append({**head, w.CHOICES: [built]})
    if _include_usage(client_body):
        chunks.append({**head, w.CHOICES: [], w.USAGE: completion.get(w.USAGE)})
    return chunks


def single_frame_chat_stream(  # noqa: PLR0913 - the options of wrap_chat_completion, keyword-only
    response: Mapping[str, Any],
    *,
    requested: OutputMode,
    client_body: Mapping[str, Any] | None = None,
    model: str | None = None,
    clock: Callable[[], float] = time.time,
    vllm_finish_reasons: bool = False,
    reasoning_content: bool = False,
) -> bytes:
    """The SSE body of a single-frame stream: :func:`single_frame_chat_chunks`, then ``[DONE]``."""
    chunks = single_frame_chat_chunks(
        response,
        requested=requested,
        client_body=client_body,
        model=model,
        clock=clock,
        vllm_finish_reasons=vllm_finish_reasons,
        reasoning_content=reasoning_content,
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

    Memory per stream is bounded by ``max_event_bytes`` (one event) and ``max_choices``
    (choice indices; a choice that appears before a lower index first gets the lower ones
    opened with a role-only delta, as vLLM's chat route sends them). After an error the
    converter is spent: discard it.

    Args:
        requested: The leg's ``output_mode``; only ``text`` streams (vLLM 0.33 refuses derender
            with ``stream: true``, and tokens carry no text).
        completion_id: The ``id`` of every chunk (generate chunks carry none).
        model: The ``model`` of every chunk.
        created: The ``created`` of every chunk (Unix seconds).
        client_body: The client's chat request (its ``top_logprobs``).
        vllm_finish_reasons: Pass vLLM's ``finish_reason`` through as is.
        max_event_bytes: Bound on one buffered event.
        max_choices: Bound on distinct choice indices.

    Raises:
        ConfigError: ``requested`` is not ``text``.
        RequestError: the client's ``top_logprobs`` is not an integer >= -1.
    """

    __slots__ = (
        "_head",
        "_max_choices",
        "_next",
        "_passthrough",
        "_reader",
        "_top",
    )

    def __init__(  # noqa: PLR0913 - keyword-only settings of one stream
        self,
        *,
        requested: OutputMode,
        completion_id: str,
        model: str,
        created: int,
        client_body: Mapping[str, Any] | None = None,
        vllm_finish_reasons: bool = False,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        max_choices: int = DEFAULT_MAX_CHOICES,
    ) -> None:
        require_text_mode(as_output_mode(requested), streaming=True)
        self._top = client_top_logprobs(client_body)
        self._head = _chunk_head(completion_id, created, model)
        self._passthrough = vllm_finish_reasons
        self._reader = GenerateStreamReader(max_event_bytes=max_event_bytes)
        self._max_choices = max_choices
        self._next = 0  # choices 0.._next-1 have had their role delta

    def feed(self, data: bytes) -> bytes:
        """Consume the next bytes of the generate stream; return the chat SSE bytes they complete.

        Raises:
            UpstreamContractError: an event is not JSON, misses its echo or carries another
                ``output_mode``, is malformed (the ``param`` is its JSON path), comes after
                ``[DONE]``, or the stream exceeds a bound.
        """
        return b"".join(self._event(payload, event) for payload, event in self._reader.feed(data))

    def close(self) -> bytes:
        r"""End the stream; returns what a held final ``\r`` completes (usually ``b""``).

        Raises:
            UpstreamContractError: the stream stopped mid-event or before ``data: [DONE]``
                (the worker or the connection died); the router should send the client an
                error event (:func:`~disagg_transforms.errors.openai_error_body`) and
                ``[DONE]``.
        """
        return b"".join(self._event(payload, event) for payload, event in self._reader.close())

    def _event(self, payload: bytes, event: StreamEvent | None) -> bytes:
        if event is None:
            return DONE_EVENT
        if event.error is not UNSET:
            return b"data: " + payload + b"\n\n"  # the worker's own error, sent on as is
        usage = None if event.usage is UNSET else event.usage
        if not event.choices:
            if usage is None:
                return b""
            return format_sse_event({**self._head, w.CHOICES: [], w.USAGE: usage})
        chunk = {**self._head, w.CHOICES: self._choices(event.choices)}
        if usage is not None:
            chunk[w.USAGE] = usage  # continuous usage stats, as the chat route sends them
        return format_sse_event(chunk)

    def _start(self, index: int, path: str) -> list[dict[str, Any]]:
        # Clients (the openai SDK's accumulator among them) expect choice k to appear only
        # after choices 0..k-1, as vLLM's chat route sends them: open the skipped ones first.
        if index >= self._max_choices:
            msg = f"{path}.index: {index} is past the bound of {self._max_choices} choices"
            raise UpstreamContractError(msg, param=f"{path}.index")
        opened = [
            {
                w.INDEX: skipped,
                w.DELTA: {w.ROLE: w.ASSISTANT, w.CONTENT: ""},
                w.LOGPROBS: None,
                w.FINISH_REASON: None,
            }
            for skipped in range(self._next, index)
        ]
        self._next = index + 1
        return opened

    def _choices(self, choices: list[StreamChoice]) -> list[dict[str, Any]]:
        built = []
        for position, choice in enumerate(choices):
            delta: dict[str, Any] = {}
            if choice.index >= self._next:
                built.extend(self._start(choice.index, f"$.{w.CHOICES}[{position}]"))
                delta[w.ROLE] = w.ASSISTANT
            delta[w.CONTENT] = choice.text
            built.append(
                {
                    w.INDEX: choice.index,
                    w.DELTA: delta,
                    w.LOGPROBS: cut_logprobs(
                        None if choice.logprobs is UNSET else choice.logprobs, self._top
                    ),
                    **finish_fields(
                        choice.finish_reason, streaming=True, passthrough=self._passthrough
                    ),
                    w.STOP_REASON: None if choice.stop_reason is UNSET else choice.stop_reason,
                }
            )
        return built

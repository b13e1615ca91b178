"""The client's reply built from the decode answer: the one place that calls the envelopes.

Which envelope a client gets follows from its route, the leg's route and mode, and streaming
(``docs/exchange.md``, "Which reply"): one row per client route (:data:`REPLY_SHAPES`), one
small function per shape for a whole answer, one relay per shape for a stream. Every call to a
wrap, a single frame or a stream converter is in this module.
"""

from __future__ import annotations

import enum
import re
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, NamedTuple, Protocol, TypeAlias

import msgspec
from msgspec import UNSET

from disagg_transforms._config import OutputMode
from disagg_transforms._engines.description import StreamReader
from disagg_transforms._request.client import ClientRequest
from disagg_transforms._request.legs import DecodeLeg
from disagg_transforms._response.chat import wrap_chat_completion_bytes
from disagg_transforms._response.dispatch import (
    ENVELOPE_ROUTES,
    StreamConverter,
    single_frame_stream,
    stream_converter,
    wrap_envelope,
)
from disagg_transforms._response.echo import check_echoed_mode, check_output_mode_echo
from disagg_transforms._response.generate_stream import GenerateStreamReader, StreamEvent
from disagg_transforms._response.options import DEFAULT_OPTIONS, EnvelopeOptions
from disagg_transforms._response.responses import responses_error_event
from disagg_transforms._routes import Route
from disagg_transforms._wire import keys as w
from disagg_transforms._wire import raw as _raw
from disagg_transforms._wire.limits import DEFAULT_LIMITS, check_body_size
from disagg_transforms._wire.sse import (
    DEFAULT_MAX_EVENT_BYTES,
    DONE_EVENT,
    EVENT_END,
    SseParser,
    format_sse_event,
    format_sse_typed_event,
)
from disagg_transforms.errors import UpstreamContractError, error_body

__all__ = (
    "DEFAULT_MAX_EVENT_BYTES",
    "REPLY_SHAPES",
    "EngineRelay",
    "Relay",
    "Shape",
    "decode_object",
    "envelope_client",
    "reply_shape",
    "stream_relay",
    "whole_reply",
)

JSON = "application/json"
SSE = "text/event-stream"

# What a generate envelope carries that no client of another route may see (internal hosts,
# the engine's ids, the prompt's token IDs).
_GENERATE_ONLY = (w.KV_TRANSFER_PARAMS, w.EC_TRANSFER_PARAMS, w.TOKEN_IDS, w.REQUEST_ID)
_TRANSFER = (w.KV_TRANSFER_PARAMS, w.EC_TRANSFER_PARAMS)


class Shape(enum.Enum):
    """The envelope a client gets from the decode answer."""

    PASS = "pass"  # noqa: S105 - not a secret
    """The leg spoke the client's own OpenAI-style route: the answer, minus transfer params."""
    GENERATE = "generate"
    """The generate envelope unchanged (a generate client)."""
    ENVELOPE = "envelope"
    """The client API's envelope rebuilt from the generate answer (``_response/dispatch.py``)."""
    UNWRAPPED = "unwrapped"
    """A chat client over the generate route with ``wrap_chat_completion`` off: the generate
    envelope minus its generate-only keys."""


REPLY_SHAPES: Mapping[Route, Shape] = {
    **dict.fromkeys(ENVELOPE_ROUTES, Shape.ENVELOPE),
    # resolve_format keeps a completions client on its own route: this row is never read today.
    Route.COMPLETIONS: Shape.GENERATE,
    Route.GENERATE: Shape.GENERATE,
}
"""One row per client route: the envelope it gets when its decode leg speaks the generate route.

The rebuilt envelopes are the dispatch tables' routes; no route falls back to another's.
"""


def reply_shape(client_route: Route, leg_route: Route, *, wrap: bool) -> Shape:
    """The envelope for a client of ``client_route`` whose decode leg speaks ``leg_route``."""
    if leg_route is not Route.GENERATE:
        return Shape.PASS
    shape = REPLY_SHAPES[client_route]
    if shape is Shape.ENVELOPE and client_route is Route.CHAT_COMPLETIONS and not wrap:
        return Shape.UNWRAPPED
    return shape


class _Object(msgspec.Struct):
    """The narrowest view of an answer: a JSON object, with its echo when it has one."""

    output_mode: Any = UNSET


def decode_object(data: bytes, what: str) -> dict[str, Any]:
    """A worker's answer as a JSON object; anything else breaks the contract."""
    check_body_size(data, DEFAULT_LIMITS, error=UpstreamContractError)
    try:
        value = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError) as error:
        msg = f"$: {what} is not valid JSON: {error}"
        raise UpstreamContractError(msg, param="$") from None
    if not isinstance(value, dict):
        msg = f"$: {what} must be a JSON object"
        raise UpstreamContractError(msg, param="$")
    return value


def _without_generate_only(answer: Mapping[str, Any]) -> dict[str, Any]:
    result = {k: v for k, v in answer.items() if k not in _GENERATE_ONLY}
    choices = result.get(w.CHOICES)
    if isinstance(choices, list):
        result[w.CHOICES] = [
            {k: v for k, v in c.items() if k != w.TOKEN_IDS} if isinstance(c, dict) else c
            for c in choices
        ]
    return result


def _frame(body: bytes) -> bytes:
    return b"data: " + body + b"\n\n" + DONE_EVENT


Hook: TypeAlias = Callable[[dict[str, Any]], dict[str, Any]]
"""The host's response transforms, run on a JSON reply."""


class _Whole(NamedTuple):
    """A non-streamed decode answer and what its reply is built with."""

    answer: bytes
    mode: OutputMode
    single_frame: bool
    client_route: Route
    client_body: Mapping[str, Any]
    hook: Hook | None
    options: EnvelopeOptions


# The leg's sampling values a Responses envelope echoes, by the client key they stand for.
_RAN_WITH: Final = (
    (w.TEMPERATURE, w.TEMPERATURE),
    (w.TOP_P, w.TOP_P),
    (w.MAX_TOKENS, w.MAX_OUTPUT_TOKENS),
)


def envelope_client(client: ClientRequest, leg: DecodeLeg) -> ClientRequest:
    """The client request an envelope is built with: a Responses client's, with what its leg ran.

    vLLM's ``response`` reports the sampling values the engine ran with (``temperature``,
    ``top_p``, ``max_output_tokens``: the model's defaults and the context's room where the
    client set none), which the generate leg carries, render's values under the client's own
    (docs/envelopes.md). Other clients, and legs on the client's own route, are left as they are.
    """
    if client.route is not Route.RESPONSES or leg.output_mode is None:
        return client
    sampling = leg.body.get(w.SAMPLING_PARAMS)
    if not isinstance(sampling, Mapping):
        return client
    ran = {echo: sampling[key] for key, echo in _RAN_WITH if key in sampling}
    if not ran:
        return client
    return msgspec.structs.replace(client, body={**client.body, **ran})


def _hooked(whole: _Whole, body: dict[str, Any]) -> bytes:
    return _raw.encode(body if whole.hook is None else whole.hook(body))


def _pass_reply(whole: _Whole) -> tuple[bytes, str]:
    if whole.hook is not None:
        answer = decode_object(whole.answer, "the decode answer")
        return _hooked(whole, {k: v for k, v in answer.items() if k not in _TRANSFER}), JSON
    members = _raw.split(whole.answer, UpstreamContractError, "the decode answer")
    if not any(key in members for key in _TRANSFER):
        return whole.answer, JSON
    return _raw.encode({k: v for k, v in members.items() if k not in _TRANSFER}), JSON


def _generate_reply(whole: _Whole) -> tuple[bytes, str]:
    if whole.hook is None or whole.single_frame:
        try:
            view = msgspec.json.decode(whole.answer, type=_Object)
        except (msgspec.DecodeError, RecursionError) as error:
            msg = f"$: the decode answer is not a JSON object: {error}"
            raise UpstreamContractError(msg, param="$") from None
        check_echoed_mode(view.output_mode, whole.mode)
        return (_frame(whole.answer), SSE) if whole.single_frame else (whole.answer, JSON)
    answer = decode_object(whole.answer, "the decode answer")
    check_output_mode_echo(answer, whole.mode)
    return _hooked(whole, answer), JSON


def _unwrapped_reply(whole: _Whole) -> tuple[bytes, str]:
    answer = decode_object(whole.answer, "the decode answer")
    check_output_mode_echo(answer, whole.mode)
    if whole.single_frame:
        return _frame(_raw.encode(_without_generate_only(answer))), SSE
    return _hooked(whole, _without_generate_only(answer)), JSON


def _envelope_reply(whole: _Whole) -> tuple[bytes, str]:
    route, mode, client_body = whole.client_route, whole.mode, whole.client_body
    options = whole.options
    if route is Route.CHAT_COMPLETIONS and not whole.single_frame and whole.hook is None:
        return wrap_chat_completion_bytes(
            whole.answer, requested=mode, client_body=client_body, options=options
        ), JSON
    answer = decode_object(whole.answer, "the decode answer")
    if whole.single_frame:
        frame = single_frame_stream(
            route, answer, requested=mode, client_body=client_body, options=options
        )
        return frame, SSE
    return _hooked(
        whole,
        wrap_envelope(route, answer, requested=mode, client_body=client_body, options=options),
    ), JSON


_WHOLE_REPLIES: Mapping[Shape, Callable[[_Whole], tuple[bytes, str]]] = {
    Shape.PASS: _pass_reply,
    Shape.GENERATE: _generate_reply,
    Shape.UNWRAPPED: _unwrapped_reply,
    Shape.ENVELOPE: _envelope_reply,
}


def whole_reply(  # noqa: PLR0913 - the answer and what the exchange knows of it, by keyword
    shape: Shape,
    answer: bytes,
    *,
    leg: DecodeLeg,
    client: ClientRequest,
    hook: Hook | None,
    cached_tokens: int | None = None,
    vllm_version: str | None = None,
) -> tuple[bytes, str]:
    """The client's body and content type for ``leg``'s non-streamed answer.

    The leg says the mode it asked for and whether the client streams (a single frame).
    ``hook`` runs the host's response transforms on a JSON reply (never on a single frame).
    ``cached_tokens``: the prefill's count, written into the answer's usage first.
    ``vllm_version``: the workers' release, whose layout a rebuilt envelope takes.

    Raises:
        UpstreamContractError: the answer is not JSON, not an object, or breaks the contract.
    """
    if cached_tokens is not None:
        answer = with_cached_tokens(answer, cached_tokens, leg.route)
    whole = _Whole(
        answer=answer,
        mode=leg.output_mode or OutputMode.TEXT,
        single_frame=leg.single_frame,
        client_route=client.route,
        client_body=client.body,
        hook=hook,
        options=DEFAULT_OPTIONS
        if vllm_version is None
        else EnvelopeOptions(vllm_version=vllm_version),
    )
    return _WHOLE_REPLIES[shape](whole)


class CachedCount(NamedTuple):
    """Where one route's answers report the prompt's size and its cached part."""

    prompt: str
    """The prompt's count in ``usage``."""
    details: str | None
    """The object in ``usage`` that holds the cached count; ``None``: ``usage`` itself."""
    cached: str
    """The cached count's key."""
    prompt_has_cached: bool
    """Whether the prompt's count includes the cached part (Anthropic's leaves it out)."""
    stream_usages: tuple[tuple[str, ...], ...]
    """Where a stream event of the route carries the usage a client reads the cached count in,
    as key paths."""
    final_usage_only: bool = False
    """Streams: only a usage-only event (``choices: []``) holds the prompt's details; the
    continuous usage of a choice's event has none (vLLM writes it so)."""


_NO_CHOICES: Final = b"[]"

_OPENAI_COUNT = CachedCount(
    prompt=w.PROMPT_TOKENS,
    details=w.PROMPT_TOKENS_DETAILS,
    cached=w.CACHED_TOKENS,
    prompt_has_cached=True,
    stream_usages=((w.USAGE,),),
    final_usage_only=True,
)
CACHED_COUNTS: Mapping[Route, CachedCount] = {
    Route.GENERATE: _OPENAI_COUNT,
    Route.CHAT_COMPLETIONS: _OPENAI_COUNT,
    Route.COMPLETIONS: _OPENAI_COUNT,
    Route.RESPONSES: CachedCount(
        prompt=w.INPUT_TOKENS,
        details=w.INPUT_TOKENS_DETAILS,
        cached=w.CACHED_TOKENS,
        prompt_has_cached=True,
        # response.completed's (created and in_progress carry a null usage).
        stream_usages=((w.RESPONSE, w.USAGE),),
    ),
    Route.MESSAGES: CachedCount(
        prompt=w.INPUT_TOKENS,
        details=None,
        cached=w.CACHE_READ_INPUT_TOKENS,
        prompt_has_cached=False,
        # message_delta's, which the SDK keeps (vLLM's message_start counts the whole prompt
        # as input and names no cache count).
        stream_usages=((w.USAGE,),),
    ),
}
"""One row per route an answer speaks: where its usage holds the cached-prompt count."""


def _count(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None


def cached_tokens_of(usage: object, route: Route) -> int | None:
    """The cached-prompt count of an answer on ``route`` whose usage is ``usage``, when known."""
    if not isinstance(usage, dict):
        return None
    place = CACHED_COUNTS[route]
    details = usage if place.details is None else usage.get(place.details)
    return _count(details.get(place.cached)) if isinstance(details, dict) else None


def _set_cached(usage: dict[str, Any], place: CachedCount, cached_tokens: int) -> bool:
    """Write ``cached_tokens`` (at most the prompt) into ``usage``; whether it had a prompt."""
    counted = _count(usage.get(place.prompt))
    if counted is None:
        return False
    if place.prompt_has_cached:
        cached = min(cached_tokens, counted)
    else:
        # Anthropic's two input counts add up to the prompt: the uncached rest moves with it.
        prompt = counted + (_count(usage.get(place.cached)) or 0)
        cached = min(cached_tokens, prompt)
        usage[place.prompt] = prompt - cached
    if place.details is None:
        usage[place.cached] = cached
        return True
    details = usage.get(place.details)
    usage[place.details] = {**(details if isinstance(details, dict) else {}), place.cached: cached}
    return True


def _patched_at(
    payload: bytes,
    path: tuple[str, ...],
    place: CachedCount,
    cached_tokens: int,
    *,
    final_only: bool = False,
) -> bytes | None:
    """``payload`` with the usage at key path ``path`` patched, its other members' bytes kept.

    ``None`` when there is no usage with a prompt's count there.
    """
    try:
        members = msgspec.json.decode(payload, type=dict[str, msgspec.Raw])
        if path[0] not in members:
            return None
        if final_only and bytes(members.get(w.CHOICES, _NO_CHOICES)) != _NO_CHOICES:
            return None  # a choice's event: its continuous usage names no details
        inner = bytes(members[path[0]])
        if len(path) > 1:
            patched = _patched_at(inner, path[1:], place, cached_tokens)
        else:
            usage = msgspec.json.decode(inner)
            ok = isinstance(usage, dict) and _set_cached(usage, place, cached_tokens)
            patched = _raw.encode(usage) if ok else None
    except (msgspec.DecodeError, RecursionError):
        return None
    if patched is None:
        return None
    members[path[0]] = msgspec.Raw(patched)
    return _raw.encode(members)


def with_cached_tokens(payload: bytes, cached_tokens: int, route: Route) -> bytes:
    """``payload`` (an answer on ``route``) with its usage's cached count ``cached_tokens``.

    After prefill and decode the prompt was computed on the prefill worker: its count is the
    one a single vLLM server would report (docs/exchange.md, "Cached tokens"). Only a usage
    with its prompt's count is patched, at most to the prompt's size. Anything else, a body
    that is not JSON included, is returned as it is, for the envelope to judge.
    """
    return _with_cached(payload, cached_tokens, CACHED_COUNTS[route], ((w.USAGE,),))


def _with_cached(
    payload: bytes,
    cached_tokens: int,
    place: CachedCount,
    paths: tuple[tuple[str, ...], ...],
    *,
    final_only: bool = False,
) -> bytes:
    """``payload`` with the first usage found at a key path of ``paths`` patched."""
    for path in paths:
        patched = _patched_at(payload, path, place, cached_tokens, final_only=final_only)
        if patched is not None:
            return patched
    return payload


class _CachedTokensRelay:
    """A relay whose worker events have the prefill's cached-prompt count in their usage.

    Events are handed on whole (a cut one is held until it ends, as every relay holds it); only
    an event that names its route's prompt count is decoded.
    """

    __slots__ = ("_cached", "_held", "_inner", "_mark", "_place")

    def __init__(self, inner: Relay, cached_tokens: int, route: Route) -> None:
        self._inner = inner
        self._cached = cached_tokens
        self._place = CACHED_COUNTS[route]
        self._mark = b'"' + self._place.prompt.encode() + b'"'
        self._held = b""

    @property
    def worker_error(self) -> bool:
        return self._inner.worker_error

    def feed(self, data: bytes) -> bytes:
        held = self._held + data
        end = _last_event_end(held)
        if not end:
            if len(held) <= DEFAULT_MAX_EVENT_BYTES:
                self._held = held
                return b""
            end = len(held)  # an event grown past the bound: the relay refuses it
        self._held = held[end:]
        return self._inner.feed(self._patched(held[:end]))

    def _patched(self, events: bytes) -> bytes:
        mark = self._mark
        if mark not in events:
            return events
        lines = events.split(_LF)
        for at, line in enumerate(lines):
            if line.startswith(_DATA_PREFIX) and mark in line:
                cr = line.endswith(_CR)
                payload = line[_DATA_PREFIX_SIZE : -1 if cr else None]
                place = self._place
                patched = _with_cached(
                    payload,
                    self._cached,
                    place,
                    place.stream_usages,
                    final_only=place.final_usage_only,
                )
                lines[at] = _DATA_PREFIX + patched + (_CR if cr else b"")
        return _LF.join(lines)

    def close(self) -> bytes:
        rest, self._held = self._held, b""
        out = self._inner.feed(rest) if rest else b""
        return out + self._inner.close()

    def error_event(self, message: str, *, status: int = 500) -> bytes:
        return self._inner.error_event(message, status=status)


def _last_event_end(data: bytes) -> int:
    """Where the last whole SSE event of ``data`` ends; 0 when none does."""
    if data.find(_CR) < 0:  # vLLM's framing
        return data.rfind(_LF2) + 2 if _LF2 in data else 0
    ends = [match.end() for match in EVENT_END.finditer(data)]
    return ends[-1] if ends else 0


class Relay(Protocol):
    """Worker stream bytes in (split anywhere), the client's stream bytes out."""

    def feed(self, data: bytes) -> bytes:
        """The client bytes ``data`` completes."""
        ...

    def close(self) -> bytes:
        """End of the worker's stream; raises ``UpstreamContractError`` when it was cut."""
        ...

    def error_event(self, message: str, *, status: int = 500) -> bytes:
        """The client API's in-stream error event that ends a started stream."""
        ...

    @property
    def worker_error(self) -> bool:
        """Whether the worker's stream carried its own in-stream error event."""
        ...


class EngineRelay:
    """A relay behind an engine's stream reader: the worker's stream read as generate SSE first.

    An SGLang stream becomes the generate SSE every converter reads (``docs/sglang.md``).
    """

    __slots__ = ("_plain", "_reader", "_relay")

    def __init__(self, reader: StreamReader, relay: Relay) -> None:
        self._reader = reader
        self._relay = relay
        # A converter writes a plain chunk from its text: no generate SSE made and read again.
        self._plain: Callable[[str], bytes | None] = (
            relay.plain_chunk if isinstance(relay, StreamConverter) else _no_plain_chunk
        )

    def feed(self, data: bytes) -> bytes:
        return self._relay.feed(self._reader.feed(data))

    def feed_each(self, data: bytes) -> Iterator[bytes]:
        """The client bytes of each event ``data`` completes; a broken event raises when reached.

        The engine's reader cuts the worker's reads into events itself: the exchange does not
        cut them first (a cumulative stream's events are tens of KB, docs/performance.md).
        """
        reader, feed, plain = self._reader, self._relay.feed, self._plain
        for event in reader.feed_each(data):
            if isinstance(event, str):  # a plain chunk's text delta
                out = plain(event)
                yield feed(reader.plain_event(event)) if out is None else out
            else:
                yield feed(event)

    def close(self) -> bytes:
        return self._relay.feed(self._reader.close()) + self._relay.close()

    def error_event(self, message: str, *, status: int = 500) -> bytes:
        return self._relay.error_event(message, status=status)

    @property
    def worker_error(self) -> bool:
        return self._relay.worker_error


def _no_plain_chunk(text: str) -> None:
    """A relay that is no converter reads every chunk as generate SSE."""
    del text


def _chat_style_error(message: str, status: int) -> bytes:
    """VLLM's in-stream error on its OpenAI routes and generate: the error body, then [DONE]."""
    body = error_body(Route.CHAT_COMPLETIONS, status=status, message=message)
    return format_sse_event(body) + DONE_EVENT


def _check_started(*, started: bool) -> None:
    if not started:
        msg = "$: the stream sent data: [DONE] before any event"
        raise UpstreamContractError(msg, param="$")


class _GenerateRelay:
    """A generate stream sent on as generate events, each checked; stripped for a chat client."""

    __slots__ = ("_reader", "_started", "_strip", "worker_error")

    def __init__(self, *, strip: bool, mode: OutputMode) -> None:
        self._reader = GenerateStreamReader(max_event_bytes=DEFAULT_MAX_EVENT_BYTES, mode=mode)
        self._strip = strip
        self._started = False
        self.worker_error = False
        """The worker sent its own in-stream error event."""

    def _write(self, payload: bytes, event: StreamEvent | None) -> bytes:
        if event is None:
            _check_started(started=self._started)
            return DONE_EVENT
        self._started = True
        if event.error is not UNSET:
            self.worker_error = True
        if self._strip:
            payload = _raw.encode(_without_generate_only(decode_object(payload, "a stream chunk")))
        return b"data: " + payload + b"\n\n"

    def feed(self, data: bytes) -> bytes:
        return b"".join(self._write(p, e) for p, e in self._reader.feed(data))

    def close(self) -> bytes:
        return b"".join(self._write(p, e) for p, e in self._reader.close())

    def error_event(self, message: str, *, status: int = 500) -> bytes:
        return _chat_style_error(message, status)


class _Event(msgspec.Struct, gc=False):
    """What a relayed event is read for: that it is a JSON object, and how a stream ends."""

    type: Any = UNSET
    error: Any = UNSET
    sequence_number: Any = UNSET


_EVENT_DECODER = msgspec.json.Decoder(_Event)
# The events that end a stream of a named-event API, as vLLM sends them; "[DONE]" ends every
# stream that has it.
_LAST_EVENTS: Mapping[Route, frozenset[str]] = {
    Route.RESPONSES: frozenset(
        {w.RESPONSE_COMPLETED, w.RESPONSE_INCOMPLETE, w.RESPONSE_FAILED, w.ERROR}
    ),
    Route.MESSAGES: frozenset({w.MESSAGE_STOP, w.ERROR}),
}
_WORKER_ERRORS = frozenset({w.ERROR, w.RESPONSE_FAILED})


class _PassRelay:
    """The worker's own stream on the client's route: its bytes, released whole events at a time.

    Each released event is checked (its ``data`` a JSON object, or ``[DONE]`` last), and the
    stream must end as the API ends one. Holding a cut event back keeps the client's stream
    well-framed when an error event must follow it.
    """

    __slots__ = (
        "_done",
        "_ended",
        "_held",
        "_last",
        "_parser",
        "_route",
        "_sequence",
        "_started",
        "worker_error",
    )

    def __init__(self, route: Route) -> None:
        self._route = route
        self._held = b""
        self._parser = SseParser(max_event_bytes=DEFAULT_MAX_EVENT_BYTES)
        self._done = False  # [DONE] came
        self._ended = False  # the API's last event came
        self._started = False  # an event came
        self._last = _LAST_EVENTS.get(route)
        self._sequence = 0  # a Responses error event's sequence_number
        self.worker_error = False
        """The worker sent its own in-stream error event."""

    def feed(self, data: bytes) -> bytes:
        held = self._held + data
        if (
            held.startswith(_DATA_PREFIX)
            and held.find(_LF) == len(held) - 2
            and held[-2:] == _LF2
            and held.find(_CR) < 0
        ):
            # One event in vLLM's framing, "data: <payload>\n\n", checked without the parser:
            # the relay's per-event cost (see docs/performance.md).
            self._held = b""
            self._check(held[_DATA_PREFIX_SIZE:-2])
            return held
        ends = [match.end() for match in EVENT_END.finditer(held)]
        end = ends[-1] if ends else 0
        self._held = held[end:]
        if len(self._held) > DEFAULT_MAX_EVENT_BYTES:
            msg = f"$: a server-sent event grew past {DEFAULT_MAX_EVENT_BYTES} bytes without ending"
            raise UpstreamContractError(msg, param="$")
        if not end:
            return b""
        events = held[:end]
        payloads = self._parser.feed(events)
        if len(payloads) < len(ends):  # an event without data: only comments and fields may be
            _check_fields(events)
        for payload in payloads:
            self._check(payload)
        return events

    def _check(self, payload: bytes) -> None:
        if self._done:
            msg = "$: the stream sent an event after data: [DONE]"
            raise UpstreamContractError(msg, param="$")
        if payload == w.SSE_DONE:
            _check_started(started=self._started)
            self._done = True
            return
        self._started = True
        try:
            event = _EVENT_DECODER.decode(payload)
        except (msgspec.DecodeError, RecursionError) as error:
            msg = f"$: a stream event is not a JSON object: {error}"
            raise UpstreamContractError(msg, param="$") from None
        if event.error is not UNSET or event.type in _WORKER_ERRORS:
            self.worker_error = True
        if self._last is not None:
            if type(event.sequence_number) is int:
                self._sequence = event.sequence_number + 1
            self._ended = self._ended or event.type in self._last

    def close(self) -> bytes:
        rest, self._held = self._held, b""
        if rest.strip():
            msg = "$: the stream ended in the middle of an event"
            raise UpstreamContractError(msg, param="$")
        if not (self._done or self._ended):
            end = "data: [DONE]" if self._last is None else "its last event"
            msg = f"$: the stream ended without {end}"
            raise UpstreamContractError(msg, param="$")
        return b""

    def error_event(self, message: str, *, status: int = 500) -> bytes:
        if self._route is Route.RESPONSES:
            event = responses_error_event(message, status=status)
            event[w.SEQUENCE_NUMBER] = self._sequence
            return format_sse_typed_event(w.ERROR, event)
        if self._route is Route.MESSAGES:
            body = error_body(Route.MESSAGES, status=status, message=message)
            return format_sse_typed_event(w.ERROR, body)
        return _chat_style_error(message, status)


_DATA_PREFIX: Final = b"data: "
_DATA_PREFIX_SIZE: Final = len(_DATA_PREFIX)
_LF: Final = b"\n"
_LF2: Final = b"\n\n"
_CR: Final = b"\r"
_FIELD = re.compile(rb"(?:|data|event|id|retry)(?::|$)")


def _check_fields(events: bytes) -> None:
    """Every line of ``events`` is an SSE field or comment (not, say, an HTML page)."""
    for line in events.splitlines():
        if line and not _FIELD.match(line):
            shown = line[:80].decode("utf-8", "replace")
            msg = f"$: the stream is not server-sent events: {shown!r}"
            raise UpstreamContractError(msg, param="$")


def stream_relay(  # noqa: PLR0913 - the shape and what the exchange knows, by keyword
    shape: Shape,
    *,
    client: ClientRequest,
    requested: OutputMode | None,
    model: object,
    clock: Callable[[], float] = time.time,
    cached_tokens: int | None = None,
    vllm_version: str | None = None,
) -> Relay:
    """The relay of a streamed decode leg for ``shape``.

    Args:
        shape: the envelope (:func:`reply_shape`).
        client: the client's request (its API: the envelope :attr:`Shape.ENVELOPE` rebuilds, the
            error event of a relayed stream).
        requested: the leg's ``output_mode`` (``None``: an OpenAI-format leg).
        model: the model to report when the client named none (the render answer's): stream
            chunks carry none.
        clock: gives ``created``.
        cached_tokens: the prefill's count, written into the worker's usage events first.
        vllm_version: the workers' release, whose layout a rebuilt envelope takes.
    """
    options = EnvelopeOptions(clock=clock, vllm_version=vllm_version)
    relay = _stream_relay(shape, client=client, requested=requested, model=model, options=options)
    if cached_tokens is None:
        return relay
    # Only a relayed stream speaks the client's route; every other shape reads generate events.
    route = client.route if shape is Shape.PASS else Route.GENERATE
    return _CachedTokensRelay(relay, cached_tokens, route)


def _stream_relay(
    shape: Shape,
    *,
    client: ClientRequest,
    requested: OutputMode | None,
    model: object,
    options: EnvelopeOptions,
) -> Relay:
    mode = requested or OutputMode.TEXT
    client_body = client.body
    if shape is Shape.ENVELOPE:
        named = client_body.get(w.MODEL)
        fallback = model if isinstance(model, str) and not isinstance(named, str) else None
        return stream_converter(
            client.route,
            requested=mode,
            client_body=client_body,
            options=msgspec.structs.replace(options, model=fallback),
        )
    if shape is Shape.PASS:
        return _PassRelay(client.route)
    return _GenerateRelay(strip=shape is Shape.UNWRAPPED, mode=mode)

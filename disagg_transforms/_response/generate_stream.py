"""Reading a text-mode generate SSE stream: the rules every streaming converter shares.

:class:`GenerateStreamReader` turns the leg's body bytes (split anywhere) into checked events:
``[DONE]`` recognised and required last, each chunk decoded through a narrow view, the
``output_mode`` echo checked on every chunk, usage, choices and logprobs validated. An in-stream
``{"error": ...}`` event comes out unchecked (it carries no echo). The chat converter sends
chunks on; :class:`NamedEventConverter` is the driver of the Responses and Anthropic
converters, whose clients get named events instead.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import msgspec
from msgspec import UNSET, UnsetType

from disagg_transforms._config import OutputMode
from disagg_transforms._response.choices import choice_path, contract_error, require_text_mode
from disagg_transforms._response.echo import as_output_mode, check_echoed_mode
from disagg_transforms._response.options import DEFAULT_OPTIONS, EnvelopeOptions, envelope_model
from disagg_transforms._response.turn import AssistantTurn, base_id
from disagg_transforms._wire import keys as w
from disagg_transforms._wire.describe import describe
from disagg_transforms._wire.sse import SseParser, encode_event_json
from disagg_transforms._wire.validate import CONVERT_ERRORS
from disagg_transforms.envelopes import ChatLogprobs, Usage
from disagg_transforms.errors import UpstreamContractError


class StreamChoice(msgspec.Struct, kw_only=True, gc=False):
    """Narrow view of a stream choice: the token_ids delta and the other keys stay undecoded.

    ``gc=False`` (as :class:`StreamEvent`): decoded JSON holds no cycle, and untracked structs
    are cheaper to make and free, once per chunk (see ``docs/performance.md``).
    """

    index: int
    text: str | UnsetType = UNSET
    finish_reason: str | UnsetType | None = UNSET
    stop_reason: int | str | UnsetType | None = UNSET
    logprobs: dict[str, Any] | UnsetType | None = UNSET
    token_ids: msgspec.Raw | UnsetType = UNSET  # passed on undecoded when the client asked


class StreamEvent(msgspec.Struct, kw_only=True, gc=False):
    """Narrow view of a generate stream chunk (or of an in-stream error event)."""

    request_id: Any = UNSET
    output_mode: Any = UNSET
    object: Any = UNSET  # a client API's chunk: not a generate stream at all
    error: Any = UNSET
    usage: dict[str, Any] | UnsetType | None = UNSET
    prompt_token_ids: msgspec.Raw | UnsetType = UNSET  # passed on undecoded when asked
    choices: list[StreamChoice] | UnsetType = UNSET
    """Never ``UNSET`` in a chunk the reader returns (only in an error event)."""


_EVENT_DECODER = msgspec.json.Decoder(StreamEvent)

PLAIN_SLOT: Final = "\x00plain\x00"
"""A marker text, put where a plain chunk's values go in an event built once per stream (the
rest of such an event is the converter's own ids and names, never this text)."""
_PLAIN_SLOT_JSON: Final = encode_event_json(PLAIN_SLOT)


def cut_at_slots(event: bytes) -> list[bytes]:
    """An event's bytes cut around each :data:`PLAIN_SLOT` (one per value that varies).

    Built once per stream: a plain chunk's event is the pieces joined with its values encoded.
    """
    return event.split(_PLAIN_SLOT_JSON)


def with_text(pieces: Sequence[bytes], text: str) -> bytes:
    """A plain chunk's event of one slot (:func:`cut_at_slots`), its text encoded in it."""
    before, after = pieces
    return before + encode_event_json(text) + after


ReadEvent = tuple[bytes, StreamEvent | None]
"""An event's raw ``data`` payload and its view; ``None`` is ``[DONE]``."""


class GenerateStreamReader:
    """Generate SSE bytes in, checked events out (see the module docstring).

    Memory is bounded by ``max_event_bytes`` (one buffered event).
    """

    __slots__ = ("_done", "_mode", "_parser", "_wire")

    def __init__(self, *, max_event_bytes: int, mode: OutputMode = OutputMode.TEXT) -> None:
        self._parser = SseParser(max_event_bytes=max_event_bytes)
        self._done = False
        self._mode = mode
        """The mode asked for: ``text`` (every converter), or a generate client's own
        ``tokens`` (its stream relayed, checked against its own mode)."""
        self._wire: str = mode.value  # read per chunk: a member's .value costs a descriptor call

    def feed(self, data: bytes) -> list[ReadEvent]:
        """The events ``data`` completes, in order.

        Raises:
            UpstreamContractError: an event is not JSON, misses its echo or carries another
                ``output_mode``, is malformed (the ``param`` is its JSON path), comes after
                ``[DONE]``, or grew past ``max_event_bytes``.
        """
        return [self._read(payload) for payload in self._parser.feed(data)]

    def feed_text(self, data: bytes) -> str | list[ReadEvent]:
        """As :meth:`feed`; when ``data`` is exactly one plain chunk, its text delta alone.

        A plain chunk is most of a stream: one choice, index 0, a non-empty text delta,
        ``logprobs`` null, no finish reason, no usage (token IDs and the rest are not read). A
        converter in its steady state writes it from bytes made once per stream
        (docs/performance.md, "Streams"); any other event takes the general path.

        Raises:
            UpstreamContractError: as :meth:`feed`.
        """
        payloads = self._parser.feed(data)
        if len(payloads) != 1:
            return [self._read(payload) for payload in payloads]
        payload = payloads[0]
        event = self._decode(payload)
        if event is not None and event.error is UNSET:
            text = _check_chunk(event, self._mode, self._wire)
            if text is not None:
                return text
        return [(payload, event)]

    def close(self) -> list[ReadEvent]:
        r"""End of the stream: the event a held final ``\r`` completes, if any.

        Raises:
            UpstreamContractError: the stream stopped mid-event or before ``data: [DONE]``.
        """
        tail = [self._read(payload) for payload in self._parser.close()]
        if not self._done:
            msg = "$: the generate stream ended without data: [DONE]"
            raise UpstreamContractError(msg, param="$")
        return tail

    def _read(self, payload: bytes) -> ReadEvent:
        event = self._decode(payload)
        if event is not None and event.error is UNSET:
            _check_chunk(event, self._mode, self._wire)  # an error event carries no echo
        return payload, event

    def _decode(self, payload: bytes) -> StreamEvent | None:
        if self._done:
            msg = "$: the generate stream sent an event after data: [DONE]"
            raise UpstreamContractError(msg, param="$")
        if payload == w.SSE_DONE:
            self._done = True
            return None
        try:
            return _EVENT_DECODER.decode(payload)
        except msgspec.ValidationError as error:
            raise contract_error(error, "a generate stream chunk") from None
        except (msgspec.DecodeError, RecursionError) as error:
            msg = f"$: a generate stream event is not a JSON object: {error}"
            raise UpstreamContractError(msg, param="$") from None


def _check_chunk(event: StreamEvent, mode: OutputMode, wire: str) -> str | None:
    """Check a chunk; its text delta when it is plain (see GenerateStreamReader.feed_text)."""
    if event.output_mode != wire:  # the one comparison a conforming chunk costs
        generate = event.choices is not UNSET and event.object is UNSET
        check_echoed_mode(event.output_mode, mode, where="stream chunk", generate=generate)
    choices = event.choices
    if isinstance(choices, UnsetType):
        msg = f"$.{w.CHOICES}: a generate stream chunk must carry choices; it has none"
        raise UpstreamContractError(msg, param=f"$.{w.CHOICES}")
    usage = event.usage
    if usage is None or usage is UNSET:
        if len(choices) == 1:
            choice = choices[0]
            text, finish = choice.text, choice.finish_reason  # text: UNSET and "" are false
            if (
                text
                and choice.index == 0
                and choice.logprobs is None
                and (finish is None or finish is UNSET)
            ):
                return text
    else:
        _check(usage, Usage, f"$.{w.USAGE} of a stream chunk")
    for choice in choices:
        if choice.text is UNSET or choice.index < 0 or choice.logprobs is not None:
            break
    else:
        return None  # the common chunk: nothing to look at closer, no path to build
    for position, choice in enumerate(choices):
        _check_choice(choice, choice_path(position), text=mode is not OutputMode.TOKENS)
    return None


def _check(value: object, view: type[msgspec.Struct], what: str) -> None:
    try:
        msgspec.convert(value, view)
    except CONVERT_ERRORS as error:
        raise contract_error(error, what) from None


def _check_choice(choice: StreamChoice, path: str, *, text: bool) -> None:
    if text and choice.text is UNSET:
        msg = f"{path}.text: a text-mode stream choice must carry its text delta"
        raise UpstreamContractError(msg, param=f"{path}.text")
    if choice.index < 0:
        msg = f"{path}.index: expected an integer >= 0, got {choice.index}"
        raise UpstreamContractError(msg, param=f"{path}.index")
    if choice.logprobs is not UNSET and choice.logprobs is not None:
        _check(choice.logprobs, ChatLogprobs, f"{path}.logprobs")


def first_request_id(event: StreamEvent) -> str:
    """The first chunk's ``request_id``: every envelope id of the stream is built from it.

    Raises:
        UpstreamContractError: the chunk has none.
    """
    if not isinstance(event.request_id, str):
        msg = f"$.{w.REQUEST_ID}: the first stream chunk has no request_id"
        raise UpstreamContractError(msg, param=f"$.{w.REQUEST_ID}")
    return event.request_id


def error_field(error: object, key: str) -> str | None:
    """A string field of a worker's in-stream ``error`` value, whatever its shape."""
    value = error.get(key) if isinstance(error, Mapping) else None
    return value if isinstance(value, str) else None


def error_message(error: object) -> str:
    """The human message of a worker's in-stream ``error`` value."""
    message = error_field(error, w.MESSAGE)
    return message if message is not None else f"the worker reported {describe(error)}"


_SERVER_ERROR: Final = 500
_FIRST_STATUS: Final = 400
_LAST_STATUS: Final = 599


def error_status(error: object) -> int:
    """The HTTP status a worker's in-stream ``error`` names (vLLM's ``code``), else 500."""
    code = error.get(w.CODE) if isinstance(error, Mapping) else None
    if type(code) is int and _FIRST_STATUS <= code <= _LAST_STATUS:
        return code
    return _SERVER_ERROR


class NamedEventConverter(abc.ABC):
    """Driver of the converters whose clients get named events (Responses, Anthropic).

    It reads the generate stream and keeps what the one answer has so far (text, logprobs,
    finish reason, usage); :meth:`_turn` is that answer as the :class:`AssistantTurn` the
    non-streaming wraps build their envelope from. The subclass returns the client events of
    the first chunk (:meth:`_start`), of each choice delta (:meth:`_delta`), of ``[DONE]``
    (:meth:`_end`) and of an error (:meth:`_error`), and writes one event (:meth:`_format`).

    Neither client API has ``n``: a choice index other than 0 is a contract breach. After an
    error event the client's stream is over: what the worker sends after it is dropped.
    """

    __slots__ = (
        "_client",
        "_created",
        "_failed",
        "_finish_reason",
        "_logprobs",
        "_model",
        "_options",
        "_plain",
        "_reader",
        "_request_id",
        "_stop_reason",
        "_text",
        "_usage",
        "_worker_error",
    )

    def __init__(
        self,
        *,
        requested: OutputMode,
        client_body: Mapping[str, Any] | None,
        options: EnvelopeOptions | None,
        created: int | None,
    ) -> None:
        require_text_mode(as_output_mode(requested), streaming=True)
        self._options = DEFAULT_OPTIONS if options is None else options
        self._client = client_body
        # Generate chunks carry no model: the options' or the client's, known from the start.
        self._model = envelope_model(self._options, None, client_body)
        self._created = created
        self._reader = GenerateStreamReader(max_event_bytes=self._options.max_event_bytes)
        self._failed = False
        self._worker_error = False
        self._plain = False  # whether a plain chunk is one _plain_event (set by the subclass)
        self._request_id: str | None = None
        self._text: list[str] = []
        self._logprobs: list[Any] | None = None  # the entries as sent (checked by the reader)
        self._finish_reason: str | None = None
        self._stop_reason: int | str | None = None
        self._usage: Usage | None = None

    def feed(self, data: bytes) -> bytes:
        """Consume the next bytes of the generate stream; return the SSE bytes they complete.

        Raises:
            UpstreamContractError: an event is not JSON, misses its echo or carries another
                ``output_mode``, is malformed (the ``param`` is its JSON path), has a choice
                index other than 0, comes after ``[DONE]``, or the stream exceeds a bound.
        """
        if self._plain:
            read = self._reader.feed_text(data)
            if isinstance(read, str):  # most chunks: the subclass writes it from its own bytes
                return self._plain_written(read)
        else:
            read = self._reader.feed(data)
        return self._write(read)

    def plain_chunk(self, text: str) -> bytes | None:
        """The client bytes of a plain generate chunk whose text delta is ``text``.

        As ``ChatStreamConverter.plain_chunk``: ``None`` until plain chunks are written from
        bytes (once the text item or block is open), and after an error.
        """
        return self._plain_written(text) if self._plain else None

    def _plain_written(self, text: str) -> bytes:
        self._text.append(text)
        return self._plain_event(text)

    def close(self) -> bytes:
        r"""End the stream; returns what a held final ``\r`` completes (usually ``b""``).

        Raises:
            UpstreamContractError: the stream stopped mid-event or before ``data: [DONE]``
                (the worker or the connection died), or ended before its first chunk; the
                router should end the client's stream with :meth:`error_event`.
        """
        return self._write(self._reader.close())

    @property
    def worker_error(self) -> bool:
        """Whether the worker sent its own in-stream error event (passed on in the API's shape)."""
        return self._worker_error

    def error_event(
        self, message: str, *, status: int = 500, error_type: str | None = None
    ) -> bytes:
        """The API's in-stream error event, for the router to end a started stream with.

        ``status`` is the HTTP status the error would have had before the stream started;
        ``error_type`` overrides the API's type for it. What the worker sends afterwards is
        dropped: the client's stream is over.
        """
        self._failed, self._plain = True, False
        return b"".join(
            self._format(event) for event in self._error(message, status, error_type, None)
        )

    def _turn(self) -> AssistantTurn:
        """The answer so far, as the non-streaming wraps read it."""
        return AssistantTurn(
            base_id=base_id(self._request_id or ""),
            model=self._model,
            created=self._created,
            choice_path=choice_path(0),
            content="".join(self._text),
            reasoning=None,
            tool_calls=(),
            finish_reason=self._finish_reason,
            stop_reason=self._stop_reason,
            # Typed only here (a stream builds its turn at most three times), not per chunk:
            # the Messages API reads none.
            logprobs=None
            if self._logprobs is None
            else msgspec.convert({w.CONTENT: self._logprobs}, ChatLogprobs),
            usage=self._usage,
        )

    def _write(self, read: Iterable[ReadEvent]) -> bytes:
        written: list[bytes] = []
        for _, event in read:
            if self._failed:
                continue
            if event is None:
                if self._request_id is None:
                    msg = "$: the generate stream ended before its first chunk"
                    raise UpstreamContractError(msg, param="$")
                events = self._end()
            elif event.error is not UNSET:
                self._failed = self._worker_error = True
                self._plain = False
                error = event.error
                events = self._error(
                    error_message(error),
                    error_status(error),
                    error_field(error, w.TYPE),
                    error_field(error, w.PARAM),
                )
            else:
                events = self._chunk(event)
            written.extend(map(self._format, events))
        return b"".join(written)

    def _chunk(self, event: StreamEvent) -> list[dict[str, Any]]:
        if event.usage is not UNSET and event.usage is not None:
            self._usage = msgspec.convert(event.usage, Usage)  # checked by the reader
        events = []
        if self._request_id is None:
            self._request_id = first_request_id(event)
            events = self._start()
        for position, choice in enumerate(event.choices or ()):
            if choice.index != 0:
                path = choice_path(position)
                msg = (
                    f"{path}.index: this client's stream carries one choice (index 0), got "
                    f"{choice.index}; neither the Responses nor the Messages API has n"
                )
                raise UpstreamContractError(msg, param=f"{path}.index")
            text = choice.text if isinstance(choice.text, str) else ""
            self._text.append(text)
            entries = None
            if choice.logprobs is not None and choice.logprobs is not UNSET:
                entries = choice.logprobs.get(w.CONTENT)
                if not isinstance(entries, list):
                    entries = None
                elif self._logprobs is None:
                    self._logprobs = list(entries)
                else:
                    self._logprobs.extend(entries)
            if choice.finish_reason is not None and choice.finish_reason is not UNSET:
                self._finish_reason = choice.finish_reason
                self._stop_reason = None if choice.stop_reason is UNSET else choice.stop_reason
            events += self._delta(text, entries, position)
        return events

    @abc.abstractmethod
    def _start(self) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def _delta(self, text: str, logprobs: list[Any] | None, position: int) -> list[dict[str, Any]]:
        """The events of one text delta; ``logprobs``: its entries as sent, checked.

        ``position`` is the choice's place in the chunk (its path, :func:`choice_path`, is
        built only for an error).
        """

    @abc.abstractmethod
    def _plain_event(self, text: str) -> bytes:
        """The bytes of a plain chunk's text (GenerateStreamReader.feed_text), once ``_plain``.

        The same as :meth:`_delta`'s events written by :meth:`_format` for that text.
        """

    @abc.abstractmethod
    def _end(self) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def _error(
        self, message: str, status: int, error_type: str | None, param: str | None
    ) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def _format(self, event: dict[str, Any]) -> bytes: ...

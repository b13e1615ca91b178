r"""Server-sent events framing shared by every streaming converter.

:class:`SseParser` takes the bytes of an ``text/event-stream`` body as a socket delivers them,
split anywhere (inside a multi-byte UTF-8 character, inside a ``\r\n``), and returns each
complete event's ``data`` payload as bytes; :func:`format_sse_event` writes one event the way
vLLM does, ``data: <compact JSON>\n\n``, and :func:`format_sse_typed_event` one with an
``event:`` line, as the Responses and Anthropic streams do.
"""

from __future__ import annotations

import re
from typing import Final

import msgspec

from disagg_transforms._wire import keys as w
from disagg_transforms.errors import UpstreamContractError

DEFAULT_MAX_EVENT_BYTES: Final = 16 * 1024 * 1024
"""Default bound on one buffered event: a first chunk may carry a 128k-token prompt's IDs."""

DONE_EVENT: Final = b"data: " + w.SSE_DONE + b"\n\n"

EVENT_END: Final = re.compile(rb"\r\n\r\n|\n\n|\r\r")
"""Where an event ends (the blank line after its last field), in vLLM's framings."""
_DATA: Final = b"data"
_DATA_PREFIX: Final = b"data: "
_DATA_PREFIX_SIZE: Final = len(_DATA_PREFIX)
_CR: Final = b"\r"
_LF: Final = b"\n"
_LF_BYTE: Final = ord(_LF)
_ENCODER = msgspec.json.Encoder()


class SseParser:
    r"""Incremental SSE parser: bytes in at arbitrary boundaries, ``data`` payloads out.

    Follows the WHATWG event-stream rules that matter here: lines end with ``\r\n``, ``\n`` or
    ``\r``; a blank line ends an event; ``data:`` lines (one optional space after the colon)
    are joined with ``\n``; comments (``:``) and other fields (``event``, ``id``, ``retry``)
    are ignored; an event without ``data`` yields nothing. ``[DONE]`` comes out as the payload
    ``b"[DONE]"``, for the caller to recognise.

    Memory is bounded: the unfinished line plus the current event's data may not exceed
    ``max_event_bytes``, else :class:`UpstreamContractError`.
    """

    __slots__ = ("_buf", "_data", "_data_size", "_max", "_scan")

    def __init__(self, *, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._max = max_event_bytes
        self._buf = bytearray()
        self._scan = 0  # where to resume looking for a line end in _buf
        self._data: list[bytes] = []
        self._data_size = 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Consume ``data`` and return the payloads of the events it completed, in order.

        Raises:
            UpstreamContractError: the event being read grew past ``max_event_bytes``.
        """
        payloads: list[bytes] = []
        self.feed_into(data, payloads)
        return payloads

    def feed_into(self, data: bytes | bytearray | memoryview, payloads: list[bytes]) -> None:
        """:meth:`feed`, the payloads appended to ``payloads``.

        When it raises, the payloads of the events ``data`` completed before the one that broke
        the bound are in ``payloads``: a reader can hand them on first.

        Raises:
            UpstreamContractError: the event being read grew past ``max_event_bytes``.
        """
        start = 0
        if type(data) is bytes and not self._data and data.find(_CR) < 0:
            # (Other bytes-like values, a memoryview among them, go to the line reader.)
            if self._buf:
                # An event the last read cut: its end is searched for in ``data`` alone.
                start = self._complete_data_line(data, payloads)
            if not self._buf:
                # Between events, vLLM's framing (one "data: <payload>\n\n" line per event) is cut
                # out with C-speed bytes searches; the first event in any other form (a comment,
                # another field, multi-line data, an event cut by the end of data; a "\r" anywhere)
                # and all after it go to the line reader, which gives the same payloads (see
                # docs/performance.md). find, not "in": measured twice as fast on a chunk.
                size = len(data)
                while start < size and data.startswith(_DATA_PREFIX, start):
                    end = data.find(_LF, start)  # one-byte search: memchr, unlike a two-byte one
                    if end < 0 or data[end + 1 : end + 2] != _LF:  # a one-byte slice is cached
                        break
                    payloads.append(data[start + _DATA_PREFIX_SIZE : end])
                    start = end + 2
                if start == size:
                    return
        self._read_lines(memoryview(data)[start:] if start else data, payloads)

    def feed_held(self, data: bytes, payloads: list[bytes]) -> int:
        """Where ``data``'s whole events start: past the end of the event the last read cut.

        That event's payload is appended to ``payloads`` (``0``: none was held). ``-1`` when
        ``data`` or the held bytes are in another form than vLLM's framing, or that event
        does not end in ``data``: then give all of ``data`` to :meth:`feed_into`. A reader
        that cuts the events from there itself gives the rest, from its first event it does
        not read, to :meth:`feed_into` (docs/sglang.md, "Streams").
        """
        if type(data) is not bytes or self._data or data.find(_CR) >= 0:
            return -1
        if not self._buf:
            return 0
        return self._complete_data_line(data, payloads) or -1

    def _complete_data_line(self, data: bytes, payloads: list[bytes]) -> int:
        """End the held ``data: `` line, when ``data`` ends it and its event at once.

        Returns where ``data``'s rest starts, ``0`` (nothing read) when the held bytes or
        ``data`` are in another form: the line reader takes them then. A cumulative stream's
        events are tens of KB, so the reads cut most of them; the line reader copied each one
        several times (docs/performance.md).
        """
        buf = self._buf
        if not buf.startswith(_DATA_PREFIX) or buf.endswith(_CR):
            return 0
        end = data.find(_LF)
        if end < 0 or data[end + 1 : end + 2] != _LF:
            return 0
        with memoryview(buf) as held, memoryview(data) as view:
            payloads.append(b"".join((held[_DATA_PREFIX_SIZE:], view[:end])))
        buf.clear()
        self._scan = 0
        return end + 2

    def _read_lines(self, data: bytes | bytearray | memoryview, payloads: list[bytes]) -> None:
        # The general reader: WHATWG line splitting, any line ends, fields and comments.
        buf = self._buf
        buf += data
        start = 0
        while True:
            # memchr searches: a line of a cumulative stream's event is tens of KB, which a
            # regex search scanned several times slower (docs/performance.md).
            at = max(start, self._scan)
            lf = buf.find(_LF, at)
            cr = buf.find(_CR, at, len(buf) if lf < 0 else lf)
            if cr >= 0:
                if cr + 1 == len(buf):
                    break  # a "\r" at the end may be the first half of a "\r\n"
                end, after = cr, cr + 2 if buf[cr + 1] == _LF_BYTE else cr + 1
            elif lf >= 0:
                end, after = lf, lf + 1
            else:
                break
            self._line(bytes(buf[start:end]), payloads)
            start = after
            self._scan = start
        del buf[:start]
        self._scan = max(len(self._buf) - 1, 0) if self._buf.endswith(b"\r") else len(self._buf)
        if len(self._buf) + self._data_size > self._max:
            msg = (
                f"$: a server-sent event grew past {self._max} bytes without ending; "
                "raise max_event_bytes if the worker's events are legitimately that large"
            )
            raise UpstreamContractError(msg, param="$")

    def close(self) -> list[bytes]:
        r"""End of the stream: return the payload a held final ``\r`` completes, if any.

        Raises:
            UpstreamContractError: the stream stopped in the middle of an event.
        """
        payloads: list[bytes] = []
        if self._buf == b"\r":  # held back by feed() in case a "\n" followed; none will
            self._buf.clear()
            self._line(b"", payloads)
        if self._data or self._buf:
            msg = "$: the stream ended in the middle of an event"
            raise UpstreamContractError(msg, param="$")
        return payloads

    def _line(self, line: bytes, payloads: list[bytes]) -> None:
        if not line:
            if self._data:
                payloads.append(b"\n".join(self._data))
            self._data, self._data_size = [], 0
            return
        field, colon, value = line.partition(b":")
        if not field and colon:
            return  # a comment line
        if field != _DATA:
            return  # event / id / retry: nothing a JSON stream needs
        if value.startswith(b" "):
            value = value[1:]
        self._data.append(value)
        self._data_size += len(value) + 1


def format_sse_event(payload: object) -> bytes:
    r"""One SSE event, ``data: <compact JSON>\n\n``, keys in the payload's own order.

    Raises:
        UpstreamContractError: the payload holds a value JSON cannot carry (it came from the
            worker, e.g. an integer too large for any JSON parser).
    """
    return b"data: " + encode_event_json(payload) + b"\n\n"


def format_sse_typed_event(event_type: str, payload: object) -> bytes:
    r"""One named SSE event, ``event: <type>\ndata: <compact JSON>\n\n``.

    The framing of the OpenAI Responses and Anthropic Messages streams, whose clients pick the
    event's model by its name.

    Raises:
        UpstreamContractError: as :func:`format_sse_event`.
    """
    return b"".join(
        (b"event: ", event_type.encode(), b"\ndata: ", encode_event_json(payload), b"\n\n")
    )


def encode_event_json(payload: object) -> bytes:
    """An event's payload as compact JSON (a converter splices it into pre-encoded bytes).

    Raises:
        UpstreamContractError: as :func:`format_sse_event`.
    """
    try:
        return _ENCODER.encode(payload)
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as error:
        msg = f"$: the converted event cannot be written as JSON: {error}"
        raise UpstreamContractError(msg, param="$") from None

"""SGLang answers: a ``/generate`` answer or stream read as the generate answer envelopes read.

Every client envelope (chat, Responses, Messages; plain and streamed) is built from a vLLM
text-mode generate answer; SGLang's answers are read here into that one shape, so the envelope
builders and stream converters stay engine-free (``docs/sglang.md``, "The answers"):
``meta_info.finish_reason`` (an object) becomes vLLM's ``finish_reason``/``stop_reason``, the
counts its ``usage``, the ``[logprob, id, text]`` triples its chat logprobs, and a cumulative
stream its deltas. An abort is a worker failure (:class:`SglangFailure`), never a choice.
"""

from __future__ import annotations

from collections.abc import Container, Generator, Iterator, Mapping
from typing import Any, Final, Literal, TypeAlias, overload

import msgspec
from msgspec import UNSET, UnsetType

from disagg_transforms._config import OutputMode
from disagg_transforms._response.choices import contract_error
from disagg_transforms._wire import keys as w
from disagg_transforms._wire.describe import describe
from disagg_transforms._wire.sse import DONE_EVENT, SseParser, format_sse_event
from disagg_transforms._wire.validate import CONVERT_ERRORS
from disagg_transforms.errors import UpstreamContractError

__all__ = (
    "SglangFailure",
    "SglangStreamReader",
    "answer_failure",
    "generate_answer",
    "prompt_logprobs",
    "sglang_error_message",
)

_Triple: TypeAlias = tuple[float | None, int, str | None]
_TEXT: Final = OutputMode.TEXT.value
# vLLM writes -9999.0 for a logprob it cannot give (-inf has no JSON spelling).
_NO_LOGPROB: Final = -9999.0
_FIRST_STATUS: Final = 400
_LAST_STATUS: Final = 599
# An abort without a status: cancelled (SGLang's own words for it) or failed.
_CANCELLED: Final = frozenset({"Aborted", "Abort in waiting queue"})
_CANCELLED_STATUS: Final = 503
_FAILED_STATUS: Final = 500
# How much of the text so far a cumulative event read whole is checked against: its tail.
_TAIL: Final = 16
# A cumulative event as SGLang writes it (orjson: compact, these keys in this order) is read
# from where the last one's text ended: the new text, the new token IDs skipped, then meta_info
# (docs/sglang.md, "Streams"). Any other event is read whole.
_TEXT_HEAD: Final = b'{"text":"'
# The rest of the text ends at the first of these: a JSON string holds no raw quote, and the new
# text is decoded with this quote, which fails when it is escaped or a raw one comes before it.
_IDS_HEAD: Final = b'","output_ids":['
_IDS_HEAD_SIZE: Final = len(_IDS_HEAD)
_ID_BYTES: Final = b"-0123456789,"  # all a new part of the IDs may hold
_META_HEAD: Final = b'],"meta_info":'
_META_HEAD_SIZE: Final = len(_META_HEAD)
_QUOTE: Final = b'"'
_DATA_PREFIX: Final = b"data: "
_LF: Final = b"\n"
_EVENT_END: Final = b"}\n\n"  # an event's JSON object closed, then the blank line after it
# A meta_info with an array may carry logprobs (each event repeats them all): read past the
# positions sent. Without one (SGLang's, unless logprobs were asked), only its counts are read.
_ARRAY: Final = b"["


class _Finish(msgspec.Struct, kw_only=True, gc=False):
    type: str
    matched: int | str | list[int] | UnsetType | None = UNSET
    message: str | UnsetType | None = UNSET
    status_code: int | UnsetType | None = UNSET


class _MetaCounts(msgspec.Struct, kw_only=True, gc=False):
    """What a meta_info says besides its logprobs."""

    id: str
    finish_reason: _Finish | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class _PlainMeta(_MetaCounts, kw_only=True, gc=False):
    """A meta_info without logprobs: one with them (arrays) fails to decode as this."""

    output_token_logprobs: None = None
    output_top_logprobs: None = None


class _Meta(_MetaCounts, kw_only=True, gc=False):
    output_token_logprobs: list[_Triple] | UnsetType = UNSET
    output_top_logprobs: list[list[_Triple] | None] | UnsetType = UNSET


class _RawLogprobsMeta(_MetaCounts, kw_only=True, gc=False):
    """A cumulative event's meta_info, its logprob arrays left undecoded.

    Only the positions past the ones already sent are decoded (:class:`_Cumulative`).
    """

    output_token_logprobs: msgspec.Raw | UnsetType = UNSET
    output_top_logprobs: msgspec.Raw | UnsetType = UNSET


class _Answer(msgspec.Struct, kw_only=True, gc=False):
    text: str
    output_ids: list[int]
    meta_info: _Meta


class _Event(msgspec.Struct, kw_only=True, gc=False):
    """A stream event: its ids stay undecoded (the envelopes never read them)."""

    text: str | UnsetType = UNSET
    output_ids: msgspec.Raw | UnsetType = UNSET
    meta_info: _Meta | UnsetType = UNSET
    error: Any = UNSET


_EVENT_DECODER = msgspec.json.Decoder(_Event)
_COUNTS_DECODER = msgspec.json.Decoder(_MetaCounts)
_PLAIN_META_DECODER = msgspec.json.Decoder(_PlainMeta)
_LOGPROBS_META_DECODER = msgspec.json.Decoder(_RawLogprobsMeta)
_TEXT_DECODER = msgspec.json.Decoder(str)


class SglangFailure(msgspec.Struct, frozen=True, kw_only=True):
    """An SGLang answer that is a worker failure: an abort, or an in-stream ``error``."""

    status: int
    """The HTTP status it names (its ``status_code``), else 503 cancelled / 500 failed."""
    message: str


def _failure(finish: _Finish) -> SglangFailure:
    message = finish.message if isinstance(finish.message, str) else "the request was aborted"
    code = finish.status_code
    if type(code) is int and _FIRST_STATUS <= code <= _LAST_STATUS:
        return SglangFailure(status=code, message=message)
    status = _CANCELLED_STATUS if message in _CANCELLED else _FAILED_STATUS
    return SglangFailure(status=status, message=message)


def _finish_fields(
    finish: _Finish, stop_token_ids: Container[int]
) -> tuple[str, int | str | None] | SglangFailure:
    """VLLM's ``(finish_reason, stop_reason)`` of a finish object, or the failure it is."""
    kind = finish.type
    if kind == w.FINISH_STOP:
        matched = finish.matched
        if isinstance(matched, str):
            return w.FINISH_STOP, matched
        # An end of sequence has no stop reason; a stop token the request named has its id.
        named = isinstance(matched, int) and matched in stop_token_ids
        return w.FINISH_STOP, matched if named and isinstance(matched, int) else None
    if kind == w.FINISH_LENGTH:
        return w.FINISH_LENGTH, None
    if kind == w.FINISH_ABORT:
        return _failure(finish)
    path = f"$.{w.META_INFO}.{w.FINISH_REASON}.{w.TYPE}"
    msg = f"{path}: expected stop, length or abort, got {describe(kind)}"
    raise UpstreamContractError(msg, param=path)


def _usage(meta: _MetaCounts) -> dict[str, Any]:
    details = {w.CACHED_TOKENS: meta.cached_tokens} if meta.cached_tokens else None
    return {
        w.PROMPT_TOKENS: meta.prompt_tokens,
        w.TOTAL_TOKENS: meta.prompt_tokens + meta.completion_tokens,
        w.COMPLETION_TOKENS: meta.completion_tokens,
        w.PROMPT_TOKENS_DETAILS: details,
    }


def _token(triple: _Triple) -> dict[str, Any]:
    logprob, token_id, text = triple
    token = text if text is not None else f"token_id:{token_id}"
    return {
        w.TOKEN: token,
        w.LOGPROB: _NO_LOGPROB if logprob is None else logprob,
        w.BYTES: list(token.encode()),
    }


def _logprobs(meta: _Meta, start: int) -> dict[str, Any] | None:
    """Chat logprobs of the output positions from ``start`` on; ``None`` when none were asked."""
    tokens = meta.output_token_logprobs
    if isinstance(tokens, UnsetType):
        return None
    tops = meta.output_top_logprobs
    content = []
    for position in range(start, len(tokens)):
        entry = _token(tokens[position])
        top = None if isinstance(tops, UnsetType) or position >= len(tops) else tops[position]
        entry[w.TOP_LOGPROBS] = [_token(alt) for alt in top or ()]
        content.append(entry)
    return {w.CONTENT: content}


class _Cumulative:
    """A logprob array of a cumulative stream's meta_info (each event repeats every position).

    The bytes of the positions read so far are cut out of the next event before it is decoded
    when they are the same bytes, so only the new positions are decoded; any other event is
    decoded whole and cut after, with the same result (docs/sglang.md, "Streams").
    """

    __slots__ = ("_count", "_decoder", "_items", "_key")

    def __init__(self, name: str, decoder: msgspec.json.Decoder[Any]) -> None:
        self._key = f'"{name}":['.encode()
        self._decoder = decoder
        self._items = b""  # the items read so far, as the last event wrote them
        self._count = 0

    def cut(self, meta: bytes, start: int) -> tuple[bytes, int]:
        """``meta`` without the items read so far, and where this array opens in it (-1: uncut).

        ``start``: the positions sent so far, which the items read must be.
        """
        items = self._items
        at = meta.find(self._key) if items and self._count == start else -1
        if at < 0:
            return meta, -1
        first = at + len(self._key)
        end = first + len(items)
        after = meta[end : end + 1]
        if not meta.startswith(items, first) or after not in (b",", b"]"):
            return meta, -1
        return meta[:first] + meta[end + (after == b",") :], first - 1

    def matches(self, raw: msgspec.Raw | UnsetType, meta: bytes, opened: int) -> bool:
        """Whether the array decoded from ``meta`` is the one :meth:`cut` cut at ``opened``."""
        return opened < 0 or (isinstance(raw, msgspec.Raw) and meta.startswith(bytes(raw), opened))

    def take(self, raw: msgspec.Raw, start: int, *, cut: bool) -> list[Any]:
        """The items from position ``start`` on of the array decoded (``cut``: the new ones)."""
        data = bytes(raw)
        items: list[Any] = self._decoder.decode(data)
        if not cut:
            self._items, self._count = data[1:-1], len(items)
            return items[start:]
        if items:
            self._items = self._items + b"," + data[1:-1]
            self._count += len(items)
        return items


_TRIPLES_DECODER: Final = msgspec.json.Decoder(list[_Triple])
_TOPS_DECODER: Final = msgspec.json.Decoder(list[list[_Triple] | None])


class _InputMeta(msgspec.Struct, kw_only=True, gc=False):
    prompt_tokens: int
    input_token_logprobs: list[_Triple]
    input_top_logprobs: list[list[_Triple] | None] = []


class _InputAnswer(msgspec.Struct, kw_only=True, gc=False):
    meta_info: _InputMeta


_INPUT_DECODER: Final = msgspec.json.Decoder(_InputAnswer)


def prompt_logprobs(body: bytes, count: int) -> list[dict[str, Any] | None]:
    """The prompt logprobs as vLLM writes them, from the SGLang worker that computed them.

    In P/D that is the prefill (its body from ``prefill_body``); ``count`` is the client's
    ``prompt_logprobs``. Each position is vLLM 0.33's: the prompt's token first, then the top
    ``count``, keyed by token id, each ``{"logprob", "rank", "decoded_token"}``; the first
    position ``None``. SGLang gives no rank: it is the one vLLM gives wherever SGLang's top list
    proves it, else ``None`` (``docs/sglang.md``, "Prompt logprobs").

    Raises:
        UpstreamContractError: the answer carries no prompt logprobs in SGLang's shape.
    """
    try:
        meta = _INPUT_DECODER.decode(body).meta_info
    except (msgspec.DecodeError, RecursionError) as error:
        raise contract_error(error, "the SGLang /generate answer") from None
    tokens, tops = meta.input_token_logprobs, meta.input_top_logprobs
    if len(tokens) != meta.prompt_tokens or (tokens and tokens[0][0] is not None):
        path = f"$.{w.META_INFO}.{w.INPUT_TOKEN_LOGPROBS}"
        msg = (
            f"{path}: expected a logprob for each of the {meta.prompt_tokens} prompt tokens, "
            f"the first null, got {len(tokens)} (was logprob_start_len 0?)"
        )
        raise UpstreamContractError(msg, param=path)
    out: list[dict[str, Any] | None] = [None]  # the first token has nothing before it
    for position in range(1, len(tokens)):
        top = tops[position] if position < len(tops) else None
        out.append(_position(tokens[position], top or [], count))
    return out


def _position(token: _Triple, top: list[_Triple], count: int) -> dict[str, Any]:
    """One prompt position as vLLM writes it: the prompt's token, then the top ``count``.

    vLLM's rank of the prompt's token is the count of tokens at least as likely (ties
    counted), and a top token's is its place in the top list; when the
    prompt's token is among the top ``count``, its place wins (vLLM writes it last). SGLang's
    top list (as long as the prefill was asked for, maybe more than ``count``) proves the count
    when the token is more likely than its last entry: every token at least as likely is in it.
    """
    logprob, token_id, text = token
    value = _NO_LOGPROB if logprob is None else logprob  # orjson's null: -inf, as vLLM clamps
    rank = None
    last = top[-1][0] if top else None
    if logprob is not None and last is not None and logprob > last:
        rank = sum(1 for alt in top if alt[0] is not None and alt[0] >= logprob)
    entries = {str(token_id): _prompt_entry(value, rank, text)}
    for place, (alt_logprob, alt_id, alt_text) in enumerate(top[:count], start=1):
        alt = _NO_LOGPROB if alt_logprob is None else alt_logprob
        entries[str(alt_id)] = _prompt_entry(alt, place, alt_text)
    return entries


def _prompt_entry(logprob: float, rank: int | None, text: str | None) -> dict[str, Any]:
    return {w.LOGPROB: logprob, w.RANK: rank, w.DECODED_TOKEN: text}


def generate_answer(
    answer: Mapping[str, Any], *, stop_token_ids: Container[int] = ()
) -> dict[str, Any] | SglangFailure:
    """The generate answer the envelopes read, from an SGLang decode worker's ``/generate`` answer.

    ``stop_token_ids`` are the ones the request named (``SglangLeg.stop_token_ids``): a match is
    the ``stop_reason``; an end of sequence has none. Pass the result to
    :func:`~disagg_transforms.wrap_envelope` with ``requested=OutputMode.TEXT``.

    Returns:
        The vLLM text-mode generate answer (a new dict), or the :class:`SglangFailure` an
        abort is.

    Raises:
        UpstreamContractError: the answer is not SGLang's (``param`` the JSON path), or has no
            finish reason.
    """
    try:
        parsed = msgspec.convert(answer, _Answer)
    except CONVERT_ERRORS as error:
        raise contract_error(error, "the SGLang /generate answer") from None
    meta = parsed.meta_info
    if meta.finish_reason is None:
        path = f"$.{w.META_INFO}.{w.FINISH_REASON}"
        msg = f"{path}: a finished SGLang answer must say why it finished, got null"
        raise UpstreamContractError(msg, param=path)
    fields = _finish_fields(meta.finish_reason, stop_token_ids)
    if isinstance(fields, SglangFailure):
        return fields
    finish_reason, stop_reason = fields
    choice = {
        w.INDEX: 0,
        w.TEXT: parsed.text,
        w.TOKEN_IDS: parsed.output_ids,
        w.FINISH_REASON: finish_reason,
        w.STOP_REASON: stop_reason,
        w.LOGPROBS: _logprobs(meta, 0),
    }
    return {
        w.REQUEST_ID: meta.id,
        w.OUTPUT_MODE: _TEXT,
        w.CHOICES: [choice],
        w.USAGE: _usage(meta),
    }


class SglangStreamReader:
    """SGLang's ``/generate`` SSE in, the generate SSE the stream converters read out.

    Cumulative events (SGLang's default) become deltas: only the part past the text so far is
    sent, and an event that does not extend it breaks the contract. ``incremental`` reads a
    worker run with ``--incremental-streaming-output``, whose events already are deltas. The
    last event's finish becomes the choice's finish, then a usage chunk; an abort or an
    in-stream ``error`` becomes an ``{"error": ...}`` event (``code`` its status).
    """

    __slots__ = (
        "_done",
        "_ended",
        "_ids_size",
        "_incremental",
        "_logprobs",
        "_parser",
        "_request_id",
        "_sent",
        "_stop_token_ids",
        "_tail",
        "_text_len",
        "_tokens",
        "_tops",
    )

    def __init__(
        self,
        *,
        incremental: bool = False,
        stop_token_ids: Container[int] = (),
        max_event_bytes: int,
    ) -> None:
        self._parser = SseParser(max_event_bytes=max_event_bytes)
        self._incremental = incremental
        self._stop_token_ids = stop_token_ids
        self._text_len = 0
        self._tail = ""
        # The last event's bytes up to the end of its text, and the size of its token IDs: the
        # next event's new part starts there. None once an event was read whole.
        self._sent: bytes | None = None if incremental else _TEXT_HEAD
        self._ids_size = 0
        self._logprobs = 0
        self._request_id = ""  # the last event's: a plain chunk written later names it
        self._tokens = _Cumulative("output_token_logprobs", _TRIPLES_DECODER)
        self._tops = _Cumulative("output_top_logprobs", _TOPS_DECODER)
        self._done = False
        self._ended = False

    def feed(self, data: bytes) -> bytes:
        """The generate SSE bytes of the events ``data`` completes.

        Raises:
            UpstreamContractError: an event is not SGLang's, does not extend the text so far
                (cumulative), or comes after ``[DONE]`` or after the finish.
        """
        return b"".join(map(self._read, self._parser.feed(data)))

    def feed_each(self, data: bytes) -> Iterator[bytes | str]:
        """:meth:`feed`, event by event; a plain chunk as its text delta alone.

        Each event ``data`` completes gives its generate SSE bytes, or, when the chunk is plain
        (one choice, a non-empty text delta, no logprobs, no finish), the ``str`` of its
        delta, for a converter's ``plain_chunk`` (:meth:`plain_event` writes it as generate
        SSE). An event that breaks the contract raises when it is reached, after the ones
        before it were given (the exchange cuts the worker's reads no further: docs/sglang.md).

        Raises:
            UpstreamContractError: as :meth:`feed`.
        """
        payloads: list[bytes] = []
        read = self._read
        parser = self._parser
        at = -1 if self._sent is None or self._ended else parser.feed_held(data, payloads)
        if at >= 0:
            for payload in payloads:  # the event the last read cut
                yield read(payload, plain=True)
            if self._sent is not None:  # still read in part after it
                at = yield from self._plain_events(self._sent, data, at)
            if at == len(data):
                return
            data, payloads = data[at:], []
        try:
            parser.feed_into(data, payloads)
        except UpstreamContractError:
            for payload in payloads:  # the events before the one too large
                yield read(payload, plain=True)
            raise
        for payload in payloads:
            yield read(payload, plain=True)

    def _plain_events(self, sent: bytes, data: bytes, at: int) -> Generator[str, None, int]:
        """The text deltas of the plain cumulative events in SGLang's layout from ``at`` on.

        Each is cut from ``data`` and read in one pass, as :meth:`_new_part` reads an event
        the SSE parser cut (only the bytes past the last event's text, and no copy of the
        event): a read of a cumulative stream holds about a hundred. Returns where the first
        event it does not read starts (cut by the read's end, another layout or framing, a
        finish, logprobs, an empty delta); :meth:`_read` reads that one and those after it.
        """
        line = _DATA_PREFIX + sent  # the last event's line up to the end of its text
        ids_size = self._ids_size
        starts, find, size = data.startswith, data.find, len(data)
        text_of, meta_of = _TEXT_DECODER.decode, _PLAIN_META_DECODER.decode
        try:
            while at < size and starts(line, at):
                start = at + len(line)
                # The line's end first: the heads are searched for before it (a bounded search
                # of a long read costs a fraction), and no "\n" is among the last event's IDs,
                # skipped unread.
                lf = find(_LF, start)
                if lf < 0:
                    break
                end = find(_IDS_HEAD, start, lf)
                if end < 0:
                    break
                new_ids = end + _IDS_HEAD_SIZE + ids_size
                ids_end = find(_META_HEAD, new_ids, lf)
                meta_at = ids_end + _META_HEAD_SIZE
                if (
                    ids_end < 0
                    or not starts(_EVENT_END, lf - 1)
                    or data[new_ids:ids_end].strip(_ID_BYTES)
                ):
                    break
                try:
                    text = text_of(_QUOTE + data[start : end + 1])
                    meta = meta_of(data[meta_at : lf - 1])
                except (msgspec.DecodeError, RecursionError):  # logprobs among them
                    break
                if not text or meta.finish_reason is not None:
                    break
                line, ids_size = data[at:end], ids_end - end - _IDS_HEAD_SIZE
                self._request_id = meta.id  # a plain chunk written from its text names it
                yield text
                at = lf + 2
        finally:  # the events given so far, however far the caller read
            self._sent, self._ids_size = line[len(_DATA_PREFIX) :], ids_size
        return at

    def plain_event(self, text: str) -> bytes:
        """The generate SSE of a plain chunk :meth:`feed_each` gave as its text delta."""
        return _generate_chunk(self._request_id, text, None, None, None)

    def close(self) -> bytes:
        """End of the stream.

        Raises:
            UpstreamContractError: it stopped mid-event or before ``data: [DONE]``.
        """
        tail = b"".join(self._read(payload) for payload in self._parser.close())
        if not self._done:
            msg = "$: the SGLang stream ended without data: [DONE]"
            raise UpstreamContractError(msg, param="$")
        return tail

    @overload
    def _read(self, payload: bytes, *, plain: Literal[False] = False) -> bytes: ...
    @overload
    def _read(self, payload: bytes, *, plain: bool) -> bytes | str: ...
    def _read(self, payload: bytes, *, plain: bool = False) -> bytes | str:
        if self._done:
            msg = "$: the SGLang stream sent an event after data: [DONE]"
            raise UpstreamContractError(msg, param="$")
        if payload == w.SSE_DONE:
            self._done = True
            return DONE_EVENT
        if self._ended:
            msg = "$: the SGLang stream sent an event after its finish"
            raise UpstreamContractError(msg, param="$")
        new = self._new_part(payload)
        if new is not None:
            text, meta, offset = new
            if plain and text and meta.finish_reason is None and type(meta) is _MetaCounts:
                self._request_id = meta.id
                return text  # a plain chunk, as _chunk gives it (the stream's most events)
            return self._chunk(text, meta, whole=False, plain=plain, offset=offset)
        self._read_whole_from_now()
        try:
            event = _EVENT_DECODER.decode(payload)
        except msgspec.ValidationError as error:
            raise contract_error(error, "an SGLang stream event") from None
        except (msgspec.DecodeError, RecursionError) as error:
            msg = f"$: an SGLang stream event is not a JSON object: {error}"
            raise UpstreamContractError(msg, param="$") from None
        if event.error is not UNSET:
            self._ended = True
            return _error_event(event.error)
        if isinstance(event.meta_info, UnsetType) or isinstance(event.text, UnsetType):
            msg = "$: an SGLang stream event must carry text and meta_info"
            raise UpstreamContractError(msg, param="$")
        return self._chunk(event.text, event.meta_info, whole=not self._incremental, plain=plain)

    def _new_part(self, payload: bytes) -> tuple[str, _MetaCounts, int] | None:
        """The new text and the meta_info of a cumulative event in SGLang's layout, else None.

        It extends the text so far when its bytes start with the last event's up to the end of
        its text (JSON escapes each character alone): only the bytes after are read. The
        third item is the output position the meta_info's logprob arrays start at.
        """
        sent = self._sent
        if sent is None or not payload.startswith(sent):
            return None
        start = len(sent)
        end = payload.find(_IDS_HEAD, start)
        if end < 0:
            return None
        new_ids = end + _IDS_HEAD_SIZE + self._ids_size
        ids_end = payload.find(_META_HEAD, new_ids)
        if ids_end < 0 or payload[new_ids:ids_end].strip(_ID_BYTES) or not payload.endswith(b"}"):
            return None
        meta_bytes = payload[ids_end + _META_HEAD_SIZE : -1]
        try:
            text = _TEXT_DECODER.decode(_QUOTE + payload[start : end + 1])
            if meta_bytes.find(_ARRAY) < 0:
                meta, offset = _COUNTS_DECODER.decode(meta_bytes), 0
            else:
                meta, offset = self._new_logprobs(meta_bytes), self._logprobs
        except (msgspec.DecodeError, RecursionError):
            return None
        self._sent = payload[:end]
        self._ids_size = ids_end - end - _IDS_HEAD_SIZE
        return text, meta, offset

    def _read_whole_from_now(self) -> None:
        """Read every event whole from now on; the text so far is the last one read in part's.

        The length and tail of the text so far, which a whole event is checked against, are
        read from it once here, not kept up event by event.
        """
        sent, self._sent = self._sent, None
        if sent is not None:
            text = _TEXT_DECODER.decode(sent[len(_TEXT_HEAD) - 1 :] + _QUOTE)
            self._text_len, self._tail = len(text), text[-_TAIL:]

    def _new_logprobs(self, meta_bytes: bytes) -> _Meta:
        """The meta_info, its logprob arrays from the first position not sent yet on.

        Each event repeats every position's logprobs so far: decoding them all made a stream
        quadratic in its length (docs/performance.md).
        """
        start, tokens, tops = self._logprobs, self._tokens, self._tops
        cut, at_tokens = tokens.cut(meta_bytes, start)
        cut, at_tops = tops.cut(cut, start)
        raw = _LOGPROBS_META_DECODER.decode(cut)
        token_raw, top_raw = raw.output_token_logprobs, raw.output_top_logprobs
        if not (tokens.matches(token_raw, cut, at_tokens) and tops.matches(top_raw, cut, at_tops)):
            raw = _LOGPROBS_META_DECODER.decode(meta_bytes)  # another layout: read whole
            token_raw, top_raw, at_tokens, at_tops = (
                raw.output_token_logprobs,
                raw.output_top_logprobs,
                -1,
                -1,
            )
        counts = {name: getattr(raw, name) for name in _MetaCounts.__struct_fields__}
        return _Meta(
            **counts,
            output_token_logprobs=UNSET
            if isinstance(token_raw, UnsetType)
            else tokens.take(token_raw, start, cut=at_tokens >= 0),
            output_top_logprobs=UNSET
            if isinstance(top_raw, UnsetType)
            else tops.take(top_raw, start, cut=at_tops >= 0),
        )

    def _delta(self, text: str) -> str:
        start = self._text_len
        if len(text) < start or text[start - len(self._tail) : start] != self._tail:
            msg = (
                f"$.{w.TEXT}: a cumulative SGLang event must extend the text so far "
                f"({start} characters), got {len(text)} characters that do not"
            )
            raise UpstreamContractError(msg, param=f"$.{w.TEXT}")
        self._text_len = len(text)
        self._tail = text[-_TAIL:]
        return text[start:]

    @overload
    def _chunk(
        self, text: str, meta: _MetaCounts, *, whole: bool, plain: Literal[False], offset: int = 0
    ) -> bytes: ...
    @overload
    def _chunk(
        self, text: str, meta: _MetaCounts, *, whole: bool, plain: bool, offset: int = 0
    ) -> bytes | str: ...
    def _chunk(
        self, text: str, meta: _MetaCounts, *, whole: bool, plain: bool, offset: int = 0
    ) -> bytes | str:
        """The generate chunk of an event: ``text`` all its text if ``whole``, else the new part.

        With ``plain``, a plain chunk is its text delta alone (:meth:`feed_each`). ``offset``:
        the output position the meta_info's logprob arrays start at.
        """
        finish = meta.finish_reason
        fields = (None, None) if finish is None else _finish_fields(finish, self._stop_token_ids)
        if isinstance(fields, SglangFailure):
            self._ended = True
            return _error_event({w.MESSAGE: fields.message, w.CODE: fields.status})
        delta = self._delta(text) if whole else text
        logprobs = None
        if type(meta) is _Meta:  # else its counts alone: no logprobs in it
            logprobs = _logprobs(meta, (0 if self._incremental else self._logprobs) - offset)
            if not isinstance(meta.output_token_logprobs, UnsetType):
                self._logprobs = offset + len(meta.output_token_logprobs)
        self._request_id = meta.id
        if plain and delta and finish is None and logprobs is None:
            return delta
        finish_reason, stop_reason = fields
        out = _generate_chunk(meta.id, delta, finish_reason, stop_reason, logprobs)
        if finish is None:
            return out
        self._ended = True
        usage = {w.REQUEST_ID: meta.id, w.OUTPUT_MODE: _TEXT, w.CHOICES: [], w.USAGE: _usage(meta)}
        return out + format_sse_event(usage)


def _generate_chunk(
    request_id: str,
    delta: str,
    finish_reason: str | None,
    stop_reason: int | str | None,
    logprobs: dict[str, Any] | None,
) -> bytes:
    choice = {
        w.INDEX: 0,
        w.TEXT: delta,
        w.FINISH_REASON: finish_reason,
        w.STOP_REASON: stop_reason,
        w.LOGPROBS: logprobs,
    }
    return format_sse_event({w.REQUEST_ID: request_id, w.OUTPUT_MODE: _TEXT, w.CHOICES: [choice]})


def answer_failure(body: bytes) -> SglangFailure | None:
    """The failure a 2xx ``/generate`` answer reports (an abort, an in-stream error), else ``None``.

    A prefill's answer is read to its end and never reaches the client (``docs/sglang.md``): it
    is read here only for the failure it may carry, whole JSON or a stream held whole. What does
    not read as SGLang's is no failure: the decode's answer is the one checked.
    """
    if body.lstrip()[:5] == b"data:":
        try:
            payloads = SseParser(max_event_bytes=len(body) + 1).feed(body + b"\n\n")
        except UpstreamContractError:
            return None
    else:
        payloads = [body]
    for payload in payloads:
        try:
            event = _EVENT_DECODER.decode(payload)
        except (msgspec.DecodeError, RecursionError):
            continue
        if event.error is not UNSET:
            code = event.error.get(w.CODE) if isinstance(event.error, Mapping) else None
            status = code if type(code) is int else _FAILED_STATUS
            message = _message_of(event.error) or "the SGLang worker reported an error"
            return SglangFailure(status=status, message=message)
        meta = event.meta_info
        finish = meta.finish_reason if isinstance(meta, _Meta) else None
        if finish is not None and finish.type == w.FINISH_ABORT:
            return _failure(finish)
    return None


def _error_event(error: object) -> bytes:
    message = _message_of(error) or f"the SGLang worker reported {describe(error)}"
    code = error.get(w.CODE) if isinstance(error, Mapping) else None
    status = code if type(code) is int else _FAILED_STATUS
    return format_sse_event({w.ERROR: {w.MESSAGE: message, w.CODE: status}})


def _message_of(error: object) -> str | None:
    if isinstance(error, str):
        return error
    value = error.get(w.MESSAGE) if isinstance(error, Mapping) else None
    return value if isinstance(value, str) else None


def sglang_error_message(body: object) -> str | None:
    """The message of an SGLang error answer, in any of its three shapes, else ``None``.

    ``{"error": "<text>"}`` (the contract gate), ``{"error": {"message": ...}}`` (a ValueError)
    and ``{"object": "error", "message": ...}`` (FastAPI and HTTP exceptions).
    """
    if not isinstance(body, Mapping):
        return None
    if w.ERROR in body:
        return _message_of(body[w.ERROR])
    return _message_of(body)

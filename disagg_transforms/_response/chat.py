"""The chat envelope over the generate route (``docs/responses.md``): wrap, single frame, stream.

A chat client on the generate route must not be able to tell: the answer is rebuilt from an
allow-list (so a field vLLM adds to the generate response later cannot leak), the derendered
message moves across whole, text becomes an assistant message, and finish reasons the openai SDK
would reject are mapped with the original kept readable. Three shapes:

- :func:`wrap_chat_completion` (and its bytes twin): one ``chat.completion``.
- :func:`single_frame_chat_stream` (and :func:`single_frame_chat_chunks`): a derender leg cannot
  stream on vLLM 0.33, so its whole answer becomes a short ``chat.completion.chunk`` stream:
  per choice one chunk with the full delta, then one with its finish reason; a usage-only
  chunk when the client asked; then ``data: [DONE]``.
- :class:`ChatStreamConverter`: a text-mode leg streams; generate SSE bytes go in, split
  anywhere, and ``chat.completion.chunk`` SSE bytes come out, the echo checked on every chunk.

The per-choice rules every envelope shares live in :mod:`disagg_transforms._response.choices`.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import starmap
from typing import Any, Final, Generic, Literal, TypedDict, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from disagg_transforms._config import OutputMode
from disagg_transforms._response.choices import (
    DICT_CODEC,
    PRECUT_LOGPROBS,
    RAW_CODEC,
    SDK_FINISH_REASONS,
    Codec,
    chat_id,
    choice_path,
    client_top_logprobs,
    contract_error,
    cut_logprobs,
    finish_fields,
    finish_pair,
    logprobs_out,
    require_text_mode,
)
from disagg_transforms._response.echo import (
    as_output_mode,
    check_echoed_mode,
    check_output_mode_echo,
    looks_generate,
)
from disagg_transforms._response.generate_stream import (
    PLAIN_SLOT,
    GenerateStreamReader,
    StreamChoice,
    StreamEvent,
    cut_at_slots,
    first_request_id,
    with_text,
)
from disagg_transforms._response.options import (
    DEFAULT_OPTIONS,
    EnvelopeOptions,
    client_mapping,
    envelope_created,
    envelope_model,
    writes_like_032,
)
from disagg_transforms._routes import Route
from disagg_transforms._wire import keys as w
from disagg_transforms._wire import limits as _limits
from disagg_transforms._wire import raw as _raw
from disagg_transforms._wire.describe import describe
from disagg_transforms._wire.sse import DONE_EVENT, encode_event_json, format_sse_event
from disagg_transforms._wire.validate import CONVERT_ERRORS, MAPPINGS
from disagg_transforms.envelopes import ChatMessage, Usage
from disagg_transforms.errors import DisaggTransformError, UpstreamContractError, error_body

__all__ = (
    "ChatStreamConverter",
    "single_frame_chat_chunks",
    "single_frame_chat_stream",
    "wrap_chat_completion",
    "wrap_chat_completion_bytes",
)

_P = TypeVar("_P")
_L = TypeVar("_L")
# An enum member costs several times a global's lookup (Python 3.11): read once per call each.
_TEXT: Final = OutputMode.TEXT
_DERENDER: Final = OutputMode.DERENDER


class _Choice(msgspec.Struct, Generic[_P, _L], kw_only=True, gc=False):
    # Narrow view: token_ids, routed_experts, sampling_mask... are never read nor decoded. The
    # members moved across whole (text included) are _P: the caller's own objects (dict path)
    # or Raw (bytes); logprobs are _L: the same, or a view cut while decoding (bytes, text mode).
    # gc=False (here and below): a decoded view holds no cycle, so the collector need not track it.
    index: int
    finish_reason: str | UnsetType | None = UNSET
    stop_reason: int | str | UnsetType | None = UNSET
    text: _P | UnsetType = UNSET
    message: _P | UnsetType = UNSET
    logprobs: _L | UnsetType = UNSET  # absent reads as null


class _Response(msgspec.Struct, Generic[_P, _L], kw_only=True, gc=False):
    request_id: str
    output_mode: Any = UNSET
    object: Any = UNSET  # a client API's envelope: not a generate answer at all
    model: str | UnsetType | None = UNSET
    created: int | UnsetType | None = UNSET
    # msgspec cannot put Raw in a union with None: a null member is Raw(b"null") (codec.is_null).
    usage: _P | UnsetType = UNSET
    prompt_logprobs: _P | UnsetType = UNSET
    choices: list[_Choice[_P, _L]]


_DICT_VIEW = _Response[Any, Any]
_RAW_DECODER = msgspec.json.Decoder(_Response[msgspec.Raw, msgspec.Raw])
# One per client top_logprobs: each choice's logprobs cut to it while the response is decoded.
_PRECUT_DECODERS = tuple(
    msgspec.json.Decoder(_Response[msgspec.Raw, view | None])  # type: ignore[valid-type]
    for view in PRECUT_LOGPROBS
)


def _message(
    codec: Codec[_P], view: _Choice[_P, Any], requested: OutputMode, position: int, reasoning: bool
) -> object:
    if requested is _DERENDER:
        path = choice_path(position)
        if view.message is UNSET:
            msg = f"{path}.message: a derender choice must carry the parsed message; it is missing"
            raise UpstreamContractError(msg, param=f"{path}.message")
        # Read for its reasoning and to check it; written whole: tool_calls, unknown keys.
        parsed = codec.read(view.message, ChatMessage, f"{path}.message")
        if reasoning and parsed.reasoning is not UNSET:
            return codec.extend(view.message, w.REASONING_CONTENT, parsed.reasoning)
        return view.message
    if view.text is UNSET:
        path = choice_path(position)
        msg = f"{path}.text: a text choice must carry its text; it is missing"
        raise UpstreamContractError(msg, param=f"{path}.text")
    if not codec.is_string(view.text):
        path = choice_path(position)
        got = describe(codec.load(view.text, f"{path}.text"))
        msg = f"{path}.text: expected a string, got {got}"
        raise UpstreamContractError(msg, param=f"{path}.text")
    return {w.ROLE: w.ASSISTANT, w.CONTENT: view.text, **_TEXT_MESSAGE_NULLS}


class _ClientView(TypedDict, total=False):
    # What the wrap reads of the client's request, decoded straight into the mapping the rules
    # read (no dict built after); the rest of its bytes is skipped.
    model: Any
    top_logprobs: Any


_CLIENT_DECODER = msgspec.json.Decoder(_ClientView)


class _Asked(msgspec.Struct, frozen=True, gc=False):
    """What the client asked for, as the wrap reads it (a struct: built in C, once a call)."""

    client: Mapping[str, Any] | None
    """The client body's ``model`` and ``top_logprobs``."""
    top: int | None
    """How many alternatives per token a text answer keeps (``None``: all; derender: as sent)."""


def _asked(client_body: object, requested: OutputMode) -> _Asked:
    """Read the client body (a bytes body narrowly: its ``model`` and ``top_logprobs``)."""
    client: Mapping[str, Any] | None
    # Bytes first (the bytes wrap's own case), and before the Mapping ABC, whose isinstance
    # check costs more than the whole read.
    if isinstance(client_body, (bytes, bytearray, memoryview)):
        try:
            client = _CLIENT_DECODER.decode(client_body)
        except (msgspec.DecodeError, RecursionError):
            raise _not_a_client_body(client_body) from None
    elif client_body is None or isinstance(client_body, MAPPINGS):
        client = client_body
    else:
        raise _not_a_client_body(client_body)
    return _Asked(client, client_top_logprobs(client) if requested is _TEXT else None)


def _not_a_client_body(client_body: object) -> UpstreamContractError:
    msg = f"client_body: expected the client's JSON object, got {describe(client_body)}"
    return UpstreamContractError(msg, param="client_body")


_NOT_ASKED: Final = _Asked(None, None)


# The nulls vLLM's chat writes where the allow-list keeps the worker's values out (merged from
# constants: cheaper than a key each): a text message's (vLLM's ChatMessage without a reasoning
# parser; tool_calls dropped empty), a choice's, and the top level's around usage.
_TEXT_MESSAGE_NULLS: Final = dict.fromkeys(
    (w.REFUSAL, w.ANNOTATIONS, w.AUDIO, w.FUNCTION_CALL, w.REASONING)
)
_CHOICE_NULLS: Final = dict.fromkeys((w.TOKEN_IDS, w.ROUTED_EXPERTS, w.WEIGHT_VERSIONS))
# vLLM 0.32's choice has no weight_versions (docs/envelopes.md, "Envelope options").
_CHOICE_NULLS_032: Final = {k: v for k, v in _CHOICE_NULLS.items() if k != w.WEIGHT_VERSIONS}
_HEAD_NULLS: Final = dict.fromkeys((w.SERVICE_TIER, w.SYSTEM_FINGERPRINT))
_TAIL_NULLS: Final = dict.fromkeys((w.PROMPT_TOKEN_IDS, w.PROMPT_TEXT, w.METRICS))
_PromptLogprobs = list[dict[str, Any] | None]
_USAGE_PATH = f"$.{w.USAGE}"
_PROMPT_LOGPROBS_PATH = f"$.{w.PROMPT_LOGPROBS}"


def _wrap(
    codec: Codec[_P],
    view: _Response[_P, Any],
    *,
    requested: OutputMode,
    asked: _Asked,
    options: EnvelopeOptions,
) -> dict[str, Any]:
    """The rules of the chat envelope, on either path's view of the response."""
    choices = []
    choice_nulls = _CHOICE_NULLS_032 if writes_like_032(options) else _CHOICE_NULLS
    for position, choice in enumerate(view.choices):
        finish = finish_fields(
            choice.finish_reason, streaming=False, passthrough=options.vllm_finish_reasons
        )
        built: dict[str, Any] = {
            w.INDEX: choice.index,
            w.MESSAGE: _message(codec, choice, requested, position, options.reasoning_content),
            w.LOGPROBS: logprobs_out(codec, choice.logprobs, asked.top, position),
            **finish,
            w.STOP_REASON: None if choice.stop_reason is UNSET else choice.stop_reason,
            **choice_nulls,
        }
        choices.append(built)
    if len(choices) > 1:
        choices.sort(key=lambda built: built[w.INDEX])
    # vLLM's ChatCompletionResponse, in its field order: its nulls written, the worker's
    # system_fingerprint unknown here (a generate answer carries none), its kv_transfer_params
    # and ec_transfer_params never (docs/responses.md, "Allow-list").
    result: dict[str, Any] = {
        w.ID: chat_id(view.request_id),
        w.OBJECT: w.CHAT_COMPLETION_OBJECT,
        w.CREATED: envelope_created(options, view.created),
        w.MODEL: envelope_model(options, view.model, asked.client),
        w.CHOICES: choices,
        **_HEAD_NULLS,
    }
    if view.usage is not UNSET:
        result[w.USAGE] = view.usage
        if not codec.is_null(view.usage) and _null_created_cache(
            codec.read(view.usage, Usage, _USAGE_PATH)
        ):
            result[w.USAGE] = _created_cache_counted(codec.load(view.usage, _USAGE_PATH))
    prompt_logprobs = None
    if view.prompt_logprobs is not UNSET and not codec.is_null(view.prompt_logprobs):
        codec.read(view.prompt_logprobs, _PromptLogprobs, _PROMPT_LOGPROBS_PATH)
        prompt_logprobs = view.prompt_logprobs
    result[w.PROMPT_LOGPROBS] = prompt_logprobs
    result.update(_TAIL_NULLS)
    return result


def _null_created_cache(usage: Usage) -> bool:
    """Whether the usage's ``created_cache_tokens`` is null (see :func:`_created_cache_counted`)."""
    details = usage.prompt_tokens_details
    return isinstance(details, dict) and details.get(w.CREATED_CACHE_TOKENS, 0) is None


class _CommonChoice(msgspec.Struct, kw_only=True, gc=False):
    # _Choice as the common text answer has it: its text, no logprobs (null or absent).
    index: int
    finish_reason: str | UnsetType | None = UNSET
    stop_reason: int | str | UnsetType | None = UNSET
    text: msgspec.Raw
    logprobs: None = None


class _CommonText(msgspec.Struct, kw_only=True, gc=False):
    # _Response as the common text answer has it: one choice, a usage, no prompt logprobs. Its
    # shape checked while decoding, by msgspec, instead of one Python test each after.
    request_id: str
    output_mode: Literal["text"]  # another echo (or none) is checked the general way
    model: str | UnsetType | None = UNSET
    created: int | UnsetType | None = UNSET
    usage: msgspec.Raw
    prompt_logprobs: None = None
    choices: tuple[_CommonChoice]


_COMMON_TEXT_DECODER: Final = msgspec.json.Decoder(_CommonText)
# How a generate answer whose last choice has no logprobs ends: vLLM writes a choice's logprobs
# last, and the choices last. Only such an answer is tried through the common view: one with
# logprobs would fail it only once read nearly whole (its logprobs are most of it).
_COMMON_TEXT_END: Final = b"null}]}"
_AT_END: Final = -len(_COMMON_TEXT_END)  # a slice's compare: cheaper than endswith's arguments


class _TextMessage(msgspec.Struct, gc=False):
    # A text choice's message as _message builds it: the nulls of _TEXT_MESSAGE_NULLS.
    role: str
    content: Any
    refusal: None = None
    annotations: None = None
    audio: None = None
    function_call: None = None
    reasoning: None = None


class _TextChoice(msgspec.Struct, kw_only=True, gc=False):
    # A choice as _wrap builds it (UNSET: left out): vllm_finish_reason only when mapped,
    # weight_versions not for vLLM 0.32.
    index: Any
    message: _TextMessage
    logprobs: None = None
    finish_reason: Any
    vllm_finish_reason: Any
    stop_reason: Any
    token_ids: None = None
    routed_experts: None = None
    weight_versions: UnsetType | None


class _TextCompletion(msgspec.Struct, kw_only=True, gc=False):
    # The chat.completion as _wrap builds it, in vLLM's field order (UNSET: left out).
    id: Any
    object: str = w.CHAT_COMPLETION_OBJECT
    created: Any
    model: Any
    choices: list[_TextChoice]
    service_tier: None = None
    system_fingerprint: None = None
    usage: Any
    prompt_logprobs: None = None
    prompt_token_ids: None = None
    prompt_text: None = None
    metrics: None = None


def _text_pieces(*, mapped: bool, weight_versions: bool) -> tuple[bytes, ...]:
    """The common text answer's envelope, encoded once and cut around the values that vary.

    In order: ``id``, ``created``, ``model``, the choice's ``index``, its text, its finish
    reason as the worker sent it (``vllm_finish_reason`` when ``mapped``), ``stop_reason``,
    ``usage``. Built from the structs laid out as :func:`_wrap` builds the envelope.
    """
    finish, vllm_finish = (
        (finish_pair(None, streaming=False, passthrough=False)[0], PLAIN_SLOT)
        if mapped
        else (PLAIN_SLOT, UNSET)
    )
    choice = _TextChoice(
        index=PLAIN_SLOT,
        message=_TextMessage(w.ASSISTANT, PLAIN_SLOT),
        finish_reason=finish,
        vllm_finish_reason=vllm_finish,
        stop_reason=PLAIN_SLOT,
        weight_versions=None if weight_versions else UNSET,
    )
    completion = _TextCompletion(
        id=PLAIN_SLOT, created=PLAIN_SLOT, model=PLAIN_SLOT, choices=[choice], usage=PLAIN_SLOT
    )
    return tuple(cut_at_slots(_raw.encode(completion)))


# _TEXT_PIECES[mapped][weight_versions]: a mapped finish reason writes vllm_finish_reason, and
# vLLM 0.32 no weight_versions.
_TEXT_PIECES: Final = tuple(
    tuple(_text_pieces(mapped=mapped, weight_versions=versions) for versions in (False, True))
    for mapped in (False, True)
)


def _finish_written(value: object, passthrough: bool) -> tuple[bool, bytes]:
    """A text choice's finish reason as the envelope writes it: mapped or not, and its bytes.

    Mapped (:func:`finish_pair`), the bytes are the ``vllm_finish_reason`` kept (the
    ``finish_reason`` is then a constant of the layout); else the ``finish_reason``.
    """
    finish, vllm_finish = finish_pair(value, streaming=False, passthrough=passthrough)
    mapped = vllm_finish is not UNSET
    return mapped, _raw.encode(vllm_finish if mapped else finish)


# _FINISH_WRITTEN[passthrough][reason]: _finish_written of the reasons vLLM writes, worked out
# once (any other value is worked out per answer).
_FINISH_WRITTEN: Final[tuple[dict[object, tuple[bool, bytes]], ...]] = tuple(
    {
        reason: _finish_written(reason, passthrough)
        for reason in (*SDK_FINISH_REASONS, w.FINISH_ABORT, w.FINISH_REPETITION, None)
    }
    for passthrough in (False, True)
)


class _KnownUsage(Usage, kw_only=True, forbid_unknown_fields=True):
    """A usage of known members only: decoding it checks the UTF-8 of every string in it.

    msgspec would skip an unknown member's value unread: such a usage goes the general way,
    which checks the bytes it passes on.
    """


_USAGE_DECODER: Final = msgspec.json.Decoder(_KnownUsage | None)


def _text_completion(data: bytes, asked: _Asked, options: EnvelopeOptions) -> bytes | None:
    """The common text answer's envelope, its values spliced into bytes; ``None``: another.

    The answer the router sees most (:class:`_CommonText`: one choice with its text, no
    logprobs, no prompt logprobs, a usage, the echo ``text``), read through its own view. Its
    envelope is what :func:`_wrap` builds (a property test holds the two to the same bytes),
    without a dict or struct per member (:data:`_TEXT_PIECES`). UTF-8 is checked on what is
    written undecoded, the text (its check also tells it is a JSON string) and the usage
    (decoded through a view of its known members, which checks every string in it); every
    other string msgspec decoded, valid by construction. ``None`` for any other answer (another
    echo, logprobs, several choices...) and a broken one (the text not a string, the usage not
    one or holding another member, a byte not UTF-8): the general way, which reads any answer,
    reports what is wrong.
    """
    try:
        view = _COMMON_TEXT_DECODER.decode(data)
        choice = view.choices[0]
        text, usage = choice.text, view.usage
        known = _USAGE_DECODER.decode(usage)
        # Only a details object (absent or null in the common answer) can hold the null.
        if known is not None and known.prompt_tokens_details and _null_created_cache(known):
            # Written as the general way writes it (docs/responses.md, "Allow-list").
            usage = msgspec.Raw(
                _raw.encode(_created_cache_counted(RAW_CODEC.load(usage, _USAGE_PATH)))
            )
        if str(text, "utf-8")[0] != '"':  # valid JSON: never empty
            return None
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return None  # the general way reports it (a bad byte: the response's first one)
    finish = choice.finish_reason
    written = _FINISH_WRITTEN[options.vllm_finish_reasons].get(finish)
    mapped, finish_bytes = (
        _finish_written(finish, options.vllm_finish_reasons) if written is None else written
    )
    created, model = view.created, view.model
    if type(created) is not int:
        created = envelope_created(options, created)
    # The worker's model in the common case, without the call.
    if type(model) is not str or not model or options.model:
        model = envelope_model(options, model, asked.client)
    stop = choice.stop_reason
    at_id, at_created, at_model, at_index, at_text, at_finish, at_stop, at_usage, end = (
        _TEXT_PIECES[mapped][not writes_like_032(options)]
    )
    encode = _raw.encode
    return b"".join(
        (
            at_id,
            encode(chat_id(view.request_id)),
            at_created,
            encode(created),
            at_model,
            encode(model),
            at_index,
            encode(choice.index),
            at_text,
            text,
            at_finish,
            finish_bytes,
            at_stop,
            _NULL if stop is None or stop is UNSET else encode(stop),
            at_usage,
            usage,
            end,
        )
    )


def _created_cache_counted(usage: Any) -> dict[str, Any]:  # noqa: ANN401 - a JSON object
    """The usage with ``created_cache_tokens`` 0 where the generate route wrote null.

    vLLM's chat serving writes the prompt tokens its prefill wrote to the prefix cache, an
    integer; its generate route has no such count: 0 (docs/responses.md, "Allow-list").
    """
    details = usage[w.PROMPT_TOKENS_DETAILS]
    return {**usage, w.PROMPT_TOKENS_DETAILS: {**details, w.CREATED_CACHE_TOKENS: 0}}


def wrap_chat_completion(
    response: Mapping[str, Any],
    *,
    requested: OutputMode,
    client_body: Mapping[str, Any] | None = None,
    options: EnvelopeOptions | None = None,
) -> dict[str, Any]:
    """Build the ``chat.completion`` a chat client expects from a text or derender response.

    Args:
        response: The decoded generate response (never mutated; nested values the result keeps,
            such as ``usage`` or a message's ``tool_calls``, are shared with it, not copied).
        requested: The ``output_mode`` the leg asked for (checked against the echo first).
        client_body: The client's chat request: its ``top_logprobs`` cuts text-mode logprobs
            and its ``model`` is the last fallback.
        options: How the envelope is built (:class:`EnvelopeOptions`).

    Raises:
        UpstreamContractError: the echo check fails (``docs/responses.md``), or the response is
            malformed; the ``param`` is the JSON path.
        ConfigError: ``requested`` is ``tokens`` (token IDs carry no text).
        RequestError: the client's ``top_logprobs`` is not an integer >= -1.
    """
    requested = as_output_mode(requested)
    check_output_mode_echo(response, requested)
    require_text_mode(requested, streaming=False)
    try:
        view = msgspec.convert(dict(response), _DICT_VIEW)
    except CONVERT_ERRORS as error:
        raise contract_error(error, "the generate response") from None
    return _wrap(
        DICT_CODEC,
        view,
        requested=requested,
        asked=_asked(client_body, requested),
        options=DEFAULT_OPTIONS if options is None else options,
    )


def wrap_chat_completion_bytes(
    response: bytes,
    *,
    requested: OutputMode,
    client_body: Mapping[str, Any] | bytes | None = None,
    options: EnvelopeOptions | None = None,
) -> bytes:
    """:func:`wrap_chat_completion` from the worker's JSON bytes to the client's JSON bytes.

    Same rules, same errors; only what the rules read is decoded: per choice its ``index``,
    finish fields and ``text`` or ``message``; ``usage`` and ``prompt_logprobs`` are checked
    and written with their input bytes, ``logprobs`` too unless text mode cuts them (then only
    the ``top_logprobs`` lists are split), and ``token_ids`` and every dropped member are
    skipped undecoded. ``client_body`` may be the client's JSON bytes (only its ``model`` and
    ``top_logprobs`` are read). See ``docs/bytes.md``.

    Raises:
        UpstreamContractError: as :func:`wrap_chat_completion`; also ``param`` ``$`` when the
            response is not bytes, not valid JSON, not an object, not UTF-8, or over
            ``options.limits.max_body_bytes``.
        ConfigError: ``requested`` is ``tokens``.
        RequestError: the client's ``top_logprobs`` is not an integer >= -1.
    """
    if requested is not _TEXT:  # the text mode itself needs no reading
        requested = as_output_mode(requested)
    built = DEFAULT_OPTIONS if options is None else options
    untyped: object = response  # the caller's value may be anything
    if type(untyped) is bytes:  # immutable already: the common case, without the calls below
        data = untyped
    elif isinstance(untyped, (bytes, bytearray, memoryview)):
        # A Raw is a view of its input: a private immutable copy keeps a caller's buffer out.
        data = bytes(untyped)
    else:
        msg = f"$: the generate response must be JSON bytes, got {describe(untyped)}"
        raise UpstreamContractError(msg, param="$")
    _limits.check_body_size(data, built.limits, error=UpstreamContractError)
    asked = _NOT_ASKED
    client_error: DisaggTransformError | None = None
    try:
        asked = _asked(client_body, requested)
    except DisaggTransformError as error:
        client_error = error  # raised below, after the checks the dict path makes first
    if requested is _TEXT and client_error is None and data[_AT_END:] == _COMMON_TEXT_END:
        out = _text_completion(data, asked, built)
        if out is not None:
            return out
    view = _general_view(data, requested, asked.top)
    if requested is not _TEXT:
        require_text_mode(requested, streaming=False)
    if client_error is not None:
        raise client_error
    out = _raw.encode(_wrap(RAW_CODEC, view, requested=requested, asked=asked, options=built))
    _raw.check_passed_on_utf8(out, data, UpstreamContractError)
    return out


def _general_view(data: bytes, requested: OutputMode, top: int | None) -> _Response[Any, Any]:
    """The response through the general view, its logprobs cut while decoding when it can be.

    Its echo is checked (first, as on the dict path).
    """
    view = _precut(data, top)
    if view is None:
        view = _decode_response(data, requested)
    if view.output_mode != requested:  # the one comparison a conforming answer costs
        check_echoed_mode(view.output_mode, requested, generate=view.object is UNSET)
    return view


def _precut(data: bytes, top: int | None) -> _Response[msgspec.Raw, Any] | None:
    """The response with text-mode logprobs cut to ``top`` while decoding; ``None``: not so.

    ``None`` when there is no cut to make or it is beyond the views, and when the response does
    not decode through the cutting view (another logprobs shape, or a broken response): the
    caller then decodes it the general way, which cuts any shape and reports any error.
    """
    if top is None or top >= len(_PRECUT_DECODERS):
        return None
    try:
        return _PRECUT_DECODERS[top].decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None


def _decode_response(data: bytes, requested: OutputMode) -> _Response[msgspec.Raw, msgspec.Raw]:
    try:
        return _RAW_DECODER.decode(data)
    except msgspec.ValidationError as error:
        if not data.lstrip().startswith(b"{"):
            msg = "$: a generate response must be a JSON object"
            raise UpstreamContractError(msg, param="$") from None
        # The echo is checked before the shape, as on the dict path.
        members = _raw.split(data, UpstreamContractError, "the generate response")
        echoed = members.get(w.OUTPUT_MODE)
        mode = UNSET if echoed is None else _raw.decode_member(echoed, "$", UpstreamContractError)
        check_echoed_mode(mode, requested, generate=looks_generate(members))
        raise contract_error(error, "the generate response") from None
    except (msgspec.DecodeError, RecursionError) as error:
        msg = f"$: the generate response is not valid JSON: {error}"
        raise UpstreamContractError(msg, param="$") from None


class _ChunkChoice(msgspec.Struct, kw_only=True, gc=False):
    """A ``chat.completion.chunk`` choice, its members in vLLM's order (``UNSET``: left out).

    Encoded by msgspec straight from the struct: faster than a dict per chunk. ``stop_reason``
    is written on a choice's finishing chunk only and ``token_ids`` on every text chunk, as
    vLLM's chat route writes them (``docs/responses.md``, chat streams); ``weight_versions``
    (null) on the finishing chunk too, as vLLM 0.33 writes it (0.32 has none).
    """

    index: int
    delta: dict[str, Any]
    logprobs: Any = None
    finish_reason: str | None = None
    vllm_finish_reason: Any = UNSET
    stop_reason: Any = UNSET
    token_ids: Any = UNSET
    weight_versions: Any = UNSET


_CHOICES_MEMBER: Final = b',"' + w.CHOICES.encode() + b'":'
_USAGE_MEMBER: Final = b',"' + w.USAGE.encode() + b'":'
_NO_CHOICES: Final = b"[]"
_CHUNK_END: Final = b"}\n\n"
# vLLM's chat route writes these two on each choice's opening chunk (null unless asked).
_PROMPT_TOKEN_IDS_MEMBER: Final = b',"prompt_token_ids":'
_OPENING_END: Final = b',"prompt_text":null}\n\n'
_NULL: Final = b"null"
_ROLE_DELTA: Final = {w.ROLE: w.ASSISTANT, w.CONTENT: ""}


def _running_usage(usage: Mapping[str, Any], completion_tokens: int | None = None) -> bytes:
    """A chunk's continuous usage as vLLM's chat route writes it (``docs/responses.md``)."""
    prompt = usage.get(w.PROMPT_TOKENS)
    if completion_tokens is None:
        completion_tokens = usage.get(w.COMPLETION_TOKENS)
        total = usage.get(w.TOTAL_TOKENS)
    else:  # an opening chunk: nothing generated yet
        total = prompt
    return encode_event_json(
        {
            w.PROMPT_TOKENS: prompt,
            w.TOTAL_TOKENS: total,
            w.COMPLETION_TOKENS: completion_tokens,
            w.COMPLETION_TOKENS_DETAILS: None,
        }
    )


def _final_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """A stream's usage as vLLM's chat route writes it: ``created_cache_tokens`` 0 if unnamed.

    The generate route names no such count: the wrap's rule (``docs/responses.md``).
    """
    details = usage.get(w.PROMPT_TOKENS_DETAILS)
    if isinstance(details, dict) and details.get(w.CREATED_CACHE_TOKENS) is None:
        return _created_cache_counted(usage)
    return usage


def _client_choice_count(client: Mapping[str, Any]) -> int:
    # The request side has checked the client's n; a missing or odd one reads as vLLM's 1.
    value = client.get(w.N)
    return value if type(value) is int and value >= 1 else 1


def _include_usage(client_body: Mapping[str, Any] | None) -> bool:
    options = client_mapping(client_body).get(w.STREAM_OPTIONS)
    return isinstance(options, Mapping) and options.get(w.INCLUDE_USAGE) is True


def _chunk_head(completion_id: str, created: int, model: str) -> dict[str, Any]:
    return {
        w.ID: completion_id,
        w.OBJECT: w.CHAT_COMPLETION_CHUNK_OBJECT,
        w.CREATED: created,
        w.MODEL: model,
    }


# ChatMessage's fields that vLLM's DeltaMessage lacks, and a reasoning never set: left out of a
# delta when null, as vLLM's stream dumps its chunks (exclude_unset).
_NOT_IN_DELTA: Final = (w.REFUSAL, w.ANNOTATIONS, w.AUDIO, w.FUNCTION_CALL, w.REASONING)


# A whole choice's members a chunk's choice leaves out: vLLM sets none of the nulls on its chunks.
_NOT_IN_CHUNK: Final = frozenset({w.MESSAGE, w.TOKEN_IDS, w.ROUTED_EXPERTS, w.WEIGHT_VERSIONS})


def _delta(message: Mapping[str, Any]) -> dict[str, Any]:
    # A streamed tool call needs its position; the rest of the message moves across whole.
    delta = {
        key: value
        for key, value in message.items()
        if value is not None or key not in _NOT_IN_DELTA
    }
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
    # The members vLLM's chat stream writes around the parse (docs/envelopes.md, single frame):
    # the token IDs only when the client asked for them, weight_versions from 0.33 on.
    token_ids = client_mapping(client_body).get(w.RETURN_TOKEN_IDS) is True
    opening_tail = {
        w.PROMPT_TOKEN_IDS: completion.get(w.PROMPT_TOKEN_IDS) if token_ids else None,
        w.PROMPT_TEXT: None,
    }
    weight_versions = not writes_like_032(DEFAULT_OPTIONS if options is None else options)
    chunks = []
    for choice in completion[w.CHOICES]:
        opened = {
            w.INDEX: choice[w.INDEX],
            w.DELTA: _delta(choice[w.MESSAGE]),
            w.LOGPROBS: choice[w.LOGPROBS],
            w.FINISH_REASON: None,
            w.TOKEN_IDS: choice.get(w.TOKEN_IDS) if token_ids else None,
        }
        finished = {key: value for key, value in choice.items() if key not in _NOT_IN_CHUNK}
        finished[w.DELTA] = {}
        finished[w.LOGPROBS] = None  # sent with the delta
        finished[w.TOKEN_IDS] = [] if token_ids else None
        if weight_versions:
            finished[w.WEIGHT_VERSIONS] = None
        chunks.append({**head, w.CHOICES: [opened], **opening_tail})
        chunks.append({**head, w.CHOICES: [_ordered(finished)]})
    if _include_usage(client_body):
        usage = response.get(w.USAGE)
        stream_usage = _final_usage(_set_only(usage)) if isinstance(usage, dict) else None
        chunks.append({**head, w.CHOICES: [], w.USAGE: stream_usage})
    return chunks


def _set_only(usage: dict[str, Any]) -> dict[str, Any]:
    # vLLM dumps a usage-only chunk leaving every null out (exclude_none): details included.
    return {
        key: {name: part for name, part in value.items() if part is not None}
        if isinstance(value, dict)
        else value
        for key, value in usage.items()
        if value is not None
    }


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
    bytes to send on, possibly empty. The chunks are cut as vLLM's own chat route cuts them
    (``docs/responses.md``, chat streams): at the first generate chunk, one opening chunk per
    choice the client asked for (``n``) with ``{"role": "assistant", "content": ""}``; then
    one chunk per generate choice, ``content`` its text delta (an empty text gives ``{}``, and
    no chunk at all unless it finishes the choice or carries logprobs), ``logprobs`` cut to the
    client's ``top_logprobs``, finish reasons mapped as in
    :func:`~disagg_transforms.wrap_chat_completion` and ``stop_reason`` on the finishing chunk;
    continuous usage, when the leg streams it, written as the chat route counts it. A
    usage-only generate chunk becomes a usage-only chat chunk; an in-stream ``{"error": ...}``
    event is sent on byte for byte; ``[DONE]`` is sent on. Output bytes depend only on the
    input bytes, not on how they were split.

    Every chunk's ``id`` comes from the first generate chunk's ``request_id`` by the rules of
    :func:`~disagg_transforms.wrap_chat_completion` (so both give one answer one id), its
    ``model`` from ``options.model``, else the client body's ``model``, and its ``created`` is
    ``created``, else ``options.clock()`` when the converter is made (generate chunks carry
    neither a model nor a time).

    Memory per stream is bounded by ``options.max_event_bytes`` (one event) and
    ``options.max_choices`` (choice indices; a choice past the client's ``n`` gets the ones
    before it opened first, as vLLM's chat route sends them). After an error the converter is
    spent: discard it.

    Args:
        requested: The leg's ``output_mode``; only ``text`` streams (vLLM 0.33 refuses derender
            with ``stream: true``, and tokens carry no text).
        client_body: The client's chat request (its ``n``, its ``top_logprobs``, and its
            ``model`` as the fallback).
        options: How the envelope is built (:class:`EnvelopeOptions`).
        created: The ``created`` of every chunk (Unix seconds).

    Raises:
        ConfigError: ``requested`` is not ``text``.
        RequestError: the client's ``top_logprobs`` is not an integer >= -1.
        UpstreamContractError: neither the options nor the client body names a model.
    """

    __slots__ = (
        "_choice_count",
        "_created",
        "_head",
        "_max_choices",
        "_model",
        "_next",
        "_passthrough",
        "_plain",
        "_prompt_token_ids",
        "_reader",
        "_token_ids",
        "_top",
        "_weight_versions",
        "_worker_error",
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
        # A plain chunk's bytes around its encoded text, once the stream is named (see _begin).
        self._plain: tuple[bytes, bytes] | None = None
        self._passthrough = built.vllm_finish_reasons
        self._weight_versions = not writes_like_032(built)
        self._reader = GenerateStreamReader(max_event_bytes=built.max_event_bytes)
        self._max_choices = built.max_choices
        client = client_mapping(client_body)
        self._choice_count = min(_client_choice_count(client), built.max_choices)
        # The token IDs the generate leg streams reach the client only when it asked for them.
        self._token_ids = client.get(w.RETURN_TOKEN_IDS) is True
        self._prompt_token_ids = _NULL
        self._next = 0  # choices 0.._next-1 have had their opening chunk
        self._worker_error = False

    @property
    def worker_error(self) -> bool:
        """Whether the worker sent its own in-stream error event (passed on to the client)."""
        return self._worker_error

    def feed(self, data: bytes) -> bytes:
        """Consume the next bytes of the generate stream; return the chat SSE bytes they complete.

        Raises:
            UpstreamContractError: an event is not JSON, misses its echo or carries another
                ``output_mode``, is malformed (the ``param`` is its JSON path), comes after
                ``[DONE]``, or the stream exceeds a bound.
        """
        plain = self._plain
        if plain is not None:
            read = self._reader.feed_text(data)
            if isinstance(read, str):  # most chunks: written with no struct and no dict
                return with_text(plain, read)
        else:
            read = self._reader.feed(data)
        if len(read) == 1:  # a worker's socket reads usually hold one event: no join to make
            return self._event(*read[0])
        return b"".join(starmap(self._event, read))

    def plain_chunk(self, text: str) -> bytes | None:
        """The client bytes of a plain generate chunk whose text delta is ``text``.

        For a reader that reads the worker's events itself (an engine's, docs/sglang.md): a
        plain chunk is one choice, index 0, a non-empty ``text``, logprobs null, no finish
        reason, no usage. ``None`` until the stream is named and plain chunks are written from
        bytes (after its first chunk, and never when the client asked for token IDs): feed the
        generate chunk then.
        """
        plain = self._plain
        return None if plain is None else with_text(plain, text)

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

    def _begin(self, event: StreamEvent, usage: Mapping[str, Any] | None) -> tuple[bytes, bytes]:
        """Name the stream from its first event: every chunk's head, the opening chunks."""
        named = _chunk_head(chat_id(first_request_id(event)), self._created, self._model)
        # The same four members open every chunk: encoded once, "}" cut to splice in the
        # choices (see docs/performance.md).
        head = self._head = b"data: " + encode_event_json(named)[:-1] + _CHOICES_MEMBER
        if self._token_ids and event.prompt_token_ids is not UNSET:
            self._prompt_token_ids = encode_event_json(event.prompt_token_ids)
        # vLLM's chat route opens every choice at its first engine output, before any text.
        running = usage if event.choices else None
        opening = self._open(self._choice_count, head, running, "$.choices[0]")
        if not self._token_ids:
            # A plain chunk (GenerateStreamReader.feed_text) is written as _event writes it,
            # but from these bytes, cut around its text once (docs/performance.md, "Streams").
            built = self._choice(StreamChoice(index=0, text=PLAIN_SLOT))
            before, after = cut_at_slots(encode_event_json([built]))
            self._plain = (head + before, after + _CHUNK_END)
        return head, opening

    def _event(self, payload: bytes, event: StreamEvent | None) -> bytes:
        if event is None:
            return DONE_EVENT
        if event.error is not UNSET:
            self._worker_error = True
            return b"data: " + payload + b"\n\n"  # the worker's own error, sent on as is
        usage = event.usage if isinstance(event.usage, dict) else None
        if self._head is None:
            head, opening = self._begin(event, usage)
        else:
            head, opening = self._head, b""
        if not event.choices:
            if usage is None:
                return opening
            usage_only = head + _NO_CHOICES + _USAGE_MEMBER + encode_event_json(_final_usage(usage))
            return opening + usage_only + _CHUNK_END
        out = [opening] if opening else []
        for position, choice in enumerate(event.choices):
            if choice.index >= self._next:
                out.append(self._open(choice.index + 1, head, usage, f"$.choices[{position}]"))
            built = self._choice(choice)
            if built is None:
                continue
            chunk = head + encode_event_json([built])
            if usage is not None:  # continuous usage stats, as the chat route counts them
                chunk += _USAGE_MEMBER + _running_usage(usage)
            out.append(chunk + _CHUNK_END)
        return b"".join(out)

    def _open(self, count: int, head: bytes, usage: Mapping[str, Any] | None, path: str) -> bytes:
        # Clients (the openai SDK's accumulator among them) expect choice k to appear only
        # after choices 0..k-1, as vLLM's chat route sends them: open each one in turn.
        if count > self._max_choices:
            msg = f"{path}.index: {count - 1} is past the bound of {self._max_choices} choices"
            raise UpstreamContractError(msg, param=f"{path}.index")
        tail = _PROMPT_TOKEN_IDS_MEMBER + self._prompt_token_ids + _OPENING_END
        if usage is not None:
            tail = _USAGE_MEMBER + _running_usage(usage, completion_tokens=0) + tail
        opened = [
            head + encode_event_json([_ChunkChoice(index=index, delta=_ROLE_DELTA)]) + tail
            for index in range(self._next, count)
        ]
        self._next = max(self._next, count)
        return b"".join(opened)

    def _choice(self, choice: StreamChoice) -> _ChunkChoice | None:
        text = "" if choice.text is UNSET else choice.text
        logprobs = None
        if choice.logprobs is not None and choice.logprobs is not UNSET:
            logprobs = cut_logprobs(choice.logprobs, self._top)
        finish = choice.finish_reason
        finished = isinstance(finish, str)
        if not text and not finished and logprobs is None and not self._token_ids:
            return None  # vLLM's chat route sends no chunk for an empty delta
        built = _ChunkChoice(
            index=choice.index,
            delta={w.CONTENT: text} if text else {},
            logprobs=logprobs,
            token_ids=choice.token_ids if self._token_ids else None,
        )
        if isinstance(finish, str):  # null (not finished yet) stays
            built.finish_reason, built.vllm_finish_reason = finish_pair(
                finish, streaming=True, passthrough=self._passthrough
            )
            built.stop_reason = None if choice.stop_reason is UNSET else choice.stop_reason
            if self._weight_versions:
                built.weight_versions = None
        return built

"""Rebuild a ``chat.completion`` from a generate response (``docs/responses.md``).

A chat client on the generate route must not be able to tell: the answer is rebuilt from an
allow-list (so a field vLLM adds to the generate response later cannot leak), the derendered
message moves across whole, text becomes an assistant message, and finish reasons the openai SDK
would reject are mapped with the original kept readable.

The per-choice rules live in :mod:`disagg_transforms._response.chat`, shared with the streams.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, NamedTuple, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from disagg_transforms._config import OutputMode
from disagg_transforms._response.chat import (
    DICT_CODEC,
    PRECUT_LOGPROBS,
    RAW_CODEC,
    Codec,
    chat_id,
    choice_path,
    client_top_logprobs,
    contract_error,
    finish_fields,
    logprobs_out,
    require_text_mode,
)
from disagg_transforms._response.echo import (
    as_output_mode,
    check_echoed_mode,
    check_output_mode_echo,
)
from disagg_transforms._response.options import (
    DEFAULT_OPTIONS,
    EnvelopeOptions,
    envelope_created,
    envelope_model,
)
from disagg_transforms._wire import keys as w
from disagg_transforms._wire import limits as _limits
from disagg_transforms._wire import raw as _raw
from disagg_transforms._wire.describe import describe
from disagg_transforms._wire.validate import CONVERT_ERRORS, MAPPINGS
from disagg_transforms.envelopes import ChatMessage, Usage
from disagg_transforms.errors import DisaggTransformError, UpstreamContractError

__all__ = ("wrap_chat_completion", "wrap_chat_completion_bytes")

_P = TypeVar("_P")
_L = TypeVar("_L")


class _Choice(msgspec.Struct, Generic[_P, _L], kw_only=True):
    # Narrow view: token_ids, routed_experts, sampling_mask... are never read nor decoded. The
    # members moved across whole (text included) are _P: the caller's own objects (dict path)
    # or Raw (bytes); logprobs are _L: the same, or a view cut while decoding (bytes, text mode).
    index: int
    finish_reason: str | UnsetType | None = UNSET
    stop_reason: int | str | UnsetType | None = UNSET
    text: _P | UnsetType = UNSET
    message: _P | UnsetType = UNSET
    logprobs: _L | UnsetType = UNSET  # absent reads as null


class _Response(msgspec.Struct, Generic[_P, _L], kw_only=True):
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
    if requested is OutputMode.DERENDER:
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
    return {w.ROLE: w.ASSISTANT, w.CONTENT: view.text}


class _ClientView(msgspec.Struct, kw_only=True):
    # What the wrap reads of the client's request; the rest of its bytes is skipped.
    model: Any = None
    top_logprobs: Any = None


_CLIENT_DECODER = msgspec.json.Decoder(_ClientView)


def _client_fields(client_body: object) -> Mapping[str, Any] | None:
    """The client body's ``model`` and ``top_logprobs`` (a bytes body is read narrowly)."""
    if client_body is None or isinstance(client_body, MAPPINGS):
        return client_body
    if isinstance(client_body, (bytes, bytearray, memoryview)):
        try:
            view = _CLIENT_DECODER.decode(client_body)
        except (msgspec.DecodeError, RecursionError):
            pass
        else:
            return {w.MODEL: view.model, w.TOP_LOGPROBS: view.top_logprobs}
    msg = f"client_body: expected the client's JSON object, got {describe(client_body)}"
    raise UpstreamContractError(msg, param="client_body")


class _Asked(NamedTuple):
    """What the client asked for, as the wrap reads it."""

    client: Mapping[str, Any] | None
    """The client body's ``model`` and ``top_logprobs``."""
    top: int | None
    """How many alternatives per token a text answer keeps (``None``: all; derender: as sent)."""


def _asked(client_body: object, requested: OutputMode) -> _Asked:
    client = _client_fields(client_body)
    return _Asked(client, client_top_logprobs(client) if requested is OutputMode.TEXT else None)


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
        }
        choices.append(built)
    if len(choices) > 1:
        choices.sort(key=lambda built: built[w.INDEX])
    result: dict[str, Any] = {
        w.ID: chat_id(view.request_id),
        w.OBJECT: w.CHAT_COMPLETION_OBJECT,
        w.CREATED: envelope_created(options, view.created),
        w.MODEL: envelope_model(options, view.model, asked.client),
        w.CHOICES: choices,
    }
    if view.usage is not UNSET:
        if not codec.is_null(view.usage):
            codec.read(view.usage, Usage, _USAGE_PATH)
        result[w.USAGE] = view.usage
    if view.prompt_logprobs is not UNSET and not codec.is_null(view.prompt_logprobs):
        codec.read(view.prompt_logprobs, _PromptLogprobs, _PROMPT_LOGPROBS_PATH)
        result[w.PROMPT_LOGPROBS] = view.prompt_logprobs
    return result


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
    requested = as_output_mode(requested)
    built = DEFAULT_OPTIONS if options is None else options
    untyped: object = response  # the caller's value may be anything
    if not isinstance(untyped, (bytes, bytearray, memoryview)):
        msg = f"$: the generate response must be JSON bytes, got {describe(untyped)}"
        raise UpstreamContractError(msg, param="$")
    # A Raw is a view of its input: a private immutable copy keeps a caller's buffer out of it.
    data = bytes(untyped)
    _limits.check_body_size(data, built.limits, error=UpstreamContractError)
    asked = _Asked(None, None)
    client_error: DisaggTransformError | None = None
    try:
        asked = _asked(client_body, requested)
    except DisaggTransformError as error:
        client_error = error  # raised below, after the checks the dict path makes first
    view = _precut(data, asked.top)
    if view is None:
        view = _decode_response(data, requested)
    check_echoed_mode(view.output_mode, requested, generate=view.object is UNSET)
    require_text_mode(requested, streaming=False)
    if client_error is not None:
        raise client_error
    wrapped = _wrap(RAW_CODEC, view, requested=requested, asked=asked, options=built)
    out = _raw.encode(wrapped)
    _raw.check_passed_on_utf8(out, data, UpstreamContractError)
    return out


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
        generate = w.CHOICES in members and w.OBJECT not in members
        check_echoed_mode(mode, requested, generate=generate)
        raise contract_error(error, "the generate response") from None
    except (msgspec.DecodeError, RecursionError) as error:
        msg = f"$: the generate response is not valid JSON: {error}"
        raise UpstreamContractError(msg, param="$") from None

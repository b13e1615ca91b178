"""Per-choice rules of the envelopes rebuilt from a generate answer.

Every envelope (chat, Responses, Anthropic) shares which requested modes can give a client its
text, the client's ``top_logprobs``, a view's contract error and a choice's JSON path. The rest
is what makes an answer look like vLLM's own chat route, for the chat wrap and stream converter:
the completion id, finish reasons the openai SDK accepts, ``top_logprobs`` cut the chat way, and
the codecs the dict and bytes wraps read a choice's members with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Generic, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from disagg_transforms._config import OutputMode
from disagg_transforms._wire import keys as w
from disagg_transforms._wire import raw as _raw
from disagg_transforms._wire.describe import describe
from disagg_transforms._wire.validate import CONVERT_ERRORS, MAPPINGS, msgspec_failure
from disagg_transforms.errors import ConfigError, RequestError, UpstreamContractError

SDK_FINISH_REASONS: Final = frozenset(
    {"stop", "length", "tool_calls", "content_filter", "function_call"}
)
"""The ``finish_reason`` values the openai SDK's ``ChatCompletion`` accepts (openai 3.x)."""

_MAPPED_FINISH_REASON: Final = "stop"
_CHAT_MODES: Final = (OutputMode.TEXT, OutputMode.DERENDER)
_STREAMED_MODES: Final = (OutputMode.TEXT,)
_ALL_TOP_LOGPROBS: Final = -1
_P = TypeVar("_P")
_T = TypeVar("_T")


def chat_id(request_id: str) -> str:
    """The chat id of a generate ``request_id``: ``generate-tokens-`` cut, ``chatcmpl-`` ensured."""
    bare = request_id.removeprefix(w.GENERATE_ID_PREFIX)
    if bare.startswith(w.CHAT_COMPLETION_ID_PREFIX):
        return bare
    return w.CHAT_COMPLETION_ID_PREFIX + bare


def contract_error(error: BaseException, what: str, root: str = "$") -> UpstreamContractError:
    """Turn a view's validation error into an :class:`UpstreamContractError` with its path.

    ``error`` is one of :data:`~disagg_transforms._wire.validate.CONVERT_ERRORS` for the value
    found at ``root``; one without a path (nesting too deep, a lone surrogate in a key) is
    reported at ``root``.
    """
    failure = msgspec_failure(error, root)
    param = failure.path
    return UpstreamContractError(
        f"{param}: {what} breaks the contract: {failure.reason}", param=param
    )


def require_text_mode(requested: OutputMode, *, streaming: bool) -> None:
    """Refuse a requested mode that cannot give a client its text: the one such refusal.

    Every envelope (chat, Responses, Anthropic), wrap, single frame and stream converter calls
    it. ``tokens`` carries token IDs only, and vLLM 0.33 cannot stream ``derender``; both are
    the router's configuration, not the worker's answer, hence :class:`ConfigError`.
    """
    allowed = _STREAMED_MODES if streaming else _CHAT_MODES
    if requested in allowed:
        return
    names = " or ".join(f'"{mode.value}"' for mode in allowed)
    what = "a streamed answer" if streaming else "a client's envelope"
    msg = (
        f'{w.OUTPUT_MODE}: {what} needs {names}, got "{requested.value}": '
        "a tokens answer carries token IDs and no text"
        if requested is OutputMode.TOKENS
        else f'{w.OUTPUT_MODE}: {what} needs {names}, got "{requested.value}"'
    )
    raise ConfigError(msg, param=w.OUTPUT_MODE)


def client_top_logprobs(client_body: Mapping[str, Any] | None) -> int | None:
    """How many alternatives per token the client gets; ``None``: do not cut.

    The one reader of every envelope (chat, Responses). As vLLM's chat and Responses routes:
    absent or ``null`` means 0 (``logprobs: true`` alone gives empty ``top_logprobs`` lists),
    ``-1`` means all. Without a client body (or with one that is not a JSON object) nothing is
    cut.

    Raises:
        RequestError: ``top_logprobs`` is not an integer >= -1.
    """
    untyped: object = client_body  # the client's JSON may be any value
    if not isinstance(untyped, MAPPINGS):
        return None
    value = untyped.get(w.TOP_LOGPROBS)
    if value is None:
        return 0
    if type(value) is int and value >= 0:
        return value  # the common case, without the checks below
    if isinstance(value, bool) or not isinstance(value, int) or value < _ALL_TOP_LOGPROBS:
        param = f"$.{w.TOP_LOGPROBS}"
        msg = f"{param}: expected an integer >= 0 (or -1 for all), got {describe(value)}"
        raise RequestError(msg, param=param)
    return None if value == _ALL_TOP_LOGPROBS else value


def cut_logprobs(logprobs: object, top: int | None) -> object:
    """``logprobs`` with each ``top_logprobs`` list cut to its first ``top`` entries.

    Only the ``top_logprobs`` lists are read: anything else (or a shape the cut does not
    recognise) passes through as the worker sent it. Copied where cut, never mutated.
    """
    if top is None or not isinstance(logprobs, Mapping):
        return logprobs
    content = logprobs.get(w.CONTENT)
    if not isinstance(content, list):
        return dict(logprobs)
    cut = [
        {**entry, w.TOP_LOGPROBS: entry[w.TOP_LOGPROBS][:top]}
        if isinstance(entry, Mapping) and isinstance(entry.get(w.TOP_LOGPROBS), list)
        else entry
        for entry in content
    ]
    return {**logprobs, w.CONTENT: cut}


_RAW_NULL: Final = msgspec.Raw(b"null")
_OPEN_BRACE: Final = ord("{")
_QUOTE: Final = ord('"')
_RAW_OBJECT: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])
_RAW_ENTRIES: Final = msgspec.json.Decoder(list[dict[str, msgspec.Raw]])
_RAW_ITEMS: Final = msgspec.json.Decoder(list[msgspec.Raw])


def cut_logprobs_raw(logprobs: msgspec.Raw, top: int | None, position: int) -> object:
    """:func:`cut_logprobs` on raw JSON: only the ``top_logprobs`` lists are split and cut.

    ``logprobs`` is a member of a document msgspec has parsed (valid JSON syntax), the logprobs
    of the choice at ``position``. The result is the input itself when nothing is cut, else a
    structure of ``msgspec.Raw`` parts for the encoder; an unusual shape is decoded and handed
    to :func:`cut_logprobs`, so both give one answer.

    Raises:
        UpstreamContractError: a string (a key included) is not UTF-8, or a value no parser
            reads; the ``param`` is the logprobs' path.
    """
    if top is None:
        return logprobs
    try:
        members: dict[str, Any] = _RAW_OBJECT.decode(logprobs)
        content = members.get(w.CONTENT)
        entries: list[dict[str, Any]] | None = (
            _RAW_ENTRIES.decode(content) if content is not None else None
        )
    except msgspec.DecodeError:  # another shape, or a key not UTF-8: the decode tells which
        path = f"{choice_path(position)}.{w.LOGPROBS}"
        return cut_logprobs(_raw.decode_member(logprobs, path, UpstreamContractError), top)
    if entries is None:
        return logprobs
    for entry in entries:
        top_list = entry.get(w.TOP_LOGPROBS)
        if top_list is None:
            continue
        try:
            items = _RAW_ITEMS.decode(top_list)
        except msgspec.ValidationError:
            continue  # not a list (null or another value): the dict cut leaves it as well
        if len(items) > top:
            entry[w.TOP_LOGPROBS] = items[:top]
    members[w.CONTENT] = entries
    return members


PRECUT_MAX_TOP: Final = 20
"""The largest client ``top_logprobs`` the bytes path cuts while decoding (OpenAI's cap)."""


def _precut_logprobs(top: int) -> type[msgspec.Struct]:
    """A view of vLLM's chat logprobs that keeps the first ``top`` alternatives of each token.

    The ``top_logprobs`` list is an array-like struct of ``top`` raw items: msgspec skips the
    items after them while decoding, so the cut costs no object per dropped alternative. The
    view takes vLLM's shape only (unknown keys, a shorter or null list fail to decode: the
    caller then cuts with :func:`cut_logprobs_raw`); every other member is kept as raw bytes.
    """
    # Only Raw inside, so no cycle: untracked by the garbage collector (8k tokens, 50k objects).
    items = msgspec.defstruct(
        f"TopLogprobs{top}",
        [(f"item_{i}", msgspec.Raw) for i in range(top)],
        array_like=True,
        gc=False,
    )
    entry = msgspec.defstruct(
        f"Logprob{top}",
        [
            (w.TOKEN, msgspec.Raw, None),
            (w.LOGPROB, msgspec.Raw, None),
            (w.BYTES, msgspec.Raw, None),
            (w.TOP_LOGPROBS, items, None),
        ],
        forbid_unknown_fields=True,
        omit_defaults=True,  # an absent member (None) stays absent
        gc=False,
    )
    return msgspec.defstruct(
        f"Logprobs{top}",
        [(w.CONTENT, list[entry] | None | UnsetType, UNSET)],  # type: ignore[valid-type]
        forbid_unknown_fields=True,
    )


PRECUT_LOGPROBS: Final = tuple(_precut_logprobs(top) for top in range(PRECUT_MAX_TOP + 1))
"""``PRECUT_LOGPROBS[k]``: the logprobs view cut to ``k`` alternatives while decoding."""


def finish_pair(value: object, *, streaming: bool, passthrough: bool) -> tuple[Any, Any]:
    """A chat choice's ``finish_reason`` and ``vllm_finish_reason`` (``UNSET``: not mapped).

    A value the openai SDK rejects (``abort``, ``repetition``, any other string, and ``null`` in
    a non-streaming answer) becomes ``"stop"`` and the original is kept in
    ``vllm_finish_reason``; ``null`` in a stream chunk means "not finished yet" and stays.
    """
    if value is UNSET:
        value = None  # absent reads as null
    if passthrough or value in SDK_FINISH_REASONS or (streaming and value is None):
        return value, UNSET
    return _MAPPED_FINISH_REASON, value


def finish_fields(value: object, *, streaming: bool, passthrough: bool) -> dict[str, Any]:
    """:func:`finish_pair` as a choice's members: ``vllm_finish_reason`` only when mapped."""
    finish, vllm_finish = finish_pair(value, streaming=streaming, passthrough=passthrough)
    if vllm_finish is UNSET:
        return {w.FINISH_REASON: finish}
    return {w.FINISH_REASON: finish, w.VLLM_FINISH_REASON: vllm_finish}


class Codec(Generic[_P]):
    """How one path reads and writes the members moved across whole; the rules are shared."""

    def read(self, value: _P, view: type[_T], path: str) -> _T:
        """Read a passed-through member through a typed view (a contract error at ``path``)."""
        raise NotImplementedError

    def is_object(self, value: _P) -> bool:
        """The member is a JSON object."""
        raise NotImplementedError

    def is_string(self, value: _P) -> bool:
        """The member is a JSON string."""
        raise NotImplementedError

    def load(self, value: _P, path: str) -> object:
        """The member as a Python value (to describe it in an error)."""
        raise NotImplementedError

    def is_null(self, value: _P) -> bool:
        """The member is JSON null."""
        raise NotImplementedError

    def extend(self, message: _P, key: str, value: object) -> object:
        """A message with one more key, the rest as given."""
        raise NotImplementedError

    def cut(self, logprobs: _P, top: int | None, position: int) -> object:
        """The choice at ``position``'s ``logprobs`` cut to ``top`` alternatives per token."""
        raise NotImplementedError


class _DictCodec(Codec[Any]):
    def read(self, value: Any, view: type[_T], path: str) -> _T:  # noqa: ANN401 - JSON value
        try:
            return msgspec.convert(value, view)
        except CONVERT_ERRORS as error:  # a lone surrogate in a key included
            raise contract_error(error, "the generate response", path) from None

    def is_object(self, value: Any) -> bool:  # noqa: ANN401 - JSON value
        return isinstance(value, Mapping)

    def is_string(self, value: Any) -> bool:  # noqa: ANN401 - JSON value
        return isinstance(value, str)

    def load(self, value: Any, path: str) -> object:  # noqa: ANN401, ARG002 - JSON value
        return value

    def is_null(self, value: Any) -> bool:  # noqa: ANN401 - JSON value
        return value is None

    def extend(self, message: Any, key: str, value: object) -> object:  # noqa: ANN401
        return {**message, key: value}

    def cut(self, logprobs: Any, top: int | None, position: int) -> object:  # noqa: ANN401, ARG002
        # Without a cut the worker's object is handed on as is (a copy when cut).
        return cut_logprobs(logprobs, top)


class _RawCodec(Codec[Any]):
    # Members are Raw, except logprobs decoded through a PRECUT_LOGPROBS view: a struct already
    # cut, or None for null (hence Any).
    def read(self, value: msgspec.Raw, view: type[_T], path: str) -> _T:
        try:
            return msgspec.json.decode(value, type=view)
        # Valid syntax, so a mismatch; or a string not UTF-8 (msgspec checks what it decodes),
        # a number no parser reads, nesting too deep: each the worker's, at the member's path.
        except (msgspec.DecodeError, RecursionError) as error:
            raise contract_error(error, "the generate response", path) from None

    def is_object(self, value: Any) -> bool:  # noqa: ANN401 - Raw, or a precut struct
        if isinstance(value, msgspec.Struct):
            return True
        return memoryview(value)[0] == _OPEN_BRACE  # valid JSON: never empty, no leading blank

    def is_string(self, value: msgspec.Raw) -> bool:
        return memoryview(value)[0] == _QUOTE

    def load(self, value: msgspec.Raw, path: str) -> object:
        return _raw.decode_member(value, path, UpstreamContractError)

    def is_null(self, value: Any) -> bool:  # noqa: ANN401 - Raw, or None from a precut view
        return value is None or value == _RAW_NULL

    def extend(self, message: msgspec.Raw, key: str, value: object) -> object:
        # A Raw is not bytes: split its buffer (the bytes path's reasoning_content).
        return {**_raw.split(memoryview(message), UpstreamContractError, "a message"), key: value}

    def cut(self, logprobs: Any, top: int | None, position: int) -> object:  # noqa: ANN401 - as is_object
        if isinstance(logprobs, msgspec.Struct):
            return logprobs
        return cut_logprobs_raw(logprobs, top, position)


DICT_CODEC = _DictCodec()
RAW_CODEC = _RawCodec()


def choice_path(position: int) -> str:
    """The JSON path of the response's choice at ``position`` (built only for an error)."""
    return f"$.{w.CHOICES}[{position}]"


def logprobs_out(codec: Codec[_P], value: _P | UnsetType, top: int | None, position: int) -> object:
    """A choice's logprobs for the client: null, or the worker's object (cut in text mode)."""
    if value is None or value is UNSET or codec.is_null(value):  # None: a precut view's null
        return None
    if not codec.is_object(value):
        path = choice_path(position)
        msg = f"{path}.logprobs: expected an object or null"
        raise UpstreamContractError(msg, param=f"{path}.logprobs")
    return codec.cut(value, top, position)

"""Per-choice rules of the chat envelope, shared by the non-streaming wrap and the streams.

One home for what makes a generate answer look like vLLM's own chat route: the completion id,
finish reasons the openai SDK accepts, ``top_logprobs`` cut the chat way, and which requested
modes can give a chat client its text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from disagg_transforms import _wire
from disagg_transforms._describe import describe
from disagg_transforms.config import OutputMode
from disagg_transforms.errors import ConfigError, RequestError, UpstreamContractError

SDK_FINISH_REASONS: Final = frozenset(
    {"stop", "length", "tool_calls", "content_filter", "function_call"}
)
"""The ``finish_reason`` values the openai SDK's ``ChatCompletion`` accepts (openai 3.x)."""

_MAPPED_FINISH_REASON: Final = "stop"
_ALL_TOP_LOGPROBS: Final = -1
_AT_PATH = re.compile(r"at `(\$[^`]*)`")


def chat_id(request_id: str) -> str:
    """The chat id of a generate ``request_id``: ``generate-tokens-`` cut, ``chatcmpl-`` ensured."""
    bare = request_id.removeprefix(_wire.GENERATE_ID_PREFIX)
    if bare.startswith(_wire.CHAT_COMPLETION_ID_PREFIX):
        return bare
    return _wire.CHAT_COMPLETION_ID_PREFIX + bare


def contract_error(error: Exception, what: str) -> UpstreamContractError:
    """Turn a view's validation error into an :class:`UpstreamContractError` with its path.

    ``error`` is one of :data:`~disagg_transforms._validate.CONVERT_ERRORS`; one without a
    path (nesting too deep, a lone surrogate in a key) is reported at ``$``.
    """
    found = _AT_PATH.search(str(error))
    param = found.group(1) if found else "$"
    return UpstreamContractError(f"{param}: {what} breaks the contract: {error}", param=param)


def require_text_mode(requested: OutputMode, *, streaming: bool) -> None:
    """Refuse a requested mode that cannot give a chat client its text.

    ``tokens`` carries token IDs only, and vLLM 0.33 cannot stream ``derender``; both are the
    router's configuration, not the worker's answer, hence :class:`ConfigError`.
    """
    allowed = (OutputMode.TEXT,) if streaming else (OutputMode.TEXT, OutputMode.DERENDER)
    if requested in allowed:
        return
    names = " or ".join(f'"{mode.value}"' for mode in allowed)
    what = "a streamed answer" if streaming else "a chat completion"
    msg = (
        f'{_wire.OUTPUT_MODE}: {what} needs {names}, got "{requested.value}": '
        "a tokens answer carries token IDs and no text"
        if requested is OutputMode.TOKENS
        else f'{_wire.OUTPUT_MODE}: {what} needs {names}, got "{requested.value}"'
    )
    raise ConfigError(msg, param=_wire.OUTPUT_MODE)


def client_top_logprobs(client_body: Mapping[str, Any] | None) -> int | None:
    """How many alternatives per token the chat client gets; ``None``: do not cut.

    As vLLM's chat route: absent or ``null`` means 0 (``logprobs: true`` alone gives empty
    ``top_logprobs`` lists), ``-1`` means all. Without a client body (or with one that is not a
    JSON object, as the other envelopes read it) nothing is cut.

    Raises:
        RequestError: ``top_logprobs`` is not an integer >= -1.
    """
    untyped: object = client_body  # the client's JSON may be any value
    if not isinstance(untyped, Mapping):
        return None
    value = untyped.get(_wire.TOP_LOGPROBS)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < _ALL_TOP_LOGPROBS:
        param = f"$.{_wire.TOP_LOGPROBS}"
        msg = f"{param}: expected an integer >= 0 (or -1 for all), got {describe(value)}"
        raise RequestError(msg, param=param)
    return None if value == _ALL_TOP_LOGPROBS else value


def cut_logprobs(logprobs: object, top: int | None) -> object:
    """``logprobs`` with each ``top_logprobs`` list cut to its first ``top`` entries.

    The input was validated as :class:`ChatLogprobs`; it is copied where cut, never mutated.
    """
    if top is None or not isinstance(logprobs, Mapping):
        return logprobs
    content = logprobs.get(_wire.CONTENT)
    if not isinstance(content, list):
        return dict(logprobs)
    cut = [
        {**entry, _wire.TOP_LOGPROBS: entry[_wire.TOP_LOGPROBS][:top]}
        if isinstance(entry.get(_wire.TOP_LOGPROBS), list)
        else entry
        for entry in content
    ]
    return {**logprobs, _wire.CONTENT: cut}


def finish_fields(value: object, *, streaming: bool, passthrough: bool) -> dict[str, Any]:
    """``finish_reason`` (and ``vllm_finish_reason`` when mapped) for a chat choice.

    A value the openai SDK rejects (``abort``, ``repetition``, any other string, and ``null`` in
    a non-streaming answer) becomes ``"stop"`` and the original is kept in
    ``vllm_finish_reason``; ``null`` in a stream chunk means "not finished yet" and stays.
    """
    if value is msgspec.UNSET:
        value = None  # absent reads as null
    if passthrough or value in SDK_FINISH_REASONS or (streaming and value is None):
        return {_wire.FINISH_REASON: value}
    return {_wire.FINISH_REASON: _MAPPED_FINISH_REASON, _wire.VLLM_FINISH_REASON: value}

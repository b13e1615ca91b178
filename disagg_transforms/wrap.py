"""Rebuild a ``chat.completion`` from a generate response (SPEC §5.2).

A chat client on the generate route must not be able to tell: the answer is rebuilt from an
allow-list (so a field vLLM adds to the generate response later cannot leak), the derendered
message moves across whole, text becomes an assistant message, and finish reasons the openai SDK
would reject are mapped with the original kept readable.

The per-choice rules live in :mod:`disagg_transforms._chat`, shared with the streaming side.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from disagg_transforms import _wire
from disagg_transforms._chat import (
    chat_id,
    client_top_logprobs,
    contract_error,
    cut_logprobs,
    finish_fields,
    require_text_mode,
)
from disagg_transforms._validate import CONVERT_ERRORS
from disagg_transforms.config import OutputMode
from disagg_transforms.echo import as_output_mode, check_output_mode_echo
from disagg_transforms.envelopes import ChatLogprobs, ChatMessage, Usage
from disagg_transforms.errors import UpstreamContractError

__all__ = ("wrap_chat_completion",)


class _Choice(msgspec.Struct, kw_only=True):
    # Narrow view: token_ids, routed_experts, sampling_mask... are never read nor decoded.
    index: int
    finish_reason: str | UnsetType | None = UNSET
    stop_reason: int | str | UnsetType | None = UNSET
    text: str | UnsetType = UNSET
    message: ChatMessage | UnsetType = UNSET
    logprobs: ChatLogprobs | UnsetType | None = UNSET


class _Response(msgspec.Struct, kw_only=True):
    request_id: str
    model: str | UnsetType | None = UNSET
    created: int | UnsetType | None = UNSET
    usage: Usage | UnsetType | None = UNSET
    prompt_logprobs: list[dict[str, Any] | None] | UnsetType | None = UNSET
    choices: list[_Choice]


def _message(
    choice: Mapping[str, Any], view: _Choice, requested: OutputMode, path: str, *, reasoning: bool
) -> dict[str, Any]:
    if requested is OutputMode.DERENDER:
        if view.message is UNSET:
            msg = f"{path}.message: a derender choice must carry the parsed message; it is missing"
            raise UpstreamContractError(msg, param=f"{path}.message")
        message = dict(choice[_wire.MESSAGE])  # whole: reasoning, tool_calls, unknown keys
        if reasoning and view.message.reasoning is not UNSET:
            message[_wire.REASONING_CONTENT] = view.message.reasoning
        return message
    if view.text is UNSET:
        msg = f"{path}.text: a text choice must carry its text; it is missing"
        raise UpstreamContractError(msg, param=f"{path}.text")
    return {_wire.ROLE: _wire.ASSISTANT, _wire.CONTENT: view.text}


def _model(view: _Response, model: str | None, client_body: Mapping[str, Any] | None) -> str:
    for candidate in (
        view.model,
        model,
        client_body.get(_wire.MODEL) if isinstance(client_body, Mapping) else None,
    ):
        if isinstance(candidate, str):
            return candidate
    msg = "$.model: the response names no model, and neither model= nor the client body gives one"
    raise UpstreamContractError(msg, param="$.model")


def wrap_chat_completion(  # noqa: PLR0913 - every option is keyword-only and documented
    response: Mapping[str, Any],
    *,
    requested: OutputMode,
    client_body: Mapping[str, Any] | None = None,
    model: str | None = None,
    clock: Callable[[], float] = time.time,
    vllm_finish_reasons: bool = False,
    reasoning_content: bool = False,
) -> dict[str, Any]:
    """Build the ``chat.completion`` a chat client expects from a text or derender response.

    Args:
        response: The decoded generate response (never mutated; nested values the result keeps,
            such as ``usage`` or a message's ``tool_calls``, are shared with it, not copied).
        requested: The ``output_mode`` the leg asked for (checked against the echo first).
        client_body: The client's chat request: its ``top_logprobs`` cuts text-mode logprobs
            and its ``model`` is the last fallback.
        model: The model name to use when the response carries none.
        clock: Gives "now" (Unix seconds) when the response carries no ``created``.
        vllm_finish_reasons: Pass vLLM's ``finish_reason`` through as is (``abort`` and
            ``repetition`` then fail the openai SDK's validation).
        reasoning_content: Also expose the message's ``reasoning`` as ``reasoning_content``.

    Raises:
        UpstreamContractError: the echo check fails (§5.1), or the response is malformed; the
            ``param`` is the JSON path.
        ConfigError: ``requested`` is ``tokens`` (token IDs carry no text).
        RequestError: the client's ``top_logprobs`` is not an integer >= -1.
    """
    requested = as_output_mode(requested)
    check_output_mode_echo(response, requested)
    require_text_mode(requested, streaming=False)
    try:
        view = msgspec.convert(dict(response), _Response)
    except CONVERT_ERRORS as error:
        raise contract_error(error, "the generate response") from None
    top = client_top_logprobs(client_body) if requested is OutputMode.TEXT else None
    raw_choices: list[Mapping[str, Any]] = response[_wire.CHOICES]
    choices = []
    for position, (raw, choice) in enumerate(zip(raw_choices, view.choices, strict=True)):
        path = f"$.{_wire.CHOICES}[{position}]"
        message = _message(raw, choice, requested, path, reasoning=reasoning_content)
        built: dict[str, Any] = {_wire.INDEX: choice.index, _wire.MESSAGE: message}
        built[_wire.LOGPROBS] = cut_logprobs(raw.get(_wire.LOGPROBS), top)
        built.update(
            finish_fields(choice.finish_reason, streaming=False, passthrough=vllm_finish_reasons)
        )
        built[_wire.STOP_REASON] = None if choice.stop_reason is UNSET else choice.stop_reason
        choices.append(built)
    choices.sort(key=lambda built: built[_wire.INDEX])
    created = view.created if isinstance(view.created, int) else int(clock())
    result: dict[str, Any] = {
        _wire.ID: chat_id(view.request_id),
        _wire.OBJECT: _wire.CHAT_COMPLETION_OBJECT,
        _wire.CREATED: created,
        _wire.MODEL: _model(view, model, client_body),
        _wire.CHOICES: choices,
    }
    if view.usage is not UNSET:
        result[_wire.USAGE] = response[_wire.USAGE]
    if view.prompt_logprobs is not None and view.prompt_logprobs is not UNSET:
        result[_wire.PROMPT_LOGPROBS] = response[_wire.PROMPT_LOGPROBS]
    return result

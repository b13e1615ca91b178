"""One assistant turn: the hub the non-chat envelopes are built from.

The Responses and Anthropic wraps read a generate response through :func:`read_turn`: the
``output_mode`` echo is checked, the body is read through the typed views of
:mod:`disagg_transforms.envelopes`, and what the envelopes need (text, reasoning, tool calls,
finish reason, usage, ids) comes back as a small frozen struct. Their stream converters build
the same struct from what the stream has carried so far, and hand it to the same envelope
builders. Nothing else of the generate response is carried, so no generate-only field can leak.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec
from msgspec import UnsetType

from disagg_transforms._config import OutputMode
from disagg_transforms._response.choices import contract_error, require_text_mode
from disagg_transforms._response.echo import check_output_mode_echo
from disagg_transforms._wire import keys as w
from disagg_transforms._wire.describe import describe
from disagg_transforms._wire.validate import CONVERT_ERRORS
from disagg_transforms.envelopes import (
    ChatLogprobs,
    GenerateDerenderChoice,
    GenerateDerenderResponse,
    GenerateTextChoice,
    GenerateTextResponse,
    ToolCall,
    Usage,
)
from disagg_transforms.errors import UpstreamContractError

# Prefixes of the ids /render and the coupled routes give requests; stripped so that the
# envelope's own prefix (resp_, msg_) is not stacked on another API's.
_CLIENT_ID_PREFIXES = (w.CHAT_COMPLETION_ID_PREFIX, "resp_", "resp-", "msg_", "msg-")
_T = TypeVar("_T")


class ToolCallOut(msgspec.Struct, frozen=True, kw_only=True):
    """A tool call of the turn, with the JSON path of its arguments for error messages."""

    id: str
    name: str
    arguments: str
    path: str


class AssistantTurn(msgspec.Struct, frozen=True, kw_only=True):
    """What every non-chat envelope is built from."""

    base_id: str
    """The base of every envelope id: ``generate-tokens-`` and client-route prefixes cut."""
    model: str | None
    created: int | None
    choice_path: str
    """``$.choices[i]`` of the choice the turn was read from."""
    content: str | None
    reasoning: str | None
    tool_calls: tuple[ToolCallOut, ...]
    finish_reason: str | None
    stop_reason: int | str | None
    logprobs: ChatLogprobs | None
    usage: Usage | None


def read_turn(response: Mapping[str, Any], requested: OutputMode) -> AssistantTurn:
    """Check the echo and read the first choice (lowest ``index``) of a generate response.

    Raises:
        ConfigError: ``requested`` is ``tokens``, which has no text to rebuild an envelope from
            (checked after the echo, as the chat wrap does).
        UpstreamContractError: the echo is missing or differs, the body does not match the
            mode's view, it has no choice, or a tool call has no name or arguments.
    """
    check_output_mode_echo(response, requested)
    require_text_mode(requested, streaming=False)
    view: type[GenerateTextResponse | GenerateDerenderResponse] = (
        GenerateTextResponse if requested is OutputMode.TEXT else GenerateDerenderResponse
    )
    try:
        parsed = msgspec.convert(response, view)
    except CONVERT_ERRORS as err:
        what = f"the generate response (vLLM's {requested.value} response)"
        raise contract_error(err, what) from None
    if not parsed.choices:
        msg = "$.choices: the generate response has no choice"
        raise UpstreamContractError(msg, param="$.choices")
    if not isinstance(parsed.request_id, str):
        msg = "$.request_id: the generate response has no request_id"
        raise UpstreamContractError(msg, param="$.request_id")
    position = min(range(len(parsed.choices)), key=lambda i: parsed.choices[i].index)
    path = f"$.choices[{position}]"
    choice: GenerateTextChoice | GenerateDerenderChoice = parsed.choices[position]
    if isinstance(choice, GenerateTextChoice):
        content: str | None = choice.text
        reasoning = None
        tool_calls: tuple[ToolCallOut, ...] = ()
    else:
        message = choice.message
        content = message.content if isinstance(message.content, str) else None
        reasoning = message.reasoning if isinstance(message.reasoning, str) else None
        tool_calls = _tool_calls(message.tool_calls or [], f"{path}.message.tool_calls")
    return AssistantTurn(
        base_id=base_id(parsed.request_id),
        model=parsed.model if isinstance(parsed.model, str) else None,
        created=parsed.created if isinstance(parsed.created, int) else None,
        choice_path=path,
        content=content,
        reasoning=reasoning,
        tool_calls=tool_calls,
        finish_reason=_or_none(choice.finish_reason),
        stop_reason=None if isinstance(choice.stop_reason, UnsetType) else choice.stop_reason,
        logprobs=_or_none(choice.logprobs),
        usage=_or_none(parsed.usage),
    )


def _or_none(value: _T | UnsetType | None) -> _T | None:
    return None if value is msgspec.UNSET else value


def base_id(request_id: str) -> str:
    """The base of every envelope id: ``generate-tokens-`` and client-route prefixes cut."""
    rest = request_id.removeprefix(w.GENERATE_ID_PREFIX)
    for prefix in _CLIENT_ID_PREFIXES:
        if rest.startswith(prefix):
            return rest[len(prefix) :]
    return rest


def _tool_calls(calls: list[ToolCall], path: str) -> tuple[ToolCallOut, ...]:
    out = []
    for index, call in enumerate(calls):
        call_path = f"{path}[{index}]"
        function = call.function
        name = function.name if function else msgspec.UNSET
        arguments = function.arguments if function else msgspec.UNSET
        if not isinstance(name, str) or not name:
            msg = f"{call_path}.function.name: a tool call needs a name, got {describe(None)}"
            raise UpstreamContractError(msg, param=f"{call_path}.function.name")
        if not isinstance(arguments, str):
            msg = f"{call_path}.function.arguments: missing"
            raise UpstreamContractError(msg, param=f"{call_path}.function.arguments")
        # vLLM's derender always sets an id; the fallback keeps the envelope well-formed.
        call_id = call.id if isinstance(call.id, str) and call.id else f"call_{index}"
        out.append(
            ToolCallOut(
                id=call_id, name=name, arguments=arguments, path=f"{call_path}.function.arguments"
            )
        )
    return tuple(out)

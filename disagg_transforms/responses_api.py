"""Rebuild an OpenAI Responses API ``response`` object from a generate response.

A router that serves ``/v1/responses`` clients over ``/inference/v1/generate`` hands the worker's
answer to :func:`wrap_responses_response` and sends the result to the client. The object is
built from an allow-list: nothing of the generate response but the assistant turn, its finish
reason and its usage reaches it. See ``docs/envelopes.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from disagg_transforms import _wire as w
from disagg_transforms._assistant_turn import AssistantTurn, ToolCallOut, read_turn, resolve_model
from disagg_transforms.config import OutputMode
from disagg_transforms.envelopes import ChatLogprob, ChatLogprobs, ChatTopLogprob, Usage
from disagg_transforms.errors import UpstreamContractError

__all__ = ("wrap_responses_response",)

# Request fields the Response object echoes when the client set them (OpenAI's own response
# carries the request's settings; the SDK's model declares each of these).
_ECHOED = (
    w.BACKGROUND,
    w.INSTRUCTIONS,
    w.MAX_OUTPUT_TOKENS,
    w.MAX_TOOL_CALLS,
    w.METADATA,
    w.REASONING,
    w.SERVICE_TIER,
    w.TEMPERATURE,
    w.TEXT,
    w.TOP_LOGPROBS,
    w.TOP_P,
    w.TRUNCATION,
    w.USER,
)


def wrap_responses_response(
    response: Mapping[str, Any],
    *,
    requested: OutputMode,
    client_body: Mapping[str, Any] | None = None,
    model: str | None = None,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any]:
    """Build a Responses API ``response`` object from a non-streaming generate response.

    Args:
        response: The worker's generate response (text or derender mode).
        requested: The output mode the leg asked for; the response must echo it.
        client_body: The client's Responses request: its tools, tool choice and settings are
            echoed as OpenAI echoes them, and its ``top_logprobs`` cuts the alternatives.
        model: The model name to report; defaults to the worker's, then the client's.
        clock: Gives ``created_at`` when the worker sent no ``created``.

    Raises:
        UpstreamContractError: the echo is missing or wrong, or the body breaks the contract.
        ConfigError: ``requested`` is ``tokens``.
    """
    turn = read_turn(response, requested)
    client: Mapping[str, Any] = client_body if isinstance(client_body, Mapping) else {}
    status, incomplete_details = _status(turn)
    tools = client.get(w.TOOLS)
    tool_choice = client.get(w.TOOL_CHOICE)
    parallel = client.get(w.PARALLEL_TOOL_CALLS)
    result: dict[str, Any] = {
        w.ID: f"resp_{turn.base_id}",
        w.OBJECT: w.RESPONSE_OBJECT,
        w.CREATED_AT: turn.created if turn.created is not None else int(clock()),
        w.MODEL: resolve_model(turn, model, client),
        w.STATUS: status,
        w.INCOMPLETE_DETAILS: incomplete_details,
        w.OUTPUT: _output_items(turn, status, _top_logprobs(client)),
        # vLLM's own defaults for a request that left them out.
        w.PARALLEL_TOOL_CALLS: parallel if isinstance(parallel, bool) else True,
        w.TOOL_CHOICE: tool_choice
        if isinstance(tool_choice, (str, Mapping))
        else w.TOOL_CHOICE_AUTO,
        w.TOOLS: tools if isinstance(tools, list) else [],
        w.USAGE: _usage(turn.usage),
    }
    for key in _ECHOED:
        if client.get(key) is not None:
            result[key] = client[key]
    return result


def _status(turn: AssistantTurn) -> tuple[str, dict[str, Any] | None]:
    if turn.finish_reason == w.FINISH_LENGTH:
        return w.STATUS_INCOMPLETE, {w.REASON: w.INCOMPLETE_MAX_OUTPUT_TOKENS}
    if turn.finish_reason in (None, w.FINISH_STOP, w.FINISH_TOOL_CALLS, w.FINISH_REPETITION):
        return w.STATUS_COMPLETED, None
    # abort and anything newer: the output stopped short for no reason the API can name.
    return w.STATUS_INCOMPLETE, None


def _output_items(turn: AssistantTurn, status: str, top_logprobs: int | None) -> list[Any]:
    items: list[Any] = []
    if turn.reasoning:
        items.append(_reasoning_item(turn.base_id, turn.reasoning, status))
    if turn.content is not None and (turn.content or not turn.tool_calls):
        logprobs = None if turn.logprobs is None else _logprobs(turn, turn.logprobs, top_logprobs)
        items.append(_message_item(turn.base_id, turn.content, status, logprobs))
    items.extend(
        _function_call_item(turn.base_id, index, call, status)
        for index, call in enumerate(turn.tool_calls)
    )
    return items


def _reasoning_item(base_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        w.ID: f"rs_{base_id}",
        w.TYPE: w.REASONING,
        w.SUMMARY: [],
        w.CONTENT: [{w.TYPE: w.REASONING_TEXT, w.TEXT: text}],
        w.STATUS: status,
    }


def _message_item(
    base_id: str, text: str, status: str, logprobs: list[dict[str, Any]] | None
) -> dict[str, Any]:
    part: dict[str, Any] = {w.TYPE: w.OUTPUT_TEXT, w.TEXT: text, w.ANNOTATIONS: []}
    if logprobs is not None:
        part[w.LOGPROBS] = logprobs
    return {
        w.ID: f"msg_{base_id}",
        w.TYPE: w.MESSAGE,
        w.ROLE: w.ASSISTANT,
        w.STATUS: status,
        w.CONTENT: [part],
    }


def _function_call_item(base_id: str, index: int, call: ToolCallOut, status: str) -> dict[str, Any]:
    return {
        w.ID: f"fc_{base_id}_{index}",
        w.TYPE: w.FUNCTION_CALL,
        w.CALL_ID: call.id,
        w.NAME: call.name,
        w.ARGUMENTS: call.arguments,
        w.STATUS: status,
    }


def _top_logprobs(client: Mapping[str, Any]) -> int | None:
    value = client.get(w.TOP_LOGPROBS)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _logprobs(
    turn: AssistantTurn, logprobs: ChatLogprobs, top: int | None
) -> list[dict[str, Any]] | None:
    if not isinstance(logprobs.content, list):
        return None
    path = f"{turn.choice_path}.logprobs.content"
    out = []
    for index, entry in enumerate(logprobs.content):
        alternatives = entry.top_logprobs if isinstance(entry.top_logprobs, list) else []
        token = _token_logprob(entry, f"{path}[{index}]")
        token[w.TOP_LOGPROBS] = [
            _token_logprob(alt, f"{path}[{index}].top_logprobs[{rank}]")
            for rank, alt in enumerate(alternatives[:top] if top is not None else alternatives)
        ]
        out.append(token)
    return out


def _token_logprob(entry: ChatLogprob | ChatTopLogprob, path: str) -> dict[str, Any]:
    if entry.logprob is msgspec.UNSET:
        msg = f"{path}.logprob: missing"
        raise UpstreamContractError(msg, param=f"{path}.logprob")
    token_bytes = entry.bytes if isinstance(entry.bytes, list) else []
    return {w.TOKEN: entry.token, w.BYTES: token_bytes, w.LOGPROB: entry.logprob}


def _usage(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    prompt = _count(usage.prompt_tokens)
    completion = _count(usage.completion_tokens)
    total = usage.total_tokens if isinstance(usage.total_tokens, int) else prompt + completion
    prompt_details = usage.prompt_tokens_details or {}
    completion_details = usage.completion_tokens_details or {}
    return {
        w.INPUT_TOKENS: prompt,
        # vLLM reports cache hits only; it does not count cache writes.
        w.INPUT_TOKENS_DETAILS: {
            w.CACHED_TOKENS: _count(prompt_details.get(w.CACHED_TOKENS)),
            w.CACHE_WRITE_TOKENS: 0,
        },
        w.OUTPUT_TOKENS: completion,
        w.OUTPUT_TOKENS_DETAILS: {
            w.REASONING_TOKENS: _count(completion_details.get(w.REASONING_TOKENS))
        },
        w.TOTAL_TOKENS: total,
    }


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0

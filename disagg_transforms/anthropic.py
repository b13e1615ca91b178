"""Rebuild an Anthropic Messages ``message`` from a generate response.

A router that serves ``/v1/messages`` clients over ``/inference/v1/generate`` hands the worker's
answer to :func:`wrap_anthropic_message`. Content blocks come in vLLM's order: ``thinking``,
``text``, then one ``tool_use`` per tool call. See ``docs/envelopes.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from disagg_transforms import _wire as w
from disagg_transforms._assistant_turn import AssistantTurn, ToolCallOut, read_turn, resolve_model
from disagg_transforms._describe import describe
from disagg_transforms.config import OutputMode
from disagg_transforms.errors import UpstreamContractError

__all__ = ("THINKING_SIGNATURE", "wrap_anthropic_message")

THINKING_SIGNATURE = ""
"""The ``signature`` of every ``thinking`` block: vLLM has no signing key, so there is nothing
to sign with; the SDK requires the field, and vLLM ignores it when the block comes back."""

# vLLM's finish_reason -> Anthropic stop_reason (vLLM's `stop_reason_map`, plus repetition,
# which ends the turn on purpose as a stop does). Others (abort) leave it null, as vLLM does.
_STOP_REASONS = {
    w.FINISH_STOP: w.END_TURN,
    w.FINISH_REPETITION: w.END_TURN,
    w.FINISH_LENGTH: w.MAX_TOKENS,
    w.FINISH_TOOL_CALLS: w.TOOL_USE,
}


def wrap_anthropic_message(
    response: Mapping[str, Any],
    *,
    requested: OutputMode,
    client_body: Mapping[str, Any] | None = None,
    model: str | None = None,
) -> dict[str, Any]:
    """Build an Anthropic ``message`` from a non-streaming generate response.

    Args:
        response: The worker's generate response (text or derender mode).
        requested: The output mode the leg asked for; the response must echo it.
        client_body: The client's Messages request: its ``stop_sequences`` tell a stop
            sequence from an end of turn.
        model: The model name to report; defaults to the worker's, then the client's.

    Raises:
        UpstreamContractError: the echo is missing or wrong, the usage is missing, or a tool
            call's arguments are not a JSON object (``tool_use.input`` must be one).
        ConfigError: ``requested`` is ``tokens``.
    """
    turn = read_turn(response, requested)
    stop_reason, stop_sequence = _stop_reason(turn, client_body)
    return {
        w.ID: f"msg_{turn.base_id}",
        w.TYPE: w.MESSAGE,
        w.ROLE: w.ASSISTANT,
        w.CONTENT: _content_blocks(turn),
        w.MODEL: resolve_model(turn, model, client_body),
        w.STOP_REASON: stop_reason,
        w.STOP_SEQUENCE: stop_sequence,
        w.USAGE: _usage(turn),
    }


def _content_blocks(turn: AssistantTurn) -> list[dict[str, Any]]:
    blocks = []
    if turn.reasoning:
        blocks.append(_thinking_block(turn.reasoning))
    # An empty text is no block: the Messages API refuses empty text blocks when a client
    # sends the turn back.
    if turn.content:
        blocks.append(_text_block(turn.content))
    blocks.extend(_tool_use_block(call) for call in turn.tool_calls)
    return blocks


def _thinking_block(thinking: str) -> dict[str, Any]:
    return {w.TYPE: w.THINKING, w.THINKING: thinking, w.SIGNATURE: THINKING_SIGNATURE}


def _text_block(text: str) -> dict[str, Any]:
    return {w.TYPE: w.TEXT, w.TEXT: text}


def _tool_use_block(call: ToolCallOut) -> dict[str, Any]:
    return {w.TYPE: w.TOOL_USE, w.ID: call.id, w.NAME: call.name, w.INPUT: _tool_input(call)}


def _tool_input(call: ToolCallOut) -> dict[str, Any]:
    try:
        value = orjson.loads(call.arguments)
    except orjson.JSONDecodeError:
        msg = (
            f"{call.path}: tool call arguments are not valid JSON, got {describe(call.arguments)}; "
            "an Anthropic tool_use input must be a JSON object"
        )
        raise UpstreamContractError(msg, param=call.path) from None
    if not isinstance(value, dict):
        msg = (
            f"{call.path}: an Anthropic tool_use input must be a JSON object, got {describe(value)}"
        )
        raise UpstreamContractError(msg, param=call.path)
    return value


def _stop_reason(
    turn: AssistantTurn, client_body: Mapping[str, Any] | None
) -> tuple[str | None, str | None]:
    stop_sequences = client_body.get(w.STOP_SEQUENCES) if isinstance(client_body, Mapping) else None
    if (
        turn.finish_reason == w.FINISH_STOP
        and isinstance(turn.stop_reason, str)
        and isinstance(stop_sequences, list)
        and turn.stop_reason in stop_sequences
    ):
        return w.STOP_SEQUENCE, turn.stop_reason
    if turn.tool_calls and turn.finish_reason == w.FINISH_STOP:
        # A named tool_choice ends with "stop" in vLLM; Anthropic clients run tools on tool_use.
        return w.TOOL_USE, None
    return _STOP_REASONS.get(turn.finish_reason or ""), None


def _usage(turn: AssistantTurn) -> dict[str, Any]:
    usage = turn.usage
    prompt = None if usage is None else usage.prompt_tokens
    completion = None if usage is None else usage.completion_tokens
    if not isinstance(prompt, int) or not isinstance(completion, int):
        msg = "$.usage: the Messages API needs prompt_tokens and completion_tokens"
        raise UpstreamContractError(msg, param="$.usage")
    result: dict[str, Any] = {w.INPUT_TOKENS: prompt, w.OUTPUT_TOKENS: completion}
    details = (usage.prompt_tokens_details if usage is not None else None) or {}
    cached = details.get(w.CACHED_TOKENS)
    if isinstance(cached, int) and not isinstance(cached, bool):
        result[w.CACHE_READ_INPUT_TOKENS] = cached
    return result

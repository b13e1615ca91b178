"""``POST /v1/messages``: vLLM 0.33's Anthropic Messages serving.

vLLM serves Messages through its chat serving (``AnthropicServingMessages``): the body is
converted to a chat request, answered, and the chat answer converted back. Here the body is
rendered as ``/v1/messages/render`` does (that conversion included) and generated as the chat
route generates it (:func:`~disagg_transforms.testing._openai.text_turn`): one ``text`` block,
or with the parser (tools offered, not streamed) the thinking, text and tool-use blocks. The
message keeps the chat answer's id (``chatcmpl-...``), as vLLM's does.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

from disagg_transforms.testing import _generate, _openai, _render
from disagg_transforms.testing._common import WorkerSettings

MESSAGES_PATH: Final = "/v1/messages"
# vLLM's stop_reason_map; any other finish reason (abort) leaves the stop reason null.
_STOP_REASONS: Final = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def anthropic_error(body: Mapping[str, Any]) -> dict[str, Any]:
    """An error the chat serving answered, as vLLM's Messages router translates it.

    Args:
        body: vLLM's error body (``{"error": {"message", "type", ...}}``).

    Returns:
        ``{"type": "error", "error": {"type", "message"}}`` (the status stays the same).
    """
    error = body["error"]
    return {"type": "error", "error": {"type": error["type"], "message": error["message"]}}


def _usage(turn: _openai.TextTurn) -> dict[str, Any]:
    """The usage as vLLM's ``_build_anthropic_usage``: the cache's counts with details.

    The chat serving's ``created_cache_tokens`` (the simulated engine writes no prefix cache: 0)
    and ``cached_tokens`` come out of ``input_tokens``.
    """
    if turn.cached_tokens is None:
        return {"input_tokens": turn.prompt_tokens, "output_tokens": turn.completion_tokens}
    return {
        "input_tokens": max(0, turn.prompt_tokens - turn.cached_tokens),
        "output_tokens": turn.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": turn.cached_tokens,
    }


def _blocks(request: Mapping[str, Any], turn: _openai.TextTurn) -> list[dict[str, Any]]:
    """The content blocks, as vLLM's ``messages_full_converter`` makes them of a chat message.

    A ``thinking`` block for the reasoning (its ``signature`` a hex string standing for vLLM's
    random one, repeatable per request), a ``text`` block, a ``tool_use`` block per call.
    """
    blocks: list[dict[str, Any]] = []
    if turn.reasoning:
        digest = hashlib.sha256(f"{request['request_id']}:signature".encode()).hexdigest()
        blocks.append({"type": "thinking", "thinking": turn.reasoning, "signature": digest[:32]})
    if turn.text:
        blocks.append({"type": "text", "text": turn.text})
    blocks.extend(
        {
            "type": "tool_use",
            "id": call["id"],
            "name": call["function"]["name"],
            "input": json.loads(call["function"]["arguments"]),
        }
        for call in turn.tool_calls
    )
    return blocks


def messages(
    body: object, settings: WorkerSettings, call: _generate.Call
) -> dict[str, Any] | list[dict[str, Any]]:
    """``POST /v1/messages``: a ``message``, or its stream's events.

    Args:
        body: The client's Messages body.
        settings: The worker's settings.
        call: Where it runs (its ``x-request-id`` is the chat id's base, as on chat).

    Returns:
        The answer body (vLLM dumps it without its nulls), or the stream's events (each named
        by its ``type``; no ``[DONE]``).
    """
    request = _render.render_messages(body, call.header_id, settings)
    turn = _openai.text_turn(request, body, settings, call)
    usage = _usage(turn)
    head = {"id": request["request_id"], "type": "message", "role": "assistant"}
    if request["stream"] is not True:
        message: dict[str, Any] = {
            **head,
            "content": _blocks(request, turn),
            "model": request["model"],
        }
        stop_reason = _STOP_REASONS.get(turn.finish_reason or "")
        if turn.tool_calls and stop_reason != "max_tokens":
            stop_reason = "tool_use"  # a named call finishes with stop: vLLM says tool_use
        if stop_reason is not None:
            message["stop_reason"] = stop_reason
        message["usage"] = usage
        if turn.kv_transfer_params is not None:
            message["kv_transfer_params"] = turn.kv_transfer_params
        return message
    # Each event is dumped with exclude_unset: only the fields vLLM sets (type, role and
    # stop_sequence set explicitly since vLLM PRs #45376 and #55325).
    start = {
        **head,
        "content": [],
        "model": request["model"],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": turn.prompt_tokens, "output_tokens": 0},
    }
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    if turn.deltas:
        block = {"type": "text", "text": ""}
        events.append({"type": "content_block_start", "content_block": block, "index": 0})
        events.extend(
            {
                "type": "content_block_delta",
                "delta": {"type": "text_delta", "text": delta},
                "index": 0,
            }
            for delta in turn.deltas
        )
        events.append({"type": "content_block_stop", "index": 0})
    # A stream that ended without a finish reason counts as a stop, as vLLM's converter reads it.
    delta = {"stop_reason": _STOP_REASONS.get(turn.finish_reason or "stop"), "stop_sequence": None}
    events.append({"type": "message_delta", "delta": delta, "usage": usage})
    events.append({"type": "message_stop"})
    return events

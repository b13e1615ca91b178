"""``POST /v1/responses``: vLLM 0.33's Responses serving.

vLLM's ``OpenAIServingResponses``: without the parser (a request offering no tools, or a
stream) the generated text is one ``message`` item holding one ``output_text`` part; with it,
the items of ``build_response_output_items``. The request is rendered as
``/v1/responses/render`` does and generated as the chat route generates it
(:func:`~disagg_transforms.testing._openai.text_turn`); the answer is vLLM's
``ResponsesResponse`` dump (every field, nulls included), or its stream of named events.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

from disagg_transforms.testing import _generate, _openai, _render
from disagg_transforms.testing._common import WorkerSettings

RESPONSES_PATH: Final = "/v1/responses"
# What ResponsesResponse.from_request echoes of the request, and the request model's defaults.
_ECHOED: Final[dict[str, object]] = {
    "instructions": None,
    "metadata": None,
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "background": False,
    "max_tool_calls": None,
    "previous_response_id": None,
    "prompt": None,
    "prompt_cache_key": None,
    "reasoning": None,
    "safety_identifier": None,
    "service_tier": "auto",
    "text": None,
    "truncation": "disabled",
    "user": None,
}


def _parse_context(body: Mapping[str, Any]) -> dict[str, Any]:
    """What vLLM's Responses serving hands its parser: the function tools, in chat's shape."""
    tools = [
        _render.responses_tool(tool)
        for tool in body.get("tools") or []
        if isinstance(tool, dict) and tool.get("type") == "function"
    ]
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    elif choice not in ("none", "auto", "required"):
        choice = "auto"
    return {"tools": tools or None, "tool_choice": choice}


def _usage(turn: _openai.TextTurn) -> dict[str, Any]:
    # vLLM's SimpleContext keeps no per-turn metrics: the per-turn lists stay empty.
    return {
        "input_tokens": turn.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": turn.cached_tokens or 0,
            # What the engine's prefill wrote to the prefix cache: the simulated one keeps none.
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": turn.completion_tokens,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": turn.prompt_tokens + turn.completion_tokens,
    }


def _part(text: str, logprobs: object) -> dict[str, Any]:
    """An ``output_text`` part, in the openai SDK model's field order (vLLM dumps that model)."""
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def _item(item_id: str, content: list[dict[str, Any]], status: str) -> dict[str, Any]:
    """A ``message`` item, in the openai SDK model's field order (``phase`` unset: null)."""
    return {
        "id": item_id,
        "content": content,
        "role": "assistant",
        "status": status,
        "type": "message",
        "phase": None,
    }


def _item_status(turn: _openai.TextTurn) -> str:
    """The item's status as vLLM 0.33's ``response_item_status``: the cap cut it too."""
    return "incomplete" if turn.finish_reason == "length" else "completed"


def _tool_choice(body: Mapping[str, Any]) -> object:
    """``tool_choice`` as vLLM's ``check_tool_usage`` leaves it: ``none`` without tools."""
    choice = body.get("tool_choice", "auto")
    return "none" if not body.get("tools") and choice in ("auto", "none") else choice


def _prompt_cache_options(body: Mapping[str, Any]) -> object:
    """The echoed ``PromptCacheOptions``: the request's less ``prewarm``, defaults filled in."""
    sent = body.get("prompt_cache_options")
    if not isinstance(sent, dict):
        return None
    return {
        "mode": sent.get("mode", "implicit"),
        "ttl": sent.get("ttl", "30m"),
        "comparison_response_id": sent.get("comparison_response_id"),
    }


def _response(
    body: Mapping[str, Any],
    request: Mapping[str, Any],
    turn: _openai.TextTurn | None,
    settings: WorkerSettings,
    output: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``ResponsesResponse.from_request``'s dump: the turn's, or the in-progress one (``None``).

    ``output``: the items a stream sent, which vLLM's final response carries.
    """
    sampling: Mapping[str, Any] = request["sampling_params"]
    status = "in_progress"
    if turn is not None:
        # vLLM's only incomplete answer without a parser: the cap cut it.
        status = "incomplete" if turn.finish_reason == "length" else "completed"
    if output is None:
        output = []
        if turn is not None and turn.parsed:
            output = _parsed_items(request, turn)
        elif turn is not None:
            # The no-parser fallback: a message item, with no part when the text is empty.
            content = [_part(turn.text, None)] if turn.text else []
            output = [_item(f"msg_{_digest(request, 'message')}", content, _item_status(turn))]
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    echoed = {key: body.get(key, default) for key, default in _ECHOED.items()}
    return {
        "id": request["request_id"],
        "created_at": _openai.created_time(settings),
        "incomplete_details": incomplete,
        "instructions": echoed["instructions"],
        "metadata": echoed["metadata"],
        "model": request["model"],
        "object": "response",
        "output": output,
        "parallel_tool_calls": echoed["parallel_tool_calls"],
        "temperature": sampling["temperature"],
        "tool_choice": _tool_choice(body),
        "tools": echoed["tools"],
        # A greedy request's dump leaves top_p out: vLLM forces it to 1.0.
        "top_p": sampling.get("top_p", 1.0),
        "background": echoed["background"],
        "max_output_tokens": sampling.get("max_tokens", _render.ENGINE_DEFAULT_MAX_TOKENS),
        "max_tool_calls": echoed["max_tool_calls"],
        "previous_response_id": echoed["previous_response_id"],
        "prompt": echoed["prompt"],
        "prompt_cache_options": _prompt_cache_options(body),
        "prompt_cache_key": echoed["prompt_cache_key"],
        # vLLM's request validator reads OpenAI's older spelling as the current one.
        "prompt_cache_retention": (
            "in_memory"
            if body.get("prompt_cache_retention") == "in-memory"
            else body.get("prompt_cache_retention")
        ),
        "reasoning": echoed["reasoning"],
        "safety_identifier": echoed["safety_identifier"],
        "service_tier": echoed["service_tier"],
        "status": status,
        "text": echoed["text"],
        "top_logprobs": sampling.get("logprobs"),
        "truncation": echoed["truncation"],
        "usage": None if turn is None else _usage(turn),
        "user": echoed["user"],
        "presence_penalty": sampling["presence_penalty"],
        "frequency_penalty": sampling["frequency_penalty"],
        # vLLM-only (PR #37424): a prefill's NIXL params, as the chat route answers them.
        "kv_transfer_params": None if turn is None else turn.kv_transfer_params,
        "ec_transfer_params": None,
        "input_messages": None,
        "output_messages": None,
    }


def _parsed_items(request: Mapping[str, Any], turn: _openai.TextTurn) -> list[dict[str, Any]]:
    """The items of a parsed turn, as vLLM's ``build_response_output_items`` makes them.

    A reasoning item, a message item when there is text, a ``function_call`` item per tool
    call; only the last can have been cut short (each in the openai SDK model's field order).
    """
    last = _item_status(turn)
    items: list[dict[str, Any]] = []
    if turn.reasoning:
        items.append(
            {
                "id": f"rs_{_digest(request, 'reasoning')}",
                "summary": [],
                "type": "reasoning",
                "content": [{"text": turn.reasoning, "type": "reasoning_text"}],
                "encrypted_content": None,
                "status": None,
            }
        )
    if turn.text:
        status = "completed" if turn.tool_calls else last
        message_id = f"msg_{_digest(request, 'message')}"
        items.append(_item(message_id, [_part(turn.text, None)], status))
    for index, call in enumerate(turn.tool_calls):
        items.append(
            {
                "arguments": call["function"]["arguments"],
                "call_id": call["id"],
                "name": call["function"]["name"],
                "type": "function_call",
                "id": f"fc_{_digest(request, f'call-{index}')}",
                "async": None,
                "caller": None,
                "namespace": None,
                "status": last if index == len(turn.tool_calls) - 1 else "completed",
            }
        )
    return items


def _digest(request: Mapping[str, Any], what: str) -> str:
    """32 hex digits standing for one of vLLM's ``random_uuid()``, repeatable per request."""
    return hashlib.sha256(f"{request['request_id']}:{what}".encode()).hexdigest()[:32]


def responses(
    body: object, settings: WorkerSettings, call: _generate.Call
) -> dict[str, Any] | list[dict[str, Any]]:
    """``POST /v1/responses``: a ``response``, or its stream's events in vLLM's order.

    Args:
        body: The client's Responses body.
        settings: The worker's settings.
        call: Where it runs (the response's id ignores its ``x-request-id``, as vLLM's does).

    Returns:
        The answer body, or the stream's events (each named by its ``type``; no ``[DONE]``).
    """
    request = _render.render_responses(body, settings)
    assert isinstance(body, dict)  # noqa: S101 - the render accepted it
    request = {**request, "parse_context": _parse_context(body)}
    turn = _openai.text_turn(request, body, settings, call)
    if request["stream"] is not True:
        return _response(body, request, turn, settings)
    started = _response(body, request, None, settings)
    events = [("response.created", {"response": started})]
    events.append(("response.in_progress", {"response": started}))
    streamed: list[dict[str, Any]] = []
    if turn.deltas:
        item_events = _item_events(f"msg_{_digest(request, 'message')}", turn)
        events.extend(item_events)
        streamed.append(item_events[-1][1]["item"])
    # The final response carries the items the stream sent; 0.33 ends an incomplete one with
    # response.incomplete (0.32: response.completed).
    final = _response(body, request, turn, settings, streamed)
    terminal = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    events.append((terminal, {"response": final}))
    # The openai SDK's event models list their fields alphabetically; vLLM dumps those models.
    return [
        dict(sorted({**fields, "sequence_number": number, "type": kind}.items()))
        for number, (kind, fields) in enumerate(events)
    ]


def _item_events(item_id: str, turn: _openai.TextTurn) -> list[tuple[str, dict[str, Any]]]:
    """The message item's events: opened at the first text, one delta per piece, closed.

    The final response carries the same item (vLLM's ``streamed_output_items``).
    """
    at = {"content_index": 0, "item_id": item_id, "output_index": 0}
    done = _part(turn.text, None)
    events = [
        (
            "response.output_item.added",
            {"item": _item(item_id, [], "in_progress"), "output_index": 0},
        ),
        ("response.content_part.added", {**at, "part": _part("", [])}),
    ]
    events.extend(
        ("response.output_text.delta", {**at, "delta": delta, "logprobs": []})
        for delta in turn.deltas
    )
    events.extend(
        [
            ("response.output_text.done", {**at, "logprobs": [], "text": turn.text}),
            ("response.content_part.done", {**at, "part": done}),
            (
                "response.output_item.done",
                {"item": _item(item_id, [done], _item_status(turn)), "output_index": 0},
            ),
        ]
    )
    return events

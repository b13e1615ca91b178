from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from anthropic.types import Message
from golden import RESPONSE_FIXTURES, load_fixture
from helpers import wrap_checked
from hypothesis import given
from strategies import generate_envelope_responses

from disagg_transforms import (
    THINKING_SIGNATURE,
    ConfigError,
    OutputMode,
    UpstreamContractError,
    single_frame_anthropic_events,
    wrap_anthropic_message,
)


def derender_with(message: dict[str, Any], finish_reason: str = "stop", **choice: Any) -> Any:
    response = copy.deepcopy(load_fixture("response-derender-text.json"))
    response["choices"][0]["message"] = {"role": "assistant", **message}
    response["choices"][0]["finish_reason"] = finish_reason
    response["choices"][0].update(choice)
    return response


@pytest.mark.parametrize(("name", "mode"), RESPONSE_FIXTURES)
def test_golden_fixtures_parse_with_the_anthropic_sdk(name: str, mode: OutputMode) -> None:
    _, parsed = wrap_checked(wrap_anthropic_message, Message, load_fixture(name), mode)
    assert (parsed.id, parsed.type, parsed.role) == ("msg_abc123", "message", "assistant")
    assert (parsed.usage.input_tokens, parsed.usage.output_tokens) == (12, 4)


def test_derender_tool_call_gives_thinking_then_tool_use() -> None:
    result = wrap_anthropic_message(
        load_fixture("response-derender-tool-call.json"), requested=OutputMode.DERENDER
    )
    assert result["content"] == [
        {"type": "thinking", "thinking": "User wants weather.", "signature": THINKING_SIGNATURE},
        {"type": "tool_use", "id": "chatcmpl-tool-1", "name": "get_weather",
         "input": {"city": "Paris"}},
    ]  # fmt: skip
    assert result["stop_reason"] == "tool_use"
    assert "stop_sequence" not in result  # vLLM dumps the message without its nulls


@pytest.mark.parametrize(
    ("finish", "expected"),
    [("stop", "end_turn"), ("length", "max_tokens"), ("repetition", "end_turn"), ("abort", None)],
)
def test_stop_reasons(finish: str, expected: str | None) -> None:
    response = derender_with({"content": "hi"}, finish)
    result = wrap_anthropic_message(response, requested=OutputMode.DERENDER)
    assert result.get("stop_reason") == expected
    assert ("stop_reason" in result) is (expected is not None)  # no null, as vLLM dumps it
    Message.model_validate(result)


def test_a_matched_stop_sequence_is_reported() -> None:
    response = derender_with({"content": "hi"}, "stop", stop_reason="END")
    result = wrap_anthropic_message(
        response, requested=OutputMode.DERENDER, client_body={"stop_sequences": ["END"]}
    )
    assert (result["stop_reason"], result["stop_sequence"]) == ("stop_sequence", "END")
    other = wrap_anthropic_message(
        response, requested=OutputMode.DERENDER, client_body={"stop_sequences": ["X"]}
    )
    assert other["stop_reason"] == "end_turn"
    assert "stop_sequence" not in other


def test_tool_calls_that_finish_with_stop_are_tool_use() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    response = derender_with({"content": None, "tool_calls": [call]}, "stop")
    result = wrap_anthropic_message(response, requested=OutputMode.DERENDER)
    assert result["stop_reason"] == "tool_use"


@pytest.mark.parametrize("arguments", ['{"a": ', "[1, 2]", '"text"', "", "nan"])
def test_arguments_that_are_not_a_json_object_are_a_clear_upstream_error(arguments: str) -> None:
    calls = [
        {"id": "c0", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "c1", "type": "function", "function": {"name": "g", "arguments": arguments}},
    ]
    response = derender_with({"content": None, "tool_calls": calls}, "tool_calls")
    with pytest.raises(UpstreamContractError) as info:
        wrap_anthropic_message(response, requested=OutputMode.DERENDER)
    assert info.value.param == "$.choices[0].message.tool_calls[1].function.arguments"
    assert info.value.status_hint == 502
    assert "object" in info.value.message


def test_text_mode_text_is_the_single_text_block_and_empty_text_no_block() -> None:
    response = load_fixture("response-text.json")
    result = wrap_anthropic_message(response, requested=OutputMode.TEXT)
    assert result["content"] == [{"type": "text", "text": "Hello!"}]
    response = copy.deepcopy(response)
    response["choices"][0]["text"] = ""
    assert wrap_anthropic_message(response, requested=OutputMode.TEXT)["content"] == []


def test_cached_tokens_become_cache_read_input_tokens() -> None:
    response = copy.deepcopy(load_fixture("response-text.json"))
    response["usage"]["prompt_tokens_details"] = {"cached_tokens": 8}
    result = wrap_anthropic_message(response, requested=OutputMode.TEXT)
    # vLLM's AnthropicUsage, in its order: the cache's creation count beside the read one.
    assert list(result["usage"].items()) == [("input_tokens", 4), ("output_tokens", 4),
                                             ("cache_creation_input_tokens", 0),
                                             ("cache_read_input_tokens", 8)]  # fmt: skip


def test_created_cache_tokens_become_cache_creation_input_tokens() -> None:
    # vLLM's _build_anthropic_usage: input_tokens = prompt - read - creation.
    response = copy.deepcopy(load_fixture("response-text.json"))
    details = {"cached_tokens": 4, "created_cache_tokens": 6, "multimodal_tokens": None}
    response["usage"]["prompt_tokens_details"] = details
    usage = wrap_anthropic_message(response, requested=OutputMode.TEXT)["usage"]
    assert usage == {
        "input_tokens": 2,
        "output_tokens": 4,
        "cache_creation_input_tokens": 6,
        "cache_read_input_tokens": 4,
    }
    # Clamped: the three counts still add up to the 12 prompt tokens the worker read.
    details["created_cache_tokens"] = 20
    usage = wrap_anthropic_message(response, requested=OutputMode.TEXT)["usage"]
    assert (usage["input_tokens"], usage["cache_creation_input_tokens"]) == (0, 8)


@pytest.mark.parametrize(("cached", "read"), [(20, 12), (12, 12), (-3, 0)])
def test_cached_tokens_are_clamped_to_the_prompt(cached: int, read: int) -> None:
    # The two counts a client adds must still give the 12 prompt tokens the worker read.
    response = copy.deepcopy(load_fixture("response-text.json"))
    response["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}
    usage = wrap_anthropic_message(response, requested=OutputMode.TEXT)["usage"]
    assert usage["cache_read_input_tokens"] == read
    assert usage["input_tokens"] == 12 - read


def test_missing_usage_is_an_upstream_error() -> None:
    response = {**load_fixture("response-text.json"), "usage": None}
    with pytest.raises(UpstreamContractError) as info:
        wrap_anthropic_message(response, requested=OutputMode.TEXT)
    assert info.value.param == "$.usage"


@pytest.mark.parametrize("usage", [{"completion_tokens": 4}, {"prompt_tokens": 4}, {}])
def test_usage_without_both_counts_is_an_upstream_error(usage: dict[str, Any]) -> None:
    # A Messages usage has no optional count: a worker's usage missing one cannot be rebuilt.
    response = {**load_fixture("response-text.json"), "usage": usage}
    with pytest.raises(UpstreamContractError) as info:
        wrap_anthropic_message(response, requested=OutputMode.TEXT)
    assert info.value.param == "$.usage"
    assert "needs prompt_tokens and completion_tokens" in info.value.message


def test_wrong_echo_and_tokens_mode() -> None:
    with pytest.raises(UpstreamContractError) as info:
        wrap_anthropic_message(load_fixture("response-tokens.json"), requested=OutputMode.TEXT)
    assert info.value.status_hint == 502
    with pytest.raises(ConfigError):
        wrap_anthropic_message(load_fixture("response-tokens.json"), requested=OutputMode.TOKENS)


@given(generate_envelope_responses)
def test_any_valid_generate_response_gives_an_sdk_valid_message(case: Any) -> None:
    response, mode = case
    _, parsed = wrap_checked(wrap_anthropic_message, Message, response, OutputMode(mode))
    choice = response["choices"][0]
    tool_uses = [block for block in parsed.content if block.type == "tool_use"]
    calls = [] if mode == "text" else choice["message"].get("tool_calls") or []
    assert [(b.id, b.input) for b in tool_uses] == [
        (c["id"], json.loads(c["function"]["arguments"])) for c in calls
    ]
    texts = [block.text for block in parsed.content if block.type == "text"]
    content = choice["text"] if mode == "text" else choice["message"]["content"]
    assert texts == ([content] if content else [])


def test_tool_use_input_keeps_integers_beyond_64_bits_exact() -> None:
    # A model may write any JSON number; an Anthropic client reads the same integer back.
    arguments = '{"low": -9223372036854775809, "high": 18446744073709551616}'
    response = derender_with(
        {"content": None, "tool_calls": [
            {"id": "call-1", "type": "function",
             "function": {"name": "count", "arguments": arguments}},
        ]},
    )  # fmt: skip
    wrapped = wrap_anthropic_message(response, requested=OutputMode.DERENDER)
    assert wrapped["content"][-1]["input"] == {"low": -(2**63) - 1, "high": 2**64}
    events = single_frame_anthropic_events(response, requested=OutputMode.DERENDER)
    partial = [e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"]
    assert partial == ['{"low":-9223372036854775809,"high":18446744073709551616}']

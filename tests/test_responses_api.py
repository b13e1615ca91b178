from __future__ import annotations

from typing import Any

import pytest
from golden import RESPONSE_FIXTURES, load_fixture
from helpers import wrap_checked
from hypothesis import given
from openai.types.responses import Response
from strategies import generate_envelope_responses

from disagg_transforms import (
    EnvelopeOptions,
    OutputMode,
    UpstreamContractError,
    wrap_responses_response,
)


@pytest.mark.parametrize(("name", "mode"), RESPONSE_FIXTURES)
def test_golden_fixtures_parse_with_the_openai_sdk(name: str, mode: OutputMode) -> None:
    _, parsed = wrap_checked(wrap_responses_response, Response, load_fixture(name), mode)
    assert parsed.id == "resp_abc123"
    assert parsed.object == "response"
    assert parsed.model == "Qwen/Qwen3-0.6B"
    assert parsed.created_at == 1796000000
    assert parsed.usage is not None
    assert (parsed.usage.input_tokens, parsed.usage.output_tokens) == (12, 4)
    assert parsed.usage.total_tokens == 16


def test_text_mode_is_one_message_with_the_text_of_choice_zero() -> None:
    result = wrap_responses_response(load_fixture("response-text.json"), requested=OutputMode.TEXT)
    assert result["status"] == "completed"
    assert result["incomplete_details"] is None
    # In the openai SDK model's field order, phase null: vLLM dumps that model whole.
    [item] = result["output"]
    assert list(item.items()) == [
        ("id", "msg_abc123"),
        (
            "content",
            [{"annotations": [], "text": "Hello!", "type": "output_text", "logprobs": None}],
        ),
        ("role", "assistant"),
        ("status", "completed"),
        ("type", "message"),
        ("phase", None),
    ]
    assert list(item["content"][0]) == ["annotations", "text", "type", "logprobs"]


def test_derender_tool_call_gives_reasoning_and_function_call_items() -> None:
    result = wrap_responses_response(
        load_fixture("response-derender-tool-call.json"), requested=OutputMode.DERENDER
    )
    reasoning, call = result["output"]
    # As vLLM's build_response_output_items writes them: a reasoning item's status unset.
    assert list(reasoning.items()) == [
        ("id", "rs_abc123"),
        ("summary", []),
        ("type", "reasoning"),
        ("content", [{"text": "User wants weather.", "type": "reasoning_text"}]),
        ("encrypted_content", None),
        ("status", None),
    ]
    assert list(call.items()) == [
        ("arguments", '{"city": "Paris"}'),
        ("call_id", "chatcmpl-tool-1"),
        ("name", "get_weather"),
        ("type", "function_call"),
        ("id", "fc_abc123_0"),
        ("async", None),
        ("caller", None),
        ("namespace", None),
        ("status", "completed"),
    ]


def test_length_is_incomplete_with_max_output_tokens() -> None:
    response = load_fixture("response-text.json")
    response = {**response, "choices": [response["choices"][1] | {"index": 0}]}
    result = wrap_responses_response(response, requested=OutputMode.TEXT)
    assert result["status"] == "incomplete"
    assert result["incomplete_details"] == {"reason": "max_output_tokens"}
    # The cap cut the item too: vLLM 0.33's response_item_status (0.32 wrote "completed").
    assert result["output"][0]["status"] == "incomplete"
    Response.model_validate(result)


def test_abort_is_completed_as_vllms_text_path_writes_it() -> None:
    # vLLM's responses_full_generator: only "length" is incomplete, "completed" the catch-all.
    result = wrap_responses_response(
        load_fixture("response-text-finish-abort.json"), requested=OutputMode.TEXT
    )
    assert (result["status"], result["incomplete_details"]) == ("completed", None)
    assert result["output"][0]["status"] == "completed"


def test_logprobs_are_cut_to_the_clients_top_logprobs() -> None:
    result = wrap_responses_response(
        load_fixture("response-text-logprobs.json"),
        requested=OutputMode.TEXT,
        client_body={"top_logprobs": 2, "include": ["message.output_text.logprobs"]},
    )
    (token,) = result["output"][0]["content"][0]["logprobs"]
    assert [alt["token"] for alt in token["top_logprobs"]] == ["Hello", "Hi"]
    assert result["top_logprobs"] == 2


def test_client_request_settings_are_echoed() -> None:
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}]
    client = {
        "model": "alias",
        "tools": tools,
        "tool_choice": {"type": "function", "name": "f"},
        "parallel_tool_calls": False,
        "temperature": 0.2,
        "instructions": "Be brief.",
        "max_output_tokens": 50,
        "metadata": {"k": "v"},
        "input": "hidden",
    }
    result = wrap_responses_response(
        load_fixture("response-derender-tool-call.json"),
        requested=OutputMode.DERENDER,
        client_body=client,
    )
    parsed = Response.model_validate(result)
    assert result["tools"] == tools
    assert result["tool_choice"] == {"type": "function", "name": "f"}
    assert parsed.parallel_tool_calls is False
    assert (parsed.temperature, parsed.instructions, parsed.max_output_tokens) == (
        0.2,
        "Be brief.",
        50,
    )
    assert "input" not in result


def test_model_and_created_fallbacks() -> None:
    response = {**load_fixture("response-text.json"), "model": None, "created": None}
    result = wrap_responses_response(
        response,
        requested=OutputMode.TEXT,
        client_body={"model": "m"},
        options=EnvelopeOptions(clock=lambda: 7.9),
    )
    assert (result["model"], result["created_at"]) == ("m", 7)
    named = wrap_responses_response(
        response, requested=OutputMode.TEXT, options=EnvelopeOptions(model="router-name")
    )
    assert named["model"] == "router-name"
    with pytest.raises(UpstreamContractError) as info:
        wrap_responses_response(response, requested=OutputMode.TEXT)
    assert info.value.param == "$.model"


@pytest.mark.parametrize("echo", [None, "tokens", "derender"])
def test_missing_or_other_output_mode_is_a_502(echo: str | None) -> None:
    response = dict(load_fixture("response-text.json"))
    if echo is None:
        del response["output_mode"]
    else:
        response["output_mode"] = echo
    with pytest.raises(UpstreamContractError) as info:
        wrap_responses_response(response, requested=OutputMode.TEXT)
    assert info.value.status_hint == 502
    assert info.value.param == "$.output_mode"
    assert "0.32.0" in info.value.message


@pytest.mark.parametrize(
    "response",
    [
        {"output_mode": "text", "request_id": "r", "choices": []},
        {"output_mode": "text", "choices": [{"index": 0, "text": "x"}]},
        {"output_mode": "text", "request_id": "r", "choices": [{"index": 0}]},
        {"output_mode": "text", "request_id": "r", "choices": "nope"},
    ],
)
def test_malformed_responses_are_upstream_errors(response: dict[str, Any]) -> None:
    with pytest.raises(UpstreamContractError):
        wrap_responses_response(
            response, requested=OutputMode.TEXT, options=EnvelopeOptions(model="m")
        )


@given(generate_envelope_responses)
def test_any_valid_generate_response_gives_an_sdk_valid_response(case: Any) -> None:
    response, mode = case
    _, parsed = wrap_checked(wrap_responses_response, Response, response, OutputMode(mode))
    choice = response["choices"][0]
    assert parsed.status == ("incomplete" if choice["finish_reason"] == "length" else "completed")
    if mode == "text":
        assert parsed.output_text == choice["text"]
    else:
        calls = choice["message"].get("tool_calls") or []
        items = [item for item in parsed.output if item.type == "function_call"]
        assert [(i.call_id, i.arguments) for i in items] == [
            (c["id"], c["function"]["arguments"]) for c in calls
        ]


@pytest.mark.parametrize(
    ("client", "echoed"),
    [
        ({}, {"temperature": 1.0, "top_p": 1.0, "max_output_tokens": None, "top_logprobs": None}),
        # vLLM's SamplingParams samples greedily below 1e-5 and forces top_p to 1.0.
        ({"temperature": 0, "top_p": 0.5}, {"temperature": 0, "top_p": 1.0}),
        (
            {"temperature": 0.7, "top_p": 0.5, "max_output_tokens": 9},
            {"temperature": 0.7, "top_p": 0.5, "max_output_tokens": 9},
        ),
        ({"include": ["message.output_text.logprobs"]}, {"top_logprobs": 0}),
        (
            {"include": ["message.output_text.logprobs"], "top_logprobs": 2},
            {"top_logprobs": 2},
        ),
        ({"background": None, "truncation": "auto"}, {"background": False, "truncation": "auto"}),
    ],
)
def test_the_settings_are_echoed_as_vllms_response_writes_them(
    client: dict[str, Any], echoed: dict[str, Any]
) -> None:
    result = wrap_responses_response(
        load_fixture("response-text.json"), requested=OutputMode.TEXT, client_body=client
    )
    assert {key: result[key] for key in echoed} == echoed
    assert result["service_tier"] == "auto"
    assert result["input_messages"] is result["output_messages"] is None
    Response.model_validate(result)


# vLLM 0.33's ResponsesResponse fields in declaration order (it dumps the model whole), less
# kv_transfer_params and ec_transfer_params, which no client sees (docs/exchange.md).
VLLM_RESPONSE_KEYS = [
    "id", "created_at", "incomplete_details", "instructions", "metadata", "model", "object",
    "output", "parallel_tool_calls", "temperature", "tool_choice", "tools", "top_p",
    "background", "max_output_tokens", "max_tool_calls", "previous_response_id", "prompt",
    "prompt_cache_options", "prompt_cache_key", "prompt_cache_retention", "reasoning",
    "safety_identifier", "service_tier", "status", "text", "top_logprobs", "truncation",
    "usage", "user", "presence_penalty", "frequency_penalty", "input_messages",
    "output_messages",
]  # fmt: skip


def test_the_response_is_laid_out_as_vllm_writes_it() -> None:
    result = wrap_responses_response(load_fixture("response-text.json"), requested=OutputMode.TEXT)
    assert list(result) == VLLM_RESPONSE_KEYS
    assert list(result["usage"]["input_tokens_details"]) == [
        "cached_tokens",
        "cache_write_tokens",
        "input_tokens_per_turn",
        "cached_tokens_per_turn",
    ]


@pytest.mark.parametrize(
    ("client", "tool_choice"),
    [
        # vLLM's check_tool_usage: without tools, "auto" (the default) and "none" are "none".
        ({}, "none"),
        ({"tool_choice": "auto", "tools": []}, "none"),
        ({"tools": [{"type": "function", "name": "f"}]}, "auto"),
        ({"tools": [{"type": "function", "name": "f"}], "tool_choice": "required"}, "required"),
    ],
)
def test_tool_choice_is_echoed_as_vllms_validator_leaves_it(
    client: dict[str, Any], tool_choice: str
) -> None:
    result = wrap_responses_response(
        load_fixture("response-text.json"), requested=OutputMode.TEXT, client_body=client
    )
    assert result["tool_choice"] == tool_choice


def test_the_penalties_and_cache_settings_are_echoed() -> None:
    plain = wrap_responses_response(load_fixture("response-text.json"), requested=OutputMode.TEXT)
    assert (plain["presence_penalty"], plain["frequency_penalty"]) == (0.0, 0.0)
    assert plain["prompt_cache_options"] is plain["safety_identifier"] is None
    client = {
        "presence_penalty": 0.5,
        "frequency_penalty": -1.0,
        "prompt_cache_key": "k",
        "prompt_cache_retention": "in-memory",
        "prompt_cache_options": {"mode": "explicit", "prewarm": True},
        "safety_identifier": "s",
    }
    result = wrap_responses_response(
        load_fixture("response-text.json"), requested=OutputMode.TEXT, client_body=client
    )
    assert (result["presence_penalty"], result["frequency_penalty"]) == (0.5, -1.0)
    assert result["prompt_cache_key"] == "k"
    assert result["prompt_cache_retention"] == "in_memory"
    assert result["prompt_cache_options"] == {
        "mode": "explicit",
        "ttl": "30m",
        "comparison_response_id": None,
    }
    assert result["safety_identifier"] == "s"
    Response.model_validate(result)

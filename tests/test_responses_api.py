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
    assert result["output"] == [
        {
            "id": "msg_abc123",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": "Hello!", "annotations": [], "logprobs": None}
            ],
        }
    ]


def test_derender_tool_call_gives_reasoning_and_function_call_items() -> None:
    result = wrap_responses_response(
        load_fixture("response-derender-tool-call.json"), requested=OutputMode.DERENDER
    )
    reasoning, call = result["output"]
    assert reasoning["type"] == "reasoning"
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "User wants weather."}]
    assert call == {
        "id": "fc_abc123_0",
        "type": "function_call",
        "call_id": "chatcmpl-tool-1",
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
        "status": "completed",
    }


def test_length_is_incomplete_with_max_output_tokens() -> None:
    response = load_fixture("response-text.json")
    response = {**response, "choices": [response["choices"][1] | {"index": 0}]}
    result = wrap_responses_response(response, requested=OutputMode.TEXT)
    assert result["status"] == "incomplete"
    assert result["incomplete_details"] == {"reason": "max_output_tokens"}
    # The item is "completed" whatever the response's status, as vLLM builds it.
    assert result["output"][0]["status"] == "completed"
    Response.model_validate(result)


def test_abort_is_incomplete_without_a_reason() -> None:
    result = wrap_responses_response(
        load_fixture("response-text-finish-abort.json"), requested=OutputMode.TEXT
    )
    assert (result["status"], result["incomplete_details"]) == ("incomplete", None)


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
    assert parsed.status == (
        "completed"
        if choice["finish_reason"] != "length" and choice["finish_reason"] != "abort"
        else "incomplete"
    )
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

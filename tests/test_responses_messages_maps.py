from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from strategies import messages_client_bodies, responses_client_bodies

from disagg_transforms import RequestError
from disagg_transforms._request.chat import map_chat_request
from disagg_transforms._request.mapping import ClientMapping
from disagg_transforms._request.messages import map_messages_request
from disagg_transforms._request.responses import map_responses_request

WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}


def test_responses_sampling_fields_map_as_vllm_maps_them() -> None:
    body = {
        "model": "m",
        "input": "hi",
        "instructions": "be brief",
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 20,
        "seed": 7,
        "stop": "END",
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 3,
        "text": {"format": {"type": "json_schema", "name": "w", "schema": WEATHER_SCHEMA}},
        "vllm_xargs": {"x": 1},
        "max_output_tokens": 100,
        "stream": True,
        "store": True,
    }
    mapping = map_responses_request(body)
    assert mapping.sampling_params == {
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 20,
        "seed": 7,
        "stop": "END",
        "logprobs": 3,
        "structured_outputs": {"json": WEATHER_SCHEMA},
        "extra_args": {"x": 1},
    }
    assert mapping.parse_context is None
    assert mapping.dropped == ("input", "instructions", "store")


def test_responses_tools_become_chat_tools_with_auto_choice() -> None:
    body = {
        "tools": [{"type": "function", "name": "w", "parameters": WEATHER_SCHEMA,
                   "description": None, "strict": True}],
        "parallel_tool_calls": False,
        "reasoning": {"effort": "low", "summary": "auto"},
    }  # fmt: skip
    assert map_responses_request(body).parse_context == {
        "tools": [{"type": "function",
                   "function": {"name": "w", "parameters": WEATHER_SCHEMA, "strict": True}}],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "chat_template_kwargs": {"reasoning_effort": "low"},
    }  # fmt: skip
    tools = [{"type": "function", "name": "w"}]
    named = map_responses_request(
        {"tools": tools, "tool_choice": {"type": "function", "name": "w"}}
    )
    assert named.parse_context is not None
    assert named.parse_context["tool_choice"] == {"type": "function", "function": {"name": "w"}}


def test_responses_logprobs_need_include() -> None:
    # As for chat's `logprobs: true`: top_logprobs without the switch would be ignored.
    with pytest.raises(RequestError) as info:
        map_responses_request({"top_logprobs": 3})
    assert info.value.param == "$.top_logprobs"
    assert "include" in info.value.message
    assert map_responses_request({"top_logprobs": 0}).sampling_params == {}
    include = {"include": ["message.output_text.logprobs"]}
    assert map_responses_request(include).sampling_params == {"logprobs": 0}


def test_responses_json_object_and_text_formats() -> None:
    json_object = {"text": {"format": {"type": "json_object"}}}
    assert map_responses_request(json_object).sampling_params == {
        "structured_outputs": {"json_object": True}
    }
    assert map_responses_request({"text": {"format": {"type": "text"}}}).sampling_params == {}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"previous_response_id": "resp_1"}, "$.previous_response_id"),
        ({"conversation": "conv_1"}, "$.conversation"),
        ({"background": True}, "$.background"),
        ({"prompt": {"id": "p"}}, "$.prompt"),
        ({"tools": [{"type": "web_search"}]}, "$.tools[0].type"),
        ({"tools": [{"type": "function"}]}, "$.tools[0].name"),
        ({"tool_choice": {"type": "file_search"}}, "$.tool_choice.type"),
        ({"tool_choice": "sometimes"}, "$.tool_choice"),
        ({"temperature": "hot"}, "$.temperature"),
        ({"temperature": True}, "$.temperature"),
        ({"top_k": 1.5}, "$.top_k"),
        ({"stop": [1]}, "$.stop[0]"),
        ({"text": {"format": {"type": "json_schema"}}}, "$.text.format.schema"),
        ({"text": {"format": {"type": "yaml"}}}, "$.text.format.type"),
        (
            {"structured_outputs": {"regex": "a"}, "text": {"format": {"type": "text"}}},
            "$.text.format",
        ),
        ({"include": [3]}, "$.include[0]"),
    ],
)
def test_responses_refusals_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as info:
        map_responses_request(body)
    assert info.value.param == param
    assert param in info.value.message


def test_responses_harmless_values_of_refused_fields_pass() -> None:
    body = {"previous_response_id": None, "background": False, "conversation": None}
    assert map_responses_request(body) == ClientMapping(sampling_params={})


def test_messages_fields_map_as_vllm_converts_them_to_chat() -> None:
    body = {
        "model": "claude",
        "max_tokens": 64,
        "system": "be brief",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.3,
        "top_p": 0.8,
        "top_k": 5,
        "stop_sequences": ["\n\nHuman:"],
        "tools": [{"name": "w", "description": "weather", "input_schema": {"properties": {}}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "thinking": {"type": "enabled", "budget_tokens": 32},
        "output_config": {"effort": "high",
                          "format": {"type": "json_schema", "schema": WEATHER_SCHEMA}},
        "metadata": {"user_id": "u"},
    }  # fmt: skip
    before = copy.deepcopy(body)
    mapping = map_messages_request(body)
    assert body == before
    assert mapping.sampling_params == {
        "temperature": 0.3,
        "top_p": 0.8,
        "top_k": 5,
        "stop": ["\n\nHuman:"],
        "structured_outputs": {"json": WEATHER_SCHEMA},
    }
    assert mapping.parse_context == {
        "tools": [{"type": "function",
                   "function": {"name": "w", "description": "weather",
                                "parameters": {"properties": {}, "type": "object"}}}],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "chat_template_kwargs": {"reasoning_effort": "high"},
    }  # fmt: skip
    assert mapping.dropped == ("system", "messages", "thinking", "metadata")


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "none"}, "none"),
        ({"type": "any"}, "required"),
        ({"type": "tool", "name": "w"}, {"type": "function", "function": {"name": "w"}}),
    ],
)
def test_messages_tool_choice(choice: dict[str, Any], expected: object) -> None:
    tools = [{"name": "w", "input_schema": {}}]
    mapping = map_messages_request({"max_tokens": 1, "tools": tools, "tool_choice": choice})
    assert mapping.parse_context is not None
    assert mapping.parse_context["tool_choice"] == expected


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "$.max_tokens"),
        ({"max_tokens": None}, "$.max_tokens"),
        ({"max_tokens": 1, "tools": [{"type": "web_search_20250305", "name": "s"}]},
         "$.tools[0].type"),
        ({"max_tokens": 1, "tools": [{"name": "w"}]}, "$.tools[0].input_schema"),
        ({"max_tokens": 1, "tool_choice": {"type": "tool"}}, "$.tool_choice.name"),
        ({"max_tokens": 1, "tool_choice": {"type": "maybe"}}, "$.tool_choice.type"),
        ({"max_tokens": 1, "tool_choice": "auto"}, "$.tool_choice"),
        ({"max_tokens": 1, "stop_sequences": [None]}, "$.stop_sequences[0]"),
        ({"max_tokens": 1, "top_k": "5"}, "$.top_k"),
        ({"max_tokens": 1, "tool_choice": {"type": "any", "disable_parallel_tool_use": 1}},
         "$.tool_choice.disable_parallel_tool_use"),
        ({"max_tokens": 1, "output_config": {"format": {"type": "xml"}}},
         "$.output_config.format.type"),
    ],
)  # fmt: skip
def test_messages_refusals_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as info:
        map_messages_request(body)
    assert info.value.param == param


@pytest.mark.parametrize("mapper", [map_responses_request, map_messages_request])
@pytest.mark.parametrize("body", [None, [], "x", {1: 2}])
def test_a_body_that_is_not_an_object_is_refused(mapper: Any, body: Any) -> None:
    with pytest.raises(RequestError) as info:
        mapper(body)
    assert info.value.param == "$"


def _check_mapping(mapper: Any, body: dict[str, Any]) -> None:
    before = copy.deepcopy(body)
    try:
        mapping = mapper(body)
    except RequestError as err:
        assert err.param is not None
        assert err.param.startswith("$")
    else:
        assert isinstance(mapping, ClientMapping)
        assert set(mapping.dropped) <= set(body)
    assert body == before


@given(responses_client_bodies)
def test_any_responses_body_maps_or_is_refused(body: dict[str, Any]) -> None:
    _check_mapping(map_responses_request, body)


@given(messages_client_bodies)
def test_any_messages_body_maps_or_is_refused(body: dict[str, Any]) -> None:
    _check_mapping(map_messages_request, body)


_GOOD_TOOLS = {
    "responses": {"type": "function", "name": "f", "parameters": {"type": "object"}},
    "messages": {"name": "f", "input_schema": {"type": "object"}},
}
_MAPPERS = {"responses": map_responses_request, "messages": map_messages_request}
_REQUIRED: dict[str, dict[str, Any]] = {"responses": {}, "messages": {"max_tokens": 1}}


@pytest.mark.parametrize("api", sorted(_MAPPERS))
@pytest.mark.parametrize("index", [0, 127, 128, 300])
def test_a_bad_tool_is_named_by_its_index_in_a_long_tool_list(api: str, index: int) -> None:
    # The first tools' paths are formatted once, the rest per request: both name the tool.
    tools: list[Any] = [_GOOD_TOOLS[api]] * (index + 2)
    tools[index] = "not a tool"
    with pytest.raises(RequestError) as info:
        _MAPPERS[api]({**_REQUIRED[api], "tools": tools})
    assert info.value.param == f"$.tools[{index}]"
    tools[index] = {**_GOOD_TOOLS[api], "name": ""}
    with pytest.raises(RequestError) as info:
        _MAPPERS[api]({**_REQUIRED[api], "tools": tools})
    assert info.value.param == f"$.tools[{index}].name"


@pytest.mark.parametrize("index", [0, 127, 128, 300])
def test_a_chat_tool_that_is_no_object_is_named_by_its_index(index: int) -> None:
    # Chat tools pass as sent, through the same paths as the converted ones.
    tools: list[Any] = [{"type": "function", "function": {"name": "f"}}] * (index + 2)
    tools[index] = "not a tool"
    with pytest.raises(RequestError) as info:
        map_chat_request({"tools": tools})
    assert info.value.param == f"$.tools[{index}]"

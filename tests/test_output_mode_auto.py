"""``output_mode: auto`` and the refusal of tools on a text step (docs/routes-and-config.md).

Auto asks the decode worker for ``derender`` when the client asks for tools (some tools, a
``tool_choice`` other than none), else for ``text``; a ``text`` step refuses a client that asks
for tools before any worker call, instead of answering it with its tools dropped.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from proxy_helpers import Server, running

from disagg_transforms import (
    ConfigError,
    DecodeParams,
    GenerateDecodeLeg,
    LegInputs,
    OutputMode,
    RequestError,
    build_decode_request,
    build_decode_request_bytes,
    check_output_mode_echo,
    parse_pipeline_params,
    parse_step_params,
    validate_output_mode,
)
from disagg_transforms.exchange import ClientReply, Exchange, WorkerCall

WEATHER: Any = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
CHAT_TOOL: Any = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
RESPONSES_TOOL: Any = {"type": "function", "name": "get_weather", "parameters": WEATHER}
MESSAGES_TOOL: Any = {"name": "get_weather", "input_schema": WEATHER}
MESSAGES: Any = [{"role": "user", "content": "Hi"}]
CHAT, RESPONSES, ANTHROPIC = "/v1/chat/completions", "/v1/responses", "/v1/messages"
# Each client API: its path, a body asking for the tool, and its way of saying "no tool".
ASKING: dict[str, tuple[str, dict[str, Any], Any]] = {
    "chat": (CHAT, {"model": "m", "messages": MESSAGES, "tools": [CHAT_TOOL]}, "none"),
    "responses": (RESPONSES, {"model": "m", "input": "Hi", "tools": [RESPONSES_TOOL]}, "none"),
    "messages": (
        ANTHROPIC,
        {"model": "m", "max_tokens": 50, "messages": MESSAGES, "tools": [MESSAGES_TOOL]},
        {"type": "none"},
    ),
}
AUTO = DecodeParams(use_openai_format=False, output_mode=OutputMode.AUTO)
TEXT = DecodeParams(use_openai_format=False, output_mode=OutputMode.TEXT)


# -- configuration ----------------------------------------------------------------------------


def test_auto_is_a_decode_setting() -> None:
    assert validate_output_mode("auto") is OutputMode.AUTO
    assert parse_step_params("decode", {"output_mode": "auto"}).output_mode is OutputMode.AUTO
    pipeline = parse_pipeline_params({"decode": {"output_mode": "auto"}}, use_openai_format=False)
    assert pipeline[next(iter(pipeline))].output_mode is OutputMode.AUTO  # type: ignore[union-attr]
    # The values there were keep their meaning.
    assert parse_step_params("decode", {}).output_mode is OutputMode.TEXT
    assert validate_output_mode("derender") is OutputMode.DERENDER


@pytest.mark.parametrize("step", ["prefill", "encode", "conditional-decode"])
def test_only_decode_takes_an_output_mode(step: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_step_params(step, {"output_mode": "auto"})
    assert raised.value.param == f"{step}.output_mode"


def test_auto_is_never_a_requested_mode_of_an_answer() -> None:
    with pytest.raises(ConfigError, match="auto"):
        check_output_mode_echo({"output_mode": "auto"}, OutputMode.AUTO)
    with pytest.raises(ConfigError, match="auto"):
        check_output_mode_echo({"output_mode": "auto"}, "auto")  # type: ignore[arg-type]


# -- the decode leg ---------------------------------------------------------------------------


@pytest.mark.parametrize("api", ASKING)
def test_auto_with_tools_is_a_derender_leg_with_their_parse_context(api: str) -> None:
    path, body, _ = ASKING[api]
    leg = build_decode_request(body, client_path=path, params=AUTO, token_ids=[1, 2])
    assert isinstance(leg, GenerateDecodeLeg)
    assert leg.output_mode is OutputMode.DERENDER
    assert leg.body["output_mode"] == "derender"
    tools = leg.body["parse_context"]["tools"]
    assert [tool["function"]["name"] for tool in tools] == ["get_weather"]
    assert leg.body["parse_context"]["tool_choice"] == "auto"
    streamed = build_decode_request(
        {**body, "stream": True}, client_path=path, params=AUTO, token_ids=[1, 2]
    )
    assert (streamed.stream, streamed.single_frame) == (False, True)
    raw = build_decode_request_bytes(
        json.dumps(body).encode(), client_path=path, params=AUTO, inputs=LegInputs(token_ids=[1, 2])
    )
    assert raw.output_mode is OutputMode.DERENDER


def _without_tools(api: str, how: str) -> dict[str, Any]:
    _, body, none = ASKING[api]
    if how == "tool_choice none":
        return {**body, "tool_choice": none}
    if how == "tools []":
        return {**body, "tools": []}
    return {k: v for k, v in body.items() if k != "tools"}


@pytest.mark.parametrize("how", ["tool_choice none", "tools []", "no tools"])
@pytest.mark.parametrize("api", ASKING)
def test_auto_without_a_tool_asked_for_is_a_text_leg(api: str, how: str) -> None:
    body = _without_tools(api, how)
    for params in (AUTO, TEXT):
        leg = build_decode_request(
            {**body, "stream": True}, client_path=ASKING[api][0], params=params, token_ids=[1]
        )
        assert leg.output_mode is OutputMode.TEXT
        assert leg.body["output_mode"] == "text"
        assert "parse_context" not in leg.body
        assert (leg.stream, leg.single_frame) == (True, False)


@pytest.mark.parametrize("api", ASKING)
def test_a_text_step_refuses_a_client_asking_for_tools(api: str) -> None:
    path, body, _ = ASKING[api]
    with pytest.raises(RequestError) as raised:
        build_decode_request(body, client_path=path, params=TEXT, token_ids=[1, 2])
    assert raised.value.param == "$.tools"
    assert "output_mode: auto" in raised.value.message
    assert raised.value.status_hint == 400


# -- the exchange -----------------------------------------------------------------------------

TEXT_PIPELINE = parse_pipeline_params(
    {"prefill": {}, "decode": {"wrap_chat_completion": True}}, use_openai_format=False
)


@pytest.mark.parametrize("api", ASKING)
def test_a_text_pipeline_refuses_tools_before_any_worker_call(api: str) -> None:
    path, body, _ = ASKING[api]
    event = Exchange(TEXT_PIPELINE, path, {}, json.dumps(body).encode()).next_event()
    assert isinstance(event, ClientReply), event
    assert event.status == 400
    error = json.loads(event.body)["error"]
    assert "output_mode: auto" in error["message"]
    assert "derender" in error["message"]


@pytest.mark.parametrize("api", ASKING)
def test_an_openai_format_decode_serves_tools_itself(api: str) -> None:
    # The worker on the client's own route runs its own tool parser: nothing to refuse.
    path, body, _ = ASKING[api]
    pipeline = parse_pipeline_params({"prefill": {}, "decode": {}})
    event = Exchange(pipeline, path, {}, json.dumps(body).encode()).next_event()
    assert isinstance(event, WorkerCall)


# -- serve --simulate with its default configuration, the official SDKs ------------------------


@pytest.fixture(scope="module")
def default_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    pytest.importorskip("uvicorn")
    logs: pathlib.Path = tmp_path_factory.mktemp("auto")
    with running((["serve", "--simulate", "--port", "0"], logs / "serve.log")) as (server,):
        yield server


def test_serve_default_answers_chat_tool_calls_plain_and_streamed(default_serve: Server) -> None:
    client = openai.OpenAI(base_url=default_serve.url + "/v1", api_key="unused")
    completion = client.chat.completions.create(model="m", messages=MESSAGES, tools=[CHAT_TOOL])
    assert completion.choices[0].finish_reason == "tool_calls"
    calls = completion.choices[0].message.tool_calls
    assert calls is not None
    assert calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    with client.chat.completions.stream(model="m", messages=MESSAGES, tools=[CHAT_TOOL]) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    streamed_calls = final.choices[0].message.tool_calls
    assert streamed_calls is not None
    assert streamed_calls[0].function.name == "get_weather"
    # Without tools the same pipeline answers text, streamed as it comes.
    with client.chat.completions.stream(model="m", messages=MESSAGES) as stream:
        text = stream.get_final_completion()
    assert text.choices[0].message.content == "Hello!"
    assert text.choices[0].message.tool_calls is None


def test_serve_default_answers_responses_tool_calls_plain_and_streamed(
    default_serve: Server,
) -> None:
    client = openai.OpenAI(base_url=default_serve.url + "/v1", api_key="unused")
    response = client.responses.create(model="m", input="Hi", tools=[RESPONSES_TOOL])
    calls = [item for item in response.output if item.type == "function_call"]
    assert [call.name for call in calls] == ["get_weather"]
    with client.responses.stream(model="m", input="Hi", tools=[RESPONSES_TOOL]) as stream:
        final = stream.get_final_response()
    streamed = [item for item in final.output if item.type == "function_call"]
    assert [call.name for call in streamed] == ["get_weather"]


def test_serve_default_answers_messages_tool_use_plain_and_streamed(
    default_serve: Server,
) -> None:
    client = anthropic.Anthropic(base_url=default_serve.url, api_key="unused")
    message = client.messages.create(
        model="m", max_tokens=200, messages=MESSAGES, tools=[MESSAGES_TOOL]
    )
    assert message.stop_reason == "tool_use"
    assert [block.type for block in message.content][-1] == "tool_use"
    with client.messages.stream(
        model="m", max_tokens=200, messages=MESSAGES, tools=[MESSAGES_TOOL]
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    uses = [block for block in final.content if block.type == "tool_use"]
    assert [use.name for use in uses] == ["get_weather"]


# -- an agent loop ends: after a tool result the simulated model answers text ----------------

TURNS = 4  # an agent loop's bound: the simulated model answers on its second turn


def _chat_loop(client: openai.OpenAI) -> tuple[int, Any]:
    messages: list[Any] = [*MESSAGES]
    for turn in range(1, TURNS + 1):
        completion = client.chat.completions.create(model="m", messages=messages, tools=[CHAT_TOOL])
        message = completion.choices[0].message
        if not message.tool_calls:
            return turn, message
        messages.append(message.model_dump(exclude_none=True))
        messages.extend(
            {"role": "tool", "tool_call_id": call.id, "content": "Sunny"}
            for call in message.tool_calls
        )
    return TURNS, None


def _messages_loop(client: anthropic.Anthropic) -> tuple[int, Any]:
    messages: list[Any] = [*MESSAGES]
    for turn in range(1, TURNS + 1):
        message = client.messages.create(
            model="m", max_tokens=200, messages=messages, tools=[MESSAGES_TOOL]
        )
        if message.stop_reason != "tool_use":
            return turn, message
        messages.append({"role": "assistant", "content": message.content})
        results = [
            {"type": "tool_result", "tool_use_id": block.id, "content": "Sunny"}
            for block in message.content
            if block.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
    return TURNS, None


def _responses_loop(client: openai.OpenAI) -> tuple[int, Any]:
    items: list[Any] = [{"role": "user", "content": "Hi"}]
    for turn in range(1, TURNS + 1):
        response = client.responses.create(model="m", input=items, tools=[RESPONSES_TOOL])
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            return turn, response
        for call in calls:
            items.append(call.model_dump(exclude_none=True))
            items.append(
                {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}
            )
    return TURNS, None


def test_an_agent_loop_ends_after_one_tool_call(default_serve: Server) -> None:
    with openai.OpenAI(base_url=default_serve.url + "/v1", api_key="unused") as client:
        turn, message = _chat_loop(client)
        assert (turn, message.content) == (2, "Hello!")
        turn, response = _responses_loop(client)
        assert (turn, response.output_text) == (2, "Hello!")
    with anthropic.Anthropic(base_url=default_serve.url, api_key="unused") as claude:
        turn, answer = _messages_loop(claude)
        assert turn == 2
        assert [block.text for block in answer.content if block.type == "text"] == ["Hello!"]


def test_a_forced_tool_choice_still_calls_after_a_tool_result(default_serve: Server) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    messages: list[Any] = [
        *MESSAGES,
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny"},
    ]
    with openai.OpenAI(base_url=default_serve.url + "/v1", api_key="unused") as client:
        forced = client.chat.completions.create(
            model="m", messages=messages, tools=[CHAT_TOOL], tool_choice="required"
        )
        answered = client.chat.completions.create(model="m", messages=messages, tools=[CHAT_TOOL])
    assert forced.choices[0].message.tool_calls
    assert answered.choices[0].message.content == "Hello!"
    assert answered.choices[0].message.tool_calls is None

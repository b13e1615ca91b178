"""Fidelity of the response side through the clients' own SDKs (stream helpers, accumulators).

Each test here names the behaviour it pins; they run under the openai SDK 2.48 and 3.x alike
(``.ci/run`` runs this file in a venv with openai 2.48).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pydantic
import pytest
from golden import load_fixture, load_stream
from hypothesis import given
from openai.types.responses import (
    ParsedResponseOutputMessage,
    ParsedResponseOutputText,
    ResponseStreamEvent,
)
from pydantic import TypeAdapter
from strategies import envelope_options, generate_envelope_responses, rebuilt_routes, request_ids

from disagg_transforms import (
    AnthropicStreamConverter,
    ChatStreamConverter,
    ConfigError,
    DisaggTransformError,
    EnvelopeOptions,
    OutputMode,
    ResponsesStreamConverter,
    Route,
    UpstreamContractError,
    check_output_mode_echo,
    single_frame_anthropic_stream,
    single_frame_chat_stream,
    single_frame_responses_stream,
    single_frame_stream,
    stream_converter,
    wrap_anthropic_message,
    wrap_chat_completion,
    wrap_chat_completion_bytes,
    wrap_envelope,
    wrap_responses_response,
)


def served(body: bytes, http: Any = httpx) -> Any:
    """An HTTP client (httpx, or httpx2 for anthropic) answering every request with ``body``."""
    return http.Client(
        transport=http.MockTransport(
            lambda _: http.Response(
                200, content=body, headers={"content-type": "text/event-stream"}
            )
        )
    )


def openai_client(sse: bytes) -> openai.OpenAI:
    return openai.OpenAI(api_key="k", base_url="http://router/v1", http_client=served(sse))


def anthropic_client(sse: bytes) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key="k", base_url="http://router", http_client=served(sse, httpx2)
    )


class GetWeather(pydantic.BaseModel):
    """The tool of the derender fixture: its arguments are ``{"city": "Paris"}``."""

    city: str


TOOL_CALL = load_fixture("response-derender-tool-call.json")
STREAMING_CHAT = {"model": "m", "stream": True, "stream_options": {"include_usage": True}}
CACHED_USAGE = {
    "prompt_tokens": 100,
    "completion_tokens": 4,
    "total_tokens": 104,
    "prompt_tokens_details": {"cached_tokens": 30},
}


def text_stream(*, usage: dict[str, Any] | None, logprobs: Any = None) -> bytes:
    """A one-chunk text generate stream, with a usage-only chunk when ``usage`` is given."""
    chunk = {
        "request_id": "generate-tokens-r1",
        "output_mode": "text",
        "choices": [{"index": 0, "text": "Hi", "finish_reason": "stop", "logprobs": logprobs}],
    }
    events: list[dict[str, Any]] = [chunk]
    if usage is not None:
        events.append(
            {
                "request_id": "generate-tokens-r1",
                "output_mode": "text",
                "usage": usage,
                "choices": [],
            }
        )
    return (
        b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    )


# ------------------------------------------------------------------ single frame, chat


def test_single_frame_chat_closes_tool_calls_for_the_openai_stream_helper() -> None:
    """The delta chunk, then a finish chunk: the helper finishes the last tool call's arguments."""
    sse = single_frame_chat_stream(
        TOOL_CALL, requested=OutputMode.DERENDER, client_body=STREAMING_CHAT
    )
    client = openai_client(sse)
    with client.chat.completions.stream(
        model="m",
        messages=[],
        tools=[openai.pydantic_function_tool(GetWeather, name="get_weather")],
    ) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    done = [e for e in events if e.type == "tool_calls.function.arguments.done"]
    assert len(done) == 1
    assert done[0].parsed_arguments == GetWeather(city="Paris")
    calls = final.choices[0].message.tool_calls
    assert calls is not None
    call = calls[0]
    assert call.function.parsed_arguments == GetWeather(city="Paris")
    assert final.choices[0].finish_reason == "tool_calls"
    assert final.usage is not None
    assert final.usage.prompt_tokens == TOOL_CALL["usage"]["prompt_tokens"]


def test_single_frame_chat_layout() -> None:
    sse = single_frame_chat_stream(
        TOOL_CALL, requested=OutputMode.DERENDER, client_body=STREAMING_CHAT
    )
    blocks = sse.decode().split("\n\n")
    assert blocks[-2:] == ["data: [DONE]", ""]
    chunks = [json.loads(block.removeprefix("data: ")) for block in blocks[:-2]]
    full, finish, usage = chunks
    assert full["choices"][0]["finish_reason"] is None
    assert full["choices"][0]["delta"]["role"] == "assistant"
    assert full["choices"][0]["delta"]["tool_calls"][0]["index"] == 0
    assert finish["choices"] == [
        {
            "index": 0,
            "delta": {},
            "logprobs": None,
            "finish_reason": "tool_calls",
            "stop_reason": None,
            "token_ids": None,
            "weight_versions": None,
        }
    ]
    assert usage["choices"] == []
    # As vLLM's chat stream writes its usage: the null details left out.
    assert usage["usage"] == {
        key: value for key, value in TOOL_CALL["usage"].items() if value is not None
    }


# ------------------------------------------------------ single frame, Responses and Anthropic


def test_single_frame_responses_through_the_openai_stream_helper() -> None:
    sse = single_frame_responses_stream(TOOL_CALL, requested=OutputMode.DERENDER)
    with openai_client(sse).responses.stream(model="m", input="hi") as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    for kind in (
        "response.reasoning_text.done",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ):
        assert kind in types
    assert final.output[-1].type == "function_call"
    assert final.output[-1].arguments == '{"city": "Paris"}'
    assert final.usage is not None


def test_responses_function_call_arguments_done_names_the_function() -> None:
    """openai 2.48 refuses the event without ``name``; 3.x accepts it with one."""
    sse = single_frame_responses_stream(TOOL_CALL, requested=OutputMode.DERENDER)
    events = [
        json.loads(line[6:]) for line in sse.decode().splitlines() if line.startswith("data: ")
    ]
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert done["name"] == "get_weather"


def test_single_frame_anthropic_through_the_anthropic_stream_helper() -> None:
    sse = single_frame_anthropic_stream(TOOL_CALL, requested=OutputMode.DERENDER)
    with anthropic_client(sse).messages.stream(model="m", max_tokens=8, messages=[]) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_message()
    assert types.count("content_block_stop") == len(final.content) == 2
    assert final.content[1].type == "tool_use"
    assert final.content[1].input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"


# ------------------------------------------------------------------ top_logprobs: -1


def _logprobs(alternatives: int) -> dict[str, Any]:
    tops = [
        {"token": t, "logprob": -1.0 - i, "bytes": [ord(t)]}
        for i, t in enumerate("abcd"[:alternatives])
    ]
    return {"content": [{"token": "a", "logprob": -1.0, "bytes": [97], "top_logprobs": tops}]}


def _text_answer(logprobs: Any) -> dict[str, Any]:
    return {
        "request_id": "generate-tokens-r1",
        "model": "m",
        "created": 5,
        "output_mode": "text",
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        "choices": [{"index": 0, "text": "Hi", "finish_reason": "stop", "logprobs": logprobs}],
    }


@pytest.mark.parametrize(("top", "kept"), [(-1, 3), (2, 2), (None, 0), (0, 0)])
def test_top_logprobs_reads_the_same_on_every_envelope(top: int | None, kept: int) -> None:
    """``-1`` keeps every alternative; absent reads as 0, as vLLM's chat and Responses do."""
    client: dict[str, Any] = {"model": "m"}
    if top is not None:
        client["top_logprobs"] = top
    answer = _text_answer(_logprobs(3))
    chat = wrap_chat_completion(answer, requested=OutputMode.TEXT, client_body=client)
    assert len(chat["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == kept
    resp = wrap_responses_response(answer, requested=OutputMode.TEXT, client_body=client)
    assert len(resp["output"][0]["content"][0]["logprobs"][0]["top_logprobs"]) == kept
    # The stream converter, through the SDK's accumulator.
    converter = ResponsesStreamConverter(requested=OutputMode.TEXT, client_body=client, created=5)
    sse = converter.feed(text_stream(usage=CACHED_USAGE, logprobs=_logprobs(3))) + converter.close()
    with openai_client(sse).responses.stream(model="m", input="hi") as stream:
        final = stream.get_final_response()
    message = final.output[0]
    assert isinstance(message, ParsedResponseOutputMessage)
    text = message.content[0]
    assert isinstance(text, ParsedResponseOutputText)
    assert text.logprobs is not None
    assert len(text.logprobs[0].top_logprobs) == kept


# ------------------------------------------------------------------ usage


def test_anthropic_usage_excludes_cached_tokens() -> None:
    answer = {**_text_answer(None), "usage": CACHED_USAGE}
    usage = wrap_anthropic_message(answer, requested=OutputMode.TEXT)["usage"]
    assert usage == {
        "input_tokens": 70,
        "output_tokens": 4,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 30,
    }


def test_anthropic_stream_usage_through_the_sdk_accumulator() -> None:
    converter = AnthropicStreamConverter(requested=OutputMode.TEXT, client_body={"model": "m"})
    sse = converter.feed(text_stream(usage=CACHED_USAGE)) + converter.close()
    with anthropic_client(sse).messages.stream(model="m", max_tokens=8, messages=[]) as stream:
        final = stream.get_final_message()
    assert final.usage.input_tokens == 70
    assert final.usage.cache_read_input_tokens == 30
    assert final.usage.output_tokens == 4


def test_responses_stream_usage_reaches_the_completed_response() -> None:
    converter = ResponsesStreamConverter(
        requested=OutputMode.TEXT, client_body={"model": "m"}, created=5
    )
    sse = converter.feed(text_stream(usage=CACHED_USAGE)) + converter.close()
    with openai_client(sse).responses.stream(model="m", input="hi") as stream:
        final = stream.get_final_response()
    assert final.usage is not None
    assert (final.usage.input_tokens, final.usage.output_tokens) == (100, 4)
    assert final.usage.input_tokens_details.cached_tokens == 30


# ------------------------------------------------------------------ the echo error


def _echo_error(response: Any, requested: OutputMode) -> str:
    with pytest.raises(UpstreamContractError) as caught:
        check_output_mode_echo(response, requested)
    assert caught.value.status_hint == 502
    return caught.value.message


def test_echo_error_not_a_generate_response() -> None:
    chat = load_fixture("chat-completion-coupled.json")
    message = _echo_error(chat, OutputMode.TEXT)
    assert "not a generate response" in message
    assert "predates" not in message
    assert "not a generate response" in _echo_error({"detail": "Not Found"}, OutputMode.DERENDER)


@pytest.mark.parametrize(
    ("mode", "version"), [(OutputMode.TEXT, "0.32.0"), (OutputMode.DERENDER, "0.33.0")]
)
def test_echo_error_worker_predates_output_mode(mode: OutputMode, version: str) -> None:
    tokens = load_fixture("response-tokens.json")
    old = {key: value for key, value in tokens.items() if key != "output_mode"}
    message = _echo_error(old, mode)
    assert "predates output_mode" in message
    assert f"vLLM >= {version}" in message
    assert "upgrade" in message


def test_echo_error_other_mode_is_a_configuration_mismatch() -> None:
    message = _echo_error(load_fixture("response-text.json"), OutputMode.DERENDER)
    assert "configuration mismatch" in message
    assert '"text"' in message
    assert "predates" not in message


def _without(response: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {key: value for key, value in response.items() if key not in keys}


@pytest.mark.parametrize(
    ("response", "requested", "cause"),
    [
        (load_fixture("chat-completion-coupled.json"), OutputMode.TEXT, "not a generate response"),
        ({"detail": "Not Found"}, OutputMode.DERENDER, "not a generate response"),
        (
            _without(load_fixture("response-tokens.json"), "output_mode"),
            OutputMode.TEXT,
            "predates",
        ),
        # Breaks the bytes wrap's view too: the echo is read from the raw members.
        (
            _without(load_fixture("response-tokens.json"), "output_mode", "request_id"),
            OutputMode.TEXT,
            "predates",
        ),
        (load_fixture("response-text.json"), OutputMode.DERENDER, "configuration mismatch"),
    ],
)
def test_the_bytes_wrap_names_the_echo_error_s_cause_as_the_dict_wrap(
    response: dict[str, Any], requested: OutputMode, cause: str
) -> None:
    with pytest.raises(UpstreamContractError) as from_dict:
        wrap_chat_completion(response, requested=requested)
    with pytest.raises(UpstreamContractError) as from_bytes:
        wrap_chat_completion_bytes(json.dumps(response).encode(), requested=requested)
    assert cause in from_dict.value.message
    assert from_bytes.value.message == from_dict.value.message
    assert from_bytes.value.param == from_dict.value.param


def test_fixtures_are_not_mutated() -> None:
    before = copy.deepcopy(TOOL_CALL)
    single_frame_chat_stream(TOOL_CALL, requested=OutputMode.DERENDER, client_body=STREAMING_CHAT)
    assert before == TOOL_CALL
    assert load_stream("stream-text.sse")


# ------------------------------------------------------------------ one start, one shape


def _one_chunk_stream(request_id: str) -> bytes:
    chunk = {
        "request_id": request_id,
        "output_mode": "text",
        "choices": [{"index": 0, "text": "Hi", "finish_reason": "stop"}],
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n"


@given(request_ids)
def test_chat_stream_id_is_the_wrap_id(request_id: str) -> None:
    answer = {**_text_answer(None), "request_id": request_id}
    wrapped = wrap_chat_completion(answer, requested=OutputMode.TEXT, client_body={"model": "m"})
    converter = ChatStreamConverter(requested=OutputMode.TEXT, client_body={"model": "m"})
    sse = converter.feed(_one_chunk_stream(request_id)) + converter.close()
    first = json.loads(sse.split(b"\n\n")[0][len(b"data: ") :])
    assert first["id"] == wrapped["id"]
    responses = stream_converter(
        Route.RESPONSES, requested=OutputMode.TEXT, client_body={"model": "m"}
    )
    events = responses.feed(_one_chunk_stream(request_id))
    created = json.loads(events.split(b"\n\n")[0].split(b"\ndata: ")[1])
    resp = wrap_responses_response(answer, requested=OutputMode.TEXT, client_body={"model": "m"})
    assert created["response"]["id"] == resp["id"]


@given(generate_envelope_responses, rebuilt_routes, envelope_options)
def test_dispatchers_are_the_per_api_functions(
    case: tuple[dict[str, Any], str], path: str, fields: dict[str, Any]
) -> None:
    response, mode_value = case
    mode = OutputMode(mode_value)
    route = Route(path)
    options = EnvelopeOptions(**fields, clock=lambda: 7.0)
    before = copy.deepcopy(response)
    wrap, single = {
        Route.CHAT_COMPLETIONS: (wrap_chat_completion, single_frame_chat_stream),
        Route.RESPONSES: (wrap_responses_response, single_frame_responses_stream),
        Route.MESSAGES: (wrap_anthropic_message, single_frame_anthropic_stream),
    }[route]
    try:
        expected = wrap(response, requested=mode, options=options)
    except DisaggTransformError as error:
        with pytest.raises(type(error)):
            wrap_envelope(route, response, requested=mode, options=options)
        return
    assert wrap_envelope(route, response, requested=mode, options=options) == expected
    assert single_frame_stream(route, response, requested=mode, options=options) == single(
        response, requested=mode, options=options
    )
    if fields["model"] is not None:
        assert expected["model"] == fields["model"]  # the option wins on every envelope
    assert response == before


@given(envelope_options)
def test_the_bytes_wrap_equals_the_dict_wrap_for_any_options(fields: dict[str, Any]) -> None:
    response = load_fixture("response-derender-tool-call.json")
    options = EnvelopeOptions(**fields)
    by_dict = wrap_chat_completion(response, requested=OutputMode.DERENDER, options=options)
    as_bytes = wrap_chat_completion_bytes(
        json.dumps(response).encode(), requested=OutputMode.DERENDER, options=options
    )
    assert json.loads(as_bytes) == by_dict


def test_model_precedence_is_one_rule() -> None:
    answer = _text_answer(None)  # the worker says "m"
    client = {"model": "client"}
    for wrap in (wrap_chat_completion, wrap_responses_response, wrap_anthropic_message):
        assert wrap(answer, requested=OutputMode.TEXT, client_body=client)["model"] == "m"
        alias = EnvelopeOptions(model="alias")
        chosen = wrap(answer, requested=OutputMode.TEXT, client_body=client, options=alias)
        assert chosen["model"] == "alias"
        nameless = {key: value for key, value in answer.items() if key != "model"}
        assert wrap(nameless, requested=OutputMode.TEXT, client_body=client)["model"] == "client"
        with pytest.raises(UpstreamContractError) as caught:
            wrap(nameless, requested=OutputMode.TEXT)
        assert caught.value.param == "$.model"


def test_dispatchers_refuse_routes_without_an_envelope() -> None:
    for route in (Route.COMPLETIONS, Route.GENERATE):
        with pytest.raises(ConfigError):
            stream_converter(route, requested=OutputMode.TEXT, client_body={"model": "m"})
        with pytest.raises(ConfigError):
            wrap_envelope(route, TOOL_CALL, requested=OutputMode.DERENDER)


@pytest.mark.parametrize("route", [Route.CHAT_COMPLETIONS, Route.RESPONSES, Route.MESSAGES])
def test_every_converter_refuses_a_first_chunk_without_request_id(route: Route) -> None:
    # Every id of the client's stream is built from it: there is no id to give without one.
    converter = stream_converter(route, requested=OutputMode.TEXT, client_body={"model": "m"})
    chunk = {"output_mode": "text", "choices": [{"index": 0, "text": "Hi"}]}
    with pytest.raises(UpstreamContractError) as caught:
        converter.feed(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    assert caught.value.param == "$.request_id"
    assert "the first stream chunk has no request_id" in caught.value.message


# ------------------------------------------------------------------ in-stream errors


def _started(route: Route) -> tuple[Any, bytes]:
    converter = stream_converter(
        route, requested=OutputMode.TEXT, client_body={"model": "m"}, created=5
    )
    first = load_stream("stream-text.sse").split(b"\n\n")[0] + b"\n\n"
    return converter, converter.feed(first)


def test_chat_error_event_reaches_the_openai_client_as_an_error() -> None:
    converter, started = _started(Route.CHAT_COMPLETIONS)
    sse = started + converter.error_event("the worker went away", status=502)
    assert sse.endswith(b"data: [DONE]\n\n")
    client = openai_client(sse)
    with pytest.raises(openai.APIError, match="the worker went away"):
        list(client.chat.completions.create(model="m", messages=[], stream=True))


def test_responses_error_event_is_numbered_and_sdk_valid() -> None:
    converter, started = _started(Route.RESPONSES)
    sse = started + converter.error_event("too big", status=413)
    events = [
        json.loads(line[6:]) for line in sse.decode().splitlines() if line.startswith("data: ")
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1] == {
        "type": "error",
        "code": "invalid_request_error",
        "message": "too big",
        "param": None,
        "sequence_number": len(events) - 1,
    }
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    for event in events:
        adapter.validate_python(event)
    assert converter.feed(b"data: [DONE]\n\n") == b""  # the client's stream is over


def test_anthropic_error_event_reaches_the_anthropic_client_as_an_error() -> None:
    converter, started = _started(Route.MESSAGES)
    sse = started + converter.error_event("slow down", status=429)
    assert sse.endswith(
        b'data: {"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}\n\n'
    )
    with (
        pytest.raises(anthropic.APIStatusError, match="slow down"),
        anthropic_client(sse).messages.stream(model="m", max_tokens=8, messages=[]) as stream,
    ):
        stream.get_final_message()

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import ErrorResponse, RawMessageStreamEvent
from golden import RESPONSE_FIXTURES, load_fixture, load_stream
from helpers import text_stream_converter
from hypothesis import given
from hypothesis import strategies as st
from openai.lib.streaming.responses import ResponseStreamState
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseIncompleteEvent,
    ResponseStreamEvent,
)
from pydantic import TypeAdapter
from strategies import generate_envelope_responses, single_choice_text_streams

from disagg_transforms import (
    AnthropicStreamConverter,
    ConfigError,
    EnvelopeOptions,
    OutputMode,
    ResponsesStreamConverter,
    Route,
    StreamConverter,
    UpstreamContractError,
    single_frame_anthropic_events,
    single_frame_anthropic_stream,
    single_frame_responses_events,
    single_frame_responses_stream,
    wrap_anthropic_message,
    wrap_responses_response,
)

RESPONSE_EVENT = TypeAdapter(ResponseStreamEvent)
ANTHROPIC_EVENT = TypeAdapter(RawMessageStreamEvent)

# The golden text stream as one non-streaming generate answer.
GOLDEN_ANSWER = {
    "request_id": "generate-tokens-r1",
    "created": 5,
    "output_mode": "text",
    "usage": {"prompt_tokens": 12, "total_tokens": 16, "completion_tokens": 4},
    "choices": [{"index": 0, "text": "Hello!", "finish_reason": "stop", "stop_reason": None}],
}


def named_events(sse: bytes) -> list[dict[str, Any]]:
    """Each event's JSON; its ``event:`` line must name the event's ``type``."""
    assert sse.endswith(b"\n\n")
    assert b"[DONE]" not in sse
    events = []
    for block in sse[:-2].split(b"\n\n"):
        name, data = block.split(b"\n")
        assert name.startswith(b"event: ")
        assert data.startswith(b"data: ")
        event = json.loads(data[len(b"data: ") :])
        assert event["type"] == name[len(b"event: ") :].decode()
        events.append(event)
    return events


def responses_converter(**kwargs: Any) -> StreamConverter:
    return text_stream_converter(Route.RESPONSES, **kwargs)


def anthropic_converter(**kwargs: Any) -> StreamConverter:
    return text_stream_converter(Route.MESSAGES, **kwargs)


def convert(make: Callable[[], Any], stream: bytes) -> bytes:
    converter = make()
    return bytes(converter.feed(stream) + converter.close())


def accumulate_responses(events: list[dict[str, Any]]) -> Any:
    """Run the openai SDK's accumulator; the final ``response`` of the terminal event."""
    state: ResponseStreamState[object] = ResponseStreamState(
        input_tools=openai.omit, text_format=openai.omit
    )
    handled = []
    for number, event in enumerate(events):
        assert event["sequence_number"] == number
        handled.extend(state.handle_event(RESPONSE_EVENT.validate_python(event)))
    terminal = handled[-1]
    # vLLM 0.33 ends an incomplete response's stream with response.incomplete.
    assert isinstance(terminal, (ResponseCompletedEvent, ResponseIncompleteEvent))
    incomplete = terminal.response.status == "incomplete"
    assert terminal.type == ("response.incomplete" if incomplete else "response.completed")
    return terminal.response


def accumulate_anthropic(events: list[dict[str, Any]]) -> Any:
    """Run the anthropic SDK's accumulator over the events."""
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for event in events:
        parsed = ANTHROPIC_EVENT.validate_python(event)
        snapshot = accumulate_event(event=parsed, current_snapshot=snapshot, json_bufs=json_bufs)
    assert events[-1] == {"type": "message_stop"}
    return snapshot


def without_none(value: Any) -> Any:
    """``value`` without null-valued keys: the SDK accumulators add ``parsed: None`` etc."""
    if isinstance(value, dict):
        return {key: without_none(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_none(item) for item in value]
    return value


def as_streamed(response: dict[str, Any]) -> dict[str, Any]:
    """The wrap's response as vLLM's stream ends it: a reasoning item closed with a status.

    (The whole answer leaves a reasoning item's status unset; the stream's done event sets it:
    the last item the cap cut is incomplete, any other completed.)
    """
    output = response["output"]
    cut = response["status"] == "incomplete"
    return {
        **response,
        "output": [
            {**item, "status": "incomplete" if cut and at == len(output) - 1 else "completed"}
            if item["type"] == "reasoning"
            else item
            for at, item in enumerate(output)
        ],
    }


def same(accumulated: Any, built: dict[str, Any]) -> bool:
    """The SDK's accumulated object carries what our non-streaming builder gave."""
    return bool(without_none(accumulated.to_dict()) == without_none(built))


def served(body: bytes, http: Any = httpx) -> Any:
    """An HTTP client (of ``http``: httpx, or httpx2 for anthropic) serving ``body`` as SSE."""
    return http.Client(
        transport=http.MockTransport(
            lambda _: http.Response(
                200, content=body, headers={"content-type": "text/event-stream"}
            )
        )
    )


# ---------------------------------------------------------------------------- Responses


def test_responses_golden_stream_through_the_openai_client() -> None:
    sse = convert(responses_converter, load_stream("stream-text.sse"))
    client = openai.OpenAI(api_key="k", base_url="http://router/v1", http_client=served(sse))
    types = [event.type for event in client.responses.create(model="m", input="hi", stream=True)]
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    with client.responses.stream(model="m", input="hi") as stream:
        final = stream.get_final_response()
    assert final.output_text == "Hello!"
    expected = wrap_responses_response(
        GOLDEN_ANSWER, requested=OutputMode.TEXT, options=EnvelopeOptions(model="m")
    )
    assert same(final, expected)


def test_responses_golden_events_accumulate_to_the_wrap() -> None:
    events = named_events(convert(responses_converter, load_stream("stream-text.sse")))
    final = accumulate_responses(events)
    expected = wrap_responses_response(
        GOLDEN_ANSWER, requested=OutputMode.TEXT, options=EnvelopeOptions(model="m")
    )
    assert events[-1]["response"] == expected
    assert final.output_text == "Hello!"
    assert events[0]["response"]["status"] == "in_progress"
    assert events[0]["response"]["output"] == []
    assert [e["delta"] for e in events if e["type"] == "response.output_text.delta"] == [
        "Hel",
        "lo",
        "!",
    ]
    assert all("request_id" not in json.dumps(e) for e in events)


def test_responses_error_event() -> None:
    events = named_events(convert(responses_converter, load_stream("stream-text-error.sse")))
    assert events[-1] == {
        "type": "error",
        "code": "InternalServerError",
        "message": "engine died",
        "param": None,
        "sequence_number": 5,
    }
    for event in events:
        RESPONSE_EVENT.validate_python(event)


def test_responses_length_is_incomplete_and_logprobs_stream() -> None:
    stream = (
        b'data: {"request_id":"generate-tokens-r","output_mode":"text","choices":[{"index":0,'
        b'"text":"a","finish_reason":"length","logprobs":{"content":[{"token":"a","logprob":-1.0,'
        b'"bytes":[97],"top_logprobs":[{"token":"a","logprob":-1.0},{"token":"b","logprob":-2.0}'
        b"]}]}}]}\n\ndata: [DONE]\n\n"
    )
    events = named_events(
        convert(lambda: responses_converter(client_body={"top_logprobs": 1}), stream)
    )
    final = accumulate_responses(events)
    assert final.status == "incomplete"
    assert final.incomplete_details.reason == "max_output_tokens"
    delta = next(e for e in events if e["type"] == "response.output_text.delta")
    assert delta["logprobs"] == [
        {"token": "a", "logprob": -1.0, "top_logprobs": [{"token": "a", "logprob": -1.0}]}
    ]
    # vLLM's done event carries no logprobs; the part in content_part.done has them all.
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert done["logprobs"] == []
    assert final.output[0].content[0].logprobs[0].bytes == [97]
    # The cap cut the message item too (vLLM 0.33's response_item_status), and the stream
    # ends with response.incomplete.
    assert final.output[0].status == "incomplete"
    assert events[-1]["type"] == "response.incomplete"


# ---------------------------------------------------------------------------- Anthropic


def test_anthropic_golden_stream_through_the_anthropic_client() -> None:
    sse = convert(anthropic_converter, load_stream("stream-text.sse"))
    client = anthropic.Anthropic(
        api_key="k", base_url="http://router", http_client=served(sse, httpx2)
    )
    with client.messages.stream(model="m", max_tokens=8, messages=[]) as stream:
        final = stream.get_final_message()
    expected = wrap_anthropic_message(
        GOLDEN_ANSWER, requested=OutputMode.TEXT, options=EnvelopeOptions(model="m")
    )
    assert same(final, expected)


def test_anthropic_golden_events() -> None:
    events = named_events(convert(anthropic_converter, load_stream("stream-text.sse")))
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0]["message"]["content"] == []
    assert events[0]["message"]["id"] == "msg_r1"
    assert events[-2] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"input_tokens": 12, "output_tokens": 4},
    }
    final = accumulate_anthropic(events)
    assert same(
        final,
        wrap_anthropic_message(
            GOLDEN_ANSWER, requested=OutputMode.TEXT, options=EnvelopeOptions(model="m")
        ),
    )


def test_anthropic_error_event_reaches_the_client_as_an_error() -> None:
    sse = convert(anthropic_converter, load_stream("stream-text-error.sse"))
    events = named_events(sse)
    assert events[-1] == {"type": "error", "error": {"type": "api_error", "message": "engine died"}}
    ErrorResponse.model_validate(events[-1])
    client = anthropic.Anthropic(
        api_key="k", base_url="http://router", http_client=served(sse, httpx2)
    )
    with (
        pytest.raises(anthropic.APIStatusError, match="engine died"),
        client.messages.stream(model="m", max_tokens=8, messages=[]) as stream,
    ):
        stream.get_final_message()


def test_anthropic_usage_and_stop_sequence() -> None:
    stream = (
        b'data: {"request_id":"r","output_mode":"text","usage":{"prompt_tokens":7,'
        b'"completion_tokens":1,"total_tokens":8},"choices":[{"index":0,"text":"",'
        b'"finish_reason":"stop","stop_reason":"END"}]}\n\ndata: [DONE]\n\n'
    )
    events = named_events(
        convert(lambda: anthropic_converter(client_body={"stop_sequences": ["END"]}), stream)
    )
    # An empty answer has no text block, as the non-streaming message has none.
    assert [e["type"] for e in events] == ["message_start", "message_delta", "message_stop"]
    assert events[0]["message"]["usage"] == {"input_tokens": 7, "output_tokens": 0}
    assert events[1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert accumulate_anthropic(events).content == []


def test_anthropic_without_usage_counts_zero() -> None:
    stream = (
        b'data: {"request_id":"r","output_mode":"text","choices":[{"index":0,"text":"x",'
        b'"finish_reason":"length"}]}\n\ndata: [DONE]\n\n'
    )
    final = accumulate_anthropic(named_events(convert(anthropic_converter, stream)))
    assert (final.usage.input_tokens, final.usage.output_tokens) == (0, 0)
    assert final.stop_reason == "max_tokens"


# ---------------------------------------------------------------------------- both

CONVERTERS = [responses_converter, anthropic_converter]


@pytest.mark.parametrize("make", CONVERTERS)
@pytest.mark.parametrize("name", ["stream-text.sse", "stream-text-error.sse"])
def test_every_byte_boundary_gives_the_same_bytes(make: Callable[[], Any], name: str) -> None:
    stream = load_stream(name)
    whole = convert(make, stream)
    for cut in range(len(stream) + 1):
        converter = make()
        assert (
            converter.feed(stream[:cut]) + converter.feed(stream[cut:]) + converter.close() == whole
        )


@pytest.mark.parametrize("make", CONVERTERS)
@pytest.mark.parametrize(
    ("stream", "param"),
    [
        (b'data: {"request_id":"r","choices":[]}\n\n', "$.output_mode"),
        (b'data: {"request_id":"r","output_mode":"tokens","choices":[]}\n\n', "$.output_mode"),
        (b"data: {nope\n\n", "$"),
        (b'data: {"output_mode":"text","choices":[]}\n\n', "$.request_id"),
        (
            b'data: {"request_id":"r","output_mode":"text","choices":[{"index":1,"text":""}]}\n\n',
            "$.choices[0].index",
        ),
        (
            b'data: {"request_id":"r","output_mode":"text","choices":[{"index":0}]}\n\n',
            "$.choices[0].text",
        ),
        (b"data: [DONE]\n\n", "$"),
        (b"data: [DONE]\n\ndata: {}\n\n", "$"),
    ],
)
def test_contract_breaches(make: Callable[[], Any], stream: bytes, param: str) -> None:
    with pytest.raises(UpstreamContractError) as caught:
        make().feed(stream)
    assert caught.value.param == param
    assert caught.value.status_hint == 502


@pytest.mark.parametrize("make", CONVERTERS)
def test_close_without_done_is_an_error(make: Callable[[], Any]) -> None:
    converter = make()
    converter.feed(b'data: {"request_id":"r","output_mode":"text","choices":[]}\n\n')
    with pytest.raises(UpstreamContractError):
        converter.close()


def test_only_text_streams() -> None:
    for mode in (OutputMode.TOKENS, OutputMode.DERENDER):
        with pytest.raises(ConfigError):
            ResponsesStreamConverter(requested=mode, client_body={"model": "m"}, created=0)
        with pytest.raises(ConfigError):
            AnthropicStreamConverter(requested=mode, client_body={"model": "m"})


@given(single_choice_text_streams(), st.lists(st.integers(0, 2000), max_size=6))
def test_random_streams_split_anywhere(stream: bytes, cuts: list[int]) -> None:
    points = sorted({min(cut, len(stream)) for cut in cuts})
    spans = list(zip([0, *points], [*points, len(stream)], strict=True))
    for make in CONVERTERS:
        expected = convert(make, stream)
        split = make()
        assert b"".join(split.feed(stream[a:b]) for a, b in spans) + split.close() == expected
    responses = named_events(convert(responses_converter, stream))
    messages = named_events(convert(anthropic_converter, stream))
    if responses[-1]["type"] == "error":
        for event in responses:
            RESPONSE_EVENT.validate_python(event)
        ErrorResponse.model_validate(messages[-1])
        return
    texts = [e["delta"] for e in responses if e["type"] == "response.output_text.delta"]
    final = accumulate_responses(responses)
    assert final.output_text == "".join(texts)
    message = accumulate_anthropic(messages)
    assert "".join(block.text for block in message.content) == "".join(texts)


@pytest.mark.parametrize("make", CONVERTERS)
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes_give_output_or_a_typed_error(make: Callable[[], Any], data: bytes) -> None:
    with contextlib.suppress(UpstreamContractError):
        convert(make, data)


@pytest.mark.parametrize("make", CONVERTERS)
@given(data=st.binary(max_size=80).map(lambda b: b'data: {"request_id":"r",' + b + b"\n\n"))
def test_arbitrary_events_give_output_or_a_typed_error(
    make: Callable[[], Any], data: bytes
) -> None:
    with contextlib.suppress(UpstreamContractError):
        make().feed(data)


# ---------------------------------------------------------------------------- single frame


@pytest.mark.parametrize(("name", "mode"), RESPONSE_FIXTURES)
def test_single_frame_responses_accumulates_to_the_wrap(name: str, mode: OutputMode) -> None:
    response = load_fixture(name)
    sse = single_frame_responses_stream(response, requested=mode)
    events = named_events(sse)
    assert events == single_frame_responses_events(response, requested=mode)
    expected = wrap_responses_response(response, requested=mode)
    Response.model_validate(expected)
    assert same(accumulate_responses(events), as_streamed(expected))


def test_single_frame_responses_tool_call_events() -> None:
    events = single_frame_responses_events(
        load_fixture("response-derender-tool-call.json"), requested=OutputMode.DERENDER
    )
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[8]["item"]["arguments"] == ""
    assert events[9]["delta"] == '{"city": "Paris"}'
    # The reasoning item is closed "completed", as vLLM's stream closes it; so is the final
    # response's (the whole answer leaves its status unset).
    assert events[7]["item"]["status"] == "completed"
    assert events[-1]["response"]["output"][0]["status"] == "completed"


@pytest.mark.parametrize(("name", "mode"), RESPONSE_FIXTURES)
def test_single_frame_anthropic_accumulates_to_the_wrap(name: str, mode: OutputMode) -> None:
    response = load_fixture(name)
    events = named_events(single_frame_anthropic_stream(response, requested=mode))
    assert events == single_frame_anthropic_events(response, requested=mode)
    assert same(accumulate_anthropic(events), wrap_anthropic_message(response, requested=mode))


def test_single_frame_anthropic_thinking_and_tool_use_events() -> None:
    events = single_frame_anthropic_events(
        load_fixture("response-derender-tool-call.json"), requested=OutputMode.DERENDER
    )
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert deltas == [
        {"type": "thinking_delta", "thinking": "User wants weather."},
        {"type": "signature_delta", "signature": ""},
        {"type": "input_json_delta", "partial_json": '{"city":"Paris"}'},
    ]
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert starts[1]["input"] == {}


@given(generate_envelope_responses)
def test_single_frame_of_any_response(case: tuple[dict[str, Any], str]) -> None:
    response, mode_value = case
    mode = OutputMode(mode_value)
    before = copy.deepcopy(response)
    final = accumulate_responses(single_frame_responses_events(response, requested=mode))
    assert same(final, as_streamed(wrap_responses_response(response, requested=mode)))
    message = accumulate_anthropic(single_frame_anthropic_events(response, requested=mode))
    assert same(message, wrap_anthropic_message(response, requested=mode))
    assert response == before

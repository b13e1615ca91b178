from __future__ import annotations

import contextlib
import copy
import json
from typing import Any

import pytest
from golden import load_fixture, load_stream
from helpers import text_stream_converter
from hypothesis import given
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from strategies import generate_responses, generate_text_streams

from disagg_transforms import (
    ChatStreamConverter,
    ConfigError,
    EnvelopeOptions,
    OutputMode,
    Route,
    StreamConverter,
    UpstreamContractError,
    single_frame_chat_chunks,
    single_frame_chat_stream,
    wrap_chat_completion,
)
from disagg_transforms._wire.sse import SseParser


def _chunks(sse: bytes) -> list[dict[str, Any]]:
    payloads = SseParser().feed(sse)
    assert payloads[-1] == b"[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


def _accumulate(chunks: list[dict[str, Any]]) -> Any:
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    for chunk in chunks:
        list(state.handle_chunk(ChatCompletionChunk.model_validate(chunk)))
    # The snapshot, not get_final_completion(): the latter refuses finish_reason "length".
    return state.current_completion_snapshot


def _converter(**kwargs: Any) -> StreamConverter:
    return text_stream_converter(Route.CHAT_COMPLETIONS, **kwargs)


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        ("response-derender-tool-call.json", OutputMode.DERENDER),
        ("response-derender-text.json", OutputMode.DERENDER),
        ("response-text.json", OutputMode.TEXT),
        ("response-text-finish-abort.json", OutputMode.TEXT),
        ("response-text-finish-repetition.json", OutputMode.TEXT),
    ],
)
def test_single_frame_accumulates_to_the_wrap(name: str, mode: OutputMode) -> None:
    response = load_fixture(name)
    client = {"model": "m", "stream": True, "stream_options": {"include_usage": True}}
    sse = single_frame_chat_stream(response, requested=mode, client_body=client)
    assert sse.endswith(b"data: [DONE]\n\n")
    chunks = _chunks(sse)
    assert chunks == single_frame_chat_chunks(response, requested=mode, client_body=client)
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["total_tokens"] == 16
    wrapped = ChatCompletion.model_validate(
        wrap_chat_completion(response, requested=mode, client_body=client)
    )
    final = _accumulate(chunks)
    for ours, theirs in zip(final.choices, wrapped.choices, strict=True):
        assert ours.message.content == theirs.message.content
        assert ours.finish_reason == theirs.finish_reason
        # Ours are function tool calls; the SDK types a completion's as a union with custom ones.
        assert [t.function.name for t in ours.message.tool_calls or []] == [
            t.function.name  # type: ignore[union-attr]
            for t in theirs.message.tool_calls or []
        ]


def test_single_frame_delta_carries_the_whole_message() -> None:
    chunks = single_frame_chat_chunks(
        load_fixture("response-derender-tool-call.json"), requested=OutputMode.DERENDER
    )
    assert len(chunks) == 2  # the delta, the finish; no usage chunk unless asked
    assert chunks[1]["choices"][0]["delta"] == {}
    assert chunks[1]["choices"][0]["finish_reason"] == "tool_calls"
    delta = chunks[0]["choices"][0]["delta"]
    assert delta["role"] == "assistant"
    assert delta["reasoning"] == "User wants weather."
    assert delta["tool_calls"][0]["index"] == 0
    assert delta["tool_calls"][0]["function"]["name"] == "get_weather"
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["choices"][0]["finish_reason"] is None


def test_single_frame_members_are_those_of_vllms_chat_stream() -> None:
    # vLLM's chat stream (captured from 0.32, read in the 0.33 wheel) writes these around
    # the deltas; the single frame differs only in the cut (docs/responses.md).
    response = copy.deepcopy(load_fixture("response-derender-tool-call.json"))
    response["usage"] = {
        "prompt_tokens": 12,
        "total_tokens": 16,
        "completion_tokens": 4,
        "prompt_tokens_details": {"cached_tokens": 0, "multimodal_tokens": None},
        "completion_tokens_details": None,
    }
    client = {"stream": True, "stream_options": {"include_usage": True}}
    opened, finished, usage = single_frame_chat_chunks(
        response, requested=OutputMode.DERENDER, client_body=client
    )
    assert list(opened)[-2:] == ["prompt_token_ids", "prompt_text"]
    assert opened["prompt_token_ids"] is None
    assert opened["choices"][0]["token_ids"] is None
    assert list(finished["choices"][0])[-3:] == ["stop_reason", "token_ids", "weight_versions"]
    assert finished["choices"][0]["weight_versions"] is None
    assert usage["usage"] == {
        "prompt_tokens": 12,
        "total_tokens": 16,
        "completion_tokens": 4,
        "prompt_tokens_details": {"cached_tokens": 0, "created_cache_tokens": 0},
    }
    before_033 = single_frame_chat_chunks(
        response,
        requested=OutputMode.DERENDER,
        client_body=client,
        options=EnvelopeOptions(vllm_version="0.32.0"),
    )
    assert "weight_versions" not in before_033[1]["choices"][0]


def test_text_stream_golden() -> None:
    converter = _converter(client_body={"stream_options": {"include_usage": True}})
    out = converter.feed(load_stream("stream-text.sse")) + converter.close()
    chunks = _chunks(out)
    # Cut as vLLM's chat route cuts them: an opening chunk, then one chunk per text delta.
    assert [c["choices"][0]["delta"] for c in chunks[:4]] == [
        {"role": "assistant", "content": ""},
        {"content": "Hel"},
        {"content": "lo"},
        {"content": "!"},
    ]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:4]] == [None, None, None, "stop"]
    assert ["stop_reason" in c["choices"][0] for c in chunks[:4]] == [False, False, False, True]
    assert chunks[4] == {
        "id": "chatcmpl-r1",
        "object": "chat.completion.chunk",
        "created": 5,
        "model": "m",
        "choices": [],
        "usage": {"prompt_tokens": 12, "total_tokens": 16, "completion_tokens": 4},
    }
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
        assert "request_id" not in chunk
        # Not asked for (return_token_ids): null where vLLM's chat route writes them.
        assert chunk.get("prompt_token_ids") is None
        assert all(c.get("token_ids") is None for c in chunk["choices"])
    assert _accumulate(chunks).choices[0].message.content == "Hello!"


def test_error_event_passes_byte_for_byte() -> None:
    stream = load_stream("stream-text-error.sse")
    converter = _converter()
    out = converter.feed(stream) + converter.close()
    error_line = stream.split(b"\n\n")[1]
    assert error_line + b"\n\n" in out
    assert out.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("name", ["stream-text.sse", "stream-text-error.sse"])
def test_every_byte_boundary_gives_the_same_bytes(name: str) -> None:
    stream = load_stream(name)
    whole = _converter().feed(stream)
    for cut in range(len(stream) + 1):
        converter = _converter()
        assert converter.feed(stream[:cut]) + converter.feed(stream[cut:]) == whole
        assert converter.close() == b""


@pytest.mark.parametrize(
    ("stream", "param"),
    [
        (b'data: {"choices":[]}\n\n', "$.output_mode"),
        (b'data: {"output_mode":"tokens","choices":[]}\n\n', "$.output_mode"),
        (b"data: {nope\n\n", "$"),
        (
            b'data: {"request_id":"r1","output_mode":"text","choices":[{"index":0}]}\n\n',
            "$.choices[0].text",
        ),
        (
            (
                b'data: {"request_id":"r1","output_mode":"text",'
                b'"choices":[{"index":"0","text":""}]}\n\n'
            ),
            "$.choices[0].index",
        ),
        (b'data: {"request_id":"r1","output_mode":"text"}\n\n', "$.choices"),
        (b"data: [DONE]\n\ndata: {}\n\n", "$"),
        (b"data: [1]\n\n", "$"),
    ],
)
def test_contract_breaches(stream: bytes, param: str) -> None:
    with pytest.raises(UpstreamContractError) as caught:
        _converter().feed(stream)
    assert caught.value.param == param
    assert caught.value.status_hint == 502


@pytest.mark.parametrize(
    "tail", [b"", b'data: {"request_id":"r1","output_mode":"text","choices":[]}\n\n', b"data: [DO"]
)
def test_close_without_done_is_an_error(tail: bytes) -> None:
    converter = _converter()
    converter.feed(tail)
    with pytest.raises(UpstreamContractError):
        converter.close()


def test_bounds() -> None:
    with pytest.raises(UpstreamContractError):
        _converter(max_event_bytes=32).feed(b"data: " + b"x" * 64)
    event = b'data: {"request_id":"r1","output_mode":"text","choices":[{"index":%d,"text":""}]}\n\n'
    converter = _converter(max_choices=2)
    out = converter.feed(event % 1 + event % 1)
    assert next(c["choices"][0]["delta"] for c in _chunks(out + b"data: [DONE]\n\n")) == {
        "role": "assistant",
        "content": "",
    }
    with pytest.raises(UpstreamContractError):
        converter.feed(event % 2)


def test_only_text_streams() -> None:
    for mode in (OutputMode.TOKENS, OutputMode.DERENDER):
        with pytest.raises(ConfigError):
            ChatStreamConverter(requested=mode, client_body={"model": "m"}, created=0)


def test_stream_logprobs_cut_and_finish_mapped() -> None:
    event = (
        b'data: {"request_id":"r1","output_mode":"text","choices":[{"index":0,"text":"a",'
        b'"finish_reason":"abort",'
        b'"logprobs":{"content":[{"token":"a","logprob":-1.0,"bytes":null,"top_logprobs":'
        b'[{"token":"a","logprob":-1.0},{"token":"b","logprob":-2.0}]}]}}]}\n\n'
    )
    chunk = _chunks(_converter(client_body={"top_logprobs": 1}).feed(event + b"data: [DONE]\n\n"))[
        1  # after the opening chunk
    ]
    choice = chunk["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["vllm_finish_reason"] == "abort"
    assert [t["token"] for t in choice["logprobs"]["content"][0]["top_logprobs"]] == ["a"]
    ChatCompletionChunk.model_validate(chunk)


@given(generate_text_streams(), st.lists(st.integers(0, 2000), max_size=8))
def test_random_streams_split_anywhere(stream: bytes, cuts: list[int]) -> None:
    whole = _converter(client_body={"top_logprobs": 1})
    expected = whole.feed(stream) + whole.close()
    points = sorted({min(c, len(stream)) for c in cuts})
    split = _converter(client_body={"top_logprobs": 1})
    out = b"".join(
        split.feed(stream[a:b]) for a, b in zip([0, *points], [*points, len(stream)], strict=True)
    )
    assert out + split.close() == expected
    chunks = _chunks(expected)
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
        assert "request_id" not in chunk
    final = _accumulate(chunks)
    assert all(choice.finish_reason in {"stop", "length", "tool_calls"} for choice in final.choices)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_give_output_or_a_typed_error(data: bytes) -> None:
    converter = _converter()
    try:
        converter.feed(data)
        converter.close()
    except UpstreamContractError:
        pass


@given(st.binary(max_size=60).map(lambda b: b"data: " + b + b"\n\n"))
def test_arbitrary_events_give_output_or_a_typed_error(data: bytes) -> None:
    with contextlib.suppress(UpstreamContractError):
        _converter().feed(data)


@given(generate_responses("derender"))
def test_single_frame_of_any_derender_response(response: dict[str, Any]) -> None:
    before = copy.deepcopy(response)
    chunks = _chunks(
        single_frame_chat_stream(
            response, requested=OutputMode.DERENDER, options=EnvelopeOptions(model="m")
        )
    )
    assert response == before
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    final = _accumulate(chunks)
    assert [c.message.content for c in final.choices] == [
        c["message"]["content"] for c in sorted(response["choices"], key=lambda c: c["index"])
    ]


@pytest.mark.parametrize("kind", [bytearray, memoryview])
def test_bytes_like_feeds_convert_as_bytes(kind: Any) -> None:
    # A router may hand on its HTTP client's buffers as they are.
    stream = load_stream("stream-text.sse")
    expected = _converter().feed(stream)
    converter = _converter()
    assert converter.feed(kind(stream)) + converter.close() == expected

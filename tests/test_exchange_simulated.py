"""The exchange end to end: the official SDKs as clients, the simulated vLLM 0.33 worker behind.

Each client request runs one exchange (``tests/simulated_router.py``); every worker call is
served in process by ``SimulatedWorker``, streams fed chunk by chunk. The legs are read back
from ``worker.calls``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pydantic
import pytest
from openai.types.responses import ResponseIncompleteEvent
from simulated_router import SimulatedRouter

from disagg_transforms import parse_pipeline_params
from disagg_transforms.testing import SimulatedWorker, WorkerSettings, toy_encode

GENERATE = "/inference/v1/generate"
CREATED = 1796000000
MESSAGES: Any = [{"role": "user", "content": "Hi"}]
ANSWER_TOKENS = len(toy_encode("Hello!")) + 1  # the answer, then <|im_end|>


def _config(decode: dict[str, Any] | None = None, **steps: Any) -> Any:
    pipeline = {"prefill": {}, **steps, "decode": {"wrap_chat_completion": True, **(decode or {})}}
    return parse_pipeline_params(pipeline, use_openai_format=False)


def _openai(router: SimulatedRouter, retries: int = 0) -> openai.OpenAI:
    # The openai SDK speaks HTTP through httpx2, as the anthropic SDK does.
    http = httpx2.Client(transport=httpx2.MockTransport(router))
    return openai.OpenAI(
        base_url="http://router/v1", api_key="k", http_client=http, max_retries=retries
    )


def _anthropic(router: SimulatedRouter, retries: int = 0) -> anthropic.Anthropic:
    http = httpx2.Client(transport=httpx2.MockTransport(router))
    return anthropic.Anthropic(
        base_url="http://router", api_key="k", http_client=http, max_retries=retries
    )


def _bodies(router: SimulatedRouter, path: str = GENERATE) -> list[Any]:
    return [call.body for call in router.worker.calls_to(path)]


def _replay(path: str, body: Any, request_id: str) -> bytes:
    """What a fresh worker answers to ``body``: the bytes the exchange was given."""
    worker = SimulatedWorker(WorkerSettings(created=CREATED))

    async def run() -> bytes:
        transport = httpx.ASGITransport(app=worker)
        async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
            headers = {"x-request-id": request_id}
            return (await client.post(path, json=body, headers=headers)).content

    return asyncio.run(run())


def test_chat_completion() -> None:
    router = SimulatedRouter(_config())
    completion = _openai(router).chat.completions.create(model="m", messages=MESSAGES)
    assert completion.choices[0].message.content == "Hello!"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == ANSWER_TOKENS
    assert [call.path for call in router.worker.calls] == [
        "/v1/chat/completions/render",
        GENERATE,
        GENERATE,
    ]


def test_chat_stream_with_usage() -> None:
    router = SimulatedRouter(_config())
    chunks = list(
        _openai(router).chat.completions.create(
            model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello!"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == ANSWER_TOKENS
    decode = _bodies(router)[-1]
    assert decode["stream"] is True
    assert decode["stream_options"]["include_usage"] is True


class Weather(pydantic.BaseModel):
    city: str


def test_derender_tool_call_through_the_stream_helper() -> None:
    router = SimulatedRouter(_config({"output_mode": "derender"}))
    tool = openai.pydantic_function_tool(Weather, name="get_weather")
    with _openai(router).chat.completions.stream(
        model="m", messages=MESSAGES, tools=[tool]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in kinds
    calls = final.choices[0].message.tool_calls
    assert calls is not None
    assert calls[0].function.name == "get_weather"
    assert calls[0].function.parsed_arguments == Weather(city="Paris")
    assert final.choices[0].finish_reason == "tool_calls"
    decode = _bodies(router)[-1]
    assert (decode["output_mode"], decode["stream"]) == ("derender", False)


def test_completions_stay_on_their_route() -> None:
    router = SimulatedRouter(_config())
    completion = _openai(router).completions.create(model="m", prompt="Hi", max_tokens=5)
    assert completion.choices[0].text == "Hello"
    assert completion.choices[0].finish_reason == "length"
    assert [call.path for call in router.worker.calls] == ["/v1/completions"] * 2
    prefill, decode = _bodies(router, "/v1/completions")
    assert prefill["max_tokens"] == 1
    assert prefill["kv_transfer_params"]["do_remote_decode"] is True
    assert (decode["prompt"], decode["max_tokens"]) == ("Hi", 5)
    assert decode["kv_transfer_params"]["remote_host"] == "localhost"


def test_completions_stream_with_usage() -> None:
    router = SimulatedRouter(_config())
    chunks = list(
        _openai(router).completions.create(
            model="m",
            prompt="Hi",
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Hello"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5


def test_responses_create() -> None:
    router = SimulatedRouter(_config())
    response = _openai(router).responses.create(model="m", input="Hi")
    assert response.output_text == "Hello!"
    assert response.usage is not None
    assert response.usage.output_tokens == ANSWER_TOKENS


def test_responses_stream_reports_usage() -> None:
    router = SimulatedRouter(_config())
    with _openai(router).responses.stream(model="m", input="Hi") as stream:
        final = stream.get_final_response()
    assert final.output_text == "Hello!"
    assert final.usage is not None
    prompt = len(_bodies(router)[-1]["token_ids"])
    assert (final.usage.input_tokens, final.usage.output_tokens) == (prompt, ANSWER_TOKENS)


def test_a_responses_stream_cut_by_its_cap_ends_as_vllm_ends_it() -> None:
    # vLLM 0.33 ends an incomplete response's stream with response.incomplete (docs/envelopes.md);
    # the SDK's stream helper makes its final response from response.completed alone, so it
    # raises here, as it does against vLLM itself. The events carry the response.
    router = SimulatedRouter(_config())
    with _openai(router).responses.stream(model="m", input="Hi", max_output_tokens=3) as stream:
        events = list(stream)
        with pytest.raises(RuntimeError, match=r"response\.completed"):
            stream.get_final_response()
    assert "response.completed" not in [event.type for event in events]
    terminal = events[-1]
    assert isinstance(terminal, ResponseIncompleteEvent)
    final = terminal.response
    assert final.output_text == "Hel"
    assert final.status == "incomplete"
    assert final.incomplete_details is not None
    assert final.incomplete_details.reason == "max_output_tokens"


def test_messages_create() -> None:
    router = SimulatedRouter(_config())
    message = _anthropic(router).messages.create(model="m", max_tokens=64, messages=MESSAGES)
    assert message.content[0].type == "text"
    assert message.content[0].text == "Hello!"
    assert message.stop_reason == "end_turn"
    prompt = len(_bodies(router)[-1]["token_ids"])
    assert (message.usage.input_tokens, message.usage.output_tokens) == (prompt, ANSWER_TOKENS)


def test_messages_stream() -> None:
    router = SimulatedRouter(_config())
    with _anthropic(router).messages.stream(model="m", max_tokens=64, messages=MESSAGES) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "text"
    assert final.content[0].text == "Hello!"
    prompt = len(_bodies(router)[-1]["token_ids"])
    assert (final.usage.input_tokens, final.usage.output_tokens) == (prompt, ANSWER_TOKENS)


@pytest.mark.parametrize("stream", [False, True])
def test_a_generate_client_gets_the_workers_envelope_unchanged(stream: bool) -> None:
    router = SimulatedRouter(_config())
    body = {
        "token_ids": toy_encode("Hi"),
        "sampling_params": {"max_tokens": 32},
        "stream": stream,
    }
    http = httpx.Client(transport=httpx.MockTransport(router), base_url="http://router")
    reply = http.post(GENERATE, json=body, headers={"x-request-id": "gen-1"})
    assert reply.status_code == 200
    decode = _bodies(router)[-1]
    assert decode["output_mode"] == "text"
    assert reply.content == _replay(GENERATE, decode, "gen-1")


@pytest.mark.parametrize("stream", [False, True])
def test_openai_format_legs_pass_the_answer_through_minus_transfer_params(stream: bool) -> None:
    config = parse_pipeline_params({"prefill": {}, "decode": {}}, use_openai_format=True)
    router = SimulatedRouter(config)
    http = httpx.Client(transport=httpx.MockTransport(router), base_url="http://router")
    chat = {"model": "m", "messages": MESSAGES, "stream": stream}
    reply = http.post("/v1/chat/completions", json=chat, headers={"x-request-id": "oa-1"})
    assert reply.status_code == 200
    prefill, decode = _bodies(router, "/v1/chat/completions")
    assert prefill["max_tokens"] == 1
    assert decode["kv_transfer_params"]["do_remote_prefill"] is True
    worker = _replay("/v1/chat/completions", decode, "oa-1")
    if stream:
        assert reply.content == worker
        return
    expected = {
        k: v
        for k, v in json.loads(worker).items()
        if k not in {"kv_transfer_params", "ec_transfer_params"}
    }
    assert json.dumps(reply.json()) == json.dumps(expected)
    openai.types.chat.ChatCompletion.model_validate(reply.json())


def test_multimodal_features_reach_the_encode_leg() -> None:
    router = SimulatedRouter(_config(encode={}))
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    messages: Any = [{"role": "user", "content": [{"type": "text", "text": "What?"}, image]}]
    completion = _openai(router).chat.completions.create(model="m", messages=messages)
    assert completion.choices[0].message.content == "Hello!"
    assert "ec_transfer_params" not in completion.model_dump()
    encode, prefill, decode = _bodies(router)
    features = encode["features"]
    (placeholder,) = features["mm_placeholders"]["image"]
    assert encode["token_ids"][placeholder["offset"] - 1] == 151652  # <|vision_start|>
    assert len(features["mm_hashes"]["image"]) == len(features["kwargs_data"]["image"]) == 1
    assert encode["sampling_params"]["max_tokens"] == 1
    assert prefill["features"] == decode["features"] == features
    assert prefill["ec_transfer_params"]["mm_hashes"] == features["mm_hashes"]["image"]


# A contract break is not retried; a worker's 5xx is (the SDK's own retry, one more time here).
FAULTS = [
    # (fault, client streams, status, x-should-retry, decode calls)
    ("no-output-mode", False, 502, "false", 1),
    ("no-output-mode", True, 502, "false", 1),
    ("not-json", False, 502, "false", 1),
    ("not-json", True, 502, "false", 1),
    ("cut-stream", False, 502, "false", 1),
    ("http-500", False, 502, None, 2),
    ("http-500", True, 502, None, 2),
    ("stream-error", False, 502, None, 2),
]


def _chat(client: openai.OpenAI, stream: bool) -> Any:
    if stream:
        return list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    return client.chat.completions.create(model="m", messages=MESSAGES)


@pytest.mark.parametrize(("fault", "stream", "status", "retry", "calls"), FAULTS)
def test_a_fault_before_the_reply_is_a_clean_error_status(
    fault: str, stream: bool, status: int, retry: str | None, calls: int
) -> None:
    router = SimulatedRouter(_config(), fault=fault)
    with pytest.raises(openai.APIStatusError) as caught:
        _chat(_openai(router, retries=2 if retry else 1), stream)
    error = caught.value
    assert error.status_code == status
    assert error.response.headers.get("x-should-retry") == retry
    assert error.body["message"].startswith("decode ")  # type: ignore[index]
    assert sum(call.step == "decode" for call in router.calls) == calls


@pytest.mark.parametrize("fault", ["no-output-mode", "http-500"])
def test_a_fault_reaches_the_anthropic_sdk_in_its_shape(fault: str) -> None:
    router = SimulatedRouter(_config(), fault=fault)
    with pytest.raises(anthropic.APIStatusError) as caught:
        _anthropic(router, retries=2 if fault == "no-output-mode" else 0).messages.create(
            model="m", max_tokens=64, messages=MESSAGES
        )
    assert caught.value.status_code == 502
    body: Any = caught.value.body
    assert body["type"] == "error"
    assert body["error"]["type"] == "api_error"
    assert body["error"]["message"].startswith("decode ")
    assert sum(call.step == "decode" for call in router.calls) == 1


@pytest.mark.parametrize("fault", ["cut-stream", "stream-error"])
def test_a_fault_after_the_stream_started_ends_it_with_the_apis_error_event(fault: str) -> None:
    router = SimulatedRouter(_config(), fault=fault)
    stream = _openai(router, retries=2).chat.completions.create(
        model="m", messages=MESSAGES, stream=True
    )
    opening = next(stream).choices[0].delta  # as vLLM opens a choice: role, empty content
    assert (opening.role, opening.content) == ("assistant", "")
    assert next(stream).choices[0].delta.content == "H"
    with pytest.raises(openai.APIError) as caught:
        next(stream)
    assert not isinstance(caught.value, openai.APIStatusError)
    with _openai(router).responses.stream(model="m", input="Hi") as events_stream:
        events = list(events_stream)
    assert events[-1].type == "error"
    assert events[-1].sequence_number == len(events) - 1
    assert sum(call.step == "decode" for call in router.calls) == 2


def test_a_slow_first_byte_just_completes_slower() -> None:
    router = SimulatedRouter(_config(), fault="slow-first-byte")
    assert _chat(_openai(router), stream=False).choices[0].message.content == "Hello!"
    chunks = _chat(_openai(router), stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello!"


@pytest.mark.parametrize("cap", [16, 100])
def test_the_legs_the_worker_saw(cap: int) -> None:
    router = SimulatedRouter(_config())
    raw = _openai(router).chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, max_tokens=cap, extra_headers={"x-request-id": "client-7"}
    )
    assert raw.headers["x-request-id"] == "client-7"
    calls = router.worker.calls
    assert [call.path for call in calls] == ["/v1/chat/completions/render", GENERATE, GENERATE]
    assert {call.headers["x-request-id"] for call in calls} == {"client-7"}
    prefill, decode = _bodies(router)
    assert prefill["sampling_params"]["max_tokens"] == 1
    assert prefill["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False}
    assert decode["sampling_params"]["max_tokens"] == cap
    kv = decode["kv_transfer_params"]
    answered = json.loads(_replay(GENERATE, prefill, "client-7"))["kv_transfer_params"]
    assert list(kv) == list(answered)
    assert kv["remote_request_id"].startswith("generate-tokens-client-7")
    assert decode["sampling_params"]["extra_args"]["kv_transfer_params"] == kv


def test_a_request_id_is_made_when_the_client_sends_none() -> None:
    router = SimulatedRouter(_config())
    raw = _openai(router).chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    made = raw.headers["x-request-id"]
    assert made
    assert {call.headers["x-request-id"] for call in router.worker.calls} == {made}

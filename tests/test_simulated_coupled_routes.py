"""The simulated worker's coupled ``/v1/responses`` and ``/v1/messages`` (docs/testing.md).

Driven in process by the official openai and anthropic SDKs (their ``http_client`` an httpx
client over ``httpx2.ASGITransport``): each answer is the chat route's text for the same prompt,
with the counts and stop reasons vLLM 0.33 writes, whole and streamed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anthropic
import httpx2
import openai
import pytest
from anthropic.types import Message, MessageParam, TextBlock
from openai.types.responses import (
    Response,
    ResponseCreatedEvent,
    ResponseIncompleteEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
)

from disagg_transforms.testing import SimulatedWorker, WorkerSettings

CREATED = 1796000000
PROMPT = "Hi"
MESSAGE: list[MessageParam] = [{"role": "user", "content": PROMPT}]
T = TypeVar("T")


def _run(worker: SimulatedWorker, body: Callable[[httpx2.AsyncClient], Awaitable[T]]) -> T:
    async def run() -> T:
        transport = httpx2.ASGITransport(app=worker)
        async with httpx2.AsyncClient(transport=transport, base_url="http://worker") as http:
            return await body(http)

    return asyncio.run(run())


def _openai(http: httpx2.AsyncClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url="http://worker/v1", api_key="k", http_client=http, max_retries=0
    )


def _anthropic(http: httpx2.AsyncClient) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url="http://worker", api_key="k", http_client=http, max_retries=0
    )


def _post(
    worker: SimulatedWorker, path: str, body: Any, headers: dict[str, str] | None = None
) -> httpx2.Response:
    async def post(http: httpx2.AsyncClient) -> httpx2.Response:
        return await http.post(path, json=body, headers=headers)

    return _run(worker, post)


def _chat(worker: SimulatedWorker, **changes: Any) -> dict[str, Any]:
    """The coupled chat route's answer to the same prompt: what the other routes must match."""
    body = {"model": "m", "messages": [{"role": "user", "content": PROMPT}], **changes}
    answer: dict[str, Any] = _post(worker, "/v1/chat/completions", body).json()
    return answer


def _only_text(message: Message) -> str:
    """The text of a message that is one text block."""
    [block] = message.content
    assert isinstance(block, TextBlock)
    return block.text


def _only_part(response: Response) -> tuple[ResponseOutputMessage, ResponseOutputText]:
    """The one message item of a response, and its one part."""
    [item] = response.output
    assert isinstance(item, ResponseOutputMessage)
    [part] = item.content
    assert isinstance(part, ResponseOutputText)
    return item, part


def _named_events(response: httpx2.Response) -> list[tuple[str, dict[str, Any]]]:
    """Each SSE event's ``event:`` name and its parsed ``data:``."""
    out = []
    for block in response.text.split("\n\n"):
        if not block:
            continue
        name_line, data_line = block.split("\n")
        assert name_line.startswith("event: ")
        assert data_line.startswith("data: ")
        out.append((name_line[len("event: ") :], json.loads(data_line[len("data: ") :])))
    return out


@pytest.fixture
def worker() -> SimulatedWorker:
    return SimulatedWorker(WorkerSettings(created=CREATED))


# ---------------------------------------------------------------- /v1/responses


def test_responses_create_answers_the_chat_routes_text_and_counts(worker: SimulatedWorker) -> None:
    chat = _chat(worker)

    async def create(http: httpx2.AsyncClient) -> Response:
        return await _openai(http).responses.create(model="m", input=PROMPT)

    response = _run(worker, create)
    assert response.output_text == chat["choices"][0]["message"]["content"] == "Hello!"
    assert response.id.startswith("resp_")
    assert (response.object, response.status, response.incomplete_details) == (
        "response",
        "completed",
        None,
    )
    assert (response.model, response.created_at) == ("m", CREATED)
    item, part = _only_part(response)
    assert (item.type, item.role, item.status) == ("message", "assistant", "completed")
    assert item.id.startswith("msg_")
    assert (part.type, part.text, part.annotations) == ("output_text", "Hello!", [])
    usage = response.usage
    assert usage is not None
    assert usage.input_tokens == chat["usage"]["prompt_tokens"] == 21
    assert usage.output_tokens == chat["usage"]["completion_tokens"] == 7
    assert usage.total_tokens == 28
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    # vLLM's own defaults and echoes of the request's settings ("none" without tools: vLLM's
    # check_tool_usage).
    assert (response.tool_choice, response.tools) == ("none", [])
    assert response.parallel_tool_calls is True
    assert (response.temperature, response.top_p, response.max_output_tokens) == (1.0, 1.0, 4075)
    raw = _post(worker, "/v1/responses", {"model": "m", "input": PROMPT}).json()
    assert raw["kv_transfer_params"] is None
    assert raw["usage"]["input_tokens_details"] == {
        "cached_tokens": 0,
        "cache_write_tokens": 0,
        "input_tokens_per_turn": [],
        "cached_tokens_per_turn": [],
    }
    assert (raw["presence_penalty"], raw["frequency_penalty"]) == (0.0, 0.0)
    assert raw["output"][0]["phase"] is None


def test_responses_stream_events_in_vllms_order(worker: SimulatedWorker) -> None:
    async def stream(http: httpx2.AsyncClient) -> tuple[list[ResponseStreamEvent], Response]:
        async with _openai(http).responses.stream(model="m", input=PROMPT) as events:
            seen: list[ResponseStreamEvent] = [event async for event in events]
            return seen, await events.get_final_response()

    seen, final = _run(worker, stream)
    kinds = [event.type for event in seen]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 6,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in seen] == list(range(len(seen)))
    deltas = [event.delta for event in seen if isinstance(event, ResponseTextDeltaEvent)]
    assert "".join(deltas) == "Hello!"
    assert isinstance(seen[0], ResponseCreatedEvent)
    created = seen[0].response
    assert (created.status, created.output, created.usage) == ("in_progress", [], None)
    assert final.output_text == "Hello!"
    assert final.status == "completed"
    assert final.usage is not None
    assert (final.usage.input_tokens, final.usage.output_tokens) == (21, 7)
    # The raw stream: every event named by its type, no [DONE].
    raw = _post(worker, "/v1/responses", {"model": "m", "input": PROMPT, "stream": True})
    assert raw.headers["content-type"].startswith("text/event-stream")
    named = _named_events(raw)
    assert all(name == data["type"] for name, data in named)
    assert [name for name, _ in named] == kinds


def test_responses_cap_is_max_output_tokens(worker: SimulatedWorker) -> None:
    chat = _chat(worker, max_tokens=3)

    async def capped(http: httpx2.AsyncClient) -> tuple[Response, Response]:
        client = _openai(http)
        whole = await client.responses.create(model="m", input=PROMPT, max_output_tokens=3)
        async with client.responses.stream(model="m", input=PROMPT, max_output_tokens=3) as events:
            seen = [event async for event in events]
            # vLLM 0.33 ends the stream with response.incomplete, from which the SDK's helper
            # makes no final response.
            with pytest.raises(RuntimeError, match=r"response\.completed"):
                await events.get_final_response()
        terminal = seen[-1]
        assert isinstance(terminal, ResponseIncompleteEvent)
        return whole, terminal.response

    whole, streamed = _run(worker, capped)
    for response in (whole, streamed):
        assert isinstance(response.output[0], ResponseOutputMessage)
        assert response.output[0].status == "incomplete"
        assert response.output_text == chat["choices"][0]["message"]["content"] == "Hel"
        assert response.status == "incomplete"
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
        assert response.usage is not None
        assert response.usage.output_tokens == 3
        assert response.max_output_tokens == 3


# ---------------------------------------------------------------- /v1/messages


def test_messages_create_answers_the_chat_routes_text_and_counts(worker: SimulatedWorker) -> None:
    chat = _chat(worker)

    async def create(http: httpx2.AsyncClient) -> Message:
        return await _anthropic(http).messages.create(
            model="m", max_tokens=64, messages=MESSAGE, extra_headers={"x-request-id": "m1"}
        )

    message = _run(worker, create)
    # vLLM answers Messages through its chat serving: the message's id is the chat id.
    assert message.id == "chatcmpl-m1"
    assert (message.type, message.role, message.model) == ("message", "assistant", "m")
    assert _only_text(message) == chat["choices"][0]["message"]["content"] == "Hello!"
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    assert message.usage.input_tokens == chat["usage"]["prompt_tokens"] == 21
    assert message.usage.output_tokens == chat["usage"]["completion_tokens"] == 7
    raw = _post(
        worker,
        "/v1/messages",
        {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": PROMPT}]},
    ).json()
    # vLLM dumps the message without its nulls.
    assert list(raw) == ["id", "type", "role", "content", "model", "stop_reason", "usage"]
    assert raw["usage"] == {"input_tokens": 21, "output_tokens": 7}


def test_messages_stream_events_with_vllms_event_lines(worker: SimulatedWorker) -> None:
    body = {"model": "m", "max_tokens": 64, "messages": MESSAGE}

    async def stream(http: httpx2.AsyncClient) -> tuple[str, Message]:
        async with _anthropic(http).messages.stream(
            model="m", max_tokens=64, messages=MESSAGE
        ) as events:
            text = "".join([piece async for piece in events.text_stream])
            return text, await events.get_final_message()

    text, final = _run(worker, stream)
    assert text == _only_text(final) == "Hello!"
    assert (final.stop_reason, final.role, final.type) == ("end_turn", "assistant", "message")
    assert (final.usage.input_tokens, final.usage.output_tokens) == (21, 7)
    raw = _post(worker, "/v1/messages", {**body, "stream": True})
    named = _named_events(raw)
    assert all(name == data["type"] for name, data in named)
    assert [name for name, _ in named] == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 6,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = named[0][1]["message"]
    assert (start["type"], start["role"], start["content"], start["stop_reason"]) == (
        "message",
        "assistant",
        [],
        None,
    )
    assert start["usage"] == {"input_tokens": 21, "output_tokens": 0}
    assert named[1][1] == {
        "type": "content_block_start",
        "content_block": {"type": "text", "text": ""},
        "index": 0,
    }
    assert named[2][1] == {
        "type": "content_block_delta",
        "delta": {"type": "text_delta", "text": "H"},
        "index": 0,
    }
    assert named[-2][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"input_tokens": 21, "output_tokens": 7},
    }
    assert named[-1][1] == {"type": "message_stop"}


def test_messages_cap_is_max_tokens_and_stops_for_max_tokens(worker: SimulatedWorker) -> None:
    chat = _chat(worker, max_tokens=3)

    async def capped(http: httpx2.AsyncClient) -> tuple[Message, Message]:
        client = _anthropic(http)
        whole = await client.messages.create(model="m", max_tokens=3, messages=MESSAGE)
        async with client.messages.stream(model="m", max_tokens=3, messages=MESSAGE) as events:
            return whole, await events.get_final_message()

    whole, streamed = _run(worker, capped)
    for message in (whole, streamed):
        assert _only_text(message) == chat["choices"][0]["message"]["content"] == "Hel"
        assert message.stop_reason == "max_tokens"
        assert message.usage.output_tokens == 3


# ---------------------------------------------------------------- P/D, errors


PREFILL_KV = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
BODIES: dict[str, dict[str, Any]] = {
    "/v1/responses": {"model": "m", "input": PROMPT, "max_output_tokens": 1},
    "/v1/messages": {
        "model": "m",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": PROMPT}],
    },
}


@pytest.mark.parametrize("path", BODIES)
def test_a_prefill_answers_the_nixl_params_as_the_chat_route_does(
    worker: SimulatedWorker, path: str
) -> None:
    chat = _chat(worker, max_tokens=1, kv_transfer_params=PREFILL_KV)["kv_transfer_params"]
    prefill = _post(worker, path, {**BODIES[path], "kv_transfer_params": PREFILL_KV}).json()
    kv = prefill["kv_transfer_params"]
    assert list(kv) == list(chat)
    assert (kv["do_remote_prefill"], kv["do_remote_decode"]) == (True, False)
    assert kv["remote_block_ids"] == chat["remote_block_ids"] == [[1, 2]]
    assert kv["remote_num_tokens"] == chat["remote_num_tokens"] == 21
    # The decode that carries them answers the text, and no params of its own.
    decode = {**BODIES[path], "kv_transfer_params": kv}
    decode["max_output_tokens" if path == "/v1/responses" else "max_tokens"] = 64
    answer = _post(worker, path, decode).json()
    assert answer.get("kv_transfer_params") is None
    assert "Hello!" in json.dumps(answer)


@pytest.mark.parametrize("path", BODIES)
def test_an_unknown_model_is_404_and_a_bad_body_400(path: str) -> None:
    worker = SimulatedWorker(WorkerSettings(served_model_names=("qwen",)))
    unknown = _post(worker, path, {**BODIES[path], "model": "x"})
    assert unknown.status_code == 404
    assert "The model `x` does not exist." in unknown.text
    required = "input" if path == "/v1/responses" else "max_tokens"
    missing = {key: value for key, value in BODIES[path].items() if key != required}
    refused = _post(worker, path, {**missing, "model": "qwen"})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == f"body.{required}"
    too_long = {**BODIES[path], "model": "qwen"}
    too_long["max_output_tokens" if path == "/v1/responses" else "max_tokens"] = 5000
    assert _post(worker, path, too_long).status_code == 400


def test_messages_errors_vllm_answers_itself_are_in_anthropics_shape() -> None:
    # vLLM's Messages router translates the chat serving's errors (an unknown model, a cap
    # beyond the context); request validation stays vLLM's own 400 body.
    worker = SimulatedWorker(WorkerSettings(served_model_names=("qwen",)))
    unknown = _post(worker, "/v1/messages", {**BODIES["/v1/messages"], "model": "x"})
    assert unknown.json() == {
        "type": "error",
        "error": {"type": "NotFoundError", "message": "The model `x` does not exist."},
    }

    async def refused(http: httpx2.AsyncClient) -> None:
        await _anthropic(http).messages.create(
            model="qwen", max_tokens=5000, messages=[{"role": "user", "content": PROMPT}]
        )

    with pytest.raises(anthropic.BadRequestError) as caught:
        _run(worker, refused)
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error"
    assert body["error"]["type"] == "BadRequestError"


@pytest.mark.parametrize("path", BODIES)
def test_stream_error_ends_the_stream_with_the_routes_error_event(
    worker: SimulatedWorker, path: str
) -> None:
    fault = {"x-simulate-fault": "stream-error"}
    streamed = _post(worker, path, {**BODIES[path], "stream": True}, fault)
    (first, _), (name, error) = _named_events(streamed)
    assert first in {"response.created", "message_start"}
    assert name == error["type"] == "error"
    if path == "/v1/messages":
        assert error["error"]["type"] == "internal_error"
    else:
        assert (error["code"], error["sequence_number"]) == ("InternalServerError", 1)
    whole = _post(worker, path, BODIES[path], fault)
    assert whole.status_code == 500
    assert "Internal server error" in whole.text


# -- an agent loop on the coupled routes: no tool parser runs there, so it answers text --------

WEATHER: Any = {"type": "object", "properties": {"city": {"type": "string"}}}


def test_an_agent_turn_after_a_tool_result_answers_text_on_every_coupled_route(
    worker: SimulatedWorker,
) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
    chat_tool: Any = {"type": "function", "function": {"name": "w", "parameters": WEATHER}}
    responses_tool: Any = {"type": "function", "name": "w", "parameters": WEATHER}
    after: Any = [*MESSAGE, {"role": "assistant", "tool_calls": [call]}]
    after.append({"role": "tool", "tool_call_id": "c1", "content": "Sunny"})
    use: Any = {"type": "tool_use", "id": "c1", "name": "w", "input": {}}
    result: Any = {"type": "tool_result", "tool_use_id": "c1", "content": "Sunny"}
    items: Any = [
        {"role": "user", "content": PROMPT},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
    ]

    async def turns(http: httpx2.AsyncClient) -> tuple[Any, Any, Any]:
        client, claude = _openai(http), _anthropic(http)
        chat = await client.chat.completions.create(model="m", messages=after, tools=[chat_tool])
        response = await client.responses.create(model="m", input=items, tools=[responses_tool])
        message = await claude.messages.create(
            model="m",
            max_tokens=64,
            messages=[
                *MESSAGE,
                {"role": "assistant", "content": [use]},
                {"role": "user", "content": [result]},
            ],
            tools=[{"name": "w", "input_schema": WEATHER}],
        )
        return chat, response, message

    chat, response, message = _run(worker, turns)
    assert (chat.choices[0].message.content, chat.choices[0].finish_reason) == ("Hello!", "stop")
    assert response.output_text == "Hello!"
    # The parser ran (tools offered): the model's thinking comes first, then the text.
    texts = [block.text for block in message.content if isinstance(block, TextBlock)]
    assert (texts, message.stop_reason) == (["Hello!"], "end_turn")
    assert message.content[0].type == "thinking"


# ---------------------------------------------------------------- the cache's counts


def test_the_cache_counts_each_route_writes_with_prompt_token_details() -> None:
    # vLLM 0.33 with --enable-prompt-tokens-details, a prefill call: the generate route leaves
    # created_cache_tokens null, chat writes an integer (the simulated engine writes no prefix
    # cache: 0), Messages subtracts both from input_tokens, Responses counts cache_write_tokens.
    worker = SimulatedWorker(WorkerSettings(created=CREATED, prompt_tokens_details=True))
    prefill = {"kv_transfer_params": {"do_remote_decode": True}}
    chat = _chat(worker, **prefill)
    assert chat["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 0,
        "created_cache_tokens": 0,
        "multimodal_tokens": None,
    }
    message = _post(
        worker,
        "/v1/messages",
        {"model": "m", "max_tokens": 64, "messages": MESSAGE, **prefill},
    ).json()
    # The chat call computed the same prompt: its whole blocks are read from the cache.
    warm = (chat["usage"]["prompt_tokens"] - 1) // 16 * 16
    assert message["usage"] == {
        "input_tokens": chat["usage"]["prompt_tokens"] - warm,
        "output_tokens": chat["usage"]["completion_tokens"],
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": warm,
    }
    response = _post(worker, "/v1/responses", {"model": "m", "input": PROMPT, **prefill}).json()
    assert response["usage"]["input_tokens_details"]["cache_write_tokens"] == 0


def test_every_route_reports_the_prefix_cache_the_generate_route_computes() -> None:
    # vLLM with --enable-prompt-tokens-details: one prefix cache behind every route, each call
    # reporting the whole blocks of its prompt some earlier call computed (16 tokens a block
    # here), whether or not it is a P/D leg.
    worker = SimulatedWorker(WorkerSettings(created=CREATED, prompt_tokens_details=True))
    body = {"model": "m", "messages": [{"role": "user", "content": "A closure. " * 8}]}
    cold = _post(worker, "/v1/chat/completions", body).json()["usage"]
    warm = (cold["prompt_tokens"] - 1) // 16 * 16
    assert cold["prompt_tokens_details"] == {
        "cached_tokens": 0,
        "created_cache_tokens": 0,
        "multimodal_tokens": None,
    }
    rendered = _post(worker, "/v1/chat/completions/render", body).json()
    generated = _post(worker, "/inference/v1/generate", rendered).json()["usage"]
    assert generated["prompt_tokens_details"] == {
        "cached_tokens": warm,
        "created_cache_tokens": None,
        "multimodal_tokens": None,
    }
    chat = _post(worker, "/v1/chat/completions", body).json()["usage"]
    assert chat["prompt_tokens_details"]["cached_tokens"] == warm
    streamed = _post(
        worker,
        "/v1/chat/completions",
        {**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    usage = json.loads(streamed.text.split("\n\n")[-3].removeprefix("data: "))["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": warm, "created_cache_tokens": 0}
    messages = {**body, "max_tokens": 64}
    message = _post(worker, "/v1/messages", messages).json()["usage"]
    cached = message["cache_read_input_tokens"]
    assert (message["input_tokens"] + cached, cached) == (cold["prompt_tokens"], warm)
    responses = {"model": "m", "input": body["messages"]}
    response = _post(worker, "/v1/responses", responses).json()["usage"]
    assert response["input_tokens_details"]["cached_tokens"] == warm
    completions = {"model": "m", "prompt": "A completion prompt. " * 4}
    _post(worker, "/v1/completions", completions)
    completed = _post(worker, "/v1/completions", completions).json()["usage"]
    assert completed["prompt_tokens_details"] == {
        "cached_tokens": (completed["prompt_tokens"] - 1) // 16 * 16,
        "created_cache_tokens": None,
        "multimodal_tokens": None,
    }


# ---------------------------------------------------------------- the parser


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_chat_with_tools_answers_the_generate_routes_parsed_message() -> None:
    # The coupled route runs the same parser as the generate route's derender mode.
    worker = SimulatedWorker(WorkerSettings(created=CREATED))
    body = {"model": "m", "messages": MESSAGE, "tools": [WEATHER_TOOL]}
    chat = _chat(worker, tools=[WEATHER_TOOL])
    rendered = _post(worker, "/v1/chat/completions/render", body).json()
    derendered = _post(
        worker, "/inference/v1/generate", {**rendered, "output_mode": "derender"}
    ).json()
    [choice] = chat["choices"]
    [parsed] = derendered["choices"]
    # The tool-call ids derive from each answer's own (random) request id.
    for message in (choice["message"], parsed["message"]):
        message["tool_calls"][0]["id"] = "call"
    assert choice["message"] == parsed["message"]
    assert choice["finish_reason"] == parsed["finish_reason"] == "tool_calls"
    assert choice["message"]["reasoning"] == "The user greets me."
    assert choice["message"]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    }
    # tool_choice none: no parser, the text answer.
    plain = _chat(worker, tools=[WEATHER_TOOL], tool_choice="none")
    assert plain["choices"][0]["message"]["content"] == "Hello!"


def test_a_chat_stream_with_tools_streams_the_parse_a_delta_per_token() -> None:
    worker = SimulatedWorker(WorkerSettings(created=CREATED))
    body = {
        "model": "m",
        "messages": MESSAGE,
        "tools": [WEATHER_TOOL],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = _post(worker, "/v1/chat/completions", body).text.split("\n\n")
    chunks = [json.loads(event[6:]) for event in events if event and event != "data: [DONE]"]
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    reasoning = "".join(delta.get("reasoning", "") for delta in deltas)
    assert reasoning == "The user greets me."
    assert all(len(delta.get("reasoning", "")) <= 1 for delta in deltas)
    # The call's text is held back until it closes: no content at all here.
    assert not [delta for delta in deltas[1:] if "content" in delta]
    [call] = [c for delta in deltas for c in delta.get("tool_calls", [])]
    assert (call["index"], call["function"]["name"]) == (0, "get_weather")
    finishing = chunks[-2]["choices"][0]
    assert (finishing["finish_reason"], finishing["weight_versions"]) == ("tool_calls", None)
    # One chunk per token that grew the parse: a token inside a tool call's text sends none.
    assert len(chunks) - 2 < chunks[-1]["usage"]["completion_tokens"]


def test_responses_and_messages_with_tools_answer_the_parsed_turn() -> None:
    worker = SimulatedWorker(WorkerSettings(created=CREATED))
    function = WEATHER_TOOL["function"]
    assert isinstance(function, dict)
    tool = {"type": "function", **function}
    response = _post(
        worker, "/v1/responses", {"model": "m", "input": PROMPT, "tools": [tool]}
    ).json()
    reasoning, called = response["output"]
    assert reasoning["type"] == "reasoning"
    assert reasoning["content"] == [{"text": "The user greets me.", "type": "reasoning_text"}]
    assert (called["type"], called["name"], called["status"]) == (
        "function_call",
        "get_weather",
        "completed",
    )
    anthropic_tool = {"name": "get_weather", "input_schema": function["parameters"]}
    message = _post(
        worker,
        "/v1/messages",
        {"model": "m", "max_tokens": 200, "messages": MESSAGE, "tools": [anthropic_tool]},
    ).json()
    thinking, use = message["content"]
    assert (thinking["type"], thinking["thinking"]) == ("thinking", "The user greets me.")
    assert isinstance(thinking["signature"], str)
    assert thinking["signature"]
    assert (use["type"], use["name"], use["input"]) == (
        "tool_use",
        "get_weather",
        {"city": "Paris"},
    )
    assert message["stop_reason"] == "tool_use"

"""The simulated SGLang worker: a P/D pair meeting by room, SGLang's refusals, its contract.

In process: the decode reaches its prefill as a listed peer; the CLI test runs them as processes.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
from typing import Any

import httpx
import openai
import pytest
import sglang_contract
from helpers import WEATHER_TOOLS

from disagg_transforms import OutputMode
from disagg_transforms._request.sglang import (
    Rendezvous,
    build_sglang_openai_request,
    build_sglang_request,
    prefill_body,
)
from disagg_transforms._response.dispatch import wrap_envelope
from disagg_transforms._response.sglang import (
    SglangFailure,
    SglangStreamReader,
    generate_answer,
    prompt_logprobs,
    sglang_error_message,
)
from disagg_transforms._routes import Route
from disagg_transforms.testing import SimulatedSglangWorker, toy_encode
from disagg_transforms.testing._sglang import JOIN_PATH

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "sglang-0.5.23"
CHAT = "/v1/chat/completions"
PROMPT = toy_encode("The capital of France is")


def _pair(
    timeout: float = 5.0, **decode: Any
) -> tuple[SimulatedSglangWorker, SimulatedSglangWorker]:
    prefill = SimulatedSglangWorker(disaggregation_mode="prefill", transfer_timeout=timeout)
    decoder = SimulatedSglangWorker(
        disaggregation_mode="decode",
        transfer_timeout=timeout,
        prefills={("prefill", 8998): prefill},
        **decode,
    )
    return prefill, decoder


def _client(worker: SimulatedSglangWorker) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=worker), base_url="http://w")


def _body(room: int = 7, **client: Any) -> dict[str, Any]:
    rendezvous = Rendezvous(
        rid=f"{room:032x}", bootstrap_host="prefill", bootstrap_port=8998, bootstrap_room=room
    )
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **client}
    return build_sglang_request(
        chat, client_path=CHAT, rendezvous=rendezvous, token_ids=PROMPT
    ).body


async def _both(
    prefill: SimulatedSglangWorker, decode: SimulatedSglangWorker, body: dict[str, Any]
) -> tuple[httpx.Response, httpx.Response]:
    async with _client(prefill) as p, _client(decode) as d:
        first, second = await asyncio.gather(
            p.post("/generate", json=body), d.post("/generate", json=body)
        )
    return first, second


def test_a_pair_meets_by_room_and_the_decode_answers() -> None:
    prefill, decode = _pair()
    body = _body(max_tokens=16, logprobs=True, top_logprobs=2)
    first, second = asyncio.run(_both(prefill, decode, body))
    assert first.status_code == second.status_code == 200
    contract = sglang_contract.contract()
    for answer in (first.json(), second.json()):
        contract.GenerateResponse.from_json_value(answer)
    assert first.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    read = generate_answer(second.json())
    assert isinstance(read, dict)
    chat = wrap_envelope(
        Route.CHAT_COMPLETIONS, read, requested=OutputMode.TEXT, client_body={"model": "m"}
    )
    assert chat["choices"][0]["message"]["content"] == "Hello!"
    assert chat["choices"][0]["finish_reason"] == "stop"
    first_token = chat["choices"][0]["logprobs"]["content"][0]
    assert first_token["bytes"] == [ord("H")]


def test_the_prefill_answers_the_prompt_logprobs_asked_and_the_decode_none() -> None:
    prefill, decode = _pair()
    body = _body(max_tokens=4, logprobs=True, top_logprobs=1)
    asked = prefill_body(body, 2)

    async def both() -> tuple[httpx.Response, httpx.Response]:
        async with _client(prefill) as p, _client(decode) as d:
            return await asyncio.gather(
                p.post("/generate", json=asked), d.post("/generate", json=body)
            )

    first, second = asyncio.run(both())
    contract = sglang_contract.contract()
    for answer in (first.json(), second.json()):
        contract.GenerateResponse.from_json_value(answer)
    assert second.json()["meta_info"]["input_token_logprobs"] == []
    meta = first.json()["meta_info"]
    assert len(meta["input_token_logprobs"]) == len(PROMPT) == len(meta["input_top_logprobs"])
    assert [len(top or ()) for top in meta["input_top_logprobs"]] == [0] + [2] * (len(PROMPT) - 1)
    read = prompt_logprobs(first.content, 2)
    assert read[0] is None
    # Scripted by position: the prompt's token first, second, or below every listed one.
    ranks = [
        entry[str(token)]["rank"]
        for token, entry in zip(PROMPT[1:], read[1:], strict=True)
        if entry
    ]
    assert ranks[:3] == [1, 2, None]
    assert read[1] is not None
    assert read[1][str(PROMPT[1])]["decoded_token"] == "h"  # noqa: S105 - a token, no password


def test_the_decode_streams_cumulatively_or_incrementally() -> None:
    for incremental in (False, True):
        prefill, decode = _pair(incremental_streaming_output=incremental)
        _, second = asyncio.run(_both(prefill, decode, _body(stream=True)))
        reader = SglangStreamReader(incremental=incremental, max_event_bytes=1 << 20)
        out = reader.feed(second.content) + reader.close()
        deltas = [
            json.loads(line[6:])["choices"]
            for line in out.decode().split("\n\n")
            if line.startswith("data: {")
        ]
        assert "".join(c[0]["text"] for c in deltas if c) == "Hello!"
        contract = sglang_contract.contract()
        for line in second.content.decode().split("\n\n"):
            if line.startswith("data: {"):
                contract.GenerateResponse.from_json_value(json.loads(line[6:]))


def test_a_decode_whose_room_never_comes_fails_as_sglang_does() -> None:
    _, decode = _pair(timeout=0.2)

    async def alone() -> httpx.Response:
        async with _client(decode) as d:
            return await d.post("/generate", json=_body(room=9))

    answer = asyncio.run(alone())
    assert answer.status_code == 500
    message = sglang_error_message(answer.json())
    assert message is not None
    assert message.startswith("Decode transfer failed for request rank=0")
    assert "timed out after 0.2s in KVPoll.WaitingForInput" in message
    assert answer.json()["type"] == "500"


def test_an_aborted_leg_answers_200_with_an_abort() -> None:
    prefill, _ = _pair(timeout=5)

    async def aborted() -> httpx.Response:
        async with _client(prefill) as p:
            call = asyncio.ensure_future(p.post("/generate", json=_body(room=11)))
            await asyncio.sleep(0.05)
            await p.post("/abort_request", json={"rid": f"{11:032x}"})
            return await call

    answer = asyncio.run(aborted())
    assert answer.status_code == 200
    assert generate_answer(answer.json()) == SglangFailure(status=503, message="Aborted")
    assert prefill.aborted == [f"{11:032x}"]


@pytest.mark.parametrize(
    ("change", "status", "text"),
    [
        ({"sampling_params": {"max_tokens": 16}}, 400, "unknown field `max_tokens`"),
        ({"bootstrap_room": "7340912231847725312"}, 400, "invalid type: string"),
        ({"bootstrap_room": None}, 400, "without bootstrap room id"),
        ({"sampling_params": {"top_k": 0}}, 400, "top_k must be -1"),
    ],
)
def test_sglangs_refusals_with_its_own_text(change: dict[str, Any], status: int, text: str) -> None:
    _, decode = _pair()

    async def refused() -> httpx.Response:
        async with _client(decode) as d:
            return await d.post("/generate", json={**_body(), **change})

    answer = asyncio.run(refused())
    assert answer.status_code == status
    message = sglang_error_message(answer.json())
    assert message is not None
    assert text in message


def test_the_unknown_field_text_is_sglangs_own() -> None:
    expected = json.loads((FIXTURES / "error-400-contract.json").read_text())["body"]
    _, decode = _pair()

    async def refused() -> httpx.Response:
        async with _client(decode) as d:
            return await d.post(
                "/generate", json={**_body(), "sampling_params": {"max_tokens": 16}}
            )

    assert asyncio.run(refused()).json() == expected


def test_info_routes() -> None:
    prefill, _ = _pair()

    async def info() -> dict[str, Any]:
        async with _client(prefill) as p:
            assert (await p.get("/health")).status_code == 200
            assert (await p.get("/route")).status_code == 200
            models = (await p.get("/v1/models")).json()
            assert models["data"][0]["owned_by"] == "sglang"
            return dict((await p.get("/server_info")).json())

    server = asyncio.run(info())
    assert server["disaggregation_mode"] == "prefill"
    assert server["disaggregation_bootstrap_port"] == 8998
    assert server["incremental_streaming_output"] is False


def test_a_streamed_stop_string_keeps_what_was_sent_as_sglang_does() -> None:
    # SGLang's stream text is the sum of its deltas: the finish's trim cuts only the last one.
    prefill, decode = _pair()
    _, second = asyncio.run(_both(prefill, decode, _body(stream=True, stop=["lo"])))
    texts = [
        json.loads(line[6:])["text"]
        for line in second.content.decode().split("\n\n")
        if line.startswith("data: {")
    ]
    assert texts == ["H", "He", "Hel", "Hell", "Hell"]
    reader = SglangStreamReader(max_event_bytes=1 << 20)
    assert b"finish_reason" in reader.feed(second.content) + reader.close()


def test_a_prefill_that_fails_leaves_its_decode_waiting_until_the_timeout() -> None:
    # What a router must not wait for (docs/sglang.md): the decode answers only at the timeout.
    for fault in ("http-500", "no-room"):
        prefill = SimulatedSglangWorker(
            disaggregation_mode="prefill", transfer_timeout=0.3, fault=fault
        )
        decode = SimulatedSglangWorker(
            disaggregation_mode="decode",
            transfer_timeout=0.3,
            prefills={("prefill", 8998): prefill},
        )
        first, second = asyncio.run(_both(prefill, decode, _body(room=13)))
        assert first.status_code == second.status_code == 500
        message = sglang_error_message(second.json())
        assert message is not None
        assert message.startswith("Decode transfer failed")


def test_an_unknown_fault_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown fault"):
        SimulatedSglangWorker(fault="bogus")


# --- SGLang's OpenAI routes in a P/D role -------------------------------------------------------


def _openai_body(room: int, **client: Any) -> dict[str, Any]:
    routing = {
        "rid": f"{room:032x}",
        "bootstrap_host": "prefill",
        "bootstrap_port": 8998,
        "bootstrap_room": room,
    }
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **routing, **client}


async def _both_on(
    path: str, prefill: SimulatedSglangWorker, decode: SimulatedSglangWorker, body: dict[str, Any]
) -> tuple[httpx.Response, httpx.Response]:
    async with _client(prefill) as p, _client(decode) as d:
        first, second = await asyncio.gather(p.post(path, json=body), d.post(path, json=body))
    return first, second


def _events(answer: httpx.Response) -> list[dict[str, Any]]:
    lines = answer.content.decode().split("\n\n")
    assert lines[-2:] == ["data: [DONE]", ""]
    return [json.loads(line[6:]) for line in lines[:-2]]


def test_a_chat_tool_call_comes_back_as_sglangs_hermes_parser_writes_it() -> None:
    prefill, decode = _pair()
    body = _openai_body(21, tools=WEATHER_TOOLS)
    first, second = asyncio.run(_both_on(CHAT, prefill, decode, body))
    assert first.status_code == second.status_code == 200
    # The prefill: one token, length (discarded by a router); both legs met by the room.
    assert first.json()["choices"][0]["finish_reason"] == "length"
    answer = second.json()
    openai.types.chat.ChatCompletion.model_validate(answer)
    assert answer["id"] == f"{21:032x}"
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["matched_stop"] is None
    assert choice["message"]["content"] == ""
    assert choice["message"]["reasoning_content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_")
    assert len(call["id"]) == len("call_") + 24
    assert call["index"] == 0
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert answer["metadata"] == {"weight_version": "default"}
    assert list(answer["usage"]) == [
        "prompt_tokens",
        "total_tokens",
        "completion_tokens",
        "prompt_tokens_details",
        "reasoning_tokens",
        "completion_tokens_details",
    ]


def test_the_libraries_openai_route_leg_serves_a_tool_call_through_a_pair() -> None:
    rendezvous = Rendezvous(
        rid=f"{29:032x}", bootstrap_host="prefill", bootstrap_port=8998, bootstrap_room=29
    )
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": WEATHER_TOOLS,
    }
    leg = build_sglang_openai_request(chat, client_path=CHAT, rendezvous=rendezvous)
    prefill, decode = _pair()
    first, second = asyncio.run(_both_on(leg.path, prefill, decode, leg.body))
    assert first.status_code == second.status_code == 200
    assert second.json()["choices"][0]["finish_reason"] == "tool_calls"


def test_a_streamed_tool_call_comes_as_a_name_then_its_arguments() -> None:
    prefill, decode = _pair()
    body = _openai_body(
        22, tools=WEATHER_TOOLS, stream=True, stream_options={"include_usage": True}
    )
    _, second = asyncio.run(_both_on(CHAT, prefill, decode, body))
    chunks = _events(second)
    for chunk in chunks:
        openai.types.chat.ChatCompletionChunk.model_validate(chunk)
    assert chunks[0]["choices"][0]["delta"] == {
        "reasoning_content": None,
        "role": "assistant",
        "content": "",
    }
    named, arguments = (chunk["choices"][0]["delta"]["tool_calls"][0] for chunk in chunks[1:3])
    assert named["function"] == {"name": "get_weather", "arguments": ""}
    assert named["id"].startswith("call_")
    assert arguments["id"] is None
    assert arguments["function"] == {"name": None, "arguments": '{"city": "Paris"}'}
    assert chunks[3]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[4]["choices"] == []
    assert chunks[4]["usage"]["completion_tokens"] > 0


def test_chat_and_completions_without_tools_answer_the_text() -> None:
    prefill, decode = _pair()
    _, second = asyncio.run(_both_on(CHAT, prefill, decode, _openai_body(23, max_tokens=3)))
    choice = second.json()["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("Hel", "length")
    body = {**_openai_body(24, stream=True), "prompt": "hi"}
    del body["messages"]
    _, streamed = asyncio.run(_both_on("/v1/completions", prefill, decode, body))
    chunks = _events(streamed)
    openai.types.Completion.model_validate(chunks[-1])  # the SDK builds the others unchecked
    assert "".join(chunk["choices"][0]["text"] for chunk in chunks) == "Hello!"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"][0]["matched_stop"] == 151645


def test_the_openai_routes_refuse_and_time_out_as_sglangs_do() -> None:
    _, decode = _pair(timeout=0.2)

    async def alone(body: dict[str, Any]) -> httpx.Response:
        async with _client(decode) as d:
            return await d.post(CHAT, json=body)

    no_room = _openai_body(25)
    del no_room["bootstrap_room"]
    refused = asyncio.run(alone(no_room))
    assert refused.status_code == 400
    assert refused.json()["type"] == "BadRequest"
    assert "without bootstrap room id" in refused.json()["message"]
    timed_out = asyncio.run(alone(_openai_body(26)))
    assert timed_out.status_code == 500
    assert timed_out.json()["message"].startswith("Decode transfer failed")
    streamed = asyncio.run(alone(_openai_body(27, stream=True)))
    assert streamed.status_code == 200
    (event,) = _events(streamed)
    assert event["error"]["code"] == 500
    assert event["error"]["type"] == "INTERNAL_SERVER_ERROR"
    # What SGLang's contract covers of the OpenAI routes: the in-stream error's message and code.
    checked = sglang_contract.contract().GenerateStreamError.from_json_value(event)
    assert checked.error.message.startswith("Decode transfer failed")


def test_the_worker_tells_what_it_received_and_what_was_aborted() -> None:
    prefill, _ = _pair(timeout=5)

    async def seen() -> dict[str, Any]:
        async with _client(prefill) as p:
            call = asyncio.ensure_future(p.post(CHAT, json=_openai_body(28)))
            await asyncio.sleep(0.05)
            await p.post("/abort_request", json={"rid": f"{28:032x}"})
            assert (await call).json()["choices"][0]["finish_reason"] == "abort"
            return dict((await p.get("/simulated/calls")).json())

    recorded = asyncio.run(seen())
    assert [call["path"] for call in recorded["calls"]] == [CHAT, "/abort_request"]
    assert recorded["calls"][0]["body"]["bootstrap_room"] == 28
    assert recorded["aborted"] == [f"{28:032x}"]


def test_ignore_eos_writes_until_the_cap() -> None:
    prefill, decode = _pair()
    for cap, expected in ((128, 128), (None, 4096 - len(PROMPT))):
        body = {**_body(room=30 + (cap is None)), "sampling_params": {"ignore_eos": True}}
        if cap is None:
            body["sampling_params"]["max_new_tokens"] = None
        _, second = asyncio.run(_both(prefill, decode, body))
        meta = second.json()["meta_info"]
        assert meta["completion_tokens"] == expected
        assert meta["finish_reason"] == {"type": "length", "length": expected}
        assert second.json()["text"].startswith("Hello!Hello!")


def test_a_join_whose_decode_went_away_ends_without_an_answer() -> None:
    # A decode that gave up (aborted) closes its join request; the prefill must not hold it
    # until the room's timeout, or a SIGTERM drains it for the whole grace period.
    prefill = SimulatedSglangWorker(disaggregation_mode="prefill", transfer_timeout=300.0)
    body = json.dumps({"room": 7, "timeout": 300.0}).encode()
    scope = {"type": "http", "method": "POST", "path": JOIN_PATH, "headers": []}
    incoming = [
        {"type": "http.request", "body": body, "more_body": False},
        {"type": "http.disconnect"},
    ]
    sent: list[Any] = []

    async def receive() -> Any:
        return incoming.pop(0)

    async def send(message: Any) -> None:
        sent.append(message)

    async def join() -> None:
        await asyncio.wait_for(prefill(scope, receive, send), timeout=10)

    asyncio.run(join())
    assert sent == []
    assert incoming == []

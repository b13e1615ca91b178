"""The simulated SGLang worker: a P/D pair meeting by room, SGLang's refusals, its contract.

In process: the decode reaches its prefill as a listed peer; the CLI test runs them as processes.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
from typing import Any

import httpx
import pytest
import sglang_contract

from disagg_transforms import OutputMode
from disagg_transforms._request.sglang import Rendezvous, build_sglang_request
from disagg_transforms._response.dispatch import wrap_envelope
from disagg_transforms._response.sglang import (
    SglangFailure,
    SglangStreamReader,
    generate_answer,
    sglang_error_message,
)
from disagg_transforms._routes import Route
from disagg_transforms.testing import SimulatedSglangWorker, toy_encode

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

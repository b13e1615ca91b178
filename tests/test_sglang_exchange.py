"""The exchange drives SGLang: prefill and decode sent together, failure coupled both ways.

In process: a simulated vLLM render worker and simulated SGLang prefill and decode workers,
driven by a small asyncio router written from docs/router.md ("Calls that go together").
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from disagg_transforms import ConfigError, KvConnector, parse_pipeline_params
from disagg_transforms._engines import Engine, SglangSettings
from disagg_transforms.exchange import (
    ClientReply,
    Driver,
    Exchange,
    ExchangeSettings,
    ExchangeStateError,
    Phase,
    WorkerCall,
)
from disagg_transforms.testing import SimulatedSglangWorker, SimulatedWorker

_PIPELINE = parse_pipeline_params({"prefill": {}, "decode": {}}, use_openai_format=False)
_BITS = itertools.count(1)


def _settings(**sglang: Any) -> ExchangeSettings:
    return ExchangeSettings(
        engine=Engine.SGLANG,
        sglang=SglangSettings(random_bits=lambda bits: next(_BITS) % (1 << bits), **sglang),
    )


@dataclass
class _Outcome:
    status: int
    body: bytes
    calls: list[WorkerCall] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads(self.body)


class _Router:
    """Runs one exchange against in-process workers: render, prefill, decode."""

    def __init__(self, workers: Mapping[str, Any]) -> None:
        self.clients = {
            step: httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://w")
            for step, app in workers.items()
        }
        self.aborts: list[tuple[str, bytes]] = []

    async def _send(self, call: WorkerCall) -> httpx.Response:
        return await self.clients[call.step].request(
            call.method, call.path, headers=list(call.headers), content=call.body
        )

    async def _cancel(self, call: WorkerCall) -> None:
        if call.abort is not None:
            self.aborts.append((call.step, call.abort.body))
            await self._send(call.abort)

    async def run(self, ex: Exchange) -> _Outcome:
        drive = Driver(ex)
        calls: list[WorkerCall] = []
        sent = bytearray()
        while (call := drive.next_call()) is not None:
            calls += (call, *call.together)
            sent += await self._call(drive, call)
        reply = drive.reply()
        for client in self.clients.values():
            await client.aclose()
        if isinstance(reply, ClientReply):
            return _Outcome(reply.status, reply.body, calls)
        return _Outcome(reply.status, reply.first + bytes(sent), calls)

    async def _call(self, drive: Driver, call: WorkerCall) -> bytes:
        """One call and those that go with it; the client's bytes after its stream's head."""
        peers = {asyncio.ensure_future(self._together(drive, p)): p for p in call.together}
        main = asyncio.ensure_future(self._send(call))
        waiting = {main, *peers}
        while main in waiting and not drive.cancelling:
            _, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        sent = b""
        if not drive.cancelling:
            answer = main.result()
            if not call.stream:
                drive.answered(answer.status_code, answer.headers.raw, answer.content)
            else:
                drive.stream_opened(answer.status_code, answer.headers.raw)
                sent = drive.relay_all([answer.content])
        if drive.cancelling:
            for task, each in [(main, call), *peers.items()]:
                if not task.done():
                    task.cancel()
                    await self._cancel(each)
        else:
            await asyncio.gather(*peers)
        return sent

    async def _together(self, drive: Driver, call: WorkerCall) -> None:
        try:
            answer = await self._send(call)
        except httpx.TransportError as error:
            drive.together_failed(call, type(error).__name__)
            return
        drive.together_answered(call, answer.status_code, answer.headers.raw, answer.content)


def _workers(**prefill: Any) -> tuple[SimulatedSglangWorker, SimulatedSglangWorker, dict[str, Any]]:
    p = SimulatedSglangWorker(disaggregation_mode="prefill", transfer_timeout=5, **prefill)
    d = SimulatedSglangWorker(
        disaggregation_mode="decode", transfer_timeout=5, prefills={("prefill", 8998): p}
    )
    return p, d, {"render": SimulatedWorker(), "prefill": p, "decode": d}


def _exchange(
    path: str, body: dict[str, Any], settings: ExchangeSettings | None = None
) -> Exchange:
    return Exchange(
        _PIPELINE,
        path,
        {},
        json.dumps(body).encode(),
        settings=settings or _settings(),
        bootstrap_host="prefill",
    )


_CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 32}


def test_prefill_and_decode_go_together_with_one_body() -> None:
    prefill, decode, workers = _workers()
    outcome = asyncio.run(_Router(workers).run(_exchange("/v1/chat/completions", _CHAT)))
    assert outcome.status == 200, outcome.body
    assert outcome.json()["choices"][0]["message"]["content"] == "Hello!"
    steps = [call.step for call in outcome.calls]
    assert steps == [Phase.RENDER, Phase.DECODE, Phase.PREFILL]
    decode_call, prefill_call = outcome.calls[1:]
    assert decode_call.together == (prefill_call,)
    assert decode_call.body == prefill_call.body
    leg = json.loads(decode_call.body)
    assert leg["bootstrap_host"] == "prefill"
    assert leg["bootstrap_port"] == 8998
    assert 1 <= leg["bootstrap_room"] <= 2**63 - 1
    assert leg["sampling_params"] == {"max_new_tokens": 32}
    assert decode_call.path == "/generate"
    assert decode_call.abort is not None
    assert json.loads(decode_call.abort.body) == {"rid": leg["rid"]}
    assert decode_call.abort.path == "/abort_request"
    assert len(prefill.calls_to("/generate")) == len(decode.calls_to("/generate")) == 1


@pytest.mark.parametrize("stream_output", ["cumulative", "incremental"])
@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("/v1/chat/completions", {}),
        ("/v1/responses", {}),
        ("/v1/messages", {}),
    ],
)
def test_every_client_api_streams_from_sglang(
    path: str, extra: dict[str, Any], stream_output: str
) -> None:
    prefill = SimulatedSglangWorker(disaggregation_mode="prefill", transfer_timeout=5)
    decode = SimulatedSglangWorker(
        disaggregation_mode="decode",
        transfer_timeout=5,
        prefills={("prefill", 8998): prefill},
        incremental_streaming_output=stream_output == "incremental",
    )
    workers = {"render": SimulatedWorker(), "prefill": prefill, "decode": decode}
    body: dict[str, Any] = {"model": "m", "max_tokens": 32, "stream": True, **extra}
    if path == "/v1/responses":
        body = {"model": "m", "input": "Hi", "max_output_tokens": 32, "stream": True}
    else:
        body["messages"] = [{"role": "user", "content": "Hi"}]
    ex = _exchange(path, body, _settings(stream_output=stream_output))
    outcome = asyncio.run(_Router(workers).run(ex))
    assert outcome.status == 200, outcome.body
    text = outcome.body.decode()
    deltas = "".join(
        _delta(path, json.loads(line[6:]))
        for line in text.split("\n")
        if line.startswith("data: {")
    )
    assert deltas == "Hello!"


def _delta(path: str, event: dict[str, Any]) -> str:
    if path == "/v1/chat/completions":
        choices = event.get("choices") or [{}]
        return str(choices[0].get("delta", {}).get("content") or "")
    if path == "/v1/responses":
        return (
            str(event.get("delta", "")) if event.get("type") == "response.output_text.delta" else ""
        )
    delta = event.get("delta", {})
    return str(delta.get("text", "")) if event.get("type") == "content_block_delta" else ""


def _sglang_event(text: str) -> bytes:
    meta = {"id": "r", "finish_reason": None, "prompt_tokens": 3, "completion_tokens": len(text)}
    event = {"text": text, "output_ids": list(range(len(text))), "meta_info": meta}
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


@pytest.mark.parametrize("too_large", [False, True], ids=["not-extending", "past-the-bound"])
def test_the_events_of_one_read_before_a_broken_one_reach_the_client(too_large: bool) -> None:
    # The engine's reader cuts a read into events itself: what came before the broken event in
    # the same read is the client's, then the error event ends its stream.
    stream = _sglang_event(" Pa") + _sglang_event(" Paris")
    # An event still growing past the reader's bound (16 MiB) when the read ends, or one that
    # does not extend the text so far.
    stream += b"data: " + b"x" * (17 << 20) if too_large else _sglang_event(" Px") * 2

    async def decode(scope: Any, receive: Any, send: Any) -> None:
        del scope, receive
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": stream})

    _, _, workers = _workers()
    ex = _exchange("/v1/chat/completions", {**_CHAT, "stream": True})
    outcome = asyncio.run(asyncio.wait_for(_Router({**workers, "decode": decode}).run(ex), 10))
    assert outcome.status == 200, outcome.body
    events = [line[6:] for line in outcome.body.decode().split("\n\n") if line.startswith("data:")]
    chunks = [json.loads(event) for event in events[:-1]]
    assert "".join(_delta("/v1/chat/completions", chunk) for chunk in chunks) == " Paris"
    assert chunks[-1]["error"]["code"] == 502
    assert events[-1] == "[DONE]"


def test_a_prefill_that_fails_ends_the_request_at_once_and_aborts_the_decode() -> None:
    _, decode, workers = _workers(fault="http-500")
    router = _Router(workers)
    outcome = asyncio.run(asyncio.wait_for(router.run(_exchange("/v1/chat/completions", _CHAT)), 3))
    assert outcome.status == 502
    message = outcome.json()["error"]["message"]
    assert message.startswith("prefill failed with HTTP 500"), message
    rid = json.loads(outcome.calls[1].body)["rid"]
    assert router.aborts == [("decode", json.dumps({"rid": rid}, separators=(",", ":")).encode())]
    assert decode.aborted == [rid]


def test_a_prefill_that_never_joins_leaves_the_decode_to_fail_and_abort_the_prefill() -> None:
    prefill, decode, workers = _workers(fault="no-room")
    decode.transfer_timeout = 0.2
    router = _Router(workers)
    outcome = asyncio.run(asyncio.wait_for(router.run(_exchange("/v1/chat/completions", _CHAT)), 3))
    assert outcome.status == 502, outcome.body
    assert "decode failed with HTTP 500" in outcome.json()["error"]["message"]
    rid = json.loads(outcome.calls[1].body)["rid"]
    assert prefill.aborted == [rid]


async def _refusing(scope: Any, receive: Any, send: Any) -> None:
    """A prefill that refuses every request at once, in SGLang's error shape."""
    del scope, receive
    body = b'{"error": {"message": "unknown field `foo`"}}'
    await send({"type": "http.response.start", "status": 400, "headers": []})
    await send({"type": "http.response.body", "body": body})


def test_a_prefill_4xx_is_the_clients_error_in_its_shape() -> None:
    _, decode, workers = _workers()
    router = _Router({**workers, "prefill": _refusing})
    ex = _exchange("/v1/messages", _CHAT)
    outcome = asyncio.run(asyncio.wait_for(router.run(ex), 3))
    assert outcome.status == 400
    assert outcome.json()["type"] == "error"
    assert outcome.json()["error"]["type"] == "invalid_request_error"
    assert outcome.json()["error"]["message"] == "prefill rejected the request: unknown field `foo`"
    assert decode.aborted == [json.loads(outcome.calls[1].body)["rid"]]


def test_a_refused_field_reaches_no_worker() -> None:
    ex = _exchange("/v1/chat/completions", {**_CHAT, "n": 2})
    reply = ex.next_event()
    assert isinstance(reply, ClientReply)
    assert reply.status == 400
    assert "n" in json.loads(reply.body)["error"]["param"]


def test_sglang_prefill_needs_its_host() -> None:
    with pytest.raises(ConfigError, match="bootstrap_host"):
        Exchange(_PIPELINE, "/v1/chat/completions", {}, b"{}", settings=_settings())


def _openai_server(answer: dict[str, Any]) -> Any:
    """An SGLang OpenAI server's stand-in: answers every call with ``answer``."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        del scope
        while (await receive()).get("more_body"):
            pass
        body = json.dumps(answer).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def test_a_tool_using_client_goes_to_sglangs_openai_server_with_the_rendezvous() -> None:
    message = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
    decode = _openai_server({"id": "chatcmpl-1", "object": "chat.completion", "choices": [choice]})
    prefill = _openai_server({"id": "chatcmpl-p", "object": "chat.completion", "choices": []})
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    client = {**_CHAT, "tools": tools, "kv_transfer_params": {"remote_host": "10.0.0.66"}}
    pipeline = parse_pipeline_params({"prefill": {}, "decode": {}}, use_openai_format=True)
    ex = Exchange(
        pipeline,
        "/v1/chat/completions",
        {},
        json.dumps(client).encode(),
        settings=_settings(),
        bootstrap_host="prefill",
    )
    outcome = asyncio.run(_Router({"prefill": prefill, "decode": decode}).run(ex))
    assert outcome.status == 200, outcome.body
    assert outcome.json()["choices"] == [choice]
    decode_call, prefill_call = outcome.calls
    assert decode_call.path == prefill_call.path == "/v1/chat/completions"
    assert decode_call.together == (prefill_call,)
    leg = json.loads(decode_call.body)
    assert leg["tools"] == tools
    assert "kv_transfer_params" not in leg
    assert leg["bootstrap_host"] == "prefill"
    assert isinstance(leg["bootstrap_room"], int)
    assert len(leg["rid"]) == 32


@pytest.mark.parametrize("stream", [False, True])
def test_sglangs_own_client_gets_the_rendezvous_and_sglangs_answer_as_written(
    *, stream: bool
) -> None:
    prefill, decode, workers = _workers()
    sent = {
        "input_ids": [1000 + ord(c) for c in "Hi"],
        "sampling_params": {"max_new_tokens": 8},
        "stream": stream,
        "rid": "mine",
        "bootstrap_room": 7,
    }
    ex = _exchange("/generate", sent)
    outcome = asyncio.run(_Router(workers).run(ex))
    assert outcome.status == 200, outcome.body
    decode_call, prefill_call = outcome.calls
    assert decode_call.path == prefill_call.path == "/generate"
    leg = json.loads(decode_call.body)
    assert leg["rid"] != "mine"  # ours: of fixed length, never a prefix of another's
    assert leg["bootstrap_room"] != 7
    assert leg["input_ids"] == sent["input_ids"]
    if stream:
        assert outcome.body.startswith(b"data: {")
        assert outcome.body.endswith(b"data: [DONE]\n\n")
        assert b'"meta_info"' in outcome.body
    else:
        answer = outcome.json()
        assert answer["meta_info"]["finish_reason"]["type"] in {"stop", "length"}
        assert "text" in answer
    assert len(prefill.calls_to("/generate")) == len(decode.calls_to("/generate")) == 1


def test_a_call_sent_together_is_named_by_its_step() -> None:
    ex = _exchange("/v1/chat/completions", _CHAT)
    with pytest.raises(ExchangeStateError, match="step"):
        ex.receive_together("bogus", 200, {}, b"{}")
    with pytest.raises(ExchangeStateError, match="step"):
        ex.together_failed("bogus", "reset")


def test_only_a_failure_sent_together_makes_a_late_answer_dropped() -> None:
    ex = _exchange("/v1/chat/completions", {**_CHAT, "n": 2})  # refused: the reply is over
    with pytest.raises(ExchangeStateError):
        ex.receive(200, {}, b"{}")  # out of order, as before
    ex = _exchange("/v1/chat/completions", _CHAT)
    render = ex.next_event()
    assert isinstance(render, WorkerCall)
    ex.together_failed("prefill", "reset")
    assert ex.reply_over
    ex.receive(200, {}, b"{}")  # the call in flight's answer, after the failure: dropped
    reply = ex.next_event()
    assert isinstance(reply, ClientReply)
    assert reply.status == 502


def test_kv_sglang_needs_the_sglang_engine() -> None:
    with pytest.raises(ConfigError) as refused:
        ExchangeSettings(kv_connector=KvConnector.SGLANG)
    assert refused.value.param == "kv_connector"
    settings = ExchangeSettings(kv_connector=KvConnector.SGLANG, engine=Engine.SGLANG)
    assert settings.engine is Engine.SGLANG


@pytest.mark.parametrize("stream", [False, True])
def test_a_completions_client_keeps_its_own_route_on_the_token_pipeline(stream: bool) -> None:
    # As with vLLM, a completions client is never rendered: both legs are its own body on
    # SGLang's OpenAI server, with our rid and room (docs/sglang.md).
    _, _, workers = _workers()
    body = {"model": "m", "prompt": "Hi", "max_tokens": 8, "stream": stream}
    outcome = asyncio.run(_Router(workers).run(_exchange("/v1/completions", body)))
    assert outcome.status == 200, outcome.body
    assert [(call.step, call.path) for call in outcome.calls] == [
        ("decode", "/v1/completions"),
        ("prefill", "/v1/completions"),
    ]
    decode, prefill = (json.loads(call.body) for call in outcome.calls)
    assert decode == prefill
    assert decode["bootstrap_host"] == "prefill"
    assert b'"text_completion"' in outcome.body


# --- prompt logprobs: the prefill computes them, the reply waits for its answer --------------


async def _legs_answered(
    workers: Mapping[str, Any], ex: Exchange
) -> tuple[Driver, WorkerCall, httpx.Response, httpx.Response]:
    """Render answered; the decode call and its prefill sent at once, neither answer fed."""
    router = _Router(workers)
    drive = Driver(ex)
    render = drive.next_call()
    assert render is not None
    answer = await router._send(render)
    drive.answered(answer.status_code, answer.headers.raw, answer.content)
    call = drive.next_call()
    assert call is not None
    (prefill,) = call.together
    decoded, prefilled = await asyncio.gather(router._send(call), router._send(prefill))
    for client in router.clients.values():
        await client.aclose()
    return drive, call, decoded, prefilled


_ASKED = {**_CHAT, "prompt_logprobs": 2}


@pytest.mark.parametrize("decode_first", [True, False])
def test_prompt_logprobs_come_from_the_prefill_whichever_answers_first(decode_first: bool) -> None:
    _, _, workers = _workers()
    drive, call, decoded, prefilled = asyncio.run(
        _legs_answered(workers, _exchange("/v1/chat/completions", _ASKED))
    )
    (prefill,) = call.together
    assert json.loads(prefill.body)["logprob_start_len"] == 0
    assert json.loads(prefill.body)["top_logprobs_num"] == 2
    assert "logprob_start_len" not in json.loads(call.body)  # the decode never computes them

    def feed_prefill() -> None:
        drive.together_answered(prefill, prefilled.status_code, (), prefilled.content)

    if decode_first:
        drive.answered(decoded.status_code, (), decoded.content)
        assert drive.awaiting
        assert drive.next_call() is None
        with pytest.raises(ExchangeStateError, match="still waits"):
            drive.reply()
        feed_prefill()
    else:
        feed_prefill()
        assert not drive.awaiting
        drive.answered(decoded.status_code, (), decoded.content)
    assert not drive.awaiting
    reply = drive.reply()
    assert isinstance(reply, ClientReply)
    assert reply.status == 200, reply.body
    completion = json.loads(reply.body)
    assert completion["choices"][0]["message"]["content"] == "Hello!"
    logprobs = completion["prompt_logprobs"]
    assert len(logprobs) == completion["usage"]["prompt_tokens"]
    assert logprobs[0] is None
    assert [len(position) for position in logprobs[1:4]] == [2, 2, 3]  # the token, then the top
    assert [next(iter(position.values()))["rank"] for position in logprobs[1:4]] == [1, 2, None]


def test_the_exchange_router_gets_prompt_logprobs_and_no_other_change() -> None:
    asked = asyncio.run(_Router(_workers()[2]).run(_exchange("/v1/chat/completions", _ASKED)))
    plain = asyncio.run(_Router(_workers()[2]).run(_exchange("/v1/chat/completions", _CHAT)))
    assert asked.status == plain.status == 200
    assert asked.json()["prompt_logprobs"][1] is not None
    assert plain.json()["prompt_logprobs"] is None
    same = {key: value for key, value in asked.json().items() if key not in {"id", "created"}}
    assert same == {
        **{key: value for key, value in plain.json().items() if key not in {"id", "created"}},
        "prompt_logprobs": asked.json()["prompt_logprobs"],
    }


@pytest.mark.parametrize("failure", ["http-500", "transport", "no-logprobs"])
def test_a_prefill_that_fails_while_the_reply_waits_for_it_is_the_reply(failure: str) -> None:
    _, _, workers = _workers()
    drive, call, decoded, _ = asyncio.run(
        _legs_answered(workers, _exchange("/v1/chat/completions", _ASKED))
    )
    (prefill,) = call.together
    drive.answered(decoded.status_code, (), decoded.content)
    assert drive.awaiting
    if failure == "transport":
        drive.together_failed(prefill, "ConnectError")
    elif failure == "http-500":
        drive.together_answered(prefill, 500, (), b'{"error": {"message": "boom"}}')
    else:  # a 200 without them: the prefill broke the contract
        drive.together_answered(prefill, 200, (), decoded.content)
    reply = drive.reply()
    assert isinstance(reply, ClientReply)
    assert reply.status == 502
    message = json.loads(reply.body)["error"]["message"]
    assert message.startswith("prefill"), message
    assert drive.cancelling
    assert not drive.awaiting


def test_a_decode_alone_gives_its_own_prompt_logprobs() -> None:
    # No prefill step: one SGLang server (no P/D) computes them itself.
    pipeline = parse_pipeline_params({"decode": {}}, use_openai_format=False)
    workers = {"render": SimulatedWorker(), "decode": SimulatedSglangWorker()}
    ex = Exchange(
        pipeline, "/v1/chat/completions", {}, json.dumps(_ASKED).encode(), settings=_settings()
    )
    outcome = asyncio.run(_Router(workers).run(ex))
    assert outcome.status == 200, outcome.body
    assert json.loads(outcome.calls[-1].body)["logprob_start_len"] == 0
    assert outcome.json()["prompt_logprobs"][1] is not None


def test_a_prompt_whose_logprobs_are_asked_reuses_no_cached_prefix() -> None:
    # SGLang computes the prompt from where its logprobs start (0): no KV reused.
    _, _, workers = _workers()
    router_runs = [
        asyncio.run(_Router(workers).run(_exchange("/v1/chat/completions", body)))
        for body in (_CHAT, _ASKED, _CHAT)
    ]
    details = [outcome.json()["usage"]["prompt_tokens_details"] for outcome in router_runs]
    assert details[1] is None
    assert details[2] is not None
    assert details[2]["cached_tokens"] > 0

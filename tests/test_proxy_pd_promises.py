"""What ``serve`` promises around a prefill: the client's cached-token count is the prefill's.

Workers are ``disagg-transforms simulate`` processes (with vLLM's
``--enable-prompt-tokens-details``: a prefill reports its prefix-cache hit, a decode that pulls
the prompt's KV reports 0, as a P/D decode does), the proxy a ``serve`` process, the clients
the official SDKs.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest
from proxy_helpers import Server, running, served

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

# Long enough for a whole block of the prefix cache (16 tokens) in every API's render.
TEXT = "Tell me, in a few words, what the weather is like in Paris in the spring of the year."
CHAT: Any = [{"role": "user", "content": TEXT}]
BLOCK = 16


@dataclass
class PD:
    proxy: Server
    prefill: Server
    decode: Server


@pytest.fixture(scope="module")
def pd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PD]:
    logs = tmp_path_factory.mktemp("pd")
    simulate = ["simulate", "--port", "0", "--enable-prompt-tokens-details"]
    with running((simulate, logs / "prefill.log"), (simulate, logs / "decode.log")) as (
        prefill,
        decode,
    ):
        serve = ["serve", "--port", "0", "--prefill-url", prefill.url, "--decode-url", decode.url]
        with running((serve, logs / "proxy.log")) as (proxy,):
            yield PD(proxy, prefill, decode)


def _warm(prompt_tokens: int) -> int:
    """What the simulated prefill reports for a prompt it computed before: its whole blocks."""
    return (prompt_tokens - 1) // BLOCK * BLOCK


def test_chat_usage_reports_the_prefills_cached_tokens(pd: PD) -> None:
    client = openai.OpenAI(base_url=pd.proxy.url + "/v1", api_key="unused")
    with client:
        cold = client.chat.completions.create(model="m", messages=CHAT, max_tokens=8)
        warm = client.chat.completions.create(model="m", messages=CHAT, max_tokens=8)
    for completion, expected in ((cold, 0), (warm, None)):
        usage = completion.usage
        assert usage is not None
        assert usage.prompt_tokens_details is not None
        want = _warm(usage.prompt_tokens) if expected is None else expected
        assert want > 0 or expected == 0
        assert usage.prompt_tokens_details.cached_tokens == want


def test_chat_stream_usage_chunk_reports_the_prefills_cached_tokens(pd: PD) -> None:
    client = openai.OpenAI(base_url=pd.proxy.url + "/v1", api_key="unused")
    text = TEXT + " Streamed."
    messages: Any = [{"role": "user", "content": text}]
    with client:
        client.chat.completions.create(model="m", messages=messages, max_tokens=8)  # warms it
        stream = client.chat.completions.create(
            model="m",
            messages=messages,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
        usages = [chunk.usage for chunk in stream if chunk.usage is not None]
    assert len(usages) == 1
    usage = usages[0]
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == _warm(usage.prompt_tokens) > 0


def test_responses_usage_reports_the_prefills_cached_tokens(pd: PD) -> None:
    client = openai.OpenAI(base_url=pd.proxy.url + "/v1", api_key="unused")
    text = TEXT + " As a Responses request."
    with client:
        client.responses.create(model="m", input=text, max_output_tokens=8)
        whole = client.responses.create(model="m", input=text, max_output_tokens=8)
        with client.responses.stream(model="m", input=text, max_output_tokens=8) as stream:
            streamed = stream.get_final_response()
    for response in (whole, streamed):
        usage = response.usage
        assert usage is not None
        assert usage.input_tokens_details.cached_tokens == _warm(usage.input_tokens) > 0


def test_messages_usage_reports_the_prefills_cached_tokens(pd: PD) -> None:
    client = anthropic.Anthropic(base_url=pd.proxy.url, api_key="unused")
    text = TEXT + " As a Messages request."
    messages: Any = [{"role": "user", "content": text}]
    with client:
        client.messages.create(model="m", messages=messages, max_tokens=8)
        whole = client.messages.create(model="m", messages=messages, max_tokens=8)
        with client.messages.stream(model="m", messages=messages, max_tokens=8) as stream:
            streamed = stream.get_final_message()
    for message in (whole, streamed):
        usage = message.usage
        cached = usage.cache_read_input_tokens
        assert cached is not None
        # Anthropic's input_tokens leaves the cached ones out; the two add up to the prompt.
        assert cached == _warm(usage.input_tokens + cached) > 0


def test_a_decode_worker_alone_reports_none_of_the_prefills_cache(pd: PD) -> None:
    """What the tests above rely on: the decode answer's own count is 0 after prefill."""
    body = {
        "token_ids": list(range(1, 40)),
        "sampling_params": {"max_tokens": 2},
        "kv_transfer_params": {"do_remote_prefill": True, "do_remote_decode": False},
    }
    answer = httpx.post(pd.decode.url + "/inference/v1/generate", json=body).json()
    # vLLM 0.33's generate route: no created_cache_tokens (its chat route writes one).
    assert answer["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 0,
        "created_cache_tokens": None,
        "multimodal_tokens": None,
    }


# -- every leg on the client's own route: the decode answer is relayed, its usage patched -----
# The simulated worker has no Responses or Messages route of its own: this worker, in the test's
# process, answers both as vLLM does (a prefill reporting 32 of its 40 prompt tokens cached, a
# decode that pulled the KV reporting none of them: vLLM's Anthropic usage has no cached count).

PROMPT, CACHED = 40, 32


def _sse(*events: dict[str, Any]) -> bytes:
    return b"".join(
        b"event: %s\ndata: %s\n\n" % (e["type"].encode(), json.dumps(e).encode()) for e in events
    )


def _response(*, prefill: bool, output: list[Any]) -> dict[str, Any]:
    usage = {
        "input_tokens": PROMPT,
        "input_tokens_details": {"cached_tokens": CACHED if prefill else 0},
        "output_tokens": 1,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": PROMPT + 1,
    }
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "model": "m",
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
    }


def _message(*, prefill: bool, content: list[Any]) -> dict[str, Any]:
    usage: dict[str, Any] = {"input_tokens": PROMPT, "output_tokens": 1}
    if prefill:  # Anthropic's meaning, as a prefill worker that reports the count gives it
        usage = {"input_tokens": PROMPT - CACHED, "output_tokens": 1}
        usage["cache_read_input_tokens"] = CACHED
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": "m",
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": usage,
    }


TEXT_PART = {"type": "output_text", "text": "Hi", "annotations": []}
ITEM = {"id": "msg_i", "type": "message", "role": "assistant", "status": "completed"}


def _responses_stream() -> bytes:
    done = _response(prefill=False, output=[{**ITEM, "content": [TEXT_PART]}])
    started = {**done, "status": "in_progress", "output": [], "usage": None}
    part = {"item_id": "msg_i", "output_index": 0, "content_index": 0}
    return _sse(
        {"type": "response.created", "response": started, "sequence_number": 0},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**ITEM, "status": "in_progress", "content": []},
            "sequence_number": 1,
        },
        {
            "type": "response.content_part.added",
            **part,
            "part": {**TEXT_PART, "text": ""},
            "sequence_number": 2,
        },
        {
            "type": "response.output_text.delta",
            **part,
            "delta": "Hi",
            "logprobs": [],
            "sequence_number": 3,
        },
        {"type": "response.completed", "response": done, "sequence_number": 4},
    )


def _messages_stream() -> bytes:
    started = {**_message(prefill=False, content=[]), "stop_reason": None}
    started["usage"] = {"input_tokens": PROMPT, "output_tokens": 0}
    return _sse(
        {"type": "message_start", "message": started},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"input_tokens": PROMPT, "output_tokens": 1},
        },
        {"type": "message_stop"},
    )


async def _own_routes_worker(scope: Any, receive: Any, send: Any) -> None:
    """vLLM's ``/v1/responses`` and ``/v1/messages``, a prefill told by its transfer params."""
    if scope["type"] != "http":
        return
    raw = b""
    while True:
        message = await receive()
        raw += message.get("body", b"")
        if not message.get("more_body"):
            break
    body = json.loads(raw)
    prefill = body["kv_transfer_params"].get("do_remote_decode") is True
    responses = scope["path"] == "/v1/responses"
    kind = b"application/json"
    if body.get("stream") and not prefill:
        kind = b"text/event-stream"
        answer = _responses_stream() if responses else _messages_stream()
    else:
        built = (
            _response(prefill=prefill, output=[{**ITEM, "content": [TEXT_PART]}])
            if responses
            else _message(prefill=prefill, content=[{"type": "text", "text": "Hi"}])
        )
        if prefill:
            built["kv_transfer_params"] = {"do_remote_prefill": True, "remote_host": "10.0.0.1"}
        answer = json.dumps(built).encode()
    headers = [(b"content-type", kind)]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


@pytest.fixture(scope="module")
def relayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    logs = tmp_path_factory.mktemp("relayed")
    config = logs / "openai.json"
    steps = {"use_openai_format": True, "steps": {"prefill": {}, "decode": {}}}
    config.write_text(json.dumps(steps))
    with served(_own_routes_worker) as worker:
        serve = ["serve", "--port", "0", "--config", str(config)]
        serve += ["--prefill-url", worker, "--decode-url", worker]
        with running((serve, logs / "proxy.log")) as (proxy,):
            yield proxy


def test_a_relayed_responses_answer_reports_the_prefills_cached_tokens(relayed: Server) -> None:
    client = openai.OpenAI(base_url=relayed.url + "/v1", api_key="unused")
    with client:
        whole = client.responses.create(model="m", input=TEXT, max_output_tokens=8)
        with client.responses.stream(model="m", input=TEXT, max_output_tokens=8) as stream:
            streamed = stream.get_final_response()
    for response in (whole, streamed):
        assert response.output_text == "Hi"
        usage = response.usage
        assert usage is not None
        assert (usage.input_tokens, usage.input_tokens_details.cached_tokens) == (PROMPT, CACHED)


def test_a_relayed_messages_answer_reports_the_prefills_cached_tokens(relayed: Server) -> None:
    client = anthropic.Anthropic(base_url=relayed.url, api_key="unused")
    messages: Any = [{"role": "user", "content": TEXT}]
    with client:
        whole = client.messages.create(model="m", messages=messages, max_tokens=8)
        with client.messages.stream(model="m", messages=messages, max_tokens=8) as stream:
            streamed = stream.get_final_message()
    for message in (whole, streamed):
        assert message.content[0].type == "text"
        usage = message.usage
        # Anthropic's input_tokens leaves the cached ones out; the two add up to the prompt.
        assert (usage.input_tokens, usage.cache_read_input_tokens) == (PROMPT - CACHED, CACHED)


# -- a failed prefill: retried only when asked and only when the worker was unavailable -------


@dataclass
class Retries:
    flaky: Server  # prefill 503 once, then fine; --prefill-max-retries 1
    refused: Server  # prefill always 400; --prefill-max-retries 3
    down: Server  # prefill always 503; no retries


@pytest.fixture(scope="module")
def retries(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Retries]:
    logs = tmp_path_factory.mktemp("retries")
    simulate = ["simulate", "--port", "0"]
    with running(
        ([*simulate, "--fault", "http-503", "--fault-calls", "1"], logs / "flaky.log"),
        ([*simulate, "--fault", "http-400"], logs / "refusing.log"),
        ([*simulate, "--fault", "http-503"], logs / "down.log"),
        (simulate, logs / "decode.log"),
    ) as (flaky, refusing, down, decode):
        serve = ["serve", "--port", "0", "--decode-url", decode.url]
        with running(
            ([*serve, "--prefill-url", flaky.url, "--prefill-max-retries", "1"], logs / "f.log"),
            ([*serve, "--prefill-url", refusing.url, "--prefill-max-retries", "3"], logs / "r.log"),
            ([*serve, "--prefill-url", down.url], logs / "d.log"),
        ) as proxies:
            yield Retries(*proxies)


def _chat(proxy: Server, request_id: str) -> Any:
    # No SDK retries: the proxy's own are what is judged.
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
    with client:
        return client.chat.completions.create(
            model="m", messages=CHAT, max_tokens=8, extra_headers={"x-request-id": request_id}
        )


def _legs(proxy: Server, line_start: str) -> list[str]:
    """The worker calls of one access-log line: ``step=outcome`` each, in order."""
    line = next(x for x in proxy.wait_for_log(line_start).splitlines() if line_start in x)
    return [leg.split("/")[0] for leg in line.split() if "=" in leg and "/" in leg]


def test_a_prefill_503_is_retried_when_asked(retries: Retries) -> None:
    completion = _chat(retries.flaky, "retry-1")
    assert completion.choices[0].message.content == "Hello!"
    assert _legs(retries.flaky, "retry-1 POST /v1/chat/completions 200") == [
        "render=200",
        "prefill=503",
        "prefill=200",
        "decode=200",
    ]


def test_a_prefill_400_is_never_retried_and_no_decode_follows(retries: Retries) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        _chat(retries.refused, "retry-2")
    assert "prefill rejected the request" in str(raised.value)
    assert _legs(retries.refused, "retry-2 POST /v1/chat/completions 400") == [
        "render=200",
        "prefill=400",
    ]


def test_without_retries_a_failed_prefill_is_a_502_and_no_decode_follows(
    retries: Retries,
) -> None:
    with pytest.raises(openai.InternalServerError) as raised:
        _chat(retries.down, "retry-3")
    assert raised.value.status_code == 502
    assert "prefill failed with HTTP 503" in str(raised.value)
    assert _legs(retries.down, "retry-3 POST /v1/chat/completions 502") == [
        "render=200",
        "prefill=503",
    ]


# -- a pooled connection the worker closed: the call is sent again on a fresh one -------------

_CHAT_ANSWER = (
    b'{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
)


class ClosingWorker:
    """A worker that answers the first request of each connection, then closes it under the next.

    It never says ``Connection: close``: to the proxy the connection looks reusable, as a
    worker's idle connection does until its close arrives, and the next call sent on it fails
    before any byte of an answer (the worst timing of an idle close, made certain).
    """

    def __init__(self, *, answers: bool = True) -> None:
        self.answers = answers  # False: every connection is closed under its first call
        self.answered = 0
        self.closed_under_a_call = 0
        self.url = ""
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ClosingWorker:  # noqa: PYI034 - a test helper, never subclassed
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._connection, "127.0.0.1", 0)
        )
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        self._ready.set()
        self._loop.run_forever()
        server.close()
        self._loop.run_until_complete(server.wait_closed())
        self._loop.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._read_request(reader)
        if not self.answers:
            self.closed_under_a_call += 1
            writer.close()
            return
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        writer.write(head % len(_CHAT_ANSWER) + _CHAT_ANSWER)
        await writer.drain()
        self.answered += 1
        if await reader.read(1):  # the next call came on this connection: closed under it
            self.closed_under_a_call += 1
        writer.close()

    @staticmethod
    async def _read_request(reader: asyncio.StreamReader) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.lower().split(b"\r\n")
                if line.startswith(b"content-length:")
            ),
            0,  # a GET
        )
        await reader.readexactly(length)


def test_a_call_on_a_connection_the_worker_closed_is_sent_again(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "openai.json"
    config.write_text('{"use_openai_format": true, "steps": {"decode": {}}}')
    with ClosingWorker() as worker:
        serve = ["serve", "--port", "0", "--config", str(config), "--decode-url", worker.url]
        with running(([*serve, "--worker-keep-alive", "30"], tmp_path / "proxy.log")) as (proxy,):
            client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
            with client:
                answers = [
                    client.chat.completions.create(model="m", messages=CHAT, max_tokens=2)
                    for _ in range(3)
                ]
    assert [a.choices[0].message.content for a in answers] == ["Hi"] * 3
    # Calls 2 and 3 each met a closed connection, and were answered on a fresh one.
    assert (worker.closed_under_a_call, worker.answered) == (2, 3)


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/v1/models"), ("POST", "/tokenize"), ("GET", "/version")]
)
def test_a_relayed_call_on_a_connection_the_worker_closed_is_sent_again(
    tmp_path: pathlib.Path, method: str, path: str
) -> None:
    config = tmp_path / "openai.json"
    config.write_text('{"use_openai_format": true, "steps": {"decode": {}}}')
    body = b'{"model": "m", "prompt": "Hi"}' if method == "POST" else None
    with ClosingWorker() as worker:
        serve = ["serve", "--port", "0", "--config", str(config), "--decode-url", worker.url]
        serve += ["--worker-keep-alive", "30"]
        with running((serve, tmp_path / "proxy.log")) as (proxy,):
            client = httpx.Client(base_url=proxy.url, timeout=30)
            with client:
                statuses = [client.request(method, path, content=body).status_code for _ in "123"]
    assert statuses == [200] * 3
    assert (worker.closed_under_a_call, worker.answered) == (2, 3)


def test_a_call_closed_on_a_fresh_connection_is_not_sent_again(tmp_path: pathlib.Path) -> None:
    """The worker read that call: sending it again could run it twice."""
    config = tmp_path / "openai.json"
    config.write_text('{"use_openai_format": true, "steps": {"decode": {}}}')
    with ClosingWorker(answers=False) as worker:
        serve = ["serve", "--port", "0", "--config", str(config), "--decode-url", worker.url]
        with running((serve, tmp_path / "proxy.log")) as (proxy,):
            client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
            with client, pytest.raises(openai.InternalServerError) as raised:
                client.chat.completions.create(model="m", messages=CHAT, max_tokens=2)
    assert raised.value.status_code == 502
    assert worker.closed_under_a_call == 1


# -- a client that goes away: the worker call in flight is cancelled, prefill included --------


def test_a_client_that_goes_away_mid_prefill_closes_the_prefill_call(
    tmp_path: pathlib.Path,
) -> None:
    slow = ["simulate", "--port", "0", "--fault", "slow-first-byte", "--first-byte-delay", "120"]
    with running(
        (slow, tmp_path / "prefill.log"), (["simulate", "--port", "0"], tmp_path / "decode.log")
    ) as (prefill, decode):
        serve = ["serve", "--port", "0", "--prefill-url", prefill.url, "--decode-url", decode.url]
        with running((serve, tmp_path / "proxy.log")) as (proxy,):
            body = {"model": "m", "messages": CHAT, "max_tokens": 8}
            headers = {"x-request-id": "gone-1"}
            # The client gives up long before the prefill's first byte (120 s) and closes.
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(
                    proxy.url + "/v1/chat/completions", json=body, headers=headers, timeout=5
                )
            # The prefill worker sees its connection closed: it aborts the call.
            log = prefill.wait_for_log("request aborted: POST /inference/v1/generate gone-1", 60)
            assert "gone-1" in log
            proxy_log = proxy.wait_for_log("gone-1 POST /v1/chat/completions 499")
            assert "decode=" not in proxy_log


@pytest.mark.parametrize("slow_leg", ["prefill", "decode"])
def test_in_the_sidecar_seat_a_client_that_goes_away_closes_the_call_in_flight(
    tmp_path: pathlib.Path, slow_leg: str
) -> None:
    slow = ["simulate", "--port", "0", "--fault", "slow-first-byte", "--first-byte-delay", "120"]
    fast = ["simulate", "--port", "0"]
    prefill_cmd, decode_cmd = (slow, fast) if slow_leg == "prefill" else (fast, slow)
    with running(
        (prefill_cmd, tmp_path / "prefill.log"), (decode_cmd, tmp_path / "decode.log")
    ) as (prefill, decode):
        serve = ["serve", "--port", "0", "--prefill-from-header", "--decode-url", decode.url]
        with running((serve, tmp_path / "proxy.log")) as (proxy,):
            request_id = f"gone-sidecar-{slow_leg}"
            headers = {
                "x-request-id": request_id,
                "x-prefiller-host-port": prefill.url.removeprefix("http://"),
            }
            body = {"model": "m", "messages": CHAT, "max_tokens": 8}
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(
                    proxy.url + "/v1/chat/completions", json=body, headers=headers, timeout=5
                )
            # The sidecar seat's legs are on the client's route; the slow one sees its close.
            worker = prefill if slow_leg == "prefill" else decode
            aborted = f"request aborted: POST /v1/chat/completions {request_id}"
            assert request_id in worker.wait_for_log(aborted, 60)
            proxy_log = proxy.wait_for_log(f"{request_id} POST /v1/chat/completions 499")
            if slow_leg == "prefill":
                assert "decode=" not in proxy_log

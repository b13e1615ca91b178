"""Relayed answers are checked as they pass, and a worker timeout is a 504 (docs/exchange.md).

A relayed answer is the worker's own (a leg on the client's route, or a generate client's
stream): the exchange sends its bytes on, but only what is JSON, framed, and ends as the API
ends a stream. How the client's stream ended is :attr:`Exchange.stream_end`.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from exchange_driver import drive, fixture_bytes, scripted
from golden import load_fixture, load_stream

from disagg_transforms import parse_pipeline_params
from disagg_transforms.exchange import (
    ClientReply,
    ClientStream,
    Exchange,
    StreamEnd,
    WorkerCall,
)

OPENAI_D = parse_pipeline_params({"decode": {}})
GENERATE_D = parse_pipeline_params({"decode": {}}, use_openai_format=False)
GENERATE_WRAP = parse_pipeline_params(
    {"decode": {"wrap_chat_completion": True}}, use_openai_format=False
)
HTML = b"<html><body>502 upstream hiccup</body></html>"

COMPLETIONS_CHUNK = (
    b'data: {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m", '
    b'"choices": [{"index": 0, "text": "Hi", "logprobs": null, "finish_reason": null}]}\n\n'
)
CHAT_CHUNK = b"data: " + fixture_bytes("chat-completion-chunk-coupled.json") + b"\n\n"
GENERATE_CHUNK = load_stream("generate-stream-usage.sse").split(b"\n\n")[0] + b"\n\n"
DONE = b"data: [DONE]\n\n"

# (pipeline, client path, client body, one good event of the worker's stream)
RELAYED = {
    "completions": (
        OPENAI_D,
        "/v1/completions",
        {"model": "m", "prompt": "Hi", "stream": True},
        COMPLETIONS_CHUNK,
    ),
    "chat": (
        OPENAI_D,
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "stream": True},
        CHAT_CHUNK,
    ),
    "generate": (
        GENERATE_D,
        "/inference/v1/generate",
        {"token_ids": [1, 2], "stream": True},
        GENERATE_CHUNK,
    ),
}

HI = [{"role": "user", "content": "Hi"}]


def _open(kind: str) -> tuple[Exchange, bytes]:
    config, path, body, event = RELAYED[kind]
    ex = Exchange(config, path, {}, json.dumps(body).encode())
    call = ex.next_event()
    assert isinstance(call, WorkerCall)
    assert call.step == "decode"
    assert call.stream
    ex.receive_stream_head(200, {"content-type": "text/event-stream"})
    return ex, event


def _end(ex: Exchange) -> StreamEnd | None:
    # A call, not the property: mypy would keep a property's value narrowed between asserts.
    return ex.stream_end


def _data(stream: bytes) -> list[bytes]:
    return [line[6:] for line in stream.split(b"\n") if line.startswith(b"data: ")]


def _relay(kind: str, chunks: list[bytes]) -> tuple[Exchange, bytes]:
    """Feed ``chunks`` and end the stream; what the client got (head's first bytes included)."""
    ex, _ = _open(kind)
    out = bytearray()
    for chunk in chunks:
        out += ex.feed(chunk)
    out += ex.end_of_stream()
    head = ex.next_event()
    if isinstance(head, ClientStream):
        out[:0] = head.first
    return ex, bytes(out)


@pytest.mark.parametrize("kind", list(RELAYED))
@pytest.mark.parametrize(
    "stream",
    [
        HTML,  # a 200 whose body is an HTML page, not an event stream
        HTML + b"\n\n",
        b"data: " + HTML + b"\n\n" + DONE,  # an event whose data is not JSON
        b'data: ["a list"]\n\n' + DONE,
        b"data: [DONE]\n\n",  # nothing but the end: no first event to start the stream with
    ],
)
def test_a_relayed_stream_not_json_before_its_first_event_is_a_clean_502(
    kind: str, stream: bytes
) -> None:
    ex, _ = _relay(kind, [stream])
    reply = ex.next_event()
    assert isinstance(reply, ClientReply)
    assert reply.status == 502
    assert dict(reply.headers)["x-should-retry"] == "false"
    assert "decode broke the contract" in json.loads(reply.body)["error"]["message"]
    assert _end(ex) is None  # no client stream ever started


@pytest.mark.parametrize("kind", list(RELAYED))
@pytest.mark.parametrize(
    ("after", "says"),
    [
        (b'data: {"choi', "in the middle of an event"),  # cut mid-event
        (b"", "without data: [DONE]"),  # ended without [DONE]
        (b"data: " + HTML + b"\n\n" + DONE, "not"),  # a non-JSON data line
    ],
)
def test_a_relayed_stream_that_breaks_after_it_started_ends_with_the_error_event(
    kind: str, after: bytes, says: str
) -> None:
    ex, first = _open(kind)
    assert ex.feed(first) == b""
    head = ex.next_event()
    assert isinstance(head, ClientStream)
    assert head.first == first
    assert _end(ex) is None  # the stream is running
    tail = ex.feed(after) + ex.end_of_stream()
    assert tail.endswith(DONE)
    *_, error, done = _data(tail)
    assert done == b"[DONE]"
    message = json.loads(error)["error"]["message"]
    assert message.startswith("decode broke the contract")
    assert says in message
    assert HTML not in tail  # nothing of the broken event reached the client
    assert _end(ex) == "contract-broken"
    assert ex.reply_over


@pytest.mark.parametrize("kind", list(RELAYED))
def test_a_relayed_stream_split_anywhere_is_sent_on_and_ends_complete(kind: str) -> None:
    _, first = _open(kind)
    whole = first + first + DONE
    ex, out = _relay(kind, [whole[i : i + 7] for i in range(0, len(whole), 7)])
    assert out == whole
    assert _end(ex) == "complete"


@pytest.mark.parametrize("kind", ["completions", "chat"])
def test_a_relayed_workers_own_error_event_is_sent_on_and_ends_worker_failed(kind: str) -> None:
    _, first = _open(kind)
    error = b'data: {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}\n\n'
    ex, out = _relay(kind, [first + error + DONE])
    assert out == first + error + DONE
    assert _end(ex) == "worker-failed"


def test_a_generate_clients_stream_with_the_workers_error_event_ends_worker_failed() -> None:
    ex, out = _relay("generate", [GENERATE_CHUNK + load_stream("generate-stream-error.sse")])
    assert json.loads(_data(out)[-2])["error"]
    assert _end(ex) == "worker-failed"


@pytest.mark.parametrize(
    ("path", "first", "cut"),
    [
        (
            "/v1/responses",
            (
                b'event: response.created\ndata: {"type": "response.created", '
                b'"sequence_number": 0, "response": {}}\n\n'
            ),
            b'event: response.output_text.delta\ndata: {"ty',
        ),
        (
            "/v1/messages",
            b'event: message_start\ndata: {"type": "message_start", "message": {}}\n\n',
            b'event: content_block_delta\ndata: {"ty',
        ),
    ],
)
def test_a_relayed_responses_or_messages_stream_cut_ends_with_its_apis_error_event(
    path: str, first: bytes, cut: bytes
) -> None:
    body = {"model": "m", "max_tokens": 8, "messages": HI, "input": "Hi", "stream": True}
    if path == "/v1/responses":
        del body["max_tokens"], body["messages"]
    else:
        del body["input"]
    ex = Exchange(OPENAI_D, path, {}, json.dumps(body).encode())
    assert isinstance(ex.next_event(), WorkerCall)
    ex.receive_stream_head(200, {})
    assert ex.feed(first) == b""
    assert isinstance(ex.next_event(), ClientStream)
    tail = ex.feed(cut) + ex.end_of_stream()
    assert tail.startswith(b"event: error\ndata: ")
    error = json.loads(_data(tail)[0])
    if path == "/v1/responses":
        assert error["type"] == "error"
        assert error["sequence_number"] == 1  # follows the events sent
        assert error["message"].startswith("decode broke the contract")
    else:
        assert error["error"]["type"] == "api_error"
        assert error["error"]["message"].startswith("decode broke the contract")
    assert _end(ex) == "contract-broken"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"model": "m", "prompt": "Hi"}),
        ("/v1/chat/completions", {"model": "m", "messages": HI}),
    ],
)
def test_an_unstreamed_relayed_answer_that_is_not_json_is_a_502_not_retried(
    path: str, body: Any
) -> None:
    worker = scripted({path: (200, {"content-type": "text/html"}, HTML)})
    out = drive(Exchange(OPENAI_D, path, {}, json.dumps(body).encode()), worker)
    assert out.status == 502
    assert out.headers["x-should-retry"] == "false"
    assert "decode broke the contract" in out.json()["error"]["message"]


# ---- timeouts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"model": "m", "prompt": "Hi"}),
        ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": HI}),
    ],
)
def test_a_worker_that_timed_out_is_a_retryable_504(path: str, body: Any) -> None:
    ex = Exchange(OPENAI_D, path, {}, json.dumps(body).encode())
    call = ex.next_event()
    assert isinstance(call, WorkerCall)
    assert ex.worker_failed(call.step, "no answer within 0.5s", timed_out=True) == b""
    reply = ex.next_event()
    assert isinstance(reply, ClientReply)
    assert reply.status == 504
    assert "x-should-retry" not in dict(reply.headers)
    error = json.loads(reply.body)
    if path == "/v1/messages":
        assert error["error"]["type"] == "timeout_error"
    else:
        assert error["error"]["type"] == "GatewayTimeoutError"
        assert error["error"]["message"] == "decode failed: no answer within 0.5s"


def test_a_timeout_after_the_stream_started_ends_it_with_a_504_error_event() -> None:
    ex, first = _open("chat")
    ex.feed(first)
    assert isinstance(ex.next_event(), ClientStream)
    tail = ex.worker_failed("decode", "no chunk within 0.5s", timed_out=True)
    error = json.loads(_data(tail)[0])["error"]
    assert error["code"] == 504
    assert error["message"] == "decode failed: no chunk within 0.5s"
    assert tail.endswith(DONE)
    assert _end(ex) == "worker-failed"


def test_a_transport_failure_mid_stream_ends_worker_failed() -> None:
    ex, first = _open("completions")
    ex.feed(first)
    tail = ex.worker_failed("decode", "connection reset")
    assert json.loads(_data(tail)[0])["error"]["code"] == 502
    assert _end(ex) == "worker-failed"


@pytest.mark.parametrize(
    ("path", "request_fixture", "render_fixture"),
    [
        ("/v1/chat/completions", "render-chat-request.json", "render-chat-response.json"),
        ("/v1/responses", "render-responses-request.json", "render-responses-response.json"),
        ("/v1/messages", "render-messages-request.json", "render-messages-response.json"),
    ],
)
def test_a_rebuilt_stream_with_the_workers_error_event_ends_worker_failed(
    path: str, request_fixture: str, render_fixture: str
) -> None:
    # Without its tools: the decode step is in text mode, which refuses them.
    client = {k: v for k, v in load_fixture(request_fixture).items() if k != "tools"}
    body = json.dumps({**client, "stream": True}).encode()
    ex = Exchange(GENERATE_WRAP, path, {}, body)
    ex.receive(200, {}, fixture_bytes(render_fixture))
    ex.receive_stream_head(200, {})
    out = ex.feed(GENERATE_CHUNK + load_stream("generate-stream-error.sse"))
    head = ex.next_event()
    assert isinstance(head, ClientStream)
    # The worker's error, in the client API's shape (the head carries what this feed gave).
    assert b"Internal server error" in head.first + out
    ex.end_of_stream()
    assert _end(ex) == "worker-failed"


def test_a_rebuilt_stream_that_ends_well_ends_complete() -> None:
    body = json.dumps({**load_fixture("render-chat-request.json"), "stream": True}).encode()
    ex = Exchange(GENERATE_WRAP, "/v1/chat/completions", {}, body)
    ex.receive(200, {}, fixture_bytes("render-chat-response.json"))
    ex.receive_stream_head(200, {})
    ex.feed(load_stream("generate-stream-usage.sse"))
    assert _end(ex) is None  # [DONE] came, but the worker's stream has not ended
    ex.end_of_stream()
    assert _end(ex) == "complete"

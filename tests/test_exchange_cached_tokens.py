"""The prefill's cached-prompt count in the client's usage, on a leg on the client's own route.

The worker here is scripted: a prefill answering a count, a chat decode answering its own
(wrong after P/D) count, whole and streamed, the stream's usage event cut across two reads.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from exchange_driver import Answer, Worker, drive

from disagg_transforms import ExchangeSettings, KvConnector, parse_pipeline_params
from disagg_transforms.exchange import Exchange

PD_CHAT = parse_pipeline_params({"prefill": {}, "decode": {}}, use_openai_format=True)
USAGE = {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42}
PREFILL = {
    "id": "p",
    "choices": [],
    "usage": {**USAGE, "prompt_tokens_details": {"cached_tokens": 32}},
    "kv_transfer_params": {"do_remote_prefill": True, "remote_host": "10.0.0.1"},
}
DECODE = {
    "id": "d",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}}],
    "usage": {**USAGE, "prompt_tokens_details": {"cached_tokens": 0}},
}


def _compact(value: object) -> bytes:
    """JSON as vLLM's pydantic writes it: no spaces."""
    return json.dumps(value, separators=(",", ":")).encode()


def _worker(decode: bytes | list[bytes], prefill: bytes = _compact(PREFILL)) -> Worker:
    """Answers the prefill leg (it asks ``do_remote_decode``) with ``prefill``, decode with
    ``decode``."""

    def answer(method: str, path: str, headers: Any, body: bytes) -> Answer:
        del method, path, headers
        if json.loads(body)["kv_transfer_params"].get("do_remote_decode"):
            return 200, {}, prefill
        return 200, {}, decode

    return answer


def _exchange(*, stream: bool, settings: ExchangeSettings | None = None) -> Exchange:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    encoded = json.dumps(body).encode()
    return Exchange(PD_CHAT, "/v1/chat/completions", {}, encoded, settings=settings)


SHARED_STORAGE = ExchangeSettings(kv_connector=KvConnector.SHARED_STORAGE)


def test_a_relayed_chat_answer_reports_the_prefills_count() -> None:
    outcome = drive(_exchange(stream=False), _worker(json.dumps(DECODE).encode()))
    assert outcome.status == 200
    usage = outcome.json()["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 32}
    assert usage["prompt_tokens"] == 40
    assert "kv_transfer_params" not in outcome.json()


def test_a_relayed_chat_stream_reports_it_in_its_usage_chunk_cut_anywhere() -> None:
    chunk = {"id": "d", "object": "chat.completion.chunk", "choices": []}
    token = {**chunk, "choices": [{"index": 0, "delta": {"content": "Hi"}}]}
    last = {**chunk, "usage": DECODE["usage"]}
    events = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in (token, last))
    events += b"data: [DONE]\n\n"
    cut = events.index(b'"cached_tokens"') + 3
    outcome = drive(_exchange(stream=True), _worker([events[:cut], events[cut:]]))
    assert outcome.status == 200
    payloads = [line[6:] for line in outcome.body.split(b"\n") if line.startswith(b"data: {")]
    usages = [json.loads(p)["usage"] for p in payloads if b'"usage"' in p]
    assert usages == [{**USAGE, "prompt_tokens_details": {"cached_tokens": 32}}]
    assert outcome.body.endswith(b"data: [DONE]\n\n")


def test_a_prefill_that_reports_no_count_leaves_the_decodes() -> None:
    silent = {k: v for k, v in PREFILL.items() if k != "usage"}
    outcome = drive(_exchange(stream=False), _worker(_compact(DECODE), _compact(silent)))
    assert outcome.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_with_shared_storage_the_prefills_count_is_the_clients_too() -> None:
    # Its params are not read (the KV is in the storage), its usage is (docs/exchange.md).
    outcome = drive(
        _exchange(stream=False, settings=SHARED_STORAGE), _worker(json.dumps(DECODE).encode())
    )
    assert outcome.status == 200
    assert outcome.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}


@pytest.mark.parametrize("answer", [b"not json", b"[]", b'{"usage": 7}', b"{}"])
def test_with_shared_storage_an_unreadable_prefill_answer_leaves_the_decodes(
    answer: bytes,
) -> None:
    worker = _worker(_compact(DECODE), answer)
    outcome = drive(_exchange(stream=False, settings=SHARED_STORAGE), worker)
    assert outcome.status == 200
    assert outcome.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


# -- Responses and Messages: where each route's usage holds the count ------------------------


def _events(*events: tuple[str, dict[str, Any]]) -> bytes:
    return b"".join(b"event: %s\ndata: %s\n\n" % (n.encode(), _compact(e)) for n, e in events)


# vLLM's Responses usage, the decode's own count 0 (it pulled the prompt's KV).
RESPONSES_USAGE = {
    "input_tokens": 40,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 2,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 42,
}
# vLLM's Anthropic usage: input_tokens is the whole prompt, no cached count.
MESSAGES_USAGE = {"input_tokens": 40, "output_tokens": 2}


def _responses_usage(cached: int) -> dict[str, Any]:
    return {**RESPONSES_USAGE, "input_tokens_details": {"cached_tokens": cached}}


def _messages_usage(cached: int, usage: dict[str, Any] = MESSAGES_USAGE) -> dict[str, Any]:
    """Anthropic's meaning: the two input counts add up to the prompt."""
    prompt = usage["input_tokens"]
    return {**usage, "input_tokens": prompt - cached, "cache_read_input_tokens": cached}


def _responses_answer(usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "resp_d",
        "created_at": 1,
        "model": "m",
        "object": "response",
        "output": [
            {
                "id": "msg_1",
                "content": [{"annotations": [], "text": "Hi", "type": "output_text"}],
                "role": "assistant",
                "status": "completed",
                "type": "message",
            }
        ],
        "status": "completed",
        "usage": usage,
        "user": None,
    }


def _messages_answer(usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "msg_d",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "Hi"}],
        "model": "m",
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": usage,
    }


def _responses_stream(usage: dict[str, Any]) -> bytes:
    created = {**_responses_answer(RESPONSES_USAGE), "output": [], "usage": None}
    created["status"] = "in_progress"
    delta = {"type": "response.output_text.delta", "delta": "Hi", "item_id": "msg_1"}
    return _events(
        ("response.created", {"type": "response.created", "response": created}),
        ("response.output_text.delta", {**delta, "sequence_number": 1}),
        (
            "response.completed",
            {
                "type": "response.completed",
                "response": _responses_answer(usage),
                "sequence_number": 2,
            },
        ),
    )


def _messages_stream(start: dict[str, Any], end: dict[str, Any]) -> bytes:
    message = {**_messages_answer(start), "content": [], "stop_reason": None}
    return _events(
        ("message_start", {"type": "message_start", "message": message}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Hi"},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": end},
        ),
        ("message_stop", {"type": "message_stop"}),
    )


START_USAGE = {"input_tokens": 40, "output_tokens": 0}  # vLLM's message_start, continuous usage
KV = {"do_remote_prefill": True, "remote_host": "10.0.0.1"}
# Each route's prefill answer reporting 32 of its 40 prompt tokens cached, where that route
# reports it.
PREFILLS: dict[str, dict[str, Any]] = {
    "/v1/responses": {**_responses_answer(_responses_usage(32)), "kv_transfer_params": KV},
    "/v1/messages": {**_messages_answer(_messages_usage(32)), "kv_transfer_params": KV},
    "/inference/v1/generate": PREFILL,
}
CLIENTS: dict[str, dict[str, Any]] = {
    "/v1/responses": {"model": "m", "input": "Hi", "max_output_tokens": 8},
    "/v1/messages": {
        "model": "m",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 8,
    },
}


def _relayed(path: str, *, stream: bool) -> Exchange:
    body = CLIENTS[path] | ({"stream": True} if stream else {})
    return Exchange(PD_CHAT, path, {}, json.dumps(body).encode())


WHOLE_CASES = {
    "responses": (
        "/v1/responses",
        _responses_answer(RESPONSES_USAGE),
        _responses_answer(_responses_usage(32)),
    ),
    "messages": (
        "/v1/messages",
        _messages_answer(MESSAGES_USAGE),
        _messages_answer(_messages_usage(32)),
    ),
}


@pytest.mark.parametrize("case", WHOLE_CASES)
def test_a_relayed_answer_reports_the_prefills_count_where_its_route_does(case: str) -> None:
    """Only the count moves (Anthropic's input_tokens with it): every other byte stays."""
    path, decode, expected = WHOLE_CASES[case]
    worker = _worker(_compact(decode), _compact(PREFILLS[path]))
    outcome = drive(_relayed(path, stream=False), worker)
    assert outcome.status == 200
    assert outcome.body == _compact(expected)


STREAM_CASES = {
    "responses": (
        "/v1/responses",
        _responses_stream(RESPONSES_USAGE),
        _responses_stream(_responses_usage(32)),
    ),
    "messages": (
        "/v1/messages",
        _messages_stream(START_USAGE, MESSAGES_USAGE),
        # message_start as vLLM writes it: the whole prompt as input, no cache count (the real
        # engine's comparison, docs/testing.md); message_delta's usage has the count.
        _messages_stream(START_USAGE, _messages_usage(32)),
    ),
}


@pytest.mark.parametrize("case", STREAM_CASES)
def test_a_relayed_stream_reports_it_in_its_usage_events_cut_at_every_byte(case: str) -> None:
    """Responses: ``response.completed``'s ``response.usage``; Messages: ``message_delta``'s
    ``usage`` (the SDK takes it), ``message_start``'s left as vLLM writes it."""
    path, events, expected = STREAM_CASES[case]
    for cut in range(1, len(events)):
        pieces = [events[:cut], events[cut:]]
        outcome = drive(_relayed(path, stream=True), _worker(pieces, _compact(PREFILLS[path])))
        assert (outcome.status, outcome.streamed) == (200, True)
        assert outcome.body == expected, cut


@pytest.mark.parametrize("case", WHOLE_CASES)
def test_a_count_above_the_prompt_is_clamped_to_it(case: str) -> None:
    path, decode, _ = WHOLE_CASES[case]
    prefill = {
        "/v1/responses": {**_responses_answer(_responses_usage(50)), "kv_transfer_params": KV},
        "/v1/messages": {
            **_messages_answer({**MESSAGES_USAGE, "cache_read_input_tokens": 50}),
            "kv_transfer_params": KV,
        },
    }[path]
    outcome = drive(_relayed(path, stream=False), _worker(_compact(decode), _compact(prefill)))
    usage = outcome.json()["usage"]
    if path == "/v1/messages":
        assert (usage["input_tokens"], usage["cache_read_input_tokens"]) == (0, 40)
    else:
        assert usage["input_tokens_details"] == {"cached_tokens": 40}


MIXED = {
    # A prefill on the client's Responses route, decode on generate: the Responses envelope
    # is rebuilt from a generate answer that reports the Responses prefill's count.
    "responses prefill, generate decode": ("/v1/responses", True, False),
    "messages prefill, generate decode": ("/v1/messages", True, False),
    # A prefill on generate, decode relayed on the client's route.
    "generate prefill, responses decode": ("/v1/responses", False, True),
    "generate prefill, messages decode": ("/v1/messages", False, True),
}


@pytest.mark.parametrize("case", MIXED)
def test_the_prefills_count_is_read_in_its_own_routes_usage(case: str) -> None:
    path, prefill_openai, decode_openai = MIXED[case]
    params = parse_pipeline_params(
        {
            "prefill": {"use_openai_format": prefill_openai},
            "decode": {"use_openai_format": decode_openai},
        }
    )
    prefill = PREFILLS[path if prefill_openai else "/inference/v1/generate"]
    generate = {
        "request_id": "d",
        "choices": [{"index": 0, "text": "Hi", "finish_reason": "stop", "token_ids": [1, 2]}],
        "usage": {**USAGE, "prompt_tokens_details": None},
        "output_mode": "text",
    }
    decode = _compact(WHOLE_CASES[path.rsplit("/", 1)[1]][1] if decode_openai else generate)
    rendered = {"token_ids": list(range(40)), "sampling_params": {"max_tokens": 8}}

    def answer(method: str, at: str, headers: Any, body: bytes) -> Answer:
        if at.endswith("/render"):
            return 200, {}, _compact(rendered)
        return _worker(decode, _compact(prefill))(method, at, headers, body)

    exchange = Exchange(params, path, {}, json.dumps(CLIENTS[path]).encode())
    outcome = drive(exchange, answer)
    assert outcome.status == 200, outcome.body
    usage = outcome.json()["usage"]
    if path == "/v1/messages":
        assert (usage["input_tokens"], usage["cache_read_input_tokens"]) == (8, 32)
    else:
        assert usage["input_tokens_details"]["cached_tokens"] == 32

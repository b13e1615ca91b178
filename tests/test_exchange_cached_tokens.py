"""The prefill's cached-prompt count in the client's usage, on a leg on the client's own route.

The worker here is scripted: a prefill answering a count, a chat decode answering its own
(wrong after P/D) count, whole and streamed, the stream's usage event cut across two reads.
"""

from __future__ import annotations

import json
from typing import Any

from exchange_driver import Answer, Worker, drive

from disagg_transforms import parse_pipeline_params
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


def _worker(decode: bytes | list[bytes]) -> Worker:
    def answer(method: str, path: str, headers: Any, body: bytes) -> Answer:
        del method, path, headers
        leg = json.loads(body)
        if leg["kv_transfer_params"].get("do_remote_decode"):
            return 200, {}, json.dumps(PREFILL).encode()
        return 200, {}, decode

    return answer


def _exchange(*, stream: bool) -> Exchange:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return Exchange(PD_CHAT, "/v1/chat/completions", {}, json.dumps(body).encode())


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
    decode = json.dumps(DECODE).encode()

    def answer(method: str, path: str, headers: Any, body: bytes) -> Answer:
        if json.loads(body)["kv_transfer_params"].get("do_remote_decode"):
            return 200, {}, json.dumps(silent).encode()
        return _worker(decode)(method, path, headers, body)

    outcome = drive(_exchange(stream=False), answer)
    assert outcome.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}

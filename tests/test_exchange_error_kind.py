"""Whose fault an error reply is, and the client's model, for a router's metrics (docs/exchange.md).

:attr:`Exchange.error_kind` sorts every error reply into the four kinds a router counts; a reply
that is no error has none. :attr:`Exchange.client_model` is the body's ``model`` as it came.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from disagg_transforms import TransformContext, parse_pipeline_params
from disagg_transforms.exchange import ErrorKind, Exchange, ExchangeSettings, WorkerCall
from disagg_transforms.hooks import Pipeline

OPENAI_PD = parse_pipeline_params({"prefill": {}, "decode": {}})
CHAT = json.dumps({"model": "m-1", "messages": [{"role": "user", "content": "Hi"}]}).encode()
CHAT_STREAM = json.dumps(
    {"model": "m-1", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
).encode()
PREFILLED = b'{"kv_transfer_params": {"do_remote_decode": true}}'
CHAT_ANSWER = json.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "m-1",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}
        ],
    }
).encode()
CHUNK = (
    b'data: {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m-1", '
    b'"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": null}]}\n\n'
)


def _kind(ex: Exchange) -> ErrorKind | None:
    # A call, not the property: mypy would keep a property's value narrowed between asserts.
    return ex.error_kind


def _call(ex: Exchange) -> WorkerCall:
    call = ex.next_event()
    assert isinstance(call, WorkerCall)
    return call


def test_a_good_reply_is_no_error_and_none_is_known_while_it_runs() -> None:
    ex = Exchange(OPENAI_PD, "/v1/chat/completions", {}, CHAT)
    assert _kind(ex) is None
    ex.receive(200, {}, PREFILLED)
    assert _kind(ex) is None
    ex.receive(200, {}, CHAT_ANSWER)
    assert ex.next_event().status == 200  # type: ignore[union-attr]
    assert _kind(ex) is None


@pytest.mark.parametrize(
    "body",
    [b"{not json", b'{"model": "m-1", "messages": [], "stream": "yes"}', b"[]"],
    ids=["not-json", "bad-field", "not-object"],
)
def test_a_refused_client_body_is_a_bad_request(body: bytes) -> None:
    ex = Exchange(OPENAI_PD, "/v1/chat/completions", {}, body)
    assert _kind(ex) == "bad_request"


def test_a_body_over_the_limit_is_a_bad_request() -> None:
    from disagg_transforms import Limits  # noqa: PLC0415

    settings = ExchangeSettings(limits=Limits(max_body_bytes=10))
    ex = Exchange(OPENAI_PD, "/v1/chat/completions", {}, CHAT, settings=settings)
    assert ex.next_event().status == 413  # type: ignore[union-attr]
    assert _kind(ex) == "bad_request"


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "upstream_4xx"), (429, "upstream_4xx"), (500, "upstream_5xx"), (503, "upstream_5xx")],
)
def test_a_worker_error_status_is_the_workers_4xx_or_5xx(status: int, kind: str) -> None:
    ex = Exchange(OPENAI_PD, "/v1/chat/completions", {}, CHAT)
    ex.receive(status, {}, b'{"error": {"message": "no"}}')
    assert _kind(ex) == kind


def test_a_status_outside_2xx_4xx_5xx_and_a_broken_answer_are_upstream_5xx() -> None:
    redirected = Exchange(OPENAI_PD, "/v1/chat/completions", {}, CHAT)
    redirected.receive(302, {}, b"")
    not_json = Exchange(OPENAI_PD, "/v1/chat/completions", {}, CHAT)
    not_json.receive(200, {}, b"<html>")
    assert (_kind(redirected), _kind(not_json)) == ("upstream_5xx", "upstream_5xx")


@pytest.mark.parametrize("timed_out", [False, True])
def test_a_failed_call_is_upstream_5xx(timed_out: bool) -> None:
    ex = Exchange(OPENAI_PD, "/v1/chat/completions", {}, CHAT)
    ex.worker_failed(_call(ex).step, "ClientConnectorError", timed_out=timed_out)
    assert _kind(ex) == "upstream_5xx"


def test_a_stream_that_ends_badly_is_upstream_5xx_and_a_complete_one_no_error() -> None:
    def streamed() -> Exchange:
        ex = Exchange(OPENAI_PD, "/v1/chat/completions", {}, CHAT_STREAM)
        ex.receive(200, {}, PREFILLED)
        ex.receive_stream_head(200, {})
        ex.feed(CHUNK)
        return ex

    complete, cut, failed = streamed(), streamed(), streamed()
    complete.feed(b"data: [DONE]\n\n")
    complete.end_of_stream()
    cut.feed(b"data: {")
    cut.end_of_stream()
    failed.worker_failed("decode", "ReadError")
    assert (complete.stream_end, cut.stream_end, failed.stream_end) == (
        "complete",
        "contract-broken",
        "worker-failed",
    )
    assert (_kind(complete), _kind(cut), _kind(failed)) == (None, "upstream_5xx", "upstream_5xx")


def test_a_host_hooks_bug_is_internal() -> None:
    def broken(body: Mapping[str, Any], context: TransformContext) -> dict[str, Any]:
        del body, context
        msg = "the hook broke"
        raise ValueError(msg)

    settings = ExchangeSettings(hooks=Pipeline(request=[broken]))
    ex = Exchange(OPENAI_PD, "/v1/chat/completions", {}, CHAT, settings=settings)
    assert ex.next_event().status == 500  # type: ignore[union-attr]
    assert _kind(ex) == "internal"


@pytest.mark.parametrize(
    ("body", "model"),
    [
        (CHAT, "m-1"),
        (
            b'{"model": "m-2", "messages": [], "max_tokens": -1}',
            "m-2",
        ),  # refused, but its model is read
        (b'{"messages": []}', None),
        (b'{"model": 7, "messages": []}', None),
        (b"{not json", None),
    ],
)
def test_the_client_model_is_the_bodys_model_string(body: bytes, model: str | None) -> None:
    assert Exchange(OPENAI_PD, "/v1/chat/completions", {}, body).client_model == model

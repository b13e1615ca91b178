"""The exchange's structure: the client read once, one row per route in every table, the plan.

What a client or a worker sees is tested in test_exchange.py; these tests hold the shape the
next steps grow on (docs/architecture.md, "Adding a client API"; docs/exchange.md, "Phases").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from exchange_driver import drive, fixture_bytes, scripted
from golden import load_stream

from disagg_transforms import ConfigError, OutputMode, Route, parse_pipeline_params
from disagg_transforms._exchange import reply
from disagg_transforms._request import caps, client, legs
from disagg_transforms._response import dispatch
from disagg_transforms.exchange import Exchange, ExchangeSettings, Phase, pipeline_phases
from disagg_transforms.integrations import proxy

CHAT = "/v1/chat/completions"
GENERATE_PD = parse_pipeline_params(
    {"prefill": {}, "decode": {"wrap_chat_completion": True}}, use_openai_format=False
)
WORKER = scripted(
    {
        "render": (200, {}, fixture_bytes("render-chat-response.json")),
        "prefill": (200, {}, fixture_bytes("generate-prefill-response.json")),
        "decode": (200, {}, fixture_bytes("generate-decode-response.json")),
    }
)


def _counted(calls: list[str], name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return function(*args, **kwargs)

    return counting


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, fixture_bytes("render-chat-request.json")),
        ("/inference/v1/generate", fixture_bytes("generate-decode-request.json")),
    ],
)
def test_the_client_s_fields_are_read_once_per_request(
    monkeypatch: pytest.MonkeyPatch, path: str, body: bytes
) -> None:
    calls: list[str] = []
    mappers = {
        route: None if mapper is None else _counted(calls, "mapper", mapper)
        for route, mapper in client.CLIENT_MAPPERS.items()
    }
    monkeypatch.setattr(client, "CLIENT_MAPPERS", mappers)
    monkeypatch.setattr(client, "client_caps", _counted(calls, "caps", client.client_caps))
    views = {route: _counted(calls, "view", view) for route, view in client._VIEWS.items()}
    monkeypatch.setattr(client, "_VIEWS", views)
    out = drive(Exchange(GENERATE_PD, path, {}, body), WORKER)
    assert out.status == 200, out.body
    assert [call.step for call in out.calls][-2:] == ["prefill", "decode"]  # two legs built
    # A common chat body is read through its API's view: the mapper and the caps are not run.
    expected = ["view"] if path == CHAT else ["caps"]
    assert calls == expected


def test_every_route_has_its_row_in_every_table() -> None:
    every = set(Route)
    assert set(client.CLIENT_MAPPERS) == every
    assert set(caps._CAP_PRECEDENCE) == every
    assert set(caps._SINGLE_TOKEN_CAP) == every
    assert set(legs.USAGE_AT_END) == every
    assert set(reply.REPLY_SHAPES) == every
    assert set(proxy._CLIENT_ROUTES) == every
    # The envelope rebuilt for a route is in every dispatch table, and only those routes.
    for route in Route:
        rebuilt = reply.REPLY_SHAPES[route] is reply.Shape.ENVELOPE
        assert (route in dispatch.ENVELOPE_ROUTES) is rebuilt
        assert (route in dispatch._WRAPS) is rebuilt
        assert (route in dispatch._SINGLE_FRAMES) is rebuilt
        if rebuilt:
            body = {"model": "m"}
            assert dispatch.stream_converter(route, requested=OutputMode.TEXT, client_body=body)
        else:
            with pytest.raises(ConfigError):
                dispatch.stream_converter(route, requested=OutputMode.TEXT)


def test_an_unknown_route_has_no_reply_shape() -> None:
    with pytest.raises(KeyError):
        reply.reply_shape("/v1/unknown", Route.GENERATE, wrap=True)  # type: ignore[arg-type]


def test_pipeline_phases_names_each_call_and_its_worker() -> None:
    assert pipeline_phases(GENERATE_PD) == {
        Phase.RENDER: "render",
        Phase.PREFILL: "prefill",
        Phase.DECODE: "decode",
    }
    assert list(pipeline_phases(parse_pipeline_params({"encode": {}, "decode": {}}))) == [
        Phase.ENCODE,
        Phase.DECODE,
    ]


# ---- adding a phase: one row, its builder and its reader (the conditional decode's) ---------

CONDITIONAL_PD = parse_pipeline_params(
    {"conditional-decode": {}, "prefill": {}, "decode": {"wrap_chat_completion": True}},
    use_openai_format=False,
)
HIT = (
    b'{"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "choices": []}'
)
HIT_CHUNK = fixture_bytes("chat-completion-chunk-coupled.json")


def _holding(answer: tuple[int, Any, Any]) -> Any:
    """A worker answering a conditional decode with ``answer``, any other call as WORKER."""

    def answering(method: str, path: str, headers: Any, sent: bytes) -> Any:
        if dict(headers).get("prefer") == "if-available":
            return answer
        return WORKER(method, path, headers, sent)

    return answering


def _client_body(**fields: Any) -> bytes:
    body = json.loads(fixture_bytes("render-chat-request.json"))
    body["kv_transfer_params"] = {"remote_host": "client's own"}
    return json.dumps({**body, **fields}).encode()


def test_a_conditional_decode_runs_first_with_the_client_body_on_its_own_route() -> None:
    out = drive(Exchange(CONDITIONAL_PD, CHAT, {}, _client_body()), _holding((412, {}, b"")))
    assert [c.step for c in out.calls] == ["conditional-decode", "render", "prefill", "decode"]
    first = out.call("conditional-decode")
    assert (first.path, first.stream) == (CHAT, False)
    assert dict(first.headers)["prefer"] == "if-available"
    sent = json.loads(_client_body())
    del sent["kv_transfer_params"]  # the client's transfer params are never sent on
    assert json.loads(first.body) == sent
    # 412: no decode worker holds the prompt's KV; the plan goes on as configured.
    assert out.status == 200
    assert out.json()["choices"][0]["message"]["content"] == "Hello!"


def test_render_first_runs_render_before_the_conditional_decode() -> None:
    # A coordinator document that lists render first runs it first (docs/llm-d.md).
    settings = ExchangeSettings(render_first=True)
    exchange = Exchange(CONDITIONAL_PD, CHAT, {}, _client_body(), settings=settings)
    out = drive(exchange, _holding((412, {}, b"")))
    assert [c.step for c in out.calls] == ["render", "conditional-decode", "prefill", "decode"]
    assert out.status == 200
    hit = drive(
        Exchange(CONDITIONAL_PD, CHAT, {}, _client_body(), settings=settings),
        _holding((200, {"content-type": "application/json"}, HIT)),
    )
    assert [c.step for c in hit.calls] == ["render", "conditional-decode"]


def test_a_conditional_decode_that_trusts_the_client_sends_its_transfer_params() -> None:
    trusting = parse_pipeline_params(
        {"conditional-decode": {"trust_client_transfer_params": True}, "decode": {}}
    )
    out = drive(Exchange(trusting, CHAT, {}, _client_body()), _holding((200, {}, HIT)))
    assert json.loads(out.call("conditional-decode").body) == json.loads(_client_body())


def test_a_conditional_decode_answer_is_the_reply() -> None:
    out = drive(Exchange(CONDITIONAL_PD, CHAT, {}, _client_body()), _holding((200, {}, HIT)))
    assert [c.step for c in out.calls] == ["conditional-decode"]
    assert (out.status, json.loads(out.body)) == (200, json.loads(HIT))


def test_a_streamed_conditional_decode_answer_is_the_clients_stream() -> None:
    stream = [b"data: " + HIT_CHUNK + b"\n\n", b"data: [DONE]\n\n"]
    body = _client_body(stream=True)
    out = drive(Exchange(CONDITIONAL_PD, CHAT, {}, body), _holding((200, {}, iter(stream))))
    assert [c.step for c in out.calls] == ["conditional-decode"]
    assert out.calls[0].stream
    assert out.streamed
    assert out.body == b"".join(stream)


def test_a_conditional_decode_stream_that_breaks_is_named_in_its_error_event() -> None:
    good = b"data: " + HIT_CHUNK + b"\n\n"
    stream = iter([good, b"data: {not json\n\n"])
    body = _client_body(stream=True)
    out = drive(Exchange(CONDITIONAL_PD, CHAT, {}, body), _holding((200, {}, stream)))
    assert out.streamed
    assert out.body.startswith(good)
    assert b"conditional-decode broke the contract" in out.body


def test_a_streamed_conditional_decode_412_goes_on_with_the_plan() -> None:
    body = _client_body(stream=True)
    missed = _holding((412, {}, iter([b'{"error": "not here"}'])))
    generate_stream = load_stream("generate-stream-usage.sse")

    def worker(method: str, path: str, headers: Any, sent: bytes) -> Any:
        if path == "/inference/v1/generate" and json.loads(sent).get("stream"):
            return (200, {}, iter([generate_stream]))
        return missed(method, path, headers, sent)

    out = drive(Exchange(CONDITIONAL_PD, CHAT, {}, body), worker)
    assert [c.step for c in out.calls] == ["conditional-decode", "render", "prefill", "decode"]
    assert out.streamed
    assert out.status == 200


@pytest.mark.parametrize("stream", [False, True])
def test_a_conditional_decode_5xx_is_a_502_in_the_clients_shape(stream: bool) -> None:
    ex = Exchange(CONDITIONAL_PD, CHAT, {}, _client_body(stream=stream))
    out = drive(ex, _holding((503, {}, iter([b'{"error": {"message": "busy"}}']))))
    assert [c.step for c in out.calls] == ["conditional-decode"]
    assert out.status == 502
    message = out.json()["error"]["message"]
    assert message == "conditional-decode failed with HTTP 503: busy"


def test_a_conditional_decode_4xx_is_relayed_as_the_clients_error() -> None:
    error = b'{"error": {"message": "bad", "type": "BadRequestError", "param": "x"}}'
    out = drive(Exchange(CONDITIONAL_PD, CHAT, {}, _client_body()), _holding((400, {}, error)))
    assert out.status == 400
    assert out.json()["error"]["param"] == "x"


def test_pipeline_phases_sends_a_conditional_decode_to_the_decode_worker() -> None:
    assert pipeline_phases(CONDITIONAL_PD) == {
        Phase.CONDITIONAL_DECODE: "decode",
        Phase.RENDER: "render",
        Phase.PREFILL: "prefill",
        Phase.DECODE: "decode",
    }


def test_the_phase_follows_the_calls() -> None:
    ex = Exchange(GENERATE_PD, CHAT, {}, fixture_bytes("render-chat-request.json"))
    phases = [ex.phase]
    for answer in ("render-chat-response.json", "generate-prefill-response.json"):
        ex.receive(200, {}, fixture_bytes(answer))
        phases.append(ex.phase)
    ex.receive(200, {}, fixture_bytes("generate-decode-response.json"))
    phases.append(ex.phase)
    assert phases == [Phase.RENDER, Phase.PREFILL, Phase.DECODE, Phase.REPLIED]
    assert ex.reply_over

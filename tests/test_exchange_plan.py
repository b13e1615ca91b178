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

from disagg_transforms import ConfigError, OutputMode, Route, parse_pipeline_params
from disagg_transforms._exchange import reply
from disagg_transforms._exchange.flow import PlanRow, _Calling
from disagg_transforms._request import caps, client, legs
from disagg_transforms._response import dispatch
from disagg_transforms.exchange import ClientReply, Exchange, Phase, WorkerCall, pipeline_phases
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
def test_the_mapper_and_the_caps_run_once_per_request(
    monkeypatch: pytest.MonkeyPatch, path: str, body: bytes
) -> None:
    calls: list[str] = []
    mappers = {
        route: None if mapper is None else _counted(calls, "mapper", mapper)
        for route, mapper in client.CLIENT_MAPPERS.items()
    }
    monkeypatch.setattr(client, "CLIENT_MAPPERS", mappers)
    monkeypatch.setattr(client, "client_caps", _counted(calls, "caps", client.client_caps))
    out = drive(Exchange(GENERATE_PD, path, {}, body), WORKER)
    assert out.status == 200, out.body
    assert [call.step for call in out.calls][-2:] == ["prefill", "decode"]  # two legs built
    expected = ["mapper", "caps"] if path == CHAT else ["caps"]
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


# ---- adding a phase: one row, its builder and its reader -----------------------------------


def _probe_call(ex: Exchange) -> _Calling:
    """A conditional decode's call: the client's body on its own route, if a worker has it."""
    request = ex._client
    return _Calling(
        WorkerCall(
            step=Phase.CONDITIONAL_DECODE,
            method="POST",
            path=request.route.value,
            headers=(*ex._forward, ("prefer", "if-available")),
            body=json.dumps(dict(request.body)).encode(),
            stream=False,
        )
    )


def _read_probe(ex: Exchange, status: int, body: bytes) -> Phase | None:
    if status == 412:  # no decode worker holds this prompt: go on with the plan
        return None
    headers = (("content-type", "application/json"), ("x-request-id", ex.request_id))
    ex._reply(ClientReply(status=status, headers=headers, body=body), drops_stream=False)
    return Phase.REPLIED


class _Probing(Exchange):
    _plan = {  # noqa: RUF012 - the class's plan, as Exchange's
        Phase.CONDITIONAL_DECODE: PlanRow(
            runs=lambda _: True,
            build=_probe_call,
            read=_read_probe,
            statuses={*range(200, 300), 412},
        ),
        **Exchange._plan,
    }


def test_a_phase_is_one_row_its_builder_and_its_reader() -> None:
    body = fixture_bytes("render-chat-request.json")
    hit = b'{"id": "chatcmpl-1", "object": "chat.completion", "choices": []}'

    def worker(answer: tuple[int, Any, bytes]) -> Any:
        def answering(method: str, path: str, headers: Any, sent: bytes) -> Any:
            if dict(headers).get("prefer") == "if-available":
                return answer
            return WORKER(method, path, headers, sent)

        return answering

    missed = drive(_Probing(GENERATE_PD, CHAT, {}, body), worker((412, {}, b"")))
    assert [c.step for c in missed.calls] == ["conditional-decode", "render", "prefill", "decode"]
    assert missed.status == 200
    assert missed.json()["choices"][0]["message"]["content"] == "Hello!"
    found = drive(_Probing(GENERATE_PD, CHAT, {}, body), worker((200, {}, hit)))
    assert [c.step for c in found.calls] == ["conditional-decode"]
    assert (found.status, found.body) == (200, hit)
    failed = drive(_Probing(GENERATE_PD, CHAT, {}, body), worker((503, {}, b"")))
    assert failed.status == 502
    assert failed.json()["error"]["message"].startswith("conditional-decode failed with HTTP 503")


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

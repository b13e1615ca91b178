"""No internal address reaches a client: a worker the proxy could not reach, or that failed in
transport, is named by its step and the kind of failure; its address and the transport's own
exception go to the log (docs/proxy.md, "Errors")."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from disagg_transforms import parse_pipeline_params

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
from proxy_helpers import served
from starlette.testclient import TestClient

from disagg_transforms.integrations.proxy import SidecarSeat, create_app

_BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": "m", "prompt": "hi"},
    "/v1/responses": {"model": "m", "input": "hi"},
    "/v1/messages": {
        "model": "m",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}],
    },
}
# What would betray the worker or the transport: its host, its port, an aiohttp class name.
_LEAKS = re.compile(r"127\.0\.0\.1|localhost|Client\w*Error|Server\w*Error|Errno|Cannot connect")


@pytest.fixture
def closed_url() -> Iterator[str]:
    """A worker URL whose port is bound but does not listen: every connection is refused."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def _port(url: str) -> str:
    return url.rsplit(":", 1)[1]


def _assert_clean(text: str, url: str) -> None:
    assert not _LEAKS.search(text), text
    assert _port(url) not in text, text


@pytest.mark.parametrize("path", sorted(_BODIES))
def test_an_unreachable_decode_worker_is_named_by_step_and_kind(
    path: str, closed_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(parse_pipeline_params({"decode": {}}), decode_url=closed_url)
    with caplog.at_level(logging.WARNING, "disagg_transforms.proxy"), TestClient(app) as client:
        answer = client.post(path, json=_BODIES[path])
    assert answer.status_code == 502
    error = answer.json()["error"]
    assert error["message"] == "decode failed: could not connect to the worker"
    if path == "/v1/messages":
        assert (answer.json()["type"], error["type"]) == ("error", "api_error")
    _assert_clean(answer.text, closed_url)
    # The log has what the client is not told.
    assert f"decode call to {closed_url} failed: ClientConnectorError" in caplog.text


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/models"), ("GET", "/version")])
def test_a_relayed_route_names_no_address(
    method: str, path: str, closed_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(parse_pipeline_params({"decode": {}}), decode_url=closed_url)
    with caplog.at_level(logging.WARNING, "disagg_transforms.proxy"), TestClient(app) as client:
        answer = client.request(method, path)
    assert answer.status_code == 502
    assert answer.json()["error"]["message"].endswith("failed: could not connect to the worker")
    _assert_clean(answer.text, closed_url)
    assert closed_url in caplog.text


def test_the_render_step_is_named_on_the_generate_pipeline(closed_url: str) -> None:
    config = parse_pipeline_params({"decode": {"output_mode": "auto"}}, use_openai_format=False)
    app = create_app(config, decode_url=closed_url)
    with TestClient(app) as client:
        answer = client.post("/v1/messages", json=_BODIES["/v1/messages"])
    assert answer.status_code == 502
    assert answer.json()["error"]["message"] == "render failed: could not connect to the worker"
    _assert_clean(answer.text, closed_url)


def test_the_sidecar_seat_names_no_prefill_address(
    closed_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The prefill worker is the one llm-d's picker names: a pod IP in a cluster.
    config = parse_pipeline_params({"prefill": {}, "decode": {}}, use_openai_format=True)
    with served(_Never()) as decode_url:
        app = create_app(config, decode_url=decode_url, sidecar=SidecarSeat())
        header = {"x-prefiller-host-port": closed_url.removeprefix("http://")}
        with caplog.at_level(logging.WARNING, "disagg_transforms.proxy"), TestClient(app) as c:
            answer = c.post(
                "/v1/chat/completions", json=_BODIES["/v1/chat/completions"], headers=header
            )
    assert answer.status_code == 502
    assert answer.json()["error"]["message"] == "prefill failed: could not connect to the worker"
    _assert_clean(answer.text, closed_url)
    assert closed_url in caplog.text


def test_gateway_mode_names_no_gateway_address(closed_url: str) -> None:
    config = parse_pipeline_params({"decode": {}}, use_openai_format=True)
    app = create_app(config, gateway_url=closed_url)
    with TestClient(app) as client:
        answer = client.post("/v1/responses", json=_BODIES["/v1/responses"])
    assert answer.status_code == 502
    assert answer.json()["error"]["message"] == "decode failed: could not connect to the worker"
    _assert_clean(answer.text, closed_url)


class _Never:
    """A worker that is never called (the test fails before its leg)."""

    async def __call__(self, scope: dict[str, Any], *_: object) -> None:
        raise AssertionError(scope)


class _CutMidStream:
    """A worker whose stream breaks off after its first event: the connection goes."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        del receive
        assert scope["type"] == "http"
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        chunk = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": "a"}}],
        }
        import json  # noqa: PLC0415

        event = f"data: {json.dumps(chunk)}\n\n".encode()
        await send({"type": "http.response.body", "body": event, "more_body": True})
        await asyncio.sleep(0.05)
        msg = "the worker dies mid-stream"
        raise RuntimeError(msg)


def test_a_stream_cut_in_transport_ends_with_an_event_naming_no_address(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = parse_pipeline_params({"decode": {}}, use_openai_format=True)
    with served(_CutMidStream()) as url:
        app = create_app(config, decode_url=url)
        body = {**_BODIES["/v1/chat/completions"], "stream": True}
        with caplog.at_level(logging.WARNING, "disagg_transforms.proxy"), TestClient(app) as c:
            answer = c.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200
    error_events = [line for line in answer.text.splitlines() if '"error"' in line]
    assert len(error_events) == 1, answer.text
    assert "decode failed: " in error_events[0]
    _assert_clean(answer.text, url)
    assert url in caplog.text

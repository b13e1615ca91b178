"""``serve`` reads a worker's stream as it arrives: in whole socket reads, under an idle deadline.

The worker is the simulated one, run in this process behind a wrapper that changes only how its
streamed answer reaches the socket (the client's ``x-delivery`` header, which the proxy passes
on): ``coalesced``, the whole stream in one write; ``split``, one event a write with a pause
between; ``stall``, three writes, then nothing for 30 s. ``serve`` runs as its own process,
with the default pipeline (render, prefill, decode in generate form, wrapped into chat chunks).
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from proxy_helpers import Server, running, served

from disagg_transforms.testing import SimulatedWorker

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

BODY: Any = {
    "model": "m",
    "messages": [{"role": "user", "content": "Tell me a story"}],
    "max_tokens": 24,
    "stream": True,
}
IDLE_TIMEOUT = "0.5"  # the stalling proxy's, against a worker silent for 30 s
STALL_SECONDS = 30.0
_CREATED = re.compile(rb'"created":\d+')


class _Delivery:
    """The simulated worker, its streamed answers written as ``x-delivery`` asks."""

    def __init__(self) -> None:
        self.worker = SimulatedWorker()
        self.release = threading.Event()  # ends a stall at teardown

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        delivery = dict(scope.get("headers", ())).get(b"x-delivery", b"").decode()
        bodies: list[bytes] = []

        async def collect(message: Any) -> None:
            if message["type"] != "http.response.body":
                await send(message)
                return
            bodies.append(message.get("body", b""))
            if not message.get("more_body", False):
                await self._deliver(delivery, b"".join(bodies), send)

        await self.worker(scope, receive, collect)

    async def _deliver(self, delivery: str, body: bytes, send: Any) -> None:
        events = [event + b"\n\n" for event in body.split(b"\n\n") if event]
        if delivery == "split" and len(events) > 1:
            for event in events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
                await asyncio.sleep(0.005)
            body = b""
        elif delivery == "stall" and len(events) > 3:
            for event in events[:3]:
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await asyncio.to_thread(self.release.wait, STALL_SECONDS)
            body = b"".join(events[3:])
        await send({"type": "http.response.body", "body": body, "more_body": False})


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    """A proxy with the default timeouts and one whose idle timeout is 0.5 s, one worker."""
    logs = tmp_path_factory.mktemp("streams")
    worker = _Delivery()
    with served(worker) as url:
        try:
            args = ["serve", "--port", "0", "--decode-url", url, "--prefill-url", url]
            with running(
                (args, logs / "proxy.log"),
                ([*args, "--idle-timeout", IDLE_TIMEOUT], logs / "stalling.log"),
            ) as (proxy, stalling):
                yield proxy, stalling
        finally:
            worker.release.set()


def _stream(proxy: Server, delivery: str, request_id: str) -> bytes:
    headers = {"x-delivery": delivery, "x-request-id": request_id}
    url = proxy.url + "/v1/chat/completions"
    with httpx.stream("POST", url, json=BODY, headers=headers, timeout=20) as answer:
        assert answer.status_code == 200
        return answer.read()


def test_a_stream_in_one_read_gives_the_client_the_bytes_of_one_event_a_read(
    fleet: tuple[Server, Server],
) -> None:
    proxy, _ = fleet
    coalesced = _stream(proxy, "coalesced", "same-id")
    split = _stream(proxy, "split", "same-id")
    assert coalesced.count(b"data: ") > 3  # a stream of several chunks, not one frame
    assert coalesced.endswith(b"data: [DONE]\n\n")
    assert _CREATED.sub(b"", coalesced) == _CREATED.sub(b"", split)


def test_a_worker_silent_past_the_idle_timeout_ends_the_stream_with_the_error_event(
    fleet: tuple[Server, Server],
) -> None:
    _, stalling = fleet
    content = _stream(stalling, "stall", "stalled-1")
    events = [event for event in content.split(b"\n\n") if event]
    assert events[-1] == b"data: [DONE]"
    assert b'"error"' in events[-2]
    assert b"no answer within the timeout" in events[-2]
    assert b'"code":504' in events[-2].replace(b" ", b"")
    assert any(b'"delta"' in event for event in events[:-2])  # chunks came before the stall
    line = stalling.wait_for_log("stalled-1 POST")
    assert "stream=worker-failed (no answer within the timeout" in line

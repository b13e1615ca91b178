"""Drive an Exchange synchronously against a pluggable worker: (method, path, headers, body).

A worker answers ``(status, headers, bytes)`` or ``(status, headers, iterator of bytes)``; a
streamed call is fed chunk by chunk. The simulated vLLM worker (``disagg_transforms.testing``)
plugs in here the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from golden import load_fixture

from disagg_transforms.exchange import ClientReply, Driver, Exchange, WorkerCall

Answer = tuple[int, Any, "bytes | Iterable[bytes]"]
Worker = Callable[[str, str, tuple[tuple[str, str], ...], bytes], Answer]


@dataclass
class Outcome:
    """What the client got, and every worker call made on the way."""

    status: int
    headers: dict[str, str]
    body: bytes
    calls: list[WorkerCall] = field(default_factory=list)
    streamed: bool = False

    def json(self) -> Any:
        return json.loads(self.body)

    def call(self, step: str) -> WorkerCall:
        return next(c for c in self.calls if c.step == step)

    def leg(self, step: str) -> Any:
        return json.loads(self.call(step).body)


def _chunks(body: bytes | Iterable[bytes]) -> Iterator[bytes]:
    if isinstance(body, bytes):
        yield body
    else:
        yield from body


def drive(ex: Exchange, worker: Worker) -> Outcome:
    """Run the exchange to its end; the client's bytes are collected as they are released."""
    driver = Driver(ex)
    calls: list[WorkerCall] = []
    sent = bytearray()
    while (call := driver.next_call()) is not None:
        calls.append(call)
        status, headers, body = worker(call.method, call.path, call.headers, call.body)
        if not call.stream:
            driver.answered(status, headers, b"".join(_chunks(body)))
            continue
        driver.stream_opened(status, headers)
        for chunk in (*_chunks(body), None):
            opening = driver.opening
            if not (opening or driver.relaying):
                break
            piece = driver.chunk(chunk)
            assert not (opening and piece), "nothing reaches the client before its head"
            sent += piece
    reply = driver.reply()
    if isinstance(reply, ClientReply):
        assert not sent
        return Outcome(reply.status, dict(reply.headers), reply.body, calls)
    assert ex.reply_over, "the worker's stream was read to its end"
    body = reply.first + bytes(sent)
    return Outcome(reply.status, dict(reply.headers), body, calls, streamed=True)


def fixture_bytes(name: str) -> bytes:
    return json.dumps(load_fixture(name)).encode()


def scripted(answers: dict[str, Answer]) -> Worker:
    """A worker answering by the call's path: ``render``, ``generate`` (prefill/decode told
    apart by their one-token cap), or any exact path."""

    def worker(method: str, path: str, headers: Any, body: bytes) -> Answer:  # noqa: ARG001
        assert method == "POST"
        if path.endswith("/render"):
            return answers["render"]
        leg = json.loads(body)
        if path == "/inference/v1/generate":
            prefill = leg.get("kv_transfer_params", {}).get("do_remote_decode") is True
            return answers["prefill" if prefill else "decode"]
        return answers[path]

    return worker

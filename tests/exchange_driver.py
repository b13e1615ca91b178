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

from disagg_transforms.exchange import ClientReply, ClientStream, Exchange, NeedData, WorkerCall

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
    calls: list[WorkerCall] = []
    while True:
        event = ex.next_event()
        if isinstance(event, ClientReply):
            return Outcome(event.status, dict(event.headers), event.body, calls)
        assert isinstance(event, WorkerCall), event
        calls.append(event)
        status, headers, body = worker(event.method, event.path, event.headers, event.body)
        if not event.stream:
            ex.receive(status, headers, b"".join(_chunks(body)))
            continue
        ex.receive_stream_head(status, headers)
        out = bytearray()
        head: ClientStream | None = None
        for chunk in _chunks(body):
            piece = ex.feed(chunk)
            if head is None:
                now = ex.next_event()
                if isinstance(now, ClientReply):
                    assert piece == b""
                    return Outcome(now.status, dict(now.headers), now.body, calls)
                if isinstance(now, ClientStream):
                    head = now
                    out += now.first
                else:
                    assert isinstance(now, NeedData)
                    assert piece == b""  # nothing reaches the client before its head
            out += piece
        tail = ex.end_of_stream()
        final = ex.next_event()
        if isinstance(final, ClientReply):
            assert head is None
            return Outcome(final.status, dict(final.headers), final.body, calls)
        assert isinstance(final, ClientStream)
        if head is None:
            out += final.first
        out += tail
        return Outcome(final.status, dict(final.headers), bytes(out), calls, streamed=True)


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

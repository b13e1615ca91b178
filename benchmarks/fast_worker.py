"""A fast fake vLLM worker for ``benchmarks/proxy.py``: the simulated worker's answers, replayed.

Usage: ``python benchmarks/fast_worker.py [--sglang prefill|decode] [--context N]`` prints
``listening on http://127.0.0.1:PORT`` once it listens (with ``--sglang``: that role of a simulated
SGLang P/D pair, ``sglang_worker``; ``--context``: the vLLM worker's context length). The simulated
worker (``disagg_transforms.testing``) builds a whole stream before its first byte and spends 17-19
ms of CPU on a 256-token stream, which is most of a c1 time to first token and costs the targets CPU
when they share its core. This one asks it once per kind of request, in process, and from then on
writes its answer pre-encoded: a raw asyncio protocol (uvloop when installed), a minimal HTTP/1.1
parser, no ASGI. A kind is the request's method, path and JSON body without the fields a proxy gives
each request a new value (``_VOLATILE``), so every route the targets call is answered exactly as the
simulated worker answers it: render, prefill (with ``kv_transfer_params``), decode in text mode
(whole and SSE, ``output_mode`` echoed), the OpenAI chat route and whatever a target checks at
start.

A stream's first chunk goes out with the status line, at once; the others follow as one write each,
back to back, as fast as the socket takes them (no gap: the time to the first token measures the
hops, not a model; the receiving proxy reads as many chunks at a time as have arrived, as it would
from the simulated worker, whose server writes one event a send too).
"""

from __future__ import annotations

import argparse
import asyncio
import http
import socket
import sys
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, cast

import orjson

_VOLATILE = frozenset({"request_id", "rid", "bootstrap_room"})
"""Body fields (at any depth) a target sets anew on each request; not part of a request's kind
(SGLang's ``rid`` and ``bootstrap_room`` too)."""
MAX_TOKENS = 256
"""The answer's length: the simulated model writes ``MAX_TOKENS - 1`` bytes, then <|im_end|>."""


@dataclass(frozen=True)
class Reply:
    """A recorded answer, pre-encoded: the writes that send it, the first with the status line."""

    writes: tuple[bytes, ...]


Kind = tuple[bytes, bytes, bytes]
"""A request's method, target and body less ``_VOLATILE`` (sorted keys)."""


def request_kind(method: bytes, target: bytes, body: bytes) -> Kind:
    """What decides the answer's shape: the method, the target and the body less ``_VOLATILE``."""
    if not body:
        return method, target, b""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return method, target, body
    return method, target, orjson.dumps(_without_volatile(parsed), option=orjson.OPT_SORT_KEYS)


def _without_volatile(value: Any) -> Any:  # noqa: ANN401 - any JSON value
    if isinstance(value, dict):
        return {k: _without_volatile(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_without_volatile(v) for v in value]
    return value


def encode(status: int, headers: list[tuple[bytes, bytes]], parts: list[bytes]) -> Reply:
    """An ASGI answer as HTTP/1.1 writes: one body part with a length, several chunked."""
    kept = b"".join(
        b"%s: %s\r\n" % (name, value)
        for name, value in headers
        if name.lower() not in {b"content-length", b"transfer-encoding", b"date", b"server"}
    )
    head = b"HTTP/1.1 %d %s\r\n%s" % (status, http.HTTPStatus(status).phrase.encode(), kept)
    parts = [part for part in parts if part]
    if len(parts) <= 1:
        content = parts[0] if parts else b""
        return Reply((head + b"content-length: %d\r\n\r\n" % len(content) + content,))
    chunks = [b"%x\r\n%s\r\n" % (len(part), part) for part in parts]
    chunks[0] = head + b"transfer-encoding: chunked\r\n\r\n" + chunks[0]
    chunks[-1] += b"0\r\n\r\n"
    return Reply(tuple(chunks))


async def record(
    app: Any,  # noqa: ANN401 - an ASGI application
    method: bytes,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
) -> Reply:
    """Ask the ASGI ``app`` once and keep its answer."""
    path, _, query = target.partition(b"?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method.decode(),
        "scheme": "http",
        "path": path.decode(),
        "raw_path": path,
        "query_string": query,
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
    }
    given = False

    async def receive() -> dict[str, Any]:
        nonlocal given
        if given:  # the client stays connected
            await asyncio.Event().wait()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    status = 500
    answer_headers: list[tuple[bytes, bytes]] = []
    parts: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, answer_headers
        if message["type"] == "http.response.start":
            status, answer_headers = message["status"], list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            parts.append(bytes(message.get("body", b"")))

    await app(scope, receive, send)
    return encode(status, answer_headers, parts)


class Replayer:
    """The answers recorded so far, by request kind, and the app that records a new kind."""

    def __init__(self, app: Any) -> None:  # noqa: ANN401 - an ASGI application
        self.app = app
        self.replies: dict[Kind, Reply] = {}
        self.recording: dict[Kind, asyncio.Future[Reply]] = {}

    def record(
        self, kind: Kind, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> asyncio.Future[Reply]:
        """The answer to a new kind of request, recorded once however many ask at a time."""
        if kind not in self.recording:
            method, target, _ = kind
            self.recording[kind] = task = asyncio.ensure_future(
                record(self.app, method, target, headers, body)
            )
            task.add_done_callback(lambda done: self.replies.setdefault(kind, done.result()))
            # on stderr: a kind recorded again and again has a field missing from _VOLATILE
            print(f"recording #{len(self.recording)}: {kind!r:.2000}", file=sys.stderr)
        return self.recording[kind]

    def connection(self) -> Connection:
        return Connection(self)


class Connection(asyncio.Protocol):
    """One client connection: requests in order, one at a time (no client here pipelines)."""

    def __init__(self, replayer: Replayer) -> None:
        self.replayer = replayer
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.recording = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.recording:
            self.answer_buffered()

    def answer_buffered(self) -> None:
        """Answer each whole request in the buffer; record a new kind, then go on."""
        assert self.transport is not None
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(self.buffer[:end]).split(b"\r\n")
            method, target, _ = lines[0].split(b" ", 2)
            headers = []
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name, value = name.strip().lower(), value.strip()
                headers.append((name, value))
                if name == b"content-length":
                    length = int(value)
                elif name == b"transfer-encoding":  # no target sends a chunked body
                    self.transport.write(
                        b"HTTP/1.1 411 Length Required\r\ncontent-length: 0\r\n\r\n"
                    )
                    self.transport.close()
                    return
            if len(self.buffer) < end + 4 + length:
                return
            body = bytes(self.buffer[end + 4 : end + 4 + length])
            del self.buffer[: end + 4 + length]
            kind = request_kind(method, target, body)
            reply = self.replayer.replies.get(kind)
            if reply is None:
                self.recording = True
                self.replayer.record(kind, headers, body).add_done_callback(self.recorded)
                return
            for write in reply.writes:
                self.transport.write(write)

    def recorded(self, done: asyncio.Future[Reply]) -> None:
        reply = done.result()
        assert self.transport is not None
        if self.transport.is_closing():  # the client left while the answer was recorded
            return
        for write in reply.writes:
            self.transport.write(write)
        self.recording = False
        self.answer_buffered()


def simulated_worker(max_model_len: int = 4096) -> Any:  # noqa: ANN401 - an ASGI application
    """The simulated worker whose answers are replayed, its answer ``MAX_TOKENS`` tokens long."""
    from disagg_transforms.testing import SimulatedWorker, WorkerSettings  # noqa: PLC0415

    settings = WorkerSettings(answer="x" * (MAX_TOKENS - 1), max_model_len=max_model_len)
    return SimulatedWorker(settings)  # a token a byte


SGLANG_ANSWER_TOKENS = 8192
"""The simulated SGLang model's answer (a token a byte): the request's cap cuts it."""


def sglang_worker(role: str) -> Any:  # noqa: ANN401 - an ASGI application
    """One role (``prefill`` or ``decode``) of a simulated SGLang P/D pair, as an ASGI app.

    A request that carries a ``bootstrap_room`` goes to both workers of a pair in this process,
    so that they meet; the role's answer is kept, the other's dropped. Others go to the role.
    """
    from disagg_transforms.testing import SimulatedSglangWorker, WorkerSettings  # noqa: PLC0415

    settings = WorkerSettings(
        answer="x" * (SGLANG_ANSWER_TOKENS - 1), max_model_len=2 * SGLANG_ANSWER_TOKENS
    )
    prefill = SimulatedSglangWorker(settings, disaggregation_mode="prefill")
    decode = SimulatedSglangWorker(
        settings, disaggregation_mode="decode", prefills={("pair", 1): prefill}
    )
    kept, dropped = (prefill, decode) if role == "prefill" else (decode, prefill)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:  # noqa: ANN401
        if scope["type"] != "http":
            await kept(scope, receive, send)
            return
        message: dict[str, Any] = dict(await receive())
        parsed = orjson.loads(message["body"]) if message.get("body") else None
        if isinstance(parsed, dict) and "bootstrap_room" in parsed:
            parsed.update(bootstrap_host="pair", bootstrap_port=1)
            message = {**message, "body": orjson.dumps(parsed)}

        async def again() -> dict[str, Any]:
            return message

        async def drop(_: MutableMapping[str, Any]) -> None:
            return

        if parsed is None or "bootstrap_room" not in parsed:
            await kept(scope, again, send)
            return
        await asyncio.gather(kept(scope, again, send), dropped(scope, again, drop))

    return app


async def serve(protocol: Callable[[], asyncio.Protocol]) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(protocol, "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(f"listening on http://127.0.0.1:{port}", flush=True)
    await server.serve_forever()


def main() -> int:
    try:
        import uvloop  # noqa: PLC0415 - the bench extra; asyncio's own loop without it
    except ImportError:
        runner: Callable[..., None] = asyncio.run
    else:
        runner = uvloop.run
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sglang", choices=("prefill", "decode"), help="an SGLang pair's role")
    parser.add_argument("--context", type=int, default=4096, help="the vLLM worker's context")
    args = parser.parse_args()
    app = sglang_worker(args.sglang) if args.sglang else simulated_worker(args.context)
    runner(serve(Replayer(app).connection))
    return 0


if __name__ == "__main__":
    sys.exit(main())

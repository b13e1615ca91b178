"""The exchange's own cost on the default pipeline, apart from any I/O.

Usage: ``python benchmarks/exchange.py [--quick]``. Drives whole :class:`Exchange` runs for the
default pipeline of ``disagg-transforms serve`` (render, prefill, decode; decode in ``auto``
mode, chat wrapped) with a chat client whose one user message renders to 1k tokens, the answer
256 tokens long, whole and streamed. The worker's answers are the simulated worker's, recorded
once up front (a streamed answer cut into one chunk per event, as vLLM sends them) and replayed
from memory, so what is timed is the exchange and its :class:`Driver` alone. Each run is
compared with the bodies' own JSON parse cost: ``orjson.loads`` of the client body and of every
answer (of every event's payload for a stream). Prints a table (docs/performance.md, "The
exchange's own cost").
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout

import harness
import proxy
from fast_worker import MAX_TOKENS, simulated_worker

from disagg_transforms import ClientStream, Driver, Exchange, parse_pipeline_params

# What `disagg-transforms serve` runs given a prefill and a decode URL (docs/proxy.md).
PIPELINE = parse_pipeline_params(
    {"prefill": {}, "decode": {"output_mode": "auto", "wrap_chat_completion": True}},
    use_openai_format=False,
)
CHAT = "/v1/chat/completions"
CLIENT_HEADERS = ((b"content-type", b"application/json"), (b"x-request-id", b"bench-1"))


@dataclass(frozen=True)
class Answer:
    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    chunks: tuple[bytes, ...]
    """The whole body as one chunk, or a stream's events one chunk each."""


def _events(body: bytes) -> tuple[bytes, ...]:
    return tuple(event + b"\n\n" for event in body.split(b"\n\n") if event)


async def _record_async(body: bytes) -> list[Answer]:
    worker = simulated_worker()
    drive = Driver(Exchange(PIPELINE, CHAT, CLIENT_HEADERS, body))
    answers = []
    transport = httpx.ASGITransport(app=worker)
    async with httpx.AsyncClient(transport=transport, base_url="http://worker") as http:
        while (call := drive.next_call()) is not None:
            request = http.build_request(
                call.method, call.path, headers=list(call.headers), content=call.body
            )
            response = await http.send(request)
            content = response.content
            chunks = _events(content) if call.stream else (content,)
            answer = Answer(response.status_code, tuple(response.headers.raw), chunks)
            answers.append(answer)
            _feed(drive, call.stream, answer)
    return answers


def _feed(drive: Driver, stream: bool, answer: Answer) -> int:
    """Hand the driver one call's answer; the count of client bytes it gave after the head."""
    if not stream:
        drive.answered(answer.status, answer.headers, answer.chunks[0])
        return 0
    drive.stream_opened(answer.status, answer.headers)
    sent = 0
    for chunk in (*answer.chunks, None):
        if not (drive.opening or drive.relaying):
            break
        sent += len(drive.chunk(chunk))
    return sent


def record(*, stream: bool) -> tuple[bytes, list[Answer]]:
    """The client body and the worker's answer to each call, from the simulated worker."""
    body = proxy.body(stream=stream)
    return body, asyncio.run(_record_async(body))


def run_exchange(body: bytes, answers: list[Answer]) -> int:
    """One request driven to its end from recorded answers; the client's byte count."""
    drive = Driver(Exchange(PIPELINE, CHAT, CLIENT_HEADERS, body))
    sent = 0
    replayed = iter(answers)
    while (call := drive.next_call()) is not None:
        sent += _feed(drive, call.stream, next(replayed))
    reply = drive.reply()
    if isinstance(reply, ClientStream):
        return sent + len(reply.first)
    if reply.status != 200:
        msg = f"the exchange refused the replayed request: {reply.body!r}"
        raise AssertionError(msg)
    return len(reply.body)


def _payloads(answer: Answer) -> list[bytes]:
    if len(answer.chunks) == 1:
        return [answer.chunks[0]]
    return [
        event[len(b"data: ") : -2]
        for event in answer.chunks
        if event.startswith(b"data: {")  # `[DONE]` is no JSON
    ]


def parse_bodies(body: bytes, answers: list[Answer]) -> None:
    """The floor: every body the exchange reads, parsed once with orjson."""
    orjson.loads(body)
    for answer in answers:
        for payload in _payloads(answer):
            orjson.loads(payload)


@dataclass(frozen=True)
class Row:
    case: str
    calls: int
    chunks: int
    exchange: float
    parse: float


def measure(*, quick: bool) -> list[Row]:
    rows = []
    for stream in (False, True):
        body, answers = record(stream=stream)
        if run_exchange(body, answers) == 0:
            msg = "the replayed exchange sent the client nothing"
            raise AssertionError(msg)
        funcs: dict[str, Callable[[], object]] = {
            "exchange": partial(run_exchange, body, answers),
            "parse": partial(parse_bodies, body, answers),
        }
        seconds = harness.median_seconds(funcs, repeats=5 if quick else 15)
        chunks = sum(len(a.chunks) for a in answers if len(a.chunks) > 1)
        name = f"chat, render + prefill + decode, {MAX_TOKENS} tokens, " + (
            "streamed" if stream else "whole"
        )
        rows.append(Row(name, len(answers), chunks, seconds["exchange"], seconds["parse"]))
    return rows


def table(rows: list[Row]) -> str:
    lines = [
        (
            "| case | worker calls | stream chunks | exchange us/request | us/chunk "
            "| bodies' orjson parse us | exchange/parse |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        per_chunk = f"{row.exchange / row.chunks * 1e6:.2f}" if row.chunks else "n/a"
        lines.append(
            f"| {row.case} | {row.calls} | {row.chunks or 'n/a'} | {row.exchange * 1e6:.1f} "
            f"| {per_chunk} | {row.parse * 1e6:.1f} | {row.exchange / row.parse:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repeats")
    args = parser.parse_args(argv)
    print(table(measure(quick=args.quick)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The ``demo`` command: client requests through the exchange against simulated workers.

Each request (chat, streaming chat, Responses, Messages, a derender tool call) runs through
:class:`~disagg_transforms.Exchange` on a render, prefill, decode pipeline; every worker call is
answered in process by :class:`~disagg_transforms.testing.SimulatedWorker`, called as an ASGI
app with asyncio alone (the demo runs on the core install: no httpx, no network, no files).
Then two requests run on SGLang workers (:class:`~disagg_transforms.testing.SimulatedSglangWorker`):
prefill and decode sent together, and a prefill that fails, which cancels the decode.
The text is built here; the command line prints it. See ``docs/cli.md``.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from disagg_transforms._config import StepParams, parse_pipeline_params
from disagg_transforms.exchange import (
    ClientStream,
    Driver,
    Engine,
    Exchange,
    ExchangeSettings,
    SglangSettings,
    WorkerCall,
)

# Each number ends at a comma or the bracket: with an optional comma a run of digits could be
# split many ways, and a long number in a non-matching array took exponential time.
_NUMBER: Final = r"\s*-?\d+(?:\.\d+)?"
_NUMBER_ARRAY: Final = re.compile(rf"\[{_NUMBER}(?:,{_NUMBER})*\s*\]")

CREATED: Final = 1796000000
MODEL: Final = "Qwen/Qwen3-0.6B"
# Auto, as every shipped configuration (docs/routes-and-config.md): derender for the tool call.
_PIPELINE: Final[Mapping[str, Any]] = {
    "prefill": {},
    "decode": {"output_mode": "auto", "wrap_chat_completion": True},
}
_HI: Final = [{"role": "user", "content": "Hi"}]
_WEATHER: Final[Mapping[str, Any]] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@dataclass(frozen=True)
class _Request:
    title: str
    path: str
    body: Mapping[str, Any]


REQUESTS: Final = (
    _Request(
        "chat",
        "/v1/chat/completions",
        # A transfer param the client must not be allowed to set: no leg carries it.
        {
            "model": MODEL,
            "messages": _HI,
            "max_tokens": 64,
            "kv_transfer_params": {"remote_host": "10.0.0.66"},
        },
    ),
    _Request(
        "streaming chat",
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": _HI,
            "max_completion_tokens": 64,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
    _Request(
        "Responses",
        "/v1/responses",
        {"model": MODEL, "input": "Hi", "max_output_tokens": 64},
    ),
    _Request(
        "Anthropic Messages",
        "/v1/messages",
        {"model": MODEL, "messages": _HI, "max_tokens": 64},
    ),
    _Request(
        "derender tool call",
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [_WEATHER],
            "max_tokens": 256,
        },
    ),
)
"""What the demo sends, each through the same pipeline (generate route throughout)."""


def _one_line_numbers(match: re.Match[str]) -> str:
    return "[" + ", ".join(match.group(0)[1:-1].replace(",", " ").split()) + "]"


def indented_json(value: object) -> str:
    """``value`` as indented JSON, with arrays of numbers (token IDs) kept on one line."""
    # msgspec, not orjson: it writes an integer beyond 64 bits exactly (orjson refuses it).
    text = msgspec.json.format(msgspec.json.encode(value), indent=2).decode()
    return _NUMBER_ARRAY.sub(_one_line_numbers, text)


def params_json(params: StepParams) -> str:
    """A step's params as one line of JSON."""
    return msgspec.json.encode(msgspec.structs.asdict(params)).decode()


# -- calling the simulated worker, ASGI over asyncio ----------------------------------------


@dataclass(frozen=True)
class _Answer:
    status: int
    headers: list[tuple[str, str]]
    chunks: list[bytes]
    """The body as the worker sent it: one chunk per ASGI message (a stream's events)."""


AsgiApp = Callable[..., Any]


async def _call(app: AsgiApp, call: WorkerCall) -> _Answer:
    """One worker call, answered by ``app`` in process."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": call.method,
        "scheme": "http",
        "path": call.path,
        "raw_path": call.path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in call.headers],
        "client": ("127.0.0.1", 0),
        "server": ("worker", 80),
    }
    request = [{"type": "http.request", "body": call.body, "more_body": False}]
    status = 0
    headers: list[tuple[str, str]] = []
    chunks: list[bytes] = []

    async def receive() -> Mapping[str, Any]:
        return request.pop() if request else {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            headers.extend((bytes(k).decode(), bytes(v).decode()) for k, v in message["headers"])
        elif message.get("body"):
            chunks.append(bytes(message["body"]))

    await app(scope, receive, send)
    return _Answer(status, headers, chunks)


@dataclass(frozen=True)
class _Leg:
    call: WorkerCall
    answer: _Answer


@dataclass(frozen=True)
class _Run:
    request: _Request
    legs: list[_Leg]
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


async def _exchange(app: AsgiApp, request: _Request, request_id: str) -> _Run:
    """One client request through the exchange, every worker call answered by ``app``."""
    config = parse_pipeline_params(_PIPELINE, use_openai_format=False)
    body = msgspec.json.encode(request.body)
    drive = Driver(Exchange(config, request.path, {"x-request-id": request_id}, body))
    legs: list[_Leg] = []
    sent = b""
    while (call := drive.next_call()) is not None:
        answer = await _call(app, call)
        legs.append(_Leg(call, answer))
        sent += _fed(drive, call, answer)
    return _ran(request, legs, drive, sent)


def _fed(drive: Driver, call: WorkerCall, answer: _Answer) -> bytes:
    """A call's answer fed to the exchange; the client's bytes it relays (a stream's)."""
    if not call.stream:
        drive.answered(answer.status, answer.headers, b"".join(answer.chunks))
        return b""
    drive.stream_opened(answer.status, answer.headers)
    return drive.relay_all(answer.chunks)


def _ran(request: _Request, legs: list[_Leg], drive: Driver, sent: bytes) -> _Run:
    """The request's run, once the exchange has its reply."""
    reply = drive.reply()
    if isinstance(reply, ClientStream):
        return _Run(request, legs, reply.status, reply.headers, reply.first + sent)
    return _Run(request, legs, reply.status, reply.headers, reply.body)


SGLANG_REQUESTS: Final = (
    _Request(
        "chat on SGLang",
        "/v1/chat/completions",
        {"model": MODEL, "messages": _HI, "max_tokens": 64},
    ),
    _Request(
        "a prefill that fails",
        "/v1/chat/completions",
        {"model": MODEL, "messages": _HI, "max_tokens": 64, "stream": True},
    ),
)
"""What the demo sends to SGLang workers; the prefill fails the second."""
_SGLANG_PIPELINE: Final[Mapping[str, Any]] = {"prefill": {}, "decode": {}}


async def _together(
    apps: Mapping[str, AsgiApp], request: _Request, request_id: str, settings: ExchangeSettings
) -> _Run:
    """One client request to SGLang workers: prefill and decode sent together (docs/router.md)."""
    config = parse_pipeline_params(_SGLANG_PIPELINE, use_openai_format=False)
    body = msgspec.json.encode(request.body)
    ex = Exchange(
        config, request.path, {"x-request-id": request_id}, body,
        settings=settings, bootstrap_host="prefill",
    )  # fmt: skip
    drive = Driver(ex)
    legs: list[_Leg] = []
    sent = b""
    while (call := drive.next_call()) is not None:
        peers = {asyncio.ensure_future(_call(apps[p.step], p)): p for p in call.together}
        main = asyncio.ensure_future(_call(apps[call.step], call))
        pending = {main, *peers}
        while main in pending and not drive.cancelling:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done & peers.keys():
                peer, answer = peers[task], task.result()
                legs.append(_Leg(peer, answer))
                drive.together_answered(
                    peer, answer.status, answer.headers, b"".join(answer.chunks)
                )
        if drive.cancelling:  # a prefill that failed: the decode is cancelled and aborted
            main.cancel()
            if call.abort is not None:
                legs.append(_Leg(call.abort, await _call(apps[call.step], call.abort)))
            break
        answer = main.result()
        legs.append(_Leg(call, answer))
        for task in peers.keys() & pending:
            peer, peer_answer = peers[task], await task
            legs.append(_Leg(peer, peer_answer))
            drive.together_answered(
                peer, peer_answer.status, peer_answer.headers, b"".join(peer_answer.chunks)
            )
        sent += _fed(drive, call, answer)
    return _ran(request, legs, drive, sent)


async def _run_sglang() -> list[_Run]:
    from disagg_transforms.testing import (  # noqa: PLC0415
        SimulatedSglangWorker,
        SimulatedWorker,
        WorkerSettings,
    )

    worker_settings = WorkerSettings(model=MODEL, created=CREATED)
    runs = []
    for number, request in enumerate(SGLANG_REQUESTS, start=len(REQUESTS) + 1):
        fault = "http-500" if request is SGLANG_REQUESTS[-1] else None
        prefill = SimulatedSglangWorker(
            worker_settings, disaggregation_mode="prefill", transfer_timeout=5, fault=fault
        )
        decode = SimulatedSglangWorker(
            worker_settings,
            disaggregation_mode="decode",
            transfer_timeout=5,
            prefills={("prefill", 8998): prefill},
        )
        apps: dict[str, AsgiApp] = {
            "render": SimulatedWorker(worker_settings),
            "prefill": prefill,
            "decode": decode,
        }
        # A seeded generator: the demo prints the same rid every run (a router draws its own).
        bits = random.Random(number).getrandbits  # noqa: S311 - a demo's fixed ids, no secret
        settings = ExchangeSettings(engine=Engine.SGLANG, sglang=SglangSettings(random_bits=bits))
        runs.append(await _together(apps, request, f"demo-{number}", settings))
    return runs


async def _run_all() -> list[_Run]:
    # Imported here: the CLI's other commands never load the simulated worker.
    from disagg_transforms.testing import SimulatedWorker, WorkerSettings  # noqa: PLC0415

    worker = SimulatedWorker(WorkerSettings(model=MODEL, created=CREATED))
    return [
        await _exchange(worker, request, f"demo-{number}")
        for number, request in enumerate(REQUESTS, start=1)
    ] + await _run_sglang()


# -- the trace ------------------------------------------------------------------------------


def _json(data: bytes) -> Any:  # noqa: ANN401 - any JSON value
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None


def _sse_payloads(data: bytes) -> list[Any]:
    """The JSON payloads of an SSE stream's ``data:`` lines (``[DONE]`` left out)."""
    lines = data.decode().splitlines()
    return [
        _json(line[6:].encode())
        for line in lines
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def _kv(params: object) -> str:
    if not isinstance(params, dict):
        return "no kv"
    flags = [key for key, value in params.items() if value is True]
    return "kv " + (", ".join(flags) if flags else ", ".join(params))


def _leg_summary(leg: _Leg, prefill_kv: object) -> str:
    body = _json(leg.call.body) or {}
    answer = _json(b"".join(leg.answer.chunks))
    if leg.call.step == "render":
        tokens = answer.get("token_ids", []) if isinstance(answer, dict) else []
        return f"{len(tokens)} prompt tokens"
    sampling = body.get("sampling_params", {})
    if leg.call.path == "/abort_request":
        return f"cancelled: rid {body.get('rid', '')[:8]}..."
    if leg.call.path == "/generate":
        return _sglang_summary(leg, body)
    cap = sampling.get("max_tokens")
    if leg.call.step == "prefill":
        return f"max_tokens {cap}, {_kv(body.get('kv_transfer_params'))}"
    kv = body.get("kv_transfer_params")
    source = "kv from prefill" if kv == prefill_kv and kv is not None else _kv(kv)
    stream = ", streamed" if leg.call.stream else ""
    tokens = len(body.get("token_ids", []))
    return f"{tokens} prompt tokens, cap {cap}, {source}, {body.get('output_mode')} mode{stream}"


def _sglang_summary(leg: _Leg, body: dict[str, Any]) -> str:
    if leg.answer.status != 200:
        return "failed"
    sampling = body.get("sampling_params", {})
    meet = f"room at {body.get('bootstrap_host')}:{body.get('bootstrap_port')}"
    tokens = len(body.get("input_ids", []))
    stream = ", streamed" if leg.call.stream else ""
    together = ", sent with prefill" if leg.call.together else ""
    cap = sampling.get("max_new_tokens")
    return f"{tokens} prompt tokens, max_new_tokens {cap}, {meet}{together}{stream}"


_OPENAI: Final = ("prompt_tokens", "completion_tokens")  # the usage keys of OpenAI's envelopes


def _usage(usage: object, prompt: str, completion: str) -> str:
    if not isinstance(usage, dict):
        return "no usage"
    return f"usage {usage.get(prompt)} in / {usage.get(completion)} out"


def _chat_reply(body: dict[str, Any]) -> str:
    message = body["choices"][0]["message"]
    finish = body["choices"][0]["finish_reason"]
    calls = message.get("tool_calls") or []
    said = (
        ", ".join(f"tool call {c['function']['name']}({c['function']['arguments']})" for c in calls)
        if calls
        else f"text {message.get('content')!r}"
    )
    return f"chat.completion: {said}, {finish}, {_usage(body.get('usage'), *_OPENAI)}"


def _chat_stream_reply(body: bytes) -> str:
    chunks = _sse_payloads(body)
    text = "".join(
        choice["delta"].get("content") or "" for chunk in chunks for choice in chunk["choices"]
    )
    usage = next((c["usage"] for c in chunks if c.get("usage")), None)
    return f"{len(chunks)} chat.completion.chunk events + [DONE]: text {text!r}, " + _usage(
        usage, *_OPENAI
    )


def _responses_reply(body: dict[str, Any]) -> str:
    text = "".join(
        part.get("text", "")
        for item in body.get("output", [])
        if item.get("type") == "message"
        for part in item.get("content", [])
    )
    usage = _usage(body.get("usage"), "input_tokens", "output_tokens")
    return f"response {body.get('status')}: text {text!r}, {usage}"


def _messages_reply(body: dict[str, Any]) -> str:
    text = "".join(block.get("text", "") for block in body.get("content", []))
    usage = _usage(body.get("usage"), "input_tokens", "output_tokens")
    return f"message: text {text!r}, {body.get('stop_reason')}, {usage}"


def _reply_summary(run: _Run) -> str:
    kind = dict(run.headers).get("content-type", "")
    if kind == "text/event-stream":
        return _chat_stream_reply(run.body)
    body = _json(run.body)
    if run.status != 200 and isinstance(body, dict) and isinstance(body.get("error"), dict):
        return f"error: {body['error'].get('message')}"
    if run.status != 200 or not isinstance(body, dict):
        return f"error: {run.body.decode(errors='replace')}"
    if run.request.path == "/v1/responses":
        return _responses_reply(body)
    if run.request.path == "/v1/messages":
        return _messages_reply(body)
    return _chat_reply(body)


def _full_body(data: bytes, indent: str) -> list[str]:
    value = _json(data)
    text = data.decode(errors="replace").rstrip() if value is None else indented_json(value)
    return [f"{indent}{line}" for line in text.splitlines()]


def _trace(run: _Run, number: int, *, full: bool) -> list[str]:
    request = run.request
    lines = [f"{number}. {request.title}: POST {request.path}"]
    if full:
        lines += _full_body(msgspec.json.encode(request.body), "     ")
    prefill_kv = None
    for leg in run.legs:
        call = leg.call
        lines.append(
            f"   {call.step:<8} {call.method} {call.path:<28} {leg.answer.status}  "
            f"{_leg_summary(leg, prefill_kv)}"
        )
        if call.step == "prefill":
            answer = _json(b"".join(leg.answer.chunks))
            prefill_kv = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        if full:
            lines += ["     sent:", *_full_body(call.body, "       ")]
            lines += ["     answered:", *_full_body(b"".join(leg.answer.chunks), "       ")]
    lines.append(f"   {'reply':<8} {run.status} {_reply_summary(run)}")
    if full:
        lines += _full_body(run.body, "     ")
    return lines


def demo_text(*, full: bool = False) -> str:
    """Everything the ``demo`` command prints; ``full`` adds every body."""
    runs = asyncio.run(_run_all())
    lines = [
        "Five client requests through the Exchange; a simulated vLLM 0.33 worker answers each",
        "call: render, then prefill and decode on the generate route. The pipeline (steps):",
        f"  use_openai_format false, {msgspec.json.encode(_PIPELINE).decode()}",
        "  (auto: the tool call's decode asks for derender, the others for text). demo --full",
        "  prints every body.",
    ]
    for number, run in enumerate(runs[: len(REQUESTS)], start=1):
        lines += ["", *_trace(run, number, full=full)]
    lines += [
        "",
        "On simulated SGLang 0.5.23 P/D workers (the vLLM worker renders), prefill and decode",
        "get one /generate body at once; a prefill that fails cancels the decode.",
    ]
    for number, run in enumerate(runs[len(REQUESTS) :], start=len(REQUESTS) + 1):
        lines += ["", *_trace(run, number, full=full)]
    return "\n".join(lines) + "\n"

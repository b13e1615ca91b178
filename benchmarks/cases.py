"""The benchmark's cases: each payload with the library's and the baselines' runners.

Every runner takes the payload's bytes and returns the JSON bytes it would send on, so the
outputs can be compared (decoded) across runners and timed the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial

import baselines
import orjson
import payloads

from disagg_transforms import (
    AnthropicStreamConverter,
    ChatStreamConverter,
    DecodeParams,
    EnvelopeOptions,
    LegInputs,
    OutputMode,
    ResponsesStreamConverter,
    Route,
    StreamConverter,
    build_decode_request,
    build_decode_request_bytes,
    wrap_chat_completion,
    wrap_chat_completion_bytes,
)
from disagg_transforms._request.render import RenderAnswer

Runner = Callable[[bytes], bytes]

LIBRARY = "library (bytes)"
DICT_PATH = "library (dict + orjson)"
ORJSON_ROUND_TRIP = "orjson round trip"
SYNTAX_SCAN = "syntax scan"
ORJSON = "orjson dicts"
STDLIB = "stdlib json"
PYDANTIC = "pydantic v2"
MSGSPEC = "msgspec views"
ORJSON_CONVERTER = "orjson converter"
TRANSFORMS = (LIBRARY, DICT_PATH, ORJSON, STDLIB, PYDANTIC, MSGSPEC, ORJSON_CONVERTER)
"""The runners that do the case's whole job, so their outputs must agree with the library's."""

DECODE_PHASE, WRAP_PHASE, STREAM_PHASE = "decode legs", "wraps", "streams"
PHASES = (DECODE_PHASE, WRAP_PHASE, STREAM_PHASE)
"""Timed apart: huge logprob responses decoded by the wrap baselines fragment the heap and
slow later orjson calls, so one phase's allocations must not be another's starting state."""

_GENERATE = Route.GENERATE.value
_CHAT = Route.CHAT_COMPLETIONS.value
_PARAMS = DecodeParams(use_openai_format=False, output_mode=OutputMode.TEXT)
_ROUTER_TOKEN_IDS = list(range(1000, 2024))  # the rendered prompt the router hands in
_CLIENT_TOP_LOGPROBS = 2
_WRAP_CLIENT = orjson.dumps(
    {"model": "Qwen/Qwen3-0.6B", "logprobs": True, "top_logprobs": _CLIENT_TOP_LOGPROBS}
)


# The exchange's default decode step (`disagg-transforms serve`): text, derender for tools.
_AUTO_PARAMS = DecodeParams(use_openai_format=False, output_mode=OutputMode.AUTO)
_RENDER_PATHS = {
    "chat": Route.CHAT_COMPLETIONS.value,
    "responses": Route.RESPONSES.value,
    "messages": Route.MESSAGES.value,
}


def _json(output: bytes) -> object:
    return orjson.loads(output)


@dataclass(frozen=True)
class Case:
    name: str
    phase: str
    build: Callable[[], bytes]
    warmup: Callable[[], bytes]
    runners: dict[str, Runner]
    decode_output: Callable[[bytes], object] = _json
    """How two runners' outputs are compared: as the JSON values they decode to."""
    compared: tuple[str, ...] = TRANSFORMS
    """The runners whose output must be the library's (a stream's baseline may speak chat)."""
    items: Callable[[bytes], int] = lambda _payload: 1
    """How many items one call handles (a stream's chunks): times are reported per item."""


def _decode_generate_bytes(raw: bytes) -> bytes:
    return build_decode_request_bytes(raw, client_path=_GENERATE, params=_PARAMS).body


def _decode_generate_dict(raw: bytes) -> bytes:
    leg = build_decode_request(orjson.loads(raw), client_path=_GENERATE, params=_PARAMS)
    return orjson.dumps(leg.body)


def _decode_chat_bytes(raw: bytes) -> bytes:
    leg = build_decode_request_bytes(
        raw, client_path=_CHAT, params=_PARAMS, inputs=LegInputs(token_ids=_ROUTER_TOKEN_IDS)
    )
    return leg.body


def _decode_chat_dict(raw: bytes, loads: Callable[[bytes], object] = orjson.loads) -> bytes:
    body = loads(raw)
    assert isinstance(body, dict)
    leg = build_decode_request(body, client_path=_CHAT, params=_PARAMS, token_ids=_ROUTER_TOKEN_IDS)
    return orjson.dumps(leg.body)


def _decode_chat_stdlib(raw: bytes) -> bytes:
    import json  # noqa: PLC0415 - only this baseline needs it

    leg = build_decode_request(
        json.loads(raw), client_path=_CHAT, params=_PARAMS, token_ids=_ROUTER_TOKEN_IDS
    )
    return json.dumps(leg.body, separators=(",", ":"), ensure_ascii=False).encode()


def _decode_rendered_bytes(raw: bytes, client: bytes, path: str) -> bytes:
    # What the exchange does with render's answer (its `_read_render`, then the decode leg):
    # the answer read through its typed view, its token IDs kept as their bytes.
    inputs = LegInputs(rendered=RenderAnswer(raw))
    return build_decode_request_bytes(
        client, client_path=path, params=_AUTO_PARAMS, inputs=inputs
    ).body


def _decode_rendered_dict(raw: bytes, client: bytes, path: str) -> bytes:
    leg = build_decode_request(
        orjson.loads(client), client_path=path, params=_AUTO_PARAMS, rendered=orjson.loads(raw)
    )
    return orjson.dumps(leg.body)


def _round_trips(raw: bytes, client: bytes) -> bytes:
    # The floor of parsing once what the leg reads: the render answer and the client's body.
    baselines.orjson_round_trip(client)
    return baselines.orjson_round_trip(raw)


def _scans(raw: bytes, client: bytes) -> bytes:
    baselines.syntax_scan(client)
    return baselines.syntax_scan(raw)


def _wrap_bytes(raw: bytes, mode: OutputMode, client: bytes = _WRAP_CLIENT) -> bytes:
    return wrap_chat_completion_bytes(raw, requested=mode, client_body=client)


def _wrap_dict(raw: bytes, mode: OutputMode, client_body: bytes = _WRAP_CLIENT) -> bytes:
    client = orjson.loads(client_body)
    return orjson.dumps(wrap_chat_completion(orjson.loads(raw), requested=mode, client_body=client))


@lru_cache(maxsize=4)
def _events(stream: bytes) -> list[bytes]:
    # Split once, outside the timing: the worker's chunks arrive one by one.
    return [event + b"\n\n" for event in stream.split(b"\n\n") if event]


def _sse_json(output: bytes) -> object:
    # Each event as its fields, a data field decoded as JSON (except the [DONE] marker).
    return [
        [
            (field, value if value == b"[DONE]" or field != b"data" else orjson.loads(value))
            for field, _, value in (line.partition(b": ") for line in event.split(b"\n"))
        ]
        for event in output.split(b"\n\n")
        if event
    ]


_STREAM_ID, _STREAM_MODEL, _STREAM_CREATED = "chatcmpl-bench", "Qwen/Qwen3-0.6B", 1796000000
# The chunks carry no model: the router names it (the chat id comes from the chunks' request_id).
_STREAM_OPTIONS = EnvelopeOptions(model=_STREAM_MODEL)


def _convert(make: Callable[[], StreamConverter], raw: bytes) -> bytes:
    converter = make()
    return b"".join([*map(converter.feed, _events(raw)), converter.close()])


_STREAM_CONVERTERS: dict[str, Callable[[], StreamConverter]] = {
    "chat": partial(
        ChatStreamConverter,
        requested=OutputMode.TEXT,
        options=_STREAM_OPTIONS,
        created=_STREAM_CREATED,
        client_body={"stream_options": {"include_usage": True}},
    ),
    "Responses": partial(
        ResponsesStreamConverter,
        requested=OutputMode.TEXT,
        options=_STREAM_OPTIONS,
        created=_STREAM_CREATED,
    ),
    "Anthropic": partial(
        AnthropicStreamConverter, requested=OutputMode.TEXT, options=_STREAM_OPTIONS
    ),
}


def _stream_case(envelope: str, n_tokens: int) -> Case:
    baseline = partial(
        baselines.chat_stream_orjson,
        completion_id=_STREAM_ID,
        model=_STREAM_MODEL,
        created=_STREAM_CREATED,
    )
    return Case(
        name=f"stream, {envelope} converter, {n_tokens} tokens",
        phase=STREAM_PHASE,
        build=partial(payloads.generate_stream, n_tokens),
        warmup=partial(payloads.generate_stream, 4),
        runners={
            LIBRARY: partial(_convert, _STREAM_CONVERTERS[envelope]),
            ORJSON_CONVERTER: lambda raw: baseline(_events(raw)),
        },
        decode_output=_sse_json,
        # The baseline speaks chat: only the chat converter's output must equal it.
        compared=TRANSFORMS if envelope == "chat" else (LIBRARY,),
        items=lambda raw: len(_events(raw)),
    )


def _floors() -> dict[str, Runner]:
    return {ORJSON_ROUND_TRIP: baselines.orjson_round_trip, SYNTAX_SCAN: baselines.syntax_scan}


def _decode_chat_case(n_messages: int) -> Case:
    return Case(
        name=f"decode leg, chat {n_messages} msg + tools",
        phase=DECODE_PHASE,
        build=partial(payloads.chat_request, n_messages),
        warmup=partial(payloads.chat_request, 1),
        runners={
            LIBRARY: _decode_chat_bytes,
            DICT_PATH: _decode_chat_dict,
            **_floors(),
            ORJSON: _decode_chat_dict,
            STDLIB: _decode_chat_stdlib,
        },
    )


def _decode_generate_case(n_tokens: int) -> Case:
    return Case(
        name=f"decode leg, generate {n_tokens // 1000}k tokens",
        phase=DECODE_PHASE,
        build=partial(payloads.generate_request, n_tokens),
        warmup=partial(payloads.generate_request, 8),
        runners={
            LIBRARY: _decode_generate_bytes,
            DICT_PATH: _decode_generate_dict,
            **_floors(),
            ORJSON: baselines.decode_leg_orjson,
            STDLIB: baselines.decode_leg_stdlib,
            PYDANTIC: baselines.decode_leg_pydantic,
        },
    )


def _size_label(n_tokens: int) -> str:
    return f"{n_tokens // 1000}k" if n_tokens >= 1000 else str(n_tokens)


def _decode_rendered_case(api: str, n_tokens: int, version: str, tools: int = 0) -> Case:
    path = _RENDER_PATHS[api]
    client = (
        payloads.render_client_with_tools(api, tools, version)
        if tools
        else payloads.render_client(api, version)
    )
    many = f"{tools} tools, " if tools else ""
    return Case(
        name=f"decode leg, {api} + vLLM {version} render, {many}{_size_label(n_tokens)} tokens",
        phase=DECODE_PHASE,
        build=partial(payloads.render_answer, api, n_tokens, version),
        warmup=partial(payloads.render_answer, api, 8, version),
        runners={
            LIBRARY: partial(_decode_rendered_bytes, client=client, path=path),
            DICT_PATH: partial(_decode_rendered_dict, client=client, path=path),
            ORJSON_ROUND_TRIP: partial(_round_trips, client=client),
            SYNTAX_SCAN: partial(_scans, client=client),
        },
    )


def _decode_generate_full_case(n_tokens: int) -> Case:
    return Case(
        name=f"decode leg, generate every field, {_size_label(n_tokens)} tokens",
        phase=DECODE_PHASE,
        build=partial(payloads.generate_request_full, n_tokens),
        warmup=partial(payloads.generate_request_full, 8),
        runners={LIBRARY: _decode_generate_bytes, DICT_PATH: _decode_generate_dict, **_floors()},
    )


def _wrap_full_client_case(n_tokens: int, mode: OutputMode) -> Case:
    client = payloads.full_chat_client()
    return Case(
        name=f"wrap, {mode.value} {_size_label(n_tokens)} tokens, full client body",
        phase=WRAP_PHASE,
        build=partial(payloads.generate_response, n_tokens, mode.value, logprobs=False),
        warmup=partial(payloads.generate_response, 4, mode.value, logprobs=False),
        runners={
            LIBRARY: partial(_wrap_bytes, mode=mode, client=client),
            DICT_PATH: partial(_wrap_dict, mode=mode, client_body=client),
            **_floors(),
        },
    )


def _wrap_case(n_tokens: int, mode: OutputMode, *, logprobs: bool) -> Case:
    top = _CLIENT_TOP_LOGPROBS
    label = "8k" if n_tokens >= 1000 else str(n_tokens)
    return Case(
        name=f"wrap, {mode.value} {label} tokens{' + logprobs' if logprobs else ''}",
        phase=WRAP_PHASE,
        build=partial(payloads.generate_response, n_tokens, mode.value, logprobs=logprobs),
        warmup=partial(payloads.generate_response, 4, mode.value, logprobs=logprobs),
        runners={
            LIBRARY: partial(_wrap_bytes, mode=mode),
            DICT_PATH: partial(_wrap_dict, mode=mode),
            **_floors(),
            ORJSON: partial(baselines.wrap_orjson, mode=mode.value, top=top),
            STDLIB: partial(baselines.wrap_stdlib, mode=mode.value, top=top),
            PYDANTIC: partial(baselines.wrap_pydantic, mode=mode.value, top=top),
            MSGSPEC: partial(baselines.wrap_msgspec, mode=mode.value, top=top),
        },
    )


def all_cases(*, quick: bool = False) -> list[Case]:
    """Every case, in phase order; ``quick`` keeps the small payloads only (a smoke run)."""
    generate_sizes = (1_000,) if quick else (1_000, 32_000, 128_000)
    render_sizes = (1_000,) if quick else (256, 1_000, 32_000, 128_000)
    wrap_sizes = (256,) if quick else (256, 8192)
    stream_chunks = 16 if quick else 512
    return [
        _decode_chat_case(1),
        _decode_chat_case(20),
        *(_decode_generate_case(n) for n in generate_sizes),
        *(_decode_generate_full_case(n) for n in render_sizes),
        *(
            _decode_rendered_case(api, n, version)
            for version in payloads.RENDER_VERSIONS
            for api in payloads.RENDER_FIXTURES
            # vLLM 0.32's answers where the floors are (0.33's at 256 tokens too)
            for n in render_sizes
            if version == "0.33" or n >= 1_000
        ),
        # An agent's body: 30 tools open more brackets than the count that skips the depth walk.
        _decode_rendered_case("responses", 1_000, "0.33", tools=30),
        *(
            _wrap_case(n, mode, logprobs=logprobs)
            for n in wrap_sizes
            for mode in (OutputMode.TEXT, OutputMode.DERENDER)
            for logprobs in (False, True)
        ),
        *(_wrap_full_client_case(256, mode) for mode in (OutputMode.TEXT, OutputMode.DERENDER)),
        *(_stream_case(envelope, stream_chunks) for envelope in _STREAM_CONVERTERS),
    ]


def real_shape_decode_cases(size: str) -> tuple[str, ...]:
    """The names of the decode legs built from vLLM's real shapes at ``size`` (``1k``...)."""
    return (
        f"decode leg, generate every field, {size} tokens",
        *(
            f"decode leg, {api} + vLLM {version} render, {size} tokens"
            for version in payloads.RENDER_VERSIONS
            for api in _RENDER_PATHS
            if version == "0.33" or size != "256"
        ),
    )


def _by_name() -> dict[str, Case]:
    return {case.name: case for case in all_cases()}


def runner(case: str, name: str) -> Runner:
    return _by_name()[case].runners[name]


def warmup_payload(case: str) -> bytes:
    return _by_name()[case].warmup()

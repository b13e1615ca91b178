"""The benchmark's cases: each payload with the library's and the baselines' runners.

Every runner takes the payload's bytes and returns the JSON bytes it would send on, so the
outputs can be compared (decoded) across runners and timed the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import baselines
import orjson
import payloads

from disagg_transforms import (
    DecodeParams,
    LegInputs,
    OutputMode,
    Route,
    build_decode_request,
    build_decode_request_bytes,
    wrap_chat_completion,
    wrap_chat_completion_bytes,
)

Runner = Callable[[bytes], bytes]

LIBRARY = "library (bytes)"
DICT_PATH = "library (dict + orjson)"
ORJSON_ROUND_TRIP = "orjson round trip"
SYNTAX_SCAN = "syntax scan"
ORJSON = "orjson dicts"
STDLIB = "stdlib json"
PYDANTIC = "pydantic v2"

_GENERATE = Route.GENERATE.value
_CHAT = Route.CHAT_COMPLETIONS.value
_PARAMS = DecodeParams(use_openai_format=False, output_mode=OutputMode.TEXT)
_ROUTER_TOKEN_IDS = list(range(1000, 2024))  # the rendered prompt the router hands in
_CLIENT_TOP_LOGPROBS = 2
_WRAP_CLIENT = orjson.dumps(
    {"model": "Qwen/Qwen3-0.6B", "logprobs": True, "top_logprobs": _CLIENT_TOP_LOGPROBS}
)


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], bytes]
    warmup: Callable[[], bytes]
    runners: dict[str, Runner]
    scan_is_floor: bool = True


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


def _wrap_bytes(raw: bytes, mode: OutputMode) -> bytes:
    return wrap_chat_completion_bytes(raw, requested=mode, client_body=_WRAP_CLIENT)


def _wrap_dict(raw: bytes, mode: OutputMode) -> bytes:
    client = orjson.loads(_WRAP_CLIENT)
    return orjson.dumps(wrap_chat_completion(orjson.loads(raw), requested=mode, client_body=client))


def _floors() -> dict[str, Runner]:
    return {ORJSON_ROUND_TRIP: baselines.orjson_round_trip, SYNTAX_SCAN: baselines.syntax_scan}


def _decode_chat_case(n_messages: int) -> Case:
    return Case(
        name=f"decode leg, chat {n_messages} msg + tools",
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


def _wrap_case(n_tokens: int, mode: OutputMode, *, logprobs: bool) -> Case:
    top = _CLIENT_TOP_LOGPROBS
    label = "8k" if n_tokens >= 1000 else str(n_tokens)
    return Case(
        name=f"wrap, {mode.value} {label} tokens{' + logprobs' if logprobs else ''}",
        build=partial(payloads.generate_response, n_tokens, mode.value, logprobs=logprobs),
        warmup=partial(payloads.generate_response, 4, mode.value, logprobs=logprobs),
        runners={
            LIBRARY: partial(_wrap_bytes, mode=mode),
            DICT_PATH: partial(_wrap_dict, mode=mode),
            **_floors(),
            ORJSON: partial(baselines.wrap_orjson, mode=mode.value, top=top),
            STDLIB: partial(baselines.wrap_stdlib, mode=mode.value, top=top),
            PYDANTIC: partial(baselines.wrap_pydantic, mode=mode.value, top=top),
        },
    )


def all_cases(*, quick: bool = False) -> list[Case]:
    """Every case; ``quick`` keeps the small payloads only (a smoke run)."""
    generate_sizes = (1_000,) if quick else (1_000, 32_000, 128_000)
    wrap_sizes = (256,) if quick else (256, 8192)
    return [
        _decode_chat_case(1),
        _decode_chat_case(20),
        *(_decode_generate_case(n) for n in generate_sizes),
        *(
            _wrap_case(n, mode, logprobs=logprobs)
            for n in wrap_sizes
            for mode in (OutputMode.TEXT, OutputMode.DERENDER)
            for logprobs in (False, True)
        ),
    ]


def _by_name() -> dict[str, Case]:
    return {case.name: case for case in all_cases()}


def runner(case: str, name: str) -> Runner:
    return _by_name()[case].runners[name]


def warmup_payload(case: str) -> bytes:
    return _by_name()[case].warmup()

"""The ``demo`` command: one chat request and vLLM 0.33 answers run through every leg and back.

The bodies are embedded (shaped like the golden fixtures in ``tests/fixtures``) so the demo
needs no worker, no network and no files. The text is built here; the command line prints it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import msgspec
import orjson

from disagg_transforms._config import (
    DecodeParams,
    OutputMode,
    PrefillParams,
    Step,
    StepParams,
    parse_step_params,
)
from disagg_transforms._request.legs import (
    LegInputs,
    build_decode_request,
    build_prefill_request,
)
from disagg_transforms._response.chat_stream import ChatStreamConverter, single_frame_chat_chunks
from disagg_transforms._response.chat_wrap import wrap_chat_completion
from disagg_transforms._response.options import EnvelopeOptions
from disagg_transforms._routes import Route, resolve_format
from disagg_transforms._wire.sse import SseParser

# Each number ends at a comma or the bracket: with an optional comma a run of digits could be
# split many ways, and a long number in a non-matching array took exponential time.
_NUMBER: Final = r"\s*-?\d+(?:\.\d+)?"
_NUMBER_ARRAY: Final = re.compile(rf"\[{_NUMBER}(?:,{_NUMBER})*\s*\]")

CREATED: Final = 1796000000
MODEL: Final = "Qwen/Qwen3-0.6B"
CHAT_PATH: Final = Route.CHAT_COMPLETIONS.value

CHAT_REQUEST: Final[Mapping[str, Any]] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ],
    "max_completion_tokens": 256,
    "temperature": 0.7,
    "seed": 7,
    "stream": True,
    "stream_options": {"include_usage": True},
    "kv_transfer_params": {"remote_host": "10.0.0.66", "remote_port": 9999},
}
"""A streaming chat client, with a transfer param it must not be allowed to set."""

TOKEN_IDS: Final = [151644, 872, 198, 3838, 374, 279, 9104, 304, 12095, 30, 151645, 198]
"""The rendered prompt (what the router got from ``/render`` or its own tokenizer)."""

PREFILL_KV: Final[Mapping[str, Any]] = {"remote_engine_id": "prefill-0", "remote_block_ids": [7]}
DECODE_KV: Final[Mapping[str, Any]] = {
    "do_remote_prefill": True,
    "remote_engine_id": "prefill-0",
    "remote_host": "10.0.0.5",
    "remote_port": 5600,
}

_GENERATE_ONLY: Final[Mapping[str, Any]] = {
    "request_id": "generate-tokens-chatcmpl-demo",
    "model": MODEL,
    "created": CREATED,
    "usage": {"prompt_tokens": 12, "total_tokens": 28, "completion_tokens": 16},
    "prompt_logprobs": None,
    "prompt_token_ids": None,
    "kv_transfer_params": None,
    "metrics": None,
}
_CHOICE_BASE: Final[Mapping[str, Any]] = {
    "index": 0,
    "stop_reason": None,
    "token_ids": [785, 9104, 304, 12095, 374, 39698, 13, 151645],
    "routed_experts": None,
    "weight_versions": [{"version": "v1", "start": 0, "end": 8}],
    "logprobs": None,
}

TEXT_RESPONSE: Final[Mapping[str, Any]] = {
    **_GENERATE_ONLY,
    "output_mode": "text",
    "choices": [{**_CHOICE_BASE, "finish_reason": "stop", "text": "It is sunny in Paris."}],
}
"""A non-streamed text-mode answer."""

DERENDER_RESPONSE: Final[Mapping[str, Any]] = {
    **_GENERATE_ONLY,
    "output_mode": "derender",
    "choices": [
        {
            **_CHOICE_BASE,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": None,
                "reasoning": "The user wants the weather: call get_weather.",
                "tool_calls": [
                    {
                        "id": "chatcmpl-tool-1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
        }
    ],
}
"""A derender-mode answer: reasoning and a tool call, parsed by the worker."""

_STREAM_EVENTS: Final = (
    {"text": "It is ", "finish_reason": None, "token_ids": [785, 374]},
    {"text": "sunny in ", "finish_reason": None, "token_ids": [39698, 304]},
    {"text": "Paris.", "finish_reason": "stop", "token_ids": [12095, 13]},
)


def _stream_event(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


TEXT_STREAM: Final = (
    b"".join(
        _stream_event(
            {
                "request_id": "generate-tokens-chatcmpl-demo",
                "usage": None,
                "output_mode": "text",
                "choices": [{"index": 0, "stop_reason": None, "logprobs": None, **event}],
            }
        )
        for event in _STREAM_EVENTS
    )
    + _stream_event(
        {
            "request_id": "generate-tokens-chatcmpl-demo",
            "usage": {"prompt_tokens": 12, "total_tokens": 18, "completion_tokens": 6},
            "output_mode": "text",
            "choices": [],
        }
    )
    + b"data: [DONE]\n\n"
)
"""A text-mode generate SSE stream, as a streamed decode leg answers."""


def _fixed_clock() -> float:
    return float(CREATED)


_DEMO_OPTIONS: Final = EnvelopeOptions(clock=_fixed_clock)


def heading(text: str) -> str:
    """A section heading, underlined."""
    return f"\n{text}\n{'=' * len(text)}"


def _one_line_numbers(match: re.Match[str]) -> str:
    return "[" + ", ".join(match.group(0)[1:-1].replace(",", " ").split()) + "]"


def indented_json(value: object) -> str:
    """``value`` as indented JSON, with arrays of numbers (token IDs) kept on one line."""
    # msgspec, not orjson: it writes an integer beyond 64 bits exactly (orjson refuses it).
    text = msgspec.json.format(msgspec.json.encode(value), indent=2).decode()
    return _NUMBER_ARRAY.sub(_one_line_numbers, text)


def pretty(value: object) -> str:
    """:func:`indented_json`, each line indented two more spaces."""
    return "\n".join(f"  {line}" for line in indented_json(value).splitlines())


def params_json(params: StepParams) -> str:
    """A step's params as one line of JSON."""
    return msgspec.json.encode(msgspec.structs.asdict(params)).decode()


def _routes() -> list[str]:
    lines = [heading("Where each leg goes (resolve_format)")]
    lines.append(f"{'client route':<24} {'use_openai_format=true':<26} use_openai_format=false")
    lines.extend(
        f"{route.value:<24} {resolve_format(True, route.value).value:<26} "  # noqa: FBT003
        f"{resolve_format(False, route.value).value}"  # noqa: FBT003
        for route in Route
    )
    lines.append(heading("Step defaults (parse_step_params with no keys)"))
    lines.extend(
        f"{step.value:<20} {params_json(parse_step_params(step.value, {}))}" for step in Step
    )
    return lines


def _requests() -> list[str]:
    lines = [heading("1. The client's request (POST /v1/chat/completions)"), pretty(CHAT_REQUEST)]
    prefill = build_prefill_request(
        CHAT_REQUEST,
        client_path=CHAT_PATH,
        params=PrefillParams(use_openai_format=False),
        inputs=LegInputs(token_ids=TOKEN_IDS, kv_transfer_params=PREFILL_KV),
    )
    lines += [
        heading(f"2. Prefill leg: POST {prefill.path} (one token, the client's kv params gone)"),
        pretty(prefill.body),
    ]
    for number, mode in ((3, OutputMode.TEXT), (4, OutputMode.DERENDER)):
        leg = build_decode_request(
            CHAT_REQUEST,
            client_path=CHAT_PATH,
            params=DecodeParams(use_openai_format=False, output_mode=mode),
            token_ids=TOKEN_IDS,
            kv_transfer_params=DECODE_KV,
        )
        lines += [
            heading(f"{number}. Decode leg, output_mode {mode.value}: POST {leg.path}"),
            (
                f"  stream: {leg.stream}, single_frame: {leg.single_frame}, "
                f"dropped: {', '.join(leg.dropped) or 'nothing'}"
            ),
            pretty(leg.body),
        ]
    return lines


def _responses() -> list[str]:
    lines: list[str] = []
    for number, response in ((5, TEXT_RESPONSE), (6, DERENDER_RESPONSE)):
        mode = OutputMode(response["output_mode"])
        wrapped = wrap_chat_completion(
            response, requested=mode, client_body=CHAT_REQUEST, options=_DEMO_OPTIONS
        )
        lines += [
            heading(f"{number}. The worker's {mode.value} answer"),
            pretty(response),
            heading(f"{number}b. ... wrapped for a non-streaming chat client (chat.completion)"),
            pretty(wrapped),
        ]
    chunks = single_frame_chat_chunks(
        DERENDER_RESPONSE,
        requested=OutputMode.DERENDER,
        client_body=CHAT_REQUEST,
        options=_DEMO_OPTIONS,
    )
    lines.append(heading("7. The derender answer as a single-frame stream (chat.completion.chunk)"))
    lines.extend(pretty(chunk) for chunk in chunks)
    lines.append("  [DONE]")
    lines += [heading("8. A streamed text-mode leg (generate SSE)"), _indent(TEXT_STREAM)]
    converter = ChatStreamConverter(
        requested=OutputMode.TEXT, client_body=CHAT_REQUEST, created=CREATED
    )
    converted = converter.feed(TEXT_STREAM) + converter.close()
    lines.append(heading("8b. ... converted for the streaming chat client (ChatStreamConverter)"))
    parser = SseParser()
    for payload in [*parser.feed(converted), *parser.close()]:
        is_done = payload == b"[DONE]"
        lines.append("  [DONE]" if is_done else pretty(orjson.loads(payload)))
    return lines


def _indent(stream: bytes) -> str:
    return "\n".join(f"  {line}" for line in stream.decode().splitlines() if line)


def demo_text() -> str:
    """Everything the ``demo`` command prints."""
    return "\n".join([*_routes(), *_requests(), *_responses()]) + "\n"

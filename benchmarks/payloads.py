"""Realistic payloads for the benchmark, built deterministically (seeded) as JSON bytes."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import orjson

_VOCAB = 151_936
_WORDS = ["the", "model", " answer", " Paris", " is", " weather", "é", "日本", " tool", "\n"]


def _tools() -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": "Look something up. " * 4,
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                    "required": ["city"],
                },
            },
        }
        for i in range(4)
    ]


def chat_request(n_messages: int) -> bytes:
    """A chat client's body with ``n_messages`` messages, tools and sampling fields."""
    rng = random.Random(n_messages)  # noqa: S311 - seeded payloads, not secrets
    messages = [{"role": "system", "content": "You are helpful."}]
    for i in range(n_messages - 1):
        role = "user" if i % 2 == 0 else "assistant"
        text = "".join(rng.choice(_WORDS) for _ in range(60))
        messages.append({"role": role, "content": text})
    body = {
        "model": "Qwen/Qwen3-0.6B",
        "messages": messages,
        "tools": _tools(),
        # Read and dropped by the text-mode leg, which refuses a client that asks for a call.
        "tool_choice": "none",
        "max_completion_tokens": 512,
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 7,
        "stop": ["\n\n"],
        "logprobs": True,
        "top_logprobs": 2,
        "stream": False,
        "user": "bench",
    }
    return orjson.dumps(body)


def generate_request(n_tokens: int) -> bytes:
    """A generate client's body with ``n_tokens`` prompt token IDs and a top-level cap."""
    rng = random.Random(n_tokens)  # noqa: S311 - seeded payloads, not secrets
    body = {
        "request_id": "chatcmpl-bench",
        "token_ids": [rng.randrange(_VOCAB) for _ in range(n_tokens)],
        "sampling_params": {
            "temperature": 0.7,
            "top_p": 0.9,
            "seed": 7,
            "stop": [],
            "stop_token_ids": [],
            "output_kind": 2,
            "skip_clone": True,
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        "max_tokens": 256,
        "model": "Qwen/Qwen3-0.6B",
        "stream": False,
        "cache_salt": "tenant-a",
    }
    return orjson.dumps(body)


def _logprobs(rng: random.Random, tokens: list[str]) -> dict[str, Any]:
    content = []
    for token in tokens:
        top = [
            {
                "token": t,
                "logprob": -rng.random() * 5,
                "bytes": list(t.encode()),
            }
            for t in [token, *rng.sample(_WORDS, 4)]
        ]
        content.append({**top[0], "top_logprobs": top})
    return {"content": content}


def generate_response(n_tokens: int, mode: str, *, logprobs: bool) -> bytes:
    """A generate response in ``text`` or ``derender`` mode with ``n_tokens`` output tokens."""
    rng = random.Random(n_tokens * 2 + logprobs)  # noqa: S311 - seeded payloads, not secrets
    tokens = [rng.choice(_WORDS) for _ in range(n_tokens)]
    choice: dict[str, Any] = {
        "index": 0,
        "finish_reason": "length",
        "stop_reason": None,
        "token_ids": [rng.randrange(_VOCAB) for _ in range(n_tokens)],
        "routed_experts": None,
        "sampling_mask": None,
        "weight_versions": [{"version": "v1", "start": 0, "end": n_tokens}],
    }
    text = "".join(tokens)
    if mode == "text":
        choice["text"] = text
    else:
        choice["message"] = {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": "Thinking about it.",
        }
    choice["logprobs"] = _logprobs(rng, tokens) if logprobs else None
    body = {
        "request_id": "generate-tokens-chatcmpl-bench",
        "model": "Qwen/Qwen3-0.6B",
        "created": 1796000000,
        "usage": {
            "prompt_tokens": 1024,
            "total_tokens": 1024 + n_tokens,
            "completion_tokens": n_tokens,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        },
        "prompt_logprobs": None,
        "prompt_token_id_logprobs": None,
        "prompt_token_ids": None,
        "mm_placeholders": None,
        "metrics": None,
        "kv_transfer_params": {"do_remote_prefill": False, "remote_engine_id": "e1"},
        "ec_transfer_params": None,
        "output_mode": mode,
        "choices": [choice],
    }
    return orjson.dumps(body)


def generate_stream(n_tokens: int) -> bytes:
    """A text-mode generate SSE stream as vLLM sends it: one chunk per token, then the finish
    chunk, the usage chunk (``stream_options.include_usage``) and ``[DONE]``."""
    rng = random.Random(n_tokens * 3)  # noqa: S311 - seeded payloads, not secrets

    def chunk(text: str, token: int, finish: str | None) -> dict[str, Any]:
        choice = {
            "index": 0,
            "finish_reason": finish,
            "stop_reason": None,
            "token_ids": [token],
            "routed_experts": None,
            "sampling_mask": None,
            "weight_versions": None,
            "text": text,
            "logprobs": None,
        }
        return {**_STREAM_HEAD, "usage": None, "output_mode": "text", "choices": [choice]}

    events = [chunk(rng.choice(_WORDS), rng.randrange(_VOCAB), None) for _ in range(n_tokens)]
    events.append(chunk("", 151_645, "stop"))
    usage = {"prompt_tokens": 1024, "total_tokens": 1024 + n_tokens, "completion_tokens": n_tokens}
    events.append({**_STREAM_HEAD, "usage": usage, "output_mode": "text", "choices": []})
    frames = [b"data: " + orjson.dumps(event) + b"\n\n" for event in events]
    return b"".join([*frames, b"data: [DONE]\n\n"])


_STREAM_HEAD = {"request_id": "generate-tokens-chatcmpl-bench"}


# Real shapes: vLLM 0.33's render answers and the client bodies that asked for them,
# as recorded in tests/fixtures (each file's `_note` says how), the prompt scaled to n tokens.
_FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
RENDER_FIXTURES = {
    "chat": "render-chat-tools",
    "responses": "render-responses",
    "messages": "render-messages",
}
"""Each rendered client API's recorded render exchange (``<name>-request.json`` and
``-response.json``). A completions client is never rendered: its legs stay on its own route."""

# What a full client body carries besides its API's own fields (every one read or dropped by
# the leg builder): metadata, user, sampling fields.
_FULL_CHAT_EXTRAS: dict[str, Any] = {
    "stream": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": False},
    "response_format": {"type": "text"},
    "metadata": {"tenant": "a", "trace": "bench-0001"},
    "user": "bench-user",
    "temperature": 0.7,
    "top_p": 0.9,
    "seed": 7,
    "stop": ["\n\n"],
    "logprobs": True,
    "top_logprobs": 2,
    "n": 1,
}


def _fixture(name: str) -> Any:  # noqa: ANN401 - a JSON value
    return json.loads((_FIXTURES / f"{name}.json").read_text(encoding="utf-8"))["body"]


# vLLM 0.32's own render answers (the real engine, captured: the file's `_note` says how).
_VLLM_032 = Path(__file__).resolve().parent / "vllm-0.32-render.json"
RENDER_VERSIONS = ("0.33", "0.32")


def _recorded(api: str, version: str, part: str) -> Any:  # noqa: ANN401 - a JSON value
    if version == "0.32":
        return json.loads(_VLLM_032.read_text(encoding="utf-8"))[api][part]
    return _fixture(f"{RENDER_FIXTURES[api]}-{part}")


def render_answer(api: str, n_tokens: int, version: str = "0.33") -> bytes:
    """vLLM's render answer for ``api``'s recorded request, its prompt ``n_tokens`` long
    (every ``GenerateRequest`` field present, most null, as vLLM serialises it)."""
    answer = _recorded(api, version, "response")
    rng = random.Random(n_tokens)  # noqa: S311 - seeded payloads, not secrets
    answer["token_ids"] = [rng.randrange(_VOCAB) for _ in range(n_tokens)]
    return orjson.dumps(answer)


def render_client(api: str, version: str = "0.33") -> bytes:
    """The client body ``api``'s render answer was recorded for, as a full client sends it."""
    body = _recorded(api, version, "request")
    extras = {
        "chat": _FULL_CHAT_EXTRAS,
        "responses": {
            "stream": True,
            "metadata": _FULL_CHAT_EXTRAS["metadata"],
            "user": "bench-user",
            "temperature": 0.7,
            "top_p": 0.9,
            "text": {"format": {"type": "text"}},
            "store": False,
        },
        "messages": {
            "metadata": {"user_id": "bench-user"},
            "temperature": 0.7,
            "top_k": 40,
            "stop_sequences": ["\n\n"],
        },
    }[api]
    return orjson.dumps({**body, **extras})


def render_client_with_tools(api: str, count: int, version: str = "0.33") -> bytes:
    """:func:`render_client`'s body with ``count`` tools, its recorded tool under new names, as
    an agent sends them: more brackets than the count that proves a body shallow."""
    body = orjson.loads(render_client(api, version))
    tool = body["tools"][0]
    tools = []
    for index in range(count):
        renamed = copy.deepcopy(tool)
        function = renamed.get("function", renamed)  # chat nests it; Responses and Messages not
        function["name"] = f"{function['name']}_{index}"
        tools.append(renamed)
    return orjson.dumps({**body, "tools": tools})


def generate_request_full(n_tokens: int) -> bytes:
    """A generate client's body as vLLM 0.33 serialises a ``GenerateRequest``: every top-level
    field present (most null), ``sampling_params`` as a render answer holds them, and a cap."""
    rng = random.Random(n_tokens)  # noqa: S311 - seeded payloads, not secrets
    body = {
        "request_id": "chatcmpl-bench",
        "token_ids": [rng.randrange(_VOCAB) for _ in range(n_tokens)],
        "token_offsets": None,
        "features": None,
        "content_parts": None,
        "sampling_params": {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 0.7,
            "top_p": 0.9,
            "min_p": 0.0,
            "seed": 7,
            "stop": [],
            "stop_token_ids": [],
            "output_kind": 2,
            "skip_clone": True,
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        "model": "Qwen/Qwen3-0.6B",
        "max_tokens": 256,
        "reasoning_ended": None,
        "reasoning_parser_kwargs": None,
        "return_token_ids": None,
        "output_mode": "text",
        "parse_context": None,
        "stream": False,
        "stream_options": None,
        "cache_salt": "tenant-a",
        "priority": 0,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
    }
    return orjson.dumps(body)


def full_chat_client() -> bytes:
    """A chat client's full body for a wrap: tools (not called), stream options, a response
    format, metadata and a user, as SDKs send them."""
    body = orjson.loads(chat_request(4))
    return orjson.dumps({**body, **_FULL_CHAT_EXTRAS, "stream": False})

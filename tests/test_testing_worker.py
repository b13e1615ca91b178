"""The simulated vLLM 0.33 worker (``disagg_transforms.testing``) against vLLM's own fixtures."""

from __future__ import annotations

import ast
import asyncio
import copy
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

import httpx
import jsonschema
import pydantic
import pytest
from golden import load_fixture, load_stream
from hypothesis import given
from strategies import simulated_generate_bodies

import disagg_transforms.testing
from disagg_transforms.testing import (
    FAULT_HEADER,
    FAULT_MODES,
    RecordedCall,
    SimulatedWorker,
    WorkerSettings,
    toy_decode,
    toy_encode,
)
from disagg_transforms.testing._schema import instance

GENERATE = "/inference/v1/generate"
CHAT_RENDER = "/v1/chat/completions/render"
CREATED = 1796000000
SCHEMA = load_fixture("request-json-schema.json")
ALLOWED_IMPORTS = {
    "__future__",
    "asyncio",
    "base64",
    "collections",
    "contextlib",
    "dataclasses",
    "hashlib",
}
ALLOWED_IMPORTS |= {"json", "logging", "orjson", "re", "time", "typing", "uuid"}


def call(  # noqa: PLR0917 - reads like the request line it sends
    worker: SimulatedWorker,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    content: bytes | None = None,
) -> httpx.Response:
    """One request to the worker in process, through httpx's ASGI transport."""

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=worker)
        async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
            if content is not None:
                return await client.request(method, path, content=content, headers=headers)
            if body is None:
                return await client.request(method, path, headers=headers)
            return await client.request(method, path, json=body, headers=headers)

    return asyncio.run(run())


def same(got: Any, expected: Any) -> bool:
    """Equal values, key order, nulls and int/float kinds included."""
    return json.dumps(got) == json.dumps(expected)


def events(response: httpx.Response) -> list[str]:
    return [event for event in response.text.split("\n\n") if event]


def generate_body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = load_fixture("generate-decode-request.json")
    body["kv_transfer_params"] = None
    body.update(changes)
    return body


@pytest.fixture
def worker() -> SimulatedWorker:
    return SimulatedWorker(WorkerSettings(created=CREATED))


# ---------------------------------------------------------------- the package's shape


def test_root_import_does_not_load_the_testing_package_or_asyncio() -> None:
    code = (
        "import sys, disagg_transforms; "
        "assert 'asyncio' not in sys.modules, 'asyncio'; "
        "assert 'disagg_transforms.testing' not in sys.modules, 'testing'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)  # noqa: S603 - fixed code


def test_testing_package_imports_nothing_else_of_the_library() -> None:
    # The worker is the peer the library is tested against: sharing code would hide bugs.
    package = Path(disagg_transforms.testing.__file__).parent
    for source in package.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                assert name.split(".")[0] in ALLOWED_IMPORTS or name.startswith(
                    "disagg_transforms.testing"
                ), (source.name, name)


def test_fault_modes_and_unknown_fault() -> None:
    assert set(FAULT_MODES) == {
        "no-output-mode",
        "http-400",
        "http-500",
        "http-503",
        "not-json",
        "cut-stream",
        "slow-first-byte",
        "stream-error",
    }
    with pytest.raises(ValueError, match="unknown fault"):
        SimulatedWorker(fault="gpu-on-fire")
    with pytest.raises(ValueError, match="fault_calls"):
        SimulatedWorker(fault="http-503", fault_calls=-1)


def test_bad_settings_are_refused_when_built() -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        WorkerSettings(max_model_len=0)
    with pytest.raises(ValueError, match="first_byte_delay"):
        SimulatedWorker(first_byte_delay=-1)
    worker = SimulatedWorker(WorkerSettings(model="m"))
    assert worker.settings == WorkerSettings(model="m")


def test_toy_tokenizer_round_trips_and_keeps_special_ids() -> None:
    text = "<|im_start|>user\nHé<think></think><tool_call></tool_call><|im_end|>"
    tokens = toy_encode(text)
    assert tokens[0] == 151644
    assert tokens[-1] == 151645
    assert [t for t in tokens if t > 150000][1:-1] == [151667, 151668, 151657, 151658]
    assert toy_encode("H") == [1072]
    assert toy_decode(tokens) == text
    assert toy_decode(tokens, skip_special_tokens=True) == "user\nHé"
    # Half of "é" is held back until its second byte arrives.
    assert toy_decode(toy_encode("é")[:1]) == ""


# ---------------------------------------------------------------- render routes

RENDER_FIXTURES = [
    ("render-chat", CHAT_RENDER, "fx-chat"),
    ("render-chat-tools", CHAT_RENDER, "fx-tools"),
    ("render-chat-kv", CHAT_RENDER, "fx-kv"),
    ("render-messages", "/v1/messages/render", "fx-msg"),
    ("render-completions", "/v1/completions/render", "fx-cmpl"),
]


@pytest.mark.parametrize(("name", "path", "request_id"), RENDER_FIXTURES)
def test_render_answers_equal_vllms_byte_for_byte(
    worker: SimulatedWorker, name: str, path: str, request_id: str
) -> None:
    request = load_fixture(f"{name}-request.json")
    response = call(worker, "POST", path, request, {"x-request-id": request_id})
    assert response.status_code == 200
    assert response.headers["x-request-id"] == request_id
    assert same(response.json(), load_fixture(f"{name}-response.json"))


def test_responses_render_equals_vllms_but_for_its_random_id(worker: SimulatedWorker) -> None:
    request = load_fixture("render-responses-request.json")
    response = call(worker, "POST", "/v1/responses/render", request, {"x-request-id": "ignored"})
    got, expected = response.json(), load_fixture("render-responses-response.json")
    # vLLM ignores X-Request-Id here: resp_ and 16 random hex digits.
    assert re.fullmatch(r"resp_[0-9a-f]{16}", got["request_id"])
    got["request_id"] = expected["request_id"]
    assert same(got, expected)
    request["request_id"] = "resp_mine"
    again = call(worker, "POST", "/v1/responses/render", request).json()
    assert again["request_id"] == "resp_mine"


def test_render_refuses_empty_tools_like_vllm(worker: SimulatedWorker) -> None:
    request = load_fixture("error-400-render-empty-tools-request.json")
    response = call(worker, "POST", CHAT_RENDER, request)
    assert response.status_code == 400
    assert same(response.json(), load_fixture("error-400-render-empty-tools.json"))


def test_render_max_tokens_rules(worker: SimulatedWorker) -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    default = call(worker, "POST", CHAT_RENDER, chat).json()
    assert default["sampling_params"]["max_tokens"] == 4096 - len(default["token_ids"])
    capped = call(worker, "POST", CHAT_RENDER, {**chat, "max_tokens": 40}).json()
    assert capped["sampling_params"]["max_tokens"] == 40
    # 16 is the engine's default: vLLM's dump leaves it out.
    sixteen = call(worker, "POST", CHAT_RENDER, {**chat, "max_completion_tokens": 16}).json()
    assert "max_tokens" not in sixteen["sampling_params"]
    small = SimulatedWorker(WorkerSettings(max_model_len=64))
    too_big = call(small, "POST", CHAT_RENDER, {**chat, "max_tokens": 60})
    assert too_big.status_code == 400
    assert too_big.json()["error"]["type"] == "BadRequestError"
    assert too_big.json()["error"]["param"] == "max_tokens"


def test_render_ids_come_from_the_header_else_are_made(worker: SimulatedWorker) -> None:
    chat = {"messages": [{"role": "user", "content": "Hi"}]}
    made = call(worker, "POST", CHAT_RENDER, chat).json()
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", made["request_id"])
    assert made["model"] == "simulated"
    completions = {"prompt": "Say hi"}
    answer = call(worker, "POST", "/v1/completions/render", completions, {"x-request-id": "c1"})
    assert [item["request_id"] for item in answer.json()] == ["cmpl-c1-0"]


def test_render_stream_options(worker: SimulatedWorker) -> None:
    chat = {"messages": [{"role": "user", "content": "Hi"}], "stream": True}
    options = {"include_usage": True}
    streamed = call(worker, "POST", CHAT_RENDER, {**chat, "stream_options": options}).json()
    assert streamed["stream_options"] == {"include_usage": True, "continuous_usage_stats": False}
    assert streamed["sampling_params"]["output_kind"] == 1
    refused = call(
        worker, "POST", CHAT_RENDER, {**chat, "stream": False, "stream_options": options}
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "stream_options"


def test_render_template_covers_history_and_thinking_off(worker: SimulatedWorker) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    body = {"messages": messages, "chat_template_kwargs": {"enable_thinking": False}}
    answer = call(worker, "POST", CHAT_RENDER, body).json()
    assert toy_decode(answer["token_ids"]) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWeather?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
        '"Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert answer["parse_context"]["history_tool_call_cnt"] == 1
    assert answer["parse_context"]["chat_template_kwargs"] == {
        "add_generation_prompt": True,
        "continue_final_message": False,
        "enable_thinking": False,
    }


def test_render_refuses_a_body_that_is_not_a_chat(worker: SimulatedWorker) -> None:
    response = call(worker, "POST", CHAT_RENDER, {"model": "m"})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "Bad Request"
    assert response.json()["error"]["param"] == "body.messages"


# ---------------------------------------------------------------- generate: golden answers


def test_prefill_answers_like_vllms_nixl_connector(worker: SimulatedWorker) -> None:
    request = load_fixture("generate-prefill-request.json")
    got = call(worker, "POST", GENERATE, request).json()
    expected = load_fixture("generate-prefill-response.json")
    # vLLM's engine-side id ends in a random suffix; ours is a hash of the id.
    suffix = r"generate-tokens-chatcmpl-fx-chat-[0-9a-f]{8}"
    assert re.fullmatch(suffix, got["kv_transfer_params"]["remote_request_id"])
    got["kv_transfer_params"]["remote_request_id"] = "generate-tokens-chatcmpl-fx-chat-1a2b3c4d"
    assert same(got, expected)


def test_decode_answers_exactly_like_vllm(worker: SimulatedWorker) -> None:
    request = load_fixture("generate-decode-request.json")
    response = call(worker, "POST", GENERATE, request)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert same(response.json(), load_fixture("generate-decode-response.json"))


def test_stream_with_usage_is_vllms_stream_byte_for_byte(worker: SimulatedWorker) -> None:
    request = load_fixture("generate-stream-usage-request.json")
    response = call(worker, "POST", GENERATE, request)
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.content == load_stream("generate-stream-usage.sse")


def test_stream_without_usage_has_no_usage_chunk(worker: SimulatedWorker) -> None:
    request = load_fixture("generate-stream-usage-request.json")
    request["stream_options"] = None
    expected = load_stream("generate-stream-usage.sse").split(b"\n\n")
    response = call(worker, "POST", GENERATE, request)
    assert response.content.split(b"\n\n") == [*expected[:7], *expected[8:]]


def test_stream_tokens_mode_continuous_usage_and_prompt_ids(worker: SimulatedWorker) -> None:
    request = generate_body(
        output_mode="tokens",
        stream=True,
        return_token_ids=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    chunks = [
        json.loads(e.removeprefix("data: "))
        for e in events(call(worker, "POST", GENERATE, request))[:-1]
    ]
    assert list(chunks[0]) == ["request_id", "usage", "prompt_token_ids", "output_mode", "choices"]
    assert chunks[0]["prompt_token_ids"] == request["token_ids"]
    assert "prompt_token_ids" not in chunks[1]
    assert "text" not in chunks[0]["choices"][0]
    assert chunks[2]["usage"]["completion_tokens"] == 3
    assert chunks[-1]["choices"] == []
    assert [c["choices"][0]["token_ids"][0] for c in chunks[:-1]] == [*toy_encode("Hello!"), 151645]


def test_refuses_derender_with_stream_like_vllm(worker: SimulatedWorker) -> None:
    request = generate_body(output_mode="derender", stream=True)
    response = call(worker, "POST", GENERATE, request)
    assert response.status_code == 400
    assert same(response.json(), load_fixture("error-400.json"))


def test_refuses_text_without_detokenize_like_vllm(worker: SimulatedWorker) -> None:
    request = load_fixture("error-400-detokenize-false-request.json")
    response = call(worker, "POST", GENERATE, request)
    assert response.status_code == 400
    assert same(response.json(), load_fixture("error-400-detokenize-false.json"))
    derender = copy.deepcopy(request)
    derender["output_mode"] = "derender"
    message = call(worker, "POST", GENERATE, derender).json()["error"]["message"]
    assert "output_mode='derender' requires sampling_params.detokenize to be true" in message
    tokens = copy.deepcopy(request)
    tokens["output_mode"] = "tokens"
    assert call(worker, "POST", GENERATE, tokens).status_code == 200


# ---------------------------------------------------------------- generate: output modes


def _choice_shape(body: dict[str, Any]) -> tuple[list[str], list[str]]:
    choice = body["choices"][0]
    return list(body), list(choice)


def test_tokens_mode_has_no_text(worker: SimulatedWorker) -> None:
    got = call(worker, "POST", GENERATE, generate_body(output_mode="tokens")).json()
    assert got["output_mode"] == "tokens"
    assert _choice_shape(got) == _choice_shape(load_fixture("response-tokens.json"))
    assert got["choices"][0]["token_ids"] == [*toy_encode("Hello!"), 151645]


def test_derender_plain_message(worker: SimulatedWorker) -> None:
    got = call(worker, "POST", GENERATE, generate_body(output_mode="derender")).json()
    expected = load_fixture("response-derender-text.json")
    assert _choice_shape(got) == _choice_shape(expected)
    message = got["choices"][0]["message"]
    assert list(message) == list(expected["choices"][0]["message"])
    assert message["content"] == "Hello!"
    assert message["reasoning"] == "The user greets me."
    assert got["choices"][0]["finish_reason"] == "stop"
    assert toy_decode(got["choices"][0]["token_ids"]).startswith("<think>\n")


def test_derender_calls_the_first_tool(worker: SimulatedWorker) -> None:
    tools = load_fixture("render-chat-tools-response.json")["parse_context"]
    got = call(
        worker, "POST", GENERATE, generate_body(output_mode="derender", parse_context=tools)
    ).json()
    expected = load_fixture("response-derender-tool-call.json")
    assert _choice_shape(got) == _choice_shape(expected)
    choice = got["choices"][0]
    assert list(choice["message"]) == list(expected["choices"][0]["message"])
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    (tool_call,) = choice["message"]["tool_calls"]
    assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{32}", tool_call["id"])
    assert tool_call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    none = {**tools, "tool_choice": "none"}
    plain = call(
        worker, "POST", GENERATE, generate_body(output_mode="derender", parse_context=none)
    )
    assert "tool_calls" not in plain.json()["choices"][0]["message"]


def test_derender_named_tool_and_hidden_reasoning(worker: SimulatedWorker) -> None:
    context = copy.deepcopy(load_fixture("render-chat-tools-response.json")["parse_context"])
    context["tool_choice"] = {"type": "function", "function": {"name": "get_weather"}}
    context["include_reasoning"] = False
    body = generate_body(output_mode="derender", parse_context=context)
    choice = call(worker, "POST", GENERATE, body).json()["choices"][0]
    # A named choice keeps finish_reason stop and writes content "".
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == ""
    assert choice["message"]["reasoning"] is None
    assert choice["token_ids"] is None
    context["tool_choice"] = {"type": "function", "function": {"name": "nope"}}
    refused = call(worker, "POST", GENERATE, body)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "tool_choice"


def test_derender_needs_a_parse_context(worker: SimulatedWorker) -> None:
    body = generate_body(output_mode="derender", parse_context=None)
    response = call(worker, "POST", GENERATE, body)
    assert response.status_code == 400
    assert "requires parse_context" in response.json()["error"]["message"]


def test_cap_n_and_logprobs(worker: SimulatedWorker) -> None:
    sampling = {"max_tokens": 3, "n": 2, "logprobs": -1}
    got = call(worker, "POST", GENERATE, generate_body(sampling_params=sampling)).json()
    assert [c["index"] for c in got["choices"]] == [0, 1]
    assert [c["finish_reason"] for c in got["choices"]] == ["length", "length"]
    assert [c["text"] for c in got["choices"]] == ["Hel", "Hel"]
    assert got["usage"] == {
        "prompt_tokens": 21,
        "total_tokens": 27,
        "completion_tokens": 6,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    expected = load_fixture("response-text-logprobs.json")["choices"][0]["logprobs"]["content"][0]
    entry = got["choices"][0]["logprobs"]["content"][0]
    assert list(entry) == list(expected)
    assert [list(top) for top in entry["top_logprobs"]] == [
        list(t) for t in expected["top_logprobs"]
    ]
    assert len(entry["top_logprobs"]) == 3
    assert (entry["token"], entry["bytes"]) == ("H", [72])
    tokens_mode = generate_body(output_mode="tokens", sampling_params={"logprobs": 1})
    token_entry = call(worker, "POST", GENERATE, tokens_mode).json()["choices"][0]["logprobs"][
        "content"
    ][0]
    assert list(token_entry) == ["token_id", "logprob", "rank", "top_logprobs"]


STOPS = [
    # (sampling_params, text, completion tokens, stop_reason, streamed text pieces)
    ({"stop": ["l"]}, "He", 3, "l", ["H", "e", ""]),
    # "lo" ends at the fifth token; one character is held back while it could begin.
    ({"stop": ["x", "lo"]}, "Hel", 5, "lo", ["", "H", "e", "l", ""]),
    ({"stop": "lo"}, "Hel", 5, "lo", ["", "H", "e", "l", ""]),
    ({"stop": ["lo"], "include_stop_str_in_output": True}, "Hello", 5, "lo", list("Hello")),
    # No match: the answer ends at its end of turn, the held-back character sent with it.
    ({"stop": ["zz"]}, "Hello!", 7, None, ["", *"Hello!"]),
]


@pytest.mark.parametrize(("sampling", "text", "tokens", "reason", "pieces"), STOPS)
def test_stop_strings_end_the_answer_as_vllms_detokenizer_does(  # noqa: PLR0917
    worker: SimulatedWorker,
    sampling: dict[str, Any],
    text: str,
    tokens: int,
    reason: str | None,
    pieces: list[str],
) -> None:
    # vLLM checks stop strings on the detokenized text after each token: a match ends the answer
    # (finish_reason stop, stop_reason the string, the token counted), the text cut before it
    # (after it with include_stop_str_in_output); a stream holds back len(longest stop) - 1
    # characters until the answer ends.
    body = generate_body(sampling_params={"max_tokens": 64, **sampling})
    choice = call(worker, "POST", GENERATE, body).json()["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == (
        text,
        "stop",
        reason,
    )
    assert len(choice["token_ids"]) == tokens
    stream = call(worker, "POST", GENERATE, {**body, "stream": True})
    chunks = [json.loads(event[len("data: ") :]) for event in events(stream)[:-1]]
    assert [chunk["choices"][0]["text"] for chunk in chunks] == pieces
    assert (chunks[-1]["choices"][0]["finish_reason"], chunks[-1]["choices"][0]["stop_reason"]) == (
        "stop",
        reason,
    )
    assert all(chunk["choices"][0]["stop_reason"] is None for chunk in chunks[:-1])


def test_coupled_routes_report_the_stop_string() -> None:
    worker = SimulatedWorker(WorkerSettings(created=CREATED))
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "stop": ["l"]}
    choice = call(worker, "POST", "/v1/chat/completions", chat).json()["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"], choice["stop_reason"]) == (
        "He",
        "stop",
        "l",
    )
    completion = {"model": "m", "prompt": "Hi", "stop": ["l"]}
    choice = call(worker, "POST", "/v1/completions", completion).json()["choices"][0]
    assert (choice["text"], choice["stop_reason"]) == ("He", "l")
    # vLLM's Messages serving maps finish reasons alone: a stop string is an end_turn.
    message = {"model": "m", "max_tokens": 64, "messages": chat["messages"]}
    answer = call(worker, "POST", "/v1/messages", {**message, "stop_sequences": ["l"]}).json()
    assert answer["content"] == [{"type": "text", "text": "He"}]
    assert answer["stop_reason"] == "end_turn"
    assert "stop_sequence" not in answer


def test_absent_cap_is_the_rest_of_the_context() -> None:
    worker = SimulatedWorker(WorkerSettings(answer="A longer answer", max_model_len=25))
    body = generate_body(sampling_params={})
    choice = call(worker, "POST", GENERATE, body).json()["choices"][0]
    # 21 prompt tokens leave 4 of the 25.
    assert (choice["text"], choice["finish_reason"]) == ("A lo", "length")
    body["token_ids"] = [1000] * 25
    assert call(worker, "POST", GENERATE, body).status_code == 400


def test_generate_request_ids(worker: SimulatedWorker) -> None:
    body = generate_body(request_id="from-body")
    assert call(worker, "POST", GENERATE, body).json()["request_id"] == "generate-tokens-from-body"
    # vLLM: the X-Request-Id header wins over the body's request_id.
    with_header = call(worker, "POST", GENERATE, body, {"x-request-id": "hdr"})
    assert with_header.json()["request_id"] == "generate-tokens-hdr"
    assert with_header.headers["x-request-id"] == "hdr"
    del body["request_id"]
    made = call(worker, "POST", GENERATE, body)
    assert re.fullmatch(r"generate-tokens-[0-9a-f]{16}", made.json()["request_id"])
    assert made.headers["x-request-id"]


# ---------------------------------------------------------------- generate: validation


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"token_ids": []}, "body.token_ids"),
        ({"token_ids": [1, -1]}, "body.token_ids.1"),
        ({"token_ids": [1, True]}, "body.token_ids.1"),
        ({"token_ids": "1 2"}, "body.token_ids"),
        ({"sampling_params": None}, "body.sampling_params"),
        ({"sampling_params": {"max_tokens": "8"}}, "body.sampling_params.max_tokens"),
        ({"output_mode": "Text"}, "body.output_mode"),
        ({"stream": "yes"}, "body.stream"),
        ({"kv_transfer_params": [1]}, "body.kv_transfer_params"),
        ({"parse_context": {"tools": [{}]}}, "body.parse_context.tools"),
        ({"request_id": None}, "body.request_id"),
    ],
)
def test_bad_bodies_get_vllms_validation_400(
    worker: SimulatedWorker, change: dict[str, Any], param: str
) -> None:
    response = call(worker, "POST", GENERATE, generate_body(**change))
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("Bad Request", param, 400)
    assert error["message"].startswith("1 validation error:\n  {'type': ")


def test_missing_fields_and_non_json(worker: SimulatedWorker) -> None:
    missing = call(worker, "POST", GENERATE, {"model": "m"}).json()["error"]
    assert missing["message"].startswith("2 validation errors:")
    assert missing["param"] == "body.token_ids"
    for content, content_type in ((b"{not json", "application/json"), (b"{}", "text/plain")):
        response = call(
            worker, "POST", GENERATE, content=content, headers={"content-type": content_type}
        )
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "Bad Request"


@pytest.mark.parametrize(
    ("sampling", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": 0, "n": 2}, "n"),
        ({"logprobs": -2}, "logprobs"),
    ],
)
def test_sampling_ranges_get_bad_request_error(
    worker: SimulatedWorker, sampling: dict[str, Any], param: str
) -> None:
    response = call(worker, "POST", GENERATE, generate_body(sampling_params=sampling))
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "BadRequestError"
    assert response.json()["error"]["param"] == param


GENERATE_FIXTURE_REQUESTS = [
    "generate-prefill-request.json",
    "generate-decode-request.json",
    "generate-stream-usage-request.json",
    "request-decode-derender.json",
]


@pytest.mark.parametrize("name", GENERATE_FIXTURE_REQUESTS)
def test_fixture_requests_are_schema_valid_and_accepted(worker: SimulatedWorker, name: str) -> None:
    request = load_fixture(name)
    jsonschema.validate(request, SCHEMA)
    assert call(worker, "POST", GENERATE, request).status_code == 200


@pytest.mark.parametrize(("name", "path"), [fixture[:2] for fixture in RENDER_FIXTURES[:4]])
def test_render_answers_are_accepted_generate_requests(
    worker: SimulatedWorker, name: str, path: str
) -> None:
    rendered = call(worker, "POST", path, load_fixture(f"{name}-request.json")).json()
    jsonschema.validate(rendered, SCHEMA)
    rendered["stream"] = False
    assert call(worker, "POST", GENERATE, rendered).status_code == 200


@given(simulated_generate_bodies())
def test_every_body_the_worker_accepts_is_valid_for_vllms_schema(body: dict[str, Any]) -> None:
    worker = SimulatedWorker()
    response = call(worker, "POST", GENERATE, body)
    assert response.status_code in {200, 400}, response.text
    if response.status_code == 200 or response.json()["error"]["type"] != "Bad Request":
        jsonschema.validate(body, SCHEMA)


# ---------------------------------------------------------------- faults


def test_no_output_mode_fault_answers_tokens_without_the_key() -> None:
    worker = SimulatedWorker(fault="no-output-mode")
    got = call(worker, "POST", GENERATE, generate_body(output_mode="text")).json()
    assert "output_mode" not in got
    assert "text" not in got["choices"][0]
    unread = generate_body(output_mode="derender", parse_context={"tools": "not a list"})
    assert call(worker, "POST", GENERATE, unread).status_code == 200
    # An old worker ignores the key entirely: derender + stream is not refused.
    stream = generate_body(output_mode="derender", stream=True)
    chunks = events(call(worker, "POST", GENERATE, stream))
    assert chunks[-1] == "data: [DONE]"
    assert all("output_mode" not in json.loads(c.removeprefix("data: ")) for c in chunks[:-1])


@pytest.mark.parametrize("path", [GENERATE, CHAT_RENDER, "/v1/models"])
def test_http_500_fault(path: str) -> None:
    worker = SimulatedWorker()
    method = "GET" if path == "/v1/models" else "POST"
    response = call(worker, method, path, {"messages": []}, {FAULT_HEADER: "http-500"})
    assert response.status_code == 500
    assert response.json() == {
        "error": {
            "message": "Internal server error",
            "type": "InternalServerError",
            "param": None,
            "code": 500,
        }
    }


def test_not_json_fault() -> None:
    worker = SimulatedWorker(fault="not-json")
    response = call(worker, "POST", GENERATE, generate_body())
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    with pytest.raises(json.JSONDecodeError):
        response.json()


def test_cut_stream_fault_stops_mid_event() -> None:
    worker = SimulatedWorker()
    request = load_fixture("generate-stream-usage-request.json")
    response = call(worker, "POST", GENERATE, request, {FAULT_HEADER: "cut-stream"})
    first, rest = response.text.split("\n\n", 1)
    assert first == load_stream("generate-stream-usage.sse").decode().split("\n\n")[0]
    assert rest.startswith('data: {"request_id"')
    assert "\n" not in rest
    assert "[DONE]" not in response.text
    whole = call(worker, "POST", GENERATE, generate_body(), {FAULT_HEADER: "cut-stream"})
    with pytest.raises(json.JSONDecodeError):
        whole.json()


def test_stream_error_fault_is_vllms_in_stream_error() -> None:
    worker = SimulatedWorker(fault="stream-error")
    request = load_fixture("generate-stream-usage-request.json")
    response = call(worker, "POST", GENERATE, request)
    assert response.status_code == 200
    assert response.content == load_stream("generate-stream-error.sse")
    assert call(worker, "POST", GENERATE, generate_body()).status_code == 500


def test_slow_first_byte_fault_waits() -> None:
    worker = SimulatedWorker(fault="slow-first-byte", first_byte_delay=0.2)
    start = time.monotonic()
    response = call(worker, "POST", GENERATE, generate_body())
    assert time.monotonic() - start >= 0.2
    assert response.status_code == 200


def test_stream_delay_spaces_the_events_of_a_stream() -> None:
    worker = SimulatedWorker(stream_delay=0.05)
    start = time.monotonic()
    response = call(worker, "POST", GENERATE, generate_body(stream=True))
    assert response.status_code == 200
    sent = events(response)
    assert time.monotonic() - start >= 0.05 * (len(sent) - 1)
    assert sent[-1] == "data: [DONE]"
    with pytest.raises(ValueError, match="non-negative"):
        SimulatedWorker(stream_delay=-1)


def test_health_ignores_the_worker_fault_but_not_its_own_header() -> None:
    worker = SimulatedWorker(fault="http-500")
    health = call(worker, "GET", "/health")
    assert (health.status_code, health.content) == (200, b"")
    assert call(worker, "GET", "/health", headers={FAULT_HEADER: "http-500"}).status_code == 500


def test_header_fault_overrides_and_unknown_is_refused() -> None:
    worker = SimulatedWorker(fault="http-500")
    ok = call(worker, "POST", GENERATE, generate_body(), {FAULT_HEADER: "slow-first-byte"})
    assert ok.status_code == 200
    unknown = call(worker, "POST", GENERATE, generate_body(), {FAULT_HEADER: "bogus"})
    assert unknown.status_code == 400
    assert unknown.json()["error"]["param"] == FAULT_HEADER


# ---------------------------------------------------------------- other routes


def test_models_lists_simulated_and_the_configured_model() -> None:
    worker = SimulatedWorker(WorkerSettings(model="Qwen/Qwen3-0.6B"))
    models = call(worker, "GET", "/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["simulated", "Qwen/Qwen3-0.6B"]
    assert [m["id"] for m in call(SimulatedWorker(), "GET", "/v1/models").json()["data"]] == [
        "simulated"
    ]


def test_unknown_route_and_wrong_method(worker: SimulatedWorker) -> None:
    missing = call(worker, "GET", "/v1/nope", headers={"x-request-id": "r9"})
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "NotFoundError"
    assert missing.headers["x-request-id"] == "r9"
    wrong = call(worker, "GET", GENERATE)
    assert wrong.status_code == 405
    assert set(wrong.json()["error"]) == {"message", "type", "param", "code"}


def test_lifespan_is_answered(worker: SimulatedWorker) -> None:
    sent: list[dict[str, Any]] = []
    incoming = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])

    async def receive() -> dict[str, Any]:
        return next(incoming)

    async def send(message: Any) -> None:
        sent.append(dict(message))

    asyncio.run(worker({"type": "lifespan"}, receive, send))
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


# ---------------------------------------------------------------- the request log


def test_the_log_shows_one_disaggregated_exchange(worker: SimulatedWorker) -> None:
    headers = {"x-request-id": "fx-chat", "X-Custom": "A"}
    chat = load_fixture("render-chat-request.json")
    rendered = call(worker, "POST", CHAT_RENDER, {**chat, "max_tokens": 5}, headers).json()
    prefill = {
        **rendered,
        "sampling_params": {**rendered["sampling_params"], "max_tokens": 1},
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
    }
    kv = call(worker, "POST", GENERATE, prefill, headers).json()["kv_transfer_params"]
    decode = {**rendered, "output_mode": "text", "kv_transfer_params": kv}
    answer = call(worker, "POST", GENERATE, decode, headers).json()
    assert answer["kv_transfer_params"] is None
    assert answer["choices"][0]["text"] == "Hello"

    assert all(isinstance(c, RecordedCall) for c in worker.calls)
    assert [(c.method, c.path) for c in worker.calls] == [
        ("POST", CHAT_RENDER),
        ("POST", GENERATE),
        ("POST", GENERATE),
    ]
    assert {c.headers["x-request-id"] for c in worker.calls} == {"fx-chat"}
    assert worker.calls[0].headers["x-custom"] == "A"
    legs = worker.calls_to(GENERATE)
    assert legs[0].body["sampling_params"]["max_tokens"] == 1
    assert legs[0].body["kv_transfer_params"]["do_remote_decode"] is True
    assert legs[1].body["sampling_params"]["max_tokens"] == 5
    assert legs[1].body["kv_transfer_params"] == kv
    assert kv["remote_num_tokens"] == len(rendered["token_ids"])


def test_the_log_keeps_bodies_that_are_not_json(worker: SimulatedWorker) -> None:
    call(worker, "POST", GENERATE, content=b"<xml/>", headers={"content-type": "application/json"})
    call(worker, "GET", "/health")
    assert [c.body for c in worker.calls] == [None, None]


def _image_render(worker: SimulatedWorker) -> dict[str, Any]:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    chat = {"model": "m", "messages": [{"role": "user", "content": [image]}]}
    answer = call(worker, "POST", CHAT_RENDER, chat)
    assert answer.status_code == 200
    rendered: dict[str, Any] = answer.json()
    return rendered


def test_generate_checks_features_like_vllm(worker: SimulatedWorker) -> None:
    rendered = _image_render(worker)
    features = rendered["features"]
    (place,) = features["mm_placeholders"]["image"]
    pads = rendered["token_ids"][place["offset"] : place["offset"] + place["length"]]
    assert pads == [151655] * 4
    body = {"token_ids": rendered["token_ids"], "sampling_params": {"max_tokens": 1}}
    encoded = call(worker, "POST", GENERATE, {**body, "features": features}).json()
    assert encoded["ec_transfer_params"]["mm_hashes"] == features["mm_hashes"]["image"]
    metadata_only = {**features, "kwargs_data": {"image": [None]}}
    refused = call(worker, "POST", GENERATE, {**body, "features": metadata_only})
    assert refused.status_code == 400
    assert "ec_transfer_params" in refused.json()["error"]["message"]
    given = {**body, "features": metadata_only, "ec_transfer_params": encoded["ec_transfer_params"]}
    assert call(worker, "POST", GENERATE, given).json()["ec_transfer_params"] is None
    outside = {**features, "mm_placeholders": {"image": [{"offset": 10_000, "length": 4}]}}
    refused = call(worker, "POST", GENERATE, {**body, "features": outside})
    assert refused.json()["error"]["param"] == "body.features"
    parts = call(worker, "POST", GENERATE, {**body, "content_parts": [{"type": "image_url"}]})
    assert parts.json()["error"]["param"] == "body.content_parts"


def test_coupled_chat_answers_like_vllms_coupled_server(worker: SimulatedWorker) -> None:
    chat = {"model": "Qwen/Qwen3-0.6B", "messages": [{"role": "user", "content": "Hi"}]}
    answer = call(worker, "POST", "/v1/chat/completions", chat, {"x-request-id": "abc123"}).json()
    expected = load_fixture("chat-completion-coupled.json")
    assert list(answer) == list(expected)
    assert list(answer["choices"][0]["message"]) == list(expected["choices"][0]["message"])
    assert answer["id"] == expected["id"]
    assert answer["choices"][0]["message"]["content"] == "Hello!"
    stream = call(worker, "POST", "/v1/chat/completions", {**chat, "stream": True})
    # As the real vLLM's chat route streams (tests/fixtures/vllm-0.32-real): an opening chunk
    # with the role and empty content, then the text.
    first, second = (json.loads(event[len("data: ") :]) for event in events(stream)[:2])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert (first["prompt_token_ids"], first["prompt_text"]) == (None, None)
    assert second["choices"][0]["delta"] == {"content": "H"}
    assert second["choices"][0]["token_ids"] is None
    assert "stop_reason" not in second["choices"][0]
    assert events(stream)[-1] == "data: [DONE]"


@pytest.mark.parametrize(("top", "alternatives"), [(None, 0), (2, 2), (-1, 3)])
def test_coupled_chat_cuts_logprobs_to_top_logprobs_as_vllms_chat_serving(
    worker: SimulatedWorker, top: int | None, alternatives: int
) -> None:
    # vLLM's _get_top_logprobs keeps top_logprobs alternatives (0 when unset, all for -1); the
    # engine's own list holds the sampled token too, which logprobs: true alone does not show.
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    chat |= {"logprobs": True} if top is None else {"logprobs": True, "top_logprobs": top}
    whole = call(worker, "POST", "/v1/chat/completions", chat).json()
    stream = call(worker, "POST", "/v1/chat/completions", {**chat, "stream": True})
    chunks = [json.loads(event[len("data: ") :]) for event in events(stream)[:-1]]
    entries = [
        *whole["choices"][0]["logprobs"]["content"],
        *(
            entry
            for chunk in chunks[1:]  # the opening chunk carries no token
            for entry in chunk["choices"][0]["logprobs"]["content"]
        ),
    ]
    assert len(entries) == 4
    assert all(len(entry["top_logprobs"]) == alternatives for entry in entries)


def test_responses_render_keeps_a_function_tools_strict_key_like_vllm(
    worker: SimulatedWorker,
) -> None:
    tool = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
    body = {"model": "m", "input": "hi", "tools": [tool]}
    loose = call(worker, "POST", "/v1/responses/render", body).json()["token_ids"]
    body["tools"] = [{**tool, "strict": True}]
    strict = call(worker, "POST", "/v1/responses/render", body).json()["token_ids"]
    assert '"strict": true' in toy_decode(strict)
    assert len(strict) == len(loose) + len(', "strict": true')


def test_served_model_names_list_those_and_refuse_another_like_vllm() -> None:
    worker = SimulatedWorker(WorkerSettings(served_model_names=("qwen", "alias")))
    models = call(worker, "GET", "/v1/models").json()
    assert [model["id"] for model in models["data"]] == ["qwen", "alias"]
    body = load_fixture("render-chat-request.json")
    refused = call(worker, "POST", "/v1/chat/completions/render", {**body, "model": "x"})
    assert refused.status_code == 404
    assert refused.json() == {
        "error": {
            "message": "The model `x` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    for path in ("/inference/v1/generate", "/v1/chat/completions", "/tokenize"):
        assert call(worker, "POST", path, {"model": "x"}).status_code == 404
    served = call(worker, "POST", "/v1/chat/completions/render", {**body, "model": "alias"})
    assert served.status_code == 200
    unnamed = {key: value for key, value in body.items() if key != "model"}
    assert call(worker, "POST", "/v1/chat/completions/render", unnamed).json()["model"] == "qwen"
    with pytest.raises(ValueError, match="served_model_names"):
        WorkerSettings(served_model_names=("",))


def test_without_served_model_names_any_name_is_served(worker: SimulatedWorker) -> None:
    assert [m["id"] for m in call(worker, "GET", "/v1/models").json()["data"]] == ["simulated"]
    body = {**load_fixture("render-chat-request.json"), "model": "anything"}
    assert call(worker, "POST", "/v1/chat/completions/render", body).json()["model"] == "anything"


def test_tokenize_detokenize_and_version_like_vllm(worker: SimulatedWorker) -> None:
    plain = call(worker, "POST", "/tokenize", {"model": "m", "prompt": "Hé"}).json()
    assert plain == {
        "count": 3,
        "max_model_len": 4096,
        "tokens": toy_encode("Hé"),
        "token_strs": None,
    }
    body = load_fixture("render-chat-request.json")
    chat = call(worker, "POST", "/tokenize", {"model": "m", "messages": body["messages"]}).json()
    rendered = call(worker, "POST", "/v1/chat/completions/render", body).json()["token_ids"]
    assert (chat["tokens"], chat["count"]) == (rendered, len(rendered))
    strs = call(worker, "POST", "/tokenize", {"prompt": "ab", "return_token_strs": True}).json()
    assert strs["token_strs"] == ["a", "b"]
    text = call(worker, "POST", "/detokenize", {"tokens": chat["tokens"]}).json()
    assert text == {"prompt": toy_decode(rendered)}
    assert call(worker, "GET", "/version").json() == {"version": "0.33.0"}
    assert call(worker, "POST", "/detokenize", {"tokens": ["a"]}).status_code == 400
    assert call(worker, "POST", "/tokenize", {"prompt": 1}).status_code == 400
    assert call(worker, "GET", "/tokenize").status_code == 405


# --- structured output: a JSON value that satisfies the schema ----------------------------------


class _Address(pydantic.BaseModel):
    city: str
    zip_code: str = pydantic.Field(min_length=7, max_length=9)


class _Person(pydantic.BaseModel):
    name: str
    age: int = pydantic.Field(ge=18, lt=130)
    height: float = pydantic.Field(gt=2)
    tags: list[str] = pydantic.Field(min_length=2)
    kind: Literal["admin", "user"]
    home: _Address
    work: _Address | None
    nickname: str | None = None
    verified: bool
    version: Literal[3] = 3


class _Tree(pydantic.BaseModel):
    label: str
    children: list[_Tree]


@pytest.mark.parametrize(
    "schema",
    [
        _Person.model_json_schema(),
        _Tree.model_json_schema(),
        {"type": "object", "properties": {"x": {"type": ["null", "integer"]}}, "required": ["x"]},
        {"allOf": [{"$ref": "#/definitions/a"}], "definitions": {"a": {"const": "c"}}},
        {"oneOf": [{"type": "number", "exclusiveMaximum": 0}, {"type": "string"}]},
        {"type": "array", "items": {"enum": [1, 2]}, "minItems": 3},
        {},
    ],
)
def test_the_structured_answer_satisfies_its_schema(schema: dict[str, Any]) -> None:
    value = instance(schema)
    jsonschema.validate(value, schema)


def test_a_pydantic_models_answer_parses_back_into_it() -> None:
    person = _Person.model_validate(instance(_Person.model_json_schema()))
    assert (person.age, person.home.zip_code, person.work) == (18, "Parisss", person.home)


def _structured(worker: SimulatedWorker, path: str, body: dict[str, Any]) -> Any:
    rendered = call(worker, "POST", path, body).json()
    assert rendered["sampling_params"]["structured_outputs"] is not None
    leg = {**rendered, "output_mode": "text"}
    answer = call(worker, "POST", "/inference/v1/generate", leg).json()
    return json.loads(answer["choices"][0]["text"])


def test_a_request_for_structured_output_is_answered_with_a_valid_json_value(
    worker: SimulatedWorker,
) -> None:
    schema = _Person.model_json_schema()
    chat = load_fixture("render-chat-request.json")
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}
    value = _structured(worker, "/v1/chat/completions/render", {**chat, "response_format": fmt})
    jsonschema.validate(value, schema)
    as_object = {**chat, "response_format": {"type": "json_object"}}
    assert _structured(worker, "/v1/chat/completions/render", as_object) == {}
    own = {**chat, "structured_outputs": {"json": schema}}
    assert _structured(worker, "/v1/chat/completions/render", own) == value
    responses = {
        "model": "m",
        "input": "hi",
        "text": {"format": {"type": "json_schema", "name": "p", "schema": schema}},
    }
    assert _structured(worker, "/v1/responses/render", responses) == value
    messages = {
        "model": "m",
        "max_tokens": 1024,
        "messages": [{"role": "user", "content": "hi"}],
        "output_config": {"format": {"type": "json_schema", "schema": schema}},
    }
    assert _structured(worker, "/v1/messages/render", messages) == value
    coupled = call(worker, "POST", "/v1/chat/completions", {**chat, "response_format": fmt})
    assert json.loads(coupled.json()["choices"][0]["message"]["content"]) == value
    plain = call(worker, "POST", "/v1/chat/completions", chat).json()
    assert plain["choices"][0]["message"]["content"] == "Hello!"


# -- a conversation vLLM refuses: what vLLM 0.32 answers (captured from a real worker) ----------

EMPTY = {
    "message": "Cannot apply chat template to an empty conversation. Provide at least one message.",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": []}),
        (CHAT_RENDER, {"messages": []}),
        ("/v1/messages/render", {"max_tokens": 5, "messages": []}),
        ("/v1/responses", {"input": []}),
        ("/v1/responses/render", {"input": []}),
    ],
)
def test_an_empty_conversation_is_vllms_400(path: str, body: dict[str, Any]) -> None:
    response = call(SimulatedWorker(), "POST", path, {"model": "tiny", **body})
    assert (response.status_code, response.json()) == (400, {"error": EMPTY})


def test_an_empty_messages_conversation_is_anthropics_400() -> None:
    body = {"model": "tiny", "max_tokens": 5, "messages": []}
    response = call(SimulatedWorker(), "POST", "/v1/messages", body)
    assert response.status_code == 400
    assert response.json() == {
        "type": "error",
        "error": {"type": "BadRequestError", "message": EMPTY["message"]},
    }


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/messages/render", {"max_tokens": 5, "system": "Be brief", "messages": []}),
        ("/v1/responses/render", {"instructions": "Be brief", "input": []}),
        (CHAT_RENDER, {"messages": [{"role": "user"}]}),
        (
            "/v1/responses/render",
            {"input": [{"role": "user", "content": "Hi"}, {"type": "reasoning", "content": None}]},
        ),
    ],
)
def test_a_system_prompt_makes_a_conversation(path: str, body: dict[str, Any]) -> None:
    assert call(SimulatedWorker(), "POST", path, {"model": "tiny", **body}).status_code == 200


def test_a_messages_content_of_42_is_vllms_validation_400() -> None:
    body = {"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": 42}]}
    for path in ("/v1/messages", "/v1/messages/render"):
        response = call(SimulatedWorker(), "POST", path, body)
        assert response.status_code == 400
        assert response.json() == {
            "error": {
                "message": "2 validation errors:\n"
                "  {'type': 'string_type', 'loc': 'body.messages.0.content', "
                "'msg': 'Input should be a valid string', 'input': '42'}\n"
                "  {'type': 'list_type', 'loc': 'body.messages.0.content', "
                "'msg': 'Input should be a valid list', 'input': '42'}",
                "type": "Bad Request",
                "param": "body.messages.0.content",
                "code": 400,
            }
        }


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": 42}]},
            "body.messages.0.ChatCompletionDeveloperMessageParam.content",
        ),
        (
            CHAT_RENDER,
            {"messages": [{"role": "user", "content": None}]},
            "body.messages.0.ChatCompletionDeveloperMessageParam.content",
        ),
        ("/v1/responses", {"input": 42}, "body.input"),
        ("/v1/responses/render", {"input": [{"role": "user", "content": 42}]}, "body.input"),
    ],
)
def test_a_content_of_the_wrong_type_is_vllms_validation_400(
    path: str, body: dict[str, Any], param: str
) -> None:
    response = call(SimulatedWorker(), "POST", path, {"model": "tiny", **body})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("Bad Request", param, 400)
    assert "'msg': 'Input should be a valid string'" in error["message"]


def test_an_assistant_message_may_have_null_content() -> None:
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "Again"},
    ]
    response = call(SimulatedWorker(), "POST", CHAT_RENDER, {"model": "tiny", "messages": messages})
    assert response.status_code == 200


# The same refusals against a real vLLM 0.32 when one is named (the real-engine set-up's
# variable, docs/testing.md): exactly its body where the simulated one writes vLLM's whole body.
REAL_URL = os.environ.get("DISAGG_REAL_VLLM_URL")
EXACT_REFUSALS = [
    ("/v1/chat/completions", {"messages": []}),
    (CHAT_RENDER, {"messages": []}),
    ("/v1/messages", {"max_tokens": 5, "messages": []}),
    ("/v1/messages/render", {"max_tokens": 5, "messages": []}),
    ("/v1/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": 42}]}),
    ("/v1/responses", {"input": []}),
    ("/v1/responses/render", {"input": []}),
]


@pytest.mark.real_vllm
@pytest.mark.skipif(REAL_URL is None, reason="no real vLLM: set DISAGG_REAL_VLLM_URL")
@pytest.mark.parametrize(("path", "body"), EXACT_REFUSALS)
def test_the_refusals_equal_a_real_vllms(path: str, body: dict[str, Any]) -> None:
    request = {"model": "tiny", **body}
    real = httpx.post(f"{REAL_URL}{path}", json=request, timeout=60)
    simulated = call(SimulatedWorker(), "POST", path, request)
    assert (simulated.status_code, simulated.json()) == (real.status_code, real.json())

"""The client's body is checked whole before the first worker call (docs/exchange.md).

Every client route, every pipeline (generate legs with prefill and render, OpenAI-format legs,
decode only): a cap, a sampling field or ``stream`` a leg would refuse is a 400 in the client
API's error shape, and no worker is called for it.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st
from proxy_helpers import running
from simulated_router import SimulatedRouter
from strategies import json_scalars

from disagg_transforms import build_decode_request, parse_pipeline_params, parse_step_params
from disagg_transforms.errors import RequestError
from disagg_transforms.exchange import ClientReply, Exchange, WorkerCall

PIPELINES = {
    "generate-prefill": parse_pipeline_params(
        {"prefill": {}, "decode": {"wrap_chat_completion": True}}, use_openai_format=False
    ),
    "generate-decode": parse_pipeline_params(
        {"decode": {"wrap_chat_completion": True}}, use_openai_format=False
    ),
    "openai-prefill": parse_pipeline_params({"prefill": {}, "decode": {}}),
    "openai-decode": parse_pipeline_params({"decode": {}}),
}
MESSAGES = [{"role": "user", "content": "hi"}]
# Each route: its path, a body every pipeline serves, and where its cap is.
ROUTES: dict[str, tuple[str, dict[str, Any], str]] = {
    "chat": ("/v1/chat/completions", {"model": "m", "messages": MESSAGES}, "max_tokens"),
    "completions": ("/v1/completions", {"model": "m", "prompt": "hi"}, "max_tokens"),
    "responses": ("/v1/responses", {"model": "m", "input": "hi"}, "max_output_tokens"),
    "messages": (
        "/v1/messages",
        {"model": "m", "max_tokens": 16, "messages": MESSAGES},
        "max_tokens",
    ),
    "generate": (
        "/inference/v1/generate",
        {"model": "m", "token_ids": [1, 2, 3], "sampling_params": {}},
        "sampling_params.max_tokens",
    ),
}
BAD_CAPS = [-1, 0, "abc", 1.5, True]
BAD_SAMPLING = [("temperature", "hot"), ("top_p", "x"), ("top_k", "many"), ("top_k", 1.5)]


def _with(route: str, key: str, value: object) -> dict[str, Any]:
    """The route's body with ``key`` set; a ``sampling_params.`` key of a generate client."""
    body: dict[str, Any] = json.loads(json.dumps(ROUTES[route][1]))
    if route == "generate" and key != "stream":
        key = key.removeprefix("sampling_params.")
        body["sampling_params"][key] = value
    else:
        body[key] = value
    return body


def _cap_key(route: str) -> str:
    return ROUTES[route][2]


def _refused_bodies() -> list[Any]:
    cases = []
    for route in ROUTES:
        cap = _cap_key(route)
        cases += [
            pytest.param(route, _with(route, cap, v), id=f"{route}-cap-{v!r}") for v in BAD_CAPS
        ]
        cases += [
            pytest.param(route, _with(route, k, v), id=f"{route}-{k}-{v!r}")
            for k, v in BAD_SAMPLING
        ]
        cases.append(pytest.param(route, _with(route, "stream", "yes"), id=f"{route}-stream"))
        over = _with(route, "min_tokens", 10)
        if route == "generate":
            over["sampling_params"]["max_tokens"] = 5
        else:
            over[cap] = 5
        cases.append(pytest.param(route, over, id=f"{route}-min-over-max"))
    return cases


def _first_event(pipeline: str, route: str, body: dict[str, Any]) -> object:
    path = ROUTES[route][0]
    return Exchange(PIPELINES[pipeline], path, {}, json.dumps(body).encode()).next_event()


def _assert_refused_in_client_shape(event: object, route: str) -> dict[str, Any]:
    assert not isinstance(event, WorkerCall), f"{event.step} was called"
    assert isinstance(event, ClientReply)
    assert event.status == 400
    body: dict[str, Any] = json.loads(event.body)
    if route == "messages":
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
    else:
        assert body["error"]["code"] == 400
    return body


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize(("route", "body"), _refused_bodies())
def test_a_refused_client_field_is_a_400_before_any_worker_call(
    pipeline: str, route: str, body: dict[str, Any]
) -> None:
    if route == "generate" and pipeline.startswith("openai"):
        pytest.skip("a generate client's legs are generate legs on every pipeline")
    _assert_refused_in_client_shape(_first_event(pipeline, route, body), route)


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("route", ROUTES)
def test_a_good_client_body_reaches_the_first_worker(pipeline: str, route: str) -> None:
    body = _with(route, "temperature", 0.5) | {"stream": True}
    if route != "generate":
        body[_cap_key(route)] = 8
    assert isinstance(_first_event(pipeline, route, body), WorkerCall)


_DECODE = parse_step_params("decode", {"use_openai_format": False})


# A completions client's legs stay on /v1/completions (docs/routes-and-config.md): no generate
# decode leg to compare with; the table above covers it.
@given(
    route=st.sampled_from(["chat", "responses", "messages"]),
    key=st.sampled_from(["temperature", "top_p", "top_k", "seed", "stream", "cap", "min_tokens"]),
    value=json_scalars,
)
def test_the_start_check_refuses_exactly_what_the_decode_leg_refuses(
    route: str, key: str, value: object
) -> None:
    # The one set of rules: the generate decode leg, built with the prompt in hand, refuses a
    # body iff the exchange refused it before calling anyone.
    path = ROUTES[route][0]
    body = _with(route, _cap_key(route) if key == "cap" else key, value)
    try:
        build_decode_request(body, client_path=path, params=_DECODE, token_ids=[1, 2])
    except RequestError:
        refused = True
    else:
        refused = False
    for pipeline in PIPELINES.values():
        event = Exchange(pipeline, path, {}, json.dumps(body).encode()).next_event()
        assert isinstance(event, ClientReply) is refused, (pipeline, body)


def test_the_openai_sdk_gets_the_400_and_no_worker_is_called() -> None:
    router = SimulatedRouter(PIPELINES["generate-prefill"])
    http = httpx2.Client(transport=httpx2.MockTransport(router))
    client = openai.OpenAI(
        base_url="http://router/v1", api_key="k", http_client=http, max_retries=0
    )
    for extra in ({"max_tokens": -1}, {"temperature": "hot"}):
        with pytest.raises(openai.BadRequestError) as raised:
            client.completions.create(model="m", prompt="hi", **extra)
        assert raised.value.status_code == 400
    assert router.worker.calls == []


# -- the conversation: what vLLM refuses before rendering it, refused before any worker call --

EMPTY_CONVERSATION = "vLLM cannot apply the chat template to an empty conversation"
# Each case: route, body, the JSON path named; vLLM 0.32 answers each with a 400 (docs/exchange.md).
REFUSED_CONVERSATIONS = [
    pytest.param("chat", {"model": "m", "messages": []}, "$.messages", id="chat-empty"),
    pytest.param(
        "chat",
        {"model": "m", "messages": [{"role": "user", "content": 42}]},
        "$.messages[0].content",
        id="chat-content-42",
    ),
    pytest.param(
        "chat",
        {"model": "m", "messages": [{"role": "user", "content": None}]},
        "$.messages[0].content",
        id="chat-user-content-null",
    ),
    pytest.param("chat", {"model": "m", "messages": [42]}, "$.messages[0]", id="chat-item-42"),
    pytest.param("chat", {"model": "m", "messages": {}}, "$.messages", id="chat-object"),
    pytest.param(
        "messages", {"model": "m", "max_tokens": 8, "messages": []}, "$.messages", id="msg-empty"
    ),
    pytest.param(
        "messages",
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": 42}]},
        "$.messages[0].content",
        id="msg-content-42",
    ),
    pytest.param("responses", {"model": "m", "input": []}, "$.input", id="responses-empty"),
    pytest.param("responses", {"model": "m", "input": 42}, "$.input", id="responses-42"),
    pytest.param(
        "responses",
        {"model": "m", "input": [{"role": "user", "content": None}]},
        "$.input[0].content",
        id="responses-message-content-null",
    ),
    pytest.param(
        "responses",
        {"model": "m", "input": [{"role": "user", "content": 42}]},
        "$.input[0].content",
        id="responses-content-42",
    ),
]
# What vLLM renders: a system prompt makes a conversation, chat's assistant may say null.
SERVED_CONVERSATIONS = [
    pytest.param(
        "messages", {"model": "m", "max_tokens": 8, "system": "Be brief", "messages": []}, id="m"
    ),
    pytest.param("responses", {"model": "m", "instructions": "Be brief", "input": []}, id="r"),
    pytest.param("responses", {"model": "m", "input": ""}, id="responses-empty-string"),
    pytest.param(
        "responses",
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "Hi"},
                {"type": "reasoning", "id": "rs_1", "summary": [], "content": None},
            ],
        },
        id="responses-reasoning-item-null-content",
    ),
    pytest.param(
        "chat",
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                {"role": "assistant", "content": None, "tool_calls": []},
                {"role": "user"},
            ],
        },
        id="chat-parts-null-assistant-no-content",
    ),
]


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize(("route", "body", "path"), REFUSED_CONVERSATIONS)
def test_a_conversation_vllm_refuses_is_a_400_before_any_worker_call(
    pipeline: str, route: str, body: dict[str, Any], path: str
) -> None:
    reply = _assert_refused_in_client_shape(_first_event(pipeline, route, body), route)
    message = reply["error"]["message"]
    assert message.startswith(f"{path}: ")
    if "empty" in str(body):
        assert EMPTY_CONVERSATION in message


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize(("route", "body"), SERVED_CONVERSATIONS)
def test_a_conversation_vllm_renders_reaches_the_first_worker(
    pipeline: str, route: str, body: dict[str, Any]
) -> None:
    assert isinstance(_first_event(pipeline, route, body), WorkerCall)


def test_the_sdks_get_the_empty_conversation_400_and_no_worker_is_called() -> None:
    router = SimulatedRouter(PIPELINES["generate-prefill"])
    http = httpx2.Client(transport=httpx2.MockTransport(router))
    client = openai.OpenAI(
        base_url="http://router/v1", api_key="k", http_client=http, max_retries=0
    )
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(model="m", messages=[])
    assert EMPTY_CONVERSATION in chat.value.message
    with pytest.raises(openai.BadRequestError) as responses:
        client.responses.create(model="m", input=[])
    assert EMPTY_CONVERSATION in responses.value.message
    claude = anthropic.Anthropic(
        base_url="http://router", api_key="k", http_client=http, max_retries=0
    )
    with pytest.raises(anthropic.BadRequestError) as messages:
        claude.messages.create(model="m", max_tokens=8, messages=[])
    assert EMPTY_CONVERSATION in messages.value.message
    assert router.worker.calls == []


def test_serve_refuses_an_empty_conversation_itself(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("uvicorn")
    # The exchange's own words, not the worker's: no worker saw the request.
    with running((["serve", "--simulate", "--port", "0"], tmp_path / "serve.log")) as (server,):
        with openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0) as client:
            with pytest.raises(openai.BadRequestError) as chat:
                client.chat.completions.create(model="m", messages=[])
            with pytest.raises(openai.BadRequestError) as responses:
                client.responses.create(model="m", input=[])
        with (
            anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0) as claude,
            pytest.raises(anthropic.BadRequestError) as messages,
        ):
            claude.messages.create(model="m", max_tokens=8, messages=[])
    for refused in (chat, responses, messages):
        assert refused.value.status_code == 400
        assert EMPTY_CONVERSATION in refused.value.message
    assert messages.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]

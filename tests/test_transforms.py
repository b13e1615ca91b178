from __future__ import annotations

import contextlib
import copy
import pickle
from typing import Any

import pytest
from golden import load_fixture
from hypothesis import given
from strategies import json_objects

from disagg_transforms import (
    ConfigError,
    DecodeParams,
    DisaggTransformError,
    LegInputs,
    OutputMode,
    Pipeline,
    PrefillParams,
    RequestError,
    Route,
    Step,
    TransformContext,
    UpstreamContractError,
    build_decode_request,
    wrap_chat_completion,
)
from disagg_transforms.transforms import (
    SamplingCaps,
    decode_request,
    sampling_caps,
    strip_client_transfer_params,
    wrap_response,
)

CHAT = "/v1/chat/completions"
TOKENS = [1, 2, 3]
CLIENT = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "max_completion_tokens": 9,
    "temperature": 0.5,
    "kv_transfer_params": {"remote_host": "evil"},
}


def context(
    params: Any = None, path: str = CHAT, *, client_body: Any = None, **inputs: Any
) -> TransformContext:
    return TransformContext(
        client_path=path,
        step=Step.DECODE,
        params=params,
        client_body=client_body,
        inputs=LegInputs(**inputs),
    )


GENERATE_TEXT = DecodeParams(use_openai_format=False)
WRAPPING = DecodeParams(use_openai_format=False, wrap_chat_completion=True)


def test_request_pipeline_builds_the_decode_leg_like_the_library() -> None:
    ctx = context(GENERATE_TEXT, token_ids=TOKENS, kv_transfer_params={"do_remote_prefill": True})
    pipeline = Pipeline([strip_client_transfer_params, decode_request])
    before = copy.deepcopy(CLIENT)
    body = pipeline.run_request(CLIENT, ctx)
    expected = build_decode_request(
        CLIENT,
        client_path=CHAT,
        params=GENERATE_TEXT,
        token_ids=TOKENS,
        kv_transfer_params={"do_remote_prefill": True},
    ).body
    assert body == expected
    assert body["sampling_params"]["max_tokens"] == 9
    assert body["kv_transfer_params"] == {"do_remote_prefill": True}
    assert before == CLIENT


def test_decode_request_uses_every_leg_input() -> None:
    rendered = load_fixture("request-decode-derender.json")
    params = DecodeParams(use_openai_format=False, output_mode=OutputMode.DERENDER)
    body = decode_request(CLIENT, context(params, rendered=rendered, request_id="router-1"))
    assert body["token_ids"] == rendered["token_ids"]
    assert body["request_id"] == "router-1"
    assert body["output_mode"] == "derender"
    assert body["parse_context"] == rendered["parse_context"]


def test_strip_client_transfer_params_everywhere_unless_trusted() -> None:
    body = {
        "kv_transfer_params": {"a": 1},
        "ec_transfer_params": {"b": 2},
        "sampling_params": {"extra_args": {"kv_transfer_params": {"c": 3}, "keep": 1}},
        "vllm_xargs": {"ec_transfer_params": {}, "keep": 2},
        "model": "m",
    }
    before = copy.deepcopy(body)
    stripped = strip_client_transfer_params(body, context(GENERATE_TEXT))
    assert stripped == {
        "sampling_params": {"extra_args": {"keep": 1}},
        "vllm_xargs": {"keep": 2},
        "model": "m",
    }
    assert body == before
    trusted = DecodeParams(trust_client_transfer_params=True)
    assert strip_client_transfer_params(body, context(trusted)) == body
    # No params at all: the safe default, stripped.
    assert "kv_transfer_params" not in strip_client_transfer_params(body, context())


@pytest.mark.parametrize(
    ("route", "path", "body", "cap"),
    [
        (None, CHAT, {"max_tokens": 5, "max_completion_tokens": 7}, 7),
        (None, "/v1/responses", {"max_output_tokens": 4}, 4),
        (Route.GENERATE, CHAT, {"max_output_tokens": 3}, 3),
    ],
)
def test_sampling_caps_reads_the_given_or_the_client_route(
    route: Route | None, path: str, body: dict[str, Any], cap: int
) -> None:
    transform = sampling_caps(route)
    assert isinstance(transform, SamplingCaps)
    assert transform.route is route
    result = Pipeline([transform]).run_request(body, context(path=path))
    assert result == {"sampling_params": {"max_tokens": cap}}
    assert sampling_caps(route) == transform
    assert hash(sampling_caps(route)) == hash(transform)
    assert repr(transform) == f"sampling_caps({route})"


def test_sampling_caps_refuses_a_bad_route_and_passes_request_errors() -> None:
    with pytest.raises(ConfigError, match="route must be a Route"):
        sampling_caps("/v1/chat/completions")  # type: ignore[arg-type]
    with pytest.raises(RequestError, match="max_tokens"):
        Pipeline([sampling_caps()]).run_request({"max_tokens": 0}, context())


@pytest.mark.parametrize("transform", [decode_request, wrap_response])
@pytest.mark.parametrize("params", [None, PrefillParams()])
def test_params_driven_transforms_need_decode_params(transform: Any, params: Any) -> None:
    with pytest.raises(ConfigError, match="DecodeParams") as caught:
        transform({}, context(params))
    assert caught.value.param == "params"


def test_wrap_response_builds_the_chat_envelope_when_the_step_wraps() -> None:
    response = load_fixture("response-text.json")
    client = {"model": "m", "top_logprobs": 1}
    ctx = context(WRAPPING, client_body=client)
    wrapped = Pipeline(response=[wrap_response]).run_response(response, ctx)
    assert wrapped == wrap_chat_completion(response, requested=OutputMode.TEXT, client_body=client)
    assert wrapped["object"] == "chat.completion"


def test_wrap_response_without_wrapping_checks_the_echo_only() -> None:
    response = load_fixture("response-text.json")
    assert wrap_response(response, context(GENERATE_TEXT)) == response
    derender = DecodeParams(use_openai_format=False, output_mode=OutputMode.DERENDER)
    with pytest.raises(UpstreamContractError, match="output_mode"):
        wrap_response(response, context(derender))
    # An OpenAI-format leg is not the generate route: nothing to check.
    assert wrap_response({"id": "x"}, context(DecodeParams())) == {"id": "x"}


@pytest.mark.parametrize(
    ("path", "kind"), [("/v1/responses", "response"), ("/v1/messages", "message")]
)
def test_wrap_response_builds_responses_and_anthropic_envelopes(path: str, kind: str) -> None:
    response = load_fixture("response-derender-tool-call.json")
    params = DecodeParams(use_openai_format=False, output_mode=OutputMode.DERENDER)
    wrapped = wrap_response(response, context(params, path, client_body={"model": "m"}))
    assert wrapped.get("object", wrapped.get("type")) == kind


@given(json_objects)
def test_builtin_transforms_never_mutate_and_raise_only_library_errors(
    body: dict[str, Any],
) -> None:
    before = copy.deepcopy(body)
    ctx = context(GENERATE_TEXT, token_ids=TOKENS)
    for transform in (strip_client_transfer_params, sampling_caps(), decode_request):
        try:
            result = transform(body, ctx)
        except DisaggTransformError:
            continue
        assert isinstance(result, dict)
    with contextlib.suppress(DisaggTransformError):
        wrap_response(body, context(WRAPPING))
    assert body == before


def test_sampling_caps_is_immutable_and_pickles() -> None:
    transform = sampling_caps(Route.RESPONSES)
    with pytest.raises(AttributeError):
        transform.route = None  # type: ignore[misc]
    with pytest.raises(AttributeError):
        transform.other = 1  # type: ignore[attr-defined]
    copied = pickle.loads(pickle.dumps(transform))  # noqa: S301 - our own object
    assert copied == transform
    assert hash(copied) == hash(transform)
    assert copied.route is Route.RESPONSES
    assert transform != sampling_caps(None)
    not_a_transform: object = "sampling_caps"
    assert transform != not_a_transform


def test_wrap_response_on_an_auto_step_reads_the_mode_the_request_chose() -> None:
    auto = DecodeParams(use_openai_format=False, output_mode=OutputMode.AUTO)
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    text = load_fixture("response-text.json")
    assert wrap_response(text, context(auto, client_body={"model": "m"})) == text
    derender = load_fixture("response-derender-tool-call.json")
    asking = context(auto, client_body={"model": "m", "tools": tools})
    assert wrap_response(derender, asking) == derender
    with pytest.raises(UpstreamContractError, match="output_mode"):
        wrap_response(text, asking)

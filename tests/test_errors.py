from __future__ import annotations

import json
import pickle
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import error_messages, error_statuses

from disagg_transforms import (
    ConfigError,
    DisaggTransformError,
    PluginLoadError,
    RequestError,
    Route,
    TransformError,
    UpstreamContractError,
    anthropic_error_body,
    error_body,
    openai_error_body,
)
from disagg_transforms import errors as errors_module


@pytest.mark.parametrize(
    ("cls", "status", "type_", "builtin"),
    [
        (ConfigError, 500, "InternalServerError", ValueError),
        (RequestError, 400, "BadRequestError", ValueError),
        (UpstreamContractError, 502, "BadGatewayError", Exception),
    ],
)
def test_tree(cls: type[DisaggTransformError], status: int, type_: str, builtin: type) -> None:
    error = cls("bad $.x: 1", param="$.x")
    assert isinstance(error, DisaggTransformError)
    assert isinstance(error, builtin)
    assert error.status_hint == status
    assert error.param == "$.x"
    assert str(error) == "bad $.x: 1"
    assert openai_error_body(error) == {
        "error": {"message": "bad $.x: 1", "type": type_, "param": "$.x", "code": status}
    }


def test_upstream_error_is_not_a_value_error() -> None:
    # A worker's broken answer is not the client's bad value.
    assert not isinstance(UpstreamContractError("x"), ValueError)


def test_root_is_never_raised_itself() -> None:
    with pytest.raises(TypeError):
        DisaggTransformError("x")


def test_param_defaults_to_none() -> None:
    assert openai_error_body(RequestError("x"))["error"]["param"] is None


@pytest.mark.parametrize("cls", [ConfigError, RequestError, UpstreamContractError])
def test_errors_pickle_with_their_param(cls: type[DisaggTransformError]) -> None:
    error = cls("msg", param="$.a[1]")
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own object
    assert type(copy) is cls
    assert copy.param == "$.a[1]"
    assert str(copy) == "msg"


def test_tree_is_drawn_in_the_module_docstring() -> None:
    doc = errors_module.__doc__ or ""
    for name in ("DisaggTransformError", "ConfigError", "RequestError", "UpstreamContractError"):
        assert name in doc


def test_error_body_is_what_the_openai_sdk_reads() -> None:
    body = openai_error_body(RequestError("bad", param="$.messages"))
    # The SDK builds its APIError from the body's "error" object.
    error = openai.BadRequestError("bad", response=_response(400), body=body["error"])
    assert error.param == "$.messages"
    assert error.type == "BadRequestError"
    # vLLM writes an integer code, and the SDK reads it as text.
    assert error.code == "400"


def _response(status: int) -> Any:
    # openai 3.x speaks HTTP through httpx2; older releases through httpx.
    try:
        import httpx2 as httpx  # noqa: PLC0415
    except ImportError:  # pragma: no cover - openai < 3
        import httpx  # type: ignore[no-redef]  # noqa: PLC0415
    return httpx.Response(
        status, request=httpx.Request("POST", "http://router/v1/chat/completions")
    )


# --- retryable and the error bodies of each client API ------------------------------------------


def test_no_library_error_is_retryable() -> None:
    # Sending the same body again gives the same answer; only a transport failure is retryable.
    for error in (
        ConfigError("x"),
        RequestError("x"),
        UpstreamContractError("x"),
        TransformError("x", transform="t"),
        PluginLoadError("x", plugin="p"),
    ):
        assert error.retryable is False


@pytest.mark.parametrize(
    ("status", "anthropic_type"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (529, "overloaded_error"),
        (502, "api_error"),
        (503, "api_error"),
        (409, "invalid_request_error"),
        (422, "invalid_request_error"),
    ],
)
def test_anthropic_error_types_by_status(status: int, anthropic_type: str) -> None:
    body = error_body(Route.MESSAGES, status=status, message="m")
    assert body == {"type": "error", "error": {"type": anthropic_type, "message": "m"}}


def test_anthropic_error_body_of_each_library_error() -> None:
    assert anthropic_error_body(RequestError("$.x: bad", param="$.x")) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "$.x: bad"},
    }
    assert anthropic_error_body(UpstreamContractError("no echo"))["error"]["type"] == "api_error"
    assert anthropic_error_body(ConfigError("c"))["error"]["type"] == "api_error"


@pytest.mark.parametrize(
    ("status", "openai_type"),
    [
        (400, "BadRequestError"),
        (401, "AuthenticationError"),
        (404, "NotFoundError"),
        (418, "BadRequestError"),
        (422, "UnprocessableEntityError"),
        (429, "RateLimitError"),
        (500, "InternalServerError"),
        (502, "BadGatewayError"),
        (503, "ServiceUnavailableError"),
        (529, "InternalServerError"),
    ],
)
def test_openai_error_body_from_a_status(status: int, openai_type: str) -> None:
    for route in (Route.CHAT_COMPLETIONS, Route.COMPLETIONS, Route.RESPONSES, Route.GENERATE):
        assert error_body(route, status=status, message="m", param="$.p") == {
            "error": {"message": "m", "type": openai_type, "param": "$.p", "code": status}
        }


def test_error_body_keeps_an_explicit_type() -> None:
    openai_body = error_body(Route.CHAT_COMPLETIONS, status=400, message="m", error_type="T")
    assert openai_body["error"]["type"] == "T"
    anthropic_body = error_body(Route.MESSAGES, status=400, message="m", error_type="billing_error")
    assert anthropic_body["error"]["type"] == "billing_error"


def test_openai_error_body_of_an_error_is_error_body_of_its_fields() -> None:
    error = RequestError("$.x: bad", param="$.x")
    assert openai_error_body(error) == error_body(
        Route.CHAT_COMPLETIONS, status=400, message="$.x: bad", param="$.x"
    )


@pytest.mark.parametrize("status", [0, 200, 302, 399, 600, True, "400", None, 4.5e2])
def test_error_body_refuses_a_status_that_is_not_an_error(status: Any) -> None:
    with pytest.raises(ConfigError, match="status") as caught:
        error_body(Route.MESSAGES, status=status, message="m")
    assert caught.value.param == "status"


def test_errors_module_exports_the_bodies() -> None:
    assert errors_module.error_body is error_body
    assert errors_module.anthropic_error_body is anthropic_error_body


@given(route=st.sampled_from(list(Route)), status=error_statuses, message=error_messages)
def test_error_body_is_always_json_with_the_status_and_message(
    route: Route, status: int, message: str
) -> None:
    body = error_body(route, status=status, message=message)
    assert json.loads(json.dumps(body)) == body
    if route is Route.MESSAGES:
        assert body["type"] == "error"
        assert body["error"]["message"] == message
        assert isinstance(body["error"]["type"], str)
    else:
        assert body["error"]["code"] == status
        assert body["error"]["message"] == message
        assert body["error"]["type"].endswith("Error")


def _answering(status: int, body: dict[str, Any]) -> httpx2.Client:
    return httpx2.Client(
        transport=httpx2.MockTransport(lambda _: httpx2.Response(status, json=body))
    )


def test_the_anthropic_sdk_reads_the_messages_error_body() -> None:
    body = anthropic_error_body(RequestError("$.max_tokens: expected an integer, got 'x'"))
    client = anthropic.Anthropic(
        api_key="k", base_url="http://router", http_client=_answering(400, body), max_retries=0
    )
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.body == body
    assert caught.value.type == "invalid_request_error"
    assert caught.value.api_message == "$.max_tokens: expected an integer, got 'x'"


def test_the_anthropic_sdk_reads_an_overloaded_worker() -> None:
    body = error_body(Route.MESSAGES, status=529, message="busy")
    client = anthropic.Anthropic(
        api_key="k", base_url="http://router", http_client=_answering(529, body), max_retries=0
    )
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.status_code == 529
    assert caught.value.type == "overloaded_error"


def test_the_openai_sdk_reads_the_chat_error_body() -> None:
    error = RequestError("$.messages: expected an array, got 1", param="$.messages")
    client = openai.OpenAI(
        api_key="k",
        base_url="http://router/v1",
        http_client=_answering(400, openai_error_body(error)),
        max_retries=0,
    )
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.code == "400"
    assert caught.value.param == "$.messages"
    # The SDK's message leads with the status, then the body; the body keeps ours as sent.
    assert "$.messages: expected an array, got 1" in caught.value.message
    assert caught.value.body == openai_error_body(error)["error"]
    assert caught.value.type == "BadRequestError"

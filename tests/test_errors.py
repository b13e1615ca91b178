from __future__ import annotations

import pickle
from typing import Any

import openai
import pytest

from disagg_transforms import (
    ConfigError,
    DisaggTransformError,
    RequestError,
    UpstreamContractError,
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

"""How a router uses the public signatures, checked by ``mypy --strict`` (tests/test_typing.py).

Never run, only type-checked: a signature that forces a router into a cast or an ignore fails
the check here. ``assert_type`` pins what each call is typed as.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from typing_extensions import assert_type

from disagg_transforms import (
    ConditionalDecodeParams,
    DecodeParams,
    DisaggTransformError,
    EncodeParams,
    Pipeline,
    PrefillParams,
    RequestError,
    RequestTransform,
    ResponseTransform,
    Route,
    Step,
    StepParams,
    TransformContext,
    anthropic_error_body,
    build_decode_request,
    error_body,
    openai_error_body,
    parse_pipeline_params,
    parse_step_params,
)


def step_params_by_literal_name(config: dict[str, dict[str, object]]) -> None:
    decode = parse_step_params("decode", config["decode"])
    assert_type(decode, DecodeParams)
    assert_type(parse_step_params("prefill", {}), PrefillParams)
    assert_type(parse_step_params("encode", {}), EncodeParams)
    assert_type(parse_step_params("conditional-decode", {}), ConditionalDecodeParams)
    # The decode leg takes the parsed params as they come, no cast.
    build_decode_request({"model": "m"}, client_path="/v1/chat/completions", params=decode)


def step_params_by_enum_member() -> None:
    assert_type(parse_step_params(Step.DECODE, {}), DecodeParams)
    assert_type(parse_step_params(Step.PREFILL, {}), PrefillParams)
    assert_type(parse_step_params(Step.ENCODE, {}), EncodeParams)
    assert_type(parse_step_params(Step.CONDITIONAL_DECODE, {}), ConditionalDecodeParams)


def step_params_by_a_name_read_from_config(name: str, step: Step) -> None:
    assert_type(parse_step_params(name, {}), StepParams)
    assert_type(parse_step_params(step, {}), StepParams)


def pipeline_params(config: dict[str, dict[str, object]]) -> bool:
    parsed = parse_pipeline_params(config, use_openai_format=False)
    assert_type(parsed, dict[Step, StepParams])
    decode = parsed[Step.DECODE]
    return isinstance(decode, DecodeParams) and decode.wrap_chat_completion


def answer_an_error(error: DisaggTransformError, route: Route) -> tuple[int, dict[str, Any]]:
    param: str | None = error.param
    status: int = error.status_hint
    retry: bool = error.retryable
    del param, retry
    if route is Route.MESSAGES:
        return status, anthropic_error_body(error)
    return status, openai_error_body(error)


def answer_a_worker_error(route: Route, status: int, text: str) -> dict[str, Any]:
    return error_body(route, status=status, message=text, param=None, error_type=None)


def catch(body: dict[str, Any]) -> str | None:
    try:
        build_decode_request(body, client_path="/v1/chat/completions", params=DecodeParams())
    except RequestError as error:
        return error.param
    return None


def pipelines(context: TransformContext) -> dict[str, Any]:
    def stamp(body: Mapping[str, Any], _context: TransformContext, /) -> dict[str, Any]:
        return {**body, "stamped": True}

    pipeline = Pipeline(request=[stamp]).with_response(stamp)
    assert_type(pipeline + pipeline, Pipeline)
    assert_type(pipeline.request, tuple[RequestTransform, ...])
    assert_type(pipeline.response, tuple[ResponseTransform, ...])
    return pipeline.run_request({"model": "m"}, context)

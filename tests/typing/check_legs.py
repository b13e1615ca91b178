"""How a router drives the leg builders and the wraps, checked by ``mypy --strict``.

No casts and no assertions on the mode: ``isinstance(leg, GenerateDecodeLeg)`` is what tells
mypy (and the reader) that the leg has an ``output_mode`` to check the answer against.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from disagg_transforms import (
    DecodeLeg,
    DecodeParams,
    GenerateDecodeLeg,
    GenerateDecodeLegBytes,
    Leg,
    LegInputs,
    OutputMode,
    PrefillParams,
    Route,
    build_decode_request,
    build_decode_request_bytes,
    build_prefill_request,
    check_output_mode_echo,
    single_frame_stream,
    wrap_anthropic_message,
    wrap_chat_completion,
    wrap_responses_response,
)


def prefill(client: Mapping[str, Any], path: str, token_ids: list[int]) -> Leg:
    return build_prefill_request(
        client,
        client_path=path,
        params=PrefillParams(use_openai_format=False),
        inputs=LegInputs(token_ids=token_ids),
    )


def decode(
    client: Mapping[str, Any], path: str, prefill_answer: Mapping[str, Any], ids: list[int]
) -> DecodeLeg:
    kv = prefill_answer.get("kv_transfer_params")
    inputs = LegInputs(token_ids=ids, kv_transfer_params=kv if isinstance(kv, dict) else None)
    params = DecodeParams(use_openai_format=False, output_mode=OutputMode.DERENDER)
    return build_decode_request(client, client_path=path, params=params, inputs=inputs)


def reply(
    leg: DecodeLeg, answer: Mapping[str, Any], client: Mapping[str, Any], client_route: Route
) -> object:
    if not isinstance(leg, GenerateDecodeLeg):
        return answer  # the client's own route: the answer is already its envelope
    mode: OutputMode = leg.output_mode
    # The envelope is the client's route's: the leg's own route is the generate route.
    if leg.single_frame:
        return single_frame_stream(client_route, answer, requested=mode, client_body=client)
    if leg.wrap_chat_completion:
        return wrap_chat_completion(answer, requested=mode, client_body=client)
    if client_route is Route.RESPONSES:
        return wrap_responses_response(answer, requested=mode, client_body=client)
    if client_route is Route.MESSAGES:
        return wrap_anthropic_message(answer, requested=mode, client_body=client)
    return answer  # a generate client, or a chat client whose step does not wrap


def reply_bytes(client: bytes, answer: Mapping[str, Any]) -> None:
    leg = build_decode_request_bytes(
        client, client_path="/inference/v1/generate", params=DecodeParams()
    )
    if isinstance(leg, GenerateDecodeLegBytes):
        check_output_mode_echo(answer, leg.output_mode)

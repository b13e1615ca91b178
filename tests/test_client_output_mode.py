"""A generate client's own ``output_mode`` is kept: the step's mode applies when it sent none
(docs/routes-and-config.md, "output_mode"), through the library, the exchange and ``serve``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from simulated_router import SimulatedRouter

from disagg_transforms import (
    DecodeParams,
    OutputMode,
    RequestError,
    build_decode_request,
    build_decode_request_bytes,
    parse_pipeline_params,
)
from disagg_transforms._request.client import decode_output_mode

GENERATE = "/inference/v1/generate"
_BODY: dict[str, Any] = {"model": "m", "token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 3}}


@pytest.mark.parametrize("own", ["tokens", "text", "derender"])
@pytest.mark.parametrize("step", [OutputMode.TEXT, OutputMode.AUTO, OutputMode.DERENDER])
def test_the_clients_own_mode_wins_over_the_steps(own: str, step: OutputMode) -> None:
    body = {**_BODY, "output_mode": own}
    params = DecodeParams(use_openai_format=False, output_mode=step)
    leg = build_decode_request(body, client_path=GENERATE, params=params)
    assert (leg.body["output_mode"], leg.output_mode) == (own, OutputMode(own))
    raw = build_decode_request_bytes(json.dumps(body).encode(), client_path=GENERATE, params=params)
    assert json.loads(raw.body)["output_mode"] == own
    assert decode_output_mode(body, client_path=GENERATE, params=params) is OutputMode(own)


def test_the_steps_mode_applies_when_the_client_sent_none() -> None:
    params = DecodeParams(use_openai_format=False, output_mode=OutputMode.AUTO)
    for body in (_BODY, {**_BODY, "output_mode": None}):
        leg = build_decode_request(body, client_path=GENERATE, params=params)
        assert leg.body["output_mode"] == "text"


def test_the_sidecar_seats_decode_keeps_it_too() -> None:
    # The sidecar seat's decode speaks the client's own route: a generate client's is generate.
    params = DecodeParams(use_openai_format=True)
    body = {**_BODY, "output_mode": "tokens", "stream": True}
    leg = build_decode_request(body, client_path=GENERATE, params=params)
    assert (leg.body["output_mode"], leg.stream) == ("tokens", True)


def test_a_clients_own_detokenize_false_stays_with_its_own_mode() -> None:
    params = DecodeParams(use_openai_format=False)
    body = {**_BODY, "output_mode": "tokens", "sampling_params": {"detokenize": False}}
    leg = build_decode_request(body, client_path=GENERATE, params=params)
    assert leg.body["sampling_params"]["detokenize"] is False
    assert leg.dropped == ()


def test_a_derender_stream_is_sent_as_asked() -> None:
    # vLLM refuses derender with stream (400): the worker's own answer, not a rewritten leg.
    params = DecodeParams(use_openai_format=False)
    body = {**_BODY, "output_mode": "derender", "stream": True}
    leg = build_decode_request(body, client_path=GENERATE, params=params)
    assert (leg.body["stream"], leg.single_frame) == (True, False)


@pytest.mark.parametrize("bad", ["auto", "TEXT", 1, True, {}])
def test_a_mode_vllm_does_not_have_is_refused(bad: object) -> None:
    params = DecodeParams(use_openai_format=False)
    with pytest.raises(RequestError) as caught:
        build_decode_request({**_BODY, "output_mode": bad}, client_path=GENERATE, params=params)
    assert caught.value.param == "$.output_mode"
    assert caught.value.status_hint == 400


def _exchanged(
    config: Any, body: dict[str, Any]
) -> tuple[int, dict[str, Any] | str, list[dict[str, Any]]]:
    router = SimulatedRouter(config)
    status, _, reply = asyncio.run(router.serve(GENERATE, [], json.dumps(body).encode()))
    legs = [json.loads(call.body) for call in router.calls if call.path == GENERATE]
    text = reply.decode()
    return status, (json.loads(text) if not body.get("stream") else text), legs


@pytest.mark.parametrize("stream", [False, True])
def test_the_exchange_sends_and_checks_the_clients_own_tokens_mode(stream: bool) -> None:
    config = parse_pipeline_params(
        {"prefill": {}, "decode": {"output_mode": "auto"}}, use_openai_format=False
    )
    status, reply, legs = _exchanged(config, {**_BODY, "output_mode": "tokens", "stream": stream})
    assert status == 200, reply
    assert legs[-1]["output_mode"] == "tokens"
    if stream:
        assert isinstance(reply, str)
        assert '"output_mode":"tokens"' in reply.replace(" ", "")
        assert '"text"' not in reply
    else:
        assert isinstance(reply, dict)
        [choice] = reply["choices"]
        assert (reply["output_mode"], "text" in choice) == ("tokens", False)

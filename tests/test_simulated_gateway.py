"""The simulated llm-d gateway: routing by EPP-Profile, conditional decode, unknown profiles."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from proxy_helpers import running

from disagg_transforms.testing import GatewayCall, SimulatedGateway

CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
CHAT_PATH = "/v1/chat/completions"
GENERATE = "/inference/v1/generate"
IF_AVAILABLE = {"EPP-Profile": "decode", "Prefer": "if-available"}


def _post(
    gateway: SimulatedGateway,
    calls: Sequence[tuple[str, Mapping[str, Any], Mapping[str, str]]],
) -> list[httpx.Response]:
    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=gateway)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            return [
                await client.post(path, json=body, headers=dict(headers))
                for path, body, headers in calls
            ]

    return asyncio.run(run())


def _rendered(gateway: SimulatedGateway) -> dict[str, Any]:
    (answer,) = _post(gateway, [(f"{CHAT_PATH}/render", CHAT, {"EPP-Profile": "decode"})])
    rendered: dict[str, Any] = answer.json()
    return rendered


def _where(calls: list[GatewayCall]) -> list[tuple[str, str | None, int]]:
    return [(call.profile, call.worker, call.status) for call in calls]


@pytest.mark.parametrize(
    ("header", "profile"),
    [
        ({"EPP-Profile": "prefill"}, "prefill"),
        ({"epp-profile": "ENCODE"}, "encode"),
        ({"EPP-Profile": " Decode "}, "decode"),
        ({"EPP-Profile": ""}, "decode"),
        ({}, "decode"),
    ],
)
def test_routes_by_profile_case_insensitively(header: dict[str, str], profile: str) -> None:
    gateway = SimulatedGateway()
    (answer,) = _post(gateway, [(f"{CHAT_PATH}/render", CHAT, header)])
    assert answer.status_code == 200
    assert _where(gateway.calls) == [(profile, f"{profile}-0", 200)]
    assert len(gateway.pools[profile][0].calls) == 1
    others = [p for p in gateway.pools if p != profile]
    assert all(not gateway.pools[p][0].calls for p in others)


def test_unknown_profile_is_429_and_reaches_no_worker() -> None:
    gateway = SimulatedGateway()
    (answer,) = _post(gateway, [(GENERATE, {}, {"EPP-Profile": "render"})])
    assert answer.status_code == 429
    assert "ResourceExhausted" in answer.text
    assert _where(gateway.calls) == [("render", None, 429)]
    assert not any(worker.calls for pool in gateway.pools.values() for worker in pool)


def test_round_robin_over_the_pool() -> None:
    gateway = SimulatedGateway(pool_size=3)
    legs = [(f"{CHAT_PATH}/render", CHAT, {"EPP-Profile": "prefill"})] * 4
    _post(gateway, legs)
    assert [call.worker for call in gateway.calls] == [
        "prefill-0",
        "prefill-1",
        "prefill-2",
        "prefill-0",
    ]


def test_hash_routing_is_deterministic_per_prompt() -> None:
    first, second = (
        SimulatedGateway(pool_size=4, routing="hash"),
        SimulatedGateway(pool_size=4, routing="hash"),
    )
    prompts = [{**CHAT, "messages": [{"role": "user", "content": f"Hi {n}"}]} for n in range(8)]
    legs = [(CHAT_PATH, body, {"EPP-Profile": "prefill"}) for body in prompts]
    _post(first, legs + legs)
    _post(second, legs)
    chosen = [call.worker for call in first.calls]
    assert chosen[:8] == chosen[8:] == [call.worker for call in second.calls]
    assert len(set(chosen)) > 1


def test_cold_conditional_decode_is_412_then_warm_after_decode() -> None:
    gateway = SimulatedGateway(pool_size=2)
    rendered = _rendered(gateway)
    decode = {**rendered, "output_mode": "text"}
    cold, served, warm = _post(
        gateway,
        [
            (CHAT_PATH, CHAT, IF_AVAILABLE),
            (GENERATE, decode, {"EPP-Profile": "decode"}),
            (CHAT_PATH, CHAT, IF_AVAILABLE),
        ],
    )
    assert cold.status_code == 412
    assert cold.text == (
        "inference error: PreconditionFailed - no decode worker has the requested KV cache"
    )
    assert served.status_code == 200
    assert warm.status_code == 200
    assert warm.json()["choices"][0]["message"]["content"] == "Hello!"
    conditional = [call for call in gateway.calls if call.conditional]
    # The warm probe goes to the decode worker that served the prompt (decode-1: the render
    # call took decode-0 in round robin).
    assert _where(conditional) == [("decode", None, 412), ("decode", "decode-1", 200)]
    assert gateway.pools["decode"][1].calls[-1].headers["prefer"] == "if-available"


def test_another_prompt_stays_cold() -> None:
    gateway = SimulatedGateway()
    rendered = _rendered(gateway)
    other = {**CHAT, "messages": [{"role": "user", "content": "Bye"}]}
    _, cold = _post(
        gateway,
        [
            (GENERATE, {**rendered, "output_mode": "text"}, {"EPP-Profile": "decode"}),
            (CHAT_PATH, other, IF_AVAILABLE),
        ],
    )
    assert cold.status_code == 412


def test_a_prefill_does_not_warm_the_decode_pool() -> None:
    gateway = SimulatedGateway()
    rendered = _rendered(gateway)
    prefill = {**rendered, "sampling_params": {"max_tokens": 1}}
    _, probe = _post(
        gateway,
        [
            (GENERATE, prefill, {"EPP-Profile": "prefill"}),
            (CHAT_PATH, CHAT, IF_AVAILABLE),
        ],
    )
    assert probe.status_code == 412


@pytest.mark.parametrize(
    "prefer",
    [
        "If-Available",
        "respond-async, if-available",
        "if-available; wait=5",
        "return=minimal,IF-AVAILABLE",
    ],
)
def test_prefer_is_parsed_as_llm_d_does(prefer: str) -> None:
    gateway = SimulatedGateway()
    (answer,) = _post(gateway, [(CHAT_PATH, CHAT, {"Prefer": prefer})])
    assert answer.status_code == 412


@pytest.mark.parametrize("prefer", ["if-available-later", "return=minimal", ""])
def test_other_prefer_values_are_plain_decodes(prefer: str) -> None:
    gateway = SimulatedGateway()
    (answer,) = _post(gateway, [(CHAT_PATH, CHAT, {"Prefer": prefer})])
    assert answer.status_code == 200
    assert not gateway.calls[0].conditional


def test_a_body_that_does_not_render_is_cold() -> None:
    gateway = SimulatedGateway()
    (answer,) = _post(gateway, [(CHAT_PATH, {"model": "m"}, IF_AVAILABLE)])
    assert answer.status_code == 412


def test_headers_reach_the_worker_as_sent() -> None:
    gateway = SimulatedGateway()
    _post(gateway, [(CHAT_PATH, CHAT, {"EPP-Profile": "Decode", "x-request-id": "r1"})])
    headers = gateway.pools["decode"][0].calls[0].headers
    assert headers["epp-profile"] == "Decode"
    assert headers["x-request-id"] == "r1"
    assert gateway.calls[0].headers == headers


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="pool_size"):
        SimulatedGateway(pool_size=0)
    with pytest.raises(ValueError, match="routing"):
        SimulatedGateway(routing="random")  # type: ignore[arg-type]


def test_simulate_gateway_as_its_own_process(tmp_path: Path) -> None:
    args = ["simulate", "--gateway", "--pool-size", "2", "--port", "0"]
    with (
        running((args, tmp_path / "gateway.log")) as (gateway,),
        httpx.Client(base_url=gateway.url, timeout=30) as client,
    ):
        cold = client.post(CHAT_PATH, json=CHAT, headers=IF_AVAILABLE)
        rendered = client.post(f"{CHAT_PATH}/render", json=CHAT).json()
        decode = client.post(
            GENERATE,
            json={**rendered, "output_mode": "text"},
            headers={"EPP-Profile": "decode"},
        )
        warm = client.post(CHAT_PATH, json=CHAT, headers=IF_AVAILABLE)
        unknown = client.post(GENERATE, json={}, headers={"EPP-Profile": "nope"})
    assert [cold.status_code, decode.status_code, warm.status_code, unknown.status_code] == [
        412,
        200,
        200,
        429,
    ]
    assert decode.json()["choices"][0]["text"] == "Hello!"

"""Legs built from a ``/render`` answer, over every golden ``render-*`` fixture pair of vLLM 0.33.

The decode leg's ``sampling_params`` are render's with the client's cap written over
``max_tokens`` (a cap of 16 included: render leaves it out), ``dropped`` names only client keys,
and the legs match vLLM's own generate bodies up to what the router supplies.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from golden import load_fixture

from disagg_transforms import (
    DecodeParams,
    KvTransferPlacement,
    LegInputs,
    OutputMode,
    PrefillParams,
    apply_sampling_caps,
    build_decode_request,
    build_decode_request_bytes,
    build_prefill_request,
    detect_route,
)

PAIRS = {
    "chat": "/v1/chat/completions",
    "chat-kv": "/v1/chat/completions",
    "chat-tools": "/v1/chat/completions",
    "messages": "/v1/messages",
    "responses": "/v1/responses",
}
GENERATE = "/inference/v1/generate"
ROUTER_KV = load_fixture("generate-decode-request.json")["kv_transfer_params"]


def _cap_16(client: dict[str, Any], render: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The pair as vLLM answers a client cap of 16 (the engine default): no ``max_tokens``."""
    route = detect_route(PAIRS[next(k for k, v in CASES.items() if v[0] is client)])
    cap_key = {"responses": "max_output_tokens"}.get(route.name.lower(), "max_tokens")
    if route.name == "CHAT_COMPLETIONS" and "max_completion_tokens" in client:
        cap_key = "max_completion_tokens"
    sampling = {k: v for k, v in render["sampling_params"].items() if k != "max_tokens"}
    return {**client, cap_key: 16}, {**render, "sampling_params": sampling}


CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    name: (
        load_fixture(f"render-{name}-request.json"),
        load_fixture(f"render-{name}-response.json"),
    )
    for name in PAIRS
}


def _pairs() -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    out = []
    for name, (client, render) in CASES.items():
        out.append((name, PAIRS[name], client, render))
        out.append((f"{name}-16", PAIRS[name], *_cap_16(client, render)))
    return out


PAIR_IDS = [p[0] for p in _pairs()]


def _client_cap(client: dict[str, Any], path: str) -> dict[str, Any]:
    caps = apply_sampling_caps(
        {k: v for k, v in client.items() if k.startswith(("max_", "min_"))}, detect_route(path)
    )
    sampling: dict[str, Any] = caps["sampling_params"]
    return sampling


# Auto: text for a client without tools, derender for one with (a text step refuses tools).
@pytest.mark.parametrize("mode", [OutputMode.AUTO, OutputMode.DERENDER])
@pytest.mark.parametrize(("name", "path", "client", "render"), _pairs(), ids=PAIR_IDS)
def test_decode_leg_keeps_renders_sampling_params_under_the_clients_cap(
    name: str, path: str, client: dict[str, Any], render: dict[str, Any], mode: OutputMode
) -> None:
    params = DecodeParams(use_openai_format=False, output_mode=mode)
    leg = build_decode_request(client, client_path=path, params=params, rendered=render)
    expected = {**render["sampling_params"], **_client_cap(client, path)}
    assert leg.body["sampling_params"] == expected
    if name.endswith("-16"):
        assert leg.body["sampling_params"]["max_tokens"] == 16
    # Only keys the client sent; render's own null placeholders are not the client's.
    assert set(leg.dropped) <= set(client)
    assert "ec_transfer_params" not in leg.dropped
    raw = build_decode_request_bytes(
        json.dumps(client).encode(),
        client_path=path,
        params=params,
        inputs=LegInputs(rendered=render),
    )
    assert json.loads(raw.body) == json.loads(json.dumps(leg.body))
    assert raw.dropped == leg.dropped


@pytest.mark.parametrize(("name", "path", "client", "render"), _pairs(), ids=PAIR_IDS)
def test_prefill_leg_is_capped_at_one_token_over_the_clients_cap(
    name: str,  # noqa: ARG001 - the id of the pair
    path: str,
    client: dict[str, Any],
    render: dict[str, Any],
) -> None:
    leg = build_prefill_request(
        client,
        client_path=path,
        params=PrefillParams(use_openai_format=False),
        inputs=LegInputs(rendered=render),
    )
    assert leg.body["sampling_params"]["max_tokens"] == 1
    assert "stream_options" not in leg.body
    assert leg.body["stream"] is False


def test_completions_render_answers_are_generate_bodies_kept_as_sent() -> None:
    # A completions client stays on /v1/completions; a router that sends each rendered prompt
    # on as a generate request gets render's sampling_params (its cap included) back.
    for render in load_fixture("render-completions-response.json"):
        leg = build_decode_request(
            render, client_path=GENERATE, params=DecodeParams(use_openai_format=False)
        )
        assert leg.body["sampling_params"] == render["sampling_params"]
        assert leg.dropped == ()


def test_messages_render_stream_options_reach_the_streamed_leg() -> None:
    client, render = CASES["messages"]
    client = {**client, "tool_choice": {"type": "none"}}  # text mode: no tool calls asked for
    params = DecodeParams(use_openai_format=False, output_mode=OutputMode.TEXT)
    leg = build_decode_request(
        client, client_path=PAIRS["messages"], params=params, rendered=render
    )
    assert leg.stream
    assert leg.body["stream_options"] == render["stream_options"]
    unstreamed = build_decode_request(
        {**client, "stream": False}, client_path=PAIRS["messages"], params=params, rendered=render
    )
    assert "stream_options" not in unstreamed.body
    assert "stream_options" not in unstreamed.dropped  # render's, not the client's


def _comparable(body: dict[str, Any]) -> dict[str, Any]:
    """A generate body up to what the router supplies and to nulls (vLLM reads null as unset)."""
    router = {"request_id", "kv_transfer_params"}
    out = {k: v for k, v in body.items() if v is not None and k not in router}
    if out.get("output_mode") == "tokens":  # the route's default
        del out["output_mode"]
    return out


def _golden_client() -> tuple[dict[str, Any], dict[str, Any]]:
    return CASES["chat"]


def test_prefill_leg_matches_vllms_prefill_body() -> None:
    client, render = _golden_client()
    golden = load_fixture("generate-prefill-request.json")
    leg = build_prefill_request(
        client,
        client_path=PAIRS["chat"],
        params=PrefillParams(
            use_openai_format=False, kv_transfer_placement=KvTransferPlacement.TOP_LEVEL
        ),
        inputs=LegInputs(rendered=render, kv_transfer_params=golden["kv_transfer_params"]),
    )
    assert _comparable(leg.body) == _comparable(golden)
    assert leg.body["kv_transfer_params"] == golden["kv_transfer_params"]


@pytest.mark.parametrize(
    ("fixture", "extra"),
    [
        ("generate-decode-request.json", {}),
        (
            "generate-stream-usage-request.json",
            {
                "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": False},
            },
        ),
    ],
)
def test_decode_leg_matches_vllms_decode_body(fixture: str, extra: dict[str, Any]) -> None:
    client, render = _golden_client()
    golden = load_fixture(fixture)
    leg = build_decode_request(
        {**client, **extra},
        client_path=PAIRS["chat"],
        params=DecodeParams(
            use_openai_format=False, kv_transfer_placement=KvTransferPlacement.TOP_LEVEL
        ),
        rendered=render,
        kv_transfer_params=ROUTER_KV,
        request_id=golden["request_id"],
    )
    assert _comparable(leg.body) == _comparable(golden)
    assert leg.body["kv_transfer_params"] == golden["kv_transfer_params"]
    assert leg.body["request_id"] == golden["request_id"]

"""A leg carries no pair vLLM refuses, loses nothing silently, treats transfer params one way.

Each test goes through the public builders, on the dict path and (for decode) the bytes path.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from golden import load_fixture
from helpers import outcome
from hypothesis import given
from hypothesis import strategies as st
from strategies import client_paths, client_request_bodies, router_leg_inputs

from disagg_transforms import (
    DecodeLeg,
    DecodeParams,
    EncodeParams,
    GenerateDecodeLeg,
    KvTransferPlacement,
    LegInputs,
    OutputMode,
    PrefillParams,
    RequestError,
    Route,
    Step,
    TransformContext,
    build_decode_request,
    build_decode_request_bytes,
    build_encode_request,
    build_prefill_request,
    decode_request,
)

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
GENERATE = "/inference/v1/generate"
TOKENS = [11, 12, 13]
MODES = [OutputMode.TEXT, OutputMode.DERENDER]


def _decode(body: dict[str, Any], path: str, params: DecodeParams, **kwargs: Any) -> DecodeLeg:
    """The decode leg, after checking the bytes path builds the same one."""
    inputs = LegInputs(**kwargs)
    leg = build_decode_request(body, client_path=path, params=params, inputs=inputs)
    raw = build_decode_request_bytes(
        json.dumps(body).encode(), client_path=path, params=params, inputs=inputs
    )
    assert json.loads(raw.body) == json.loads(json.dumps(leg.body))
    assert (raw.stream, raw.single_frame, raw.dropped) == (
        leg.stream,
        leg.single_frame,
        leg.dropped,
    )
    return leg


def _generate(mode: OutputMode, **kwargs: Any) -> DecodeParams:
    return DecodeParams(use_openai_format=False, output_mode=mode, **kwargs)


# ---- detokenize: false cannot reach a text or derender leg ----


@pytest.mark.parametrize("mode", MODES)
def test_generate_client_detokenize_false_is_dropped_and_reported(mode: OutputMode) -> None:
    body = load_fixture("error-400-detokenize-false-request.json")
    leg = _decode(body, GENERATE, _generate(mode))
    assert "detokenize" not in leg.body["sampling_params"]
    assert "sampling_params.detokenize" in leg.dropped
    # Everything else the client sent under sampling_params stays as sent.
    kept = {k: v for k, v in body["sampling_params"].items() if k != "detokenize"}
    assert leg.body["sampling_params"] == kept


@pytest.mark.parametrize("mode", MODES)
def test_rendered_detokenize_false_is_dropped_too(mode: OutputMode) -> None:
    rendered = load_fixture("render-chat-response.json")
    rendered = {**rendered, "sampling_params": {**rendered["sampling_params"], "detokenize": False}}
    client = load_fixture("render-chat-request.json")
    leg = _decode(client, CHAT, _generate(mode), rendered=rendered)
    assert "detokenize" not in leg.body["sampling_params"]
    assert "sampling_params.detokenize" in leg.dropped


def test_detokenize_true_is_kept() -> None:
    body = {"token_ids": TOKENS, "sampling_params": {"detokenize": True}}
    leg = _decode(body, GENERATE, _generate(OutputMode.TEXT))
    assert leg.body["sampling_params"] == {"detokenize": True}
    assert leg.dropped == ()


# ---- tools: [] counts as no tools ----

EMPTY_TOOLS = [
    (CHAT, {"messages": [], "tools": [], "tool_choice": "auto"}),
    (CHAT, {"messages": [], "tools": [], "tool_choice": "none"}),
    (RESPONSES, {"input": "x", "tools": [], "tool_choice": "required"}),
    (MESSAGES, {"max_tokens": 5, "messages": [], "tools": [], "tool_choice": {"type": "any"}}),
]


@pytest.mark.parametrize(("path", "body"), EMPTY_TOOLS)
def test_empty_tools_send_no_tool_choice(path: str, body: dict[str, Any]) -> None:
    leg = _decode(body, path, _generate(OutputMode.DERENDER), token_ids=TOKENS)
    context = leg.body["parse_context"]
    assert "tools" not in context
    assert "tool_choice" not in context
    assert {"tools", "tool_choice"} <= set(leg.dropped)


@pytest.mark.parametrize(("path", "body"), EMPTY_TOOLS)
def test_tool_choice_without_tools_is_not_sent(path: str, body: dict[str, Any]) -> None:
    body = {k: v for k, v in body.items() if k != "tools"}
    leg = _decode(body, path, _generate(OutputMode.DERENDER), token_ids=TOKENS)
    assert "tool_choice" not in leg.body["parse_context"]
    assert "tool_choice" in leg.dropped


# ---- a streamed leg asks for the usage the client's envelope reports at its end ----


@pytest.mark.parametrize(
    ("path", "body"),
    [(RESPONSES, {"input": "x"}), (MESSAGES, {"max_tokens": 5, "messages": []})],
)
def test_responses_and_messages_streams_ask_for_usage(path: str, body: dict[str, Any]) -> None:
    leg = _decode({**body, "stream": True}, path, _generate(OutputMode.TEXT), token_ids=TOKENS)
    assert leg.stream
    assert leg.body["stream_options"] == {"include_usage": True}
    unstreamed = _decode(body, path, _generate(OutputMode.TEXT), token_ids=TOKENS)
    assert "stream_options" not in unstreamed.body
    single = _decode(
        {**body, "stream": True}, path, _generate(OutputMode.DERENDER), token_ids=TOKENS
    )
    assert single.single_frame
    assert "stream_options" not in single.body


def test_chat_stream_asks_for_usage_only_when_the_client_did() -> None:
    body = {"messages": [], "stream": True}
    leg = _decode(body, CHAT, _generate(OutputMode.TEXT), token_ids=TOKENS)
    assert "stream_options" not in leg.body
    asked = {**body, "stream_options": {"include_usage": True}}
    leg = _decode(asked, CHAT, _generate(OutputMode.TEXT), token_ids=TOKENS)
    assert leg.body["stream_options"] == {"include_usage": True}
    single = _decode(asked, CHAT, _generate(OutputMode.DERENDER), token_ids=TOKENS)
    assert "stream_options" not in single.body
    assert "stream_options" in single.dropped


# ---- transfer params: one rule for every leg ----

CLIENT_KV = {"remote_host": "client", "remote_port": 1, "do_remote_decode": False, "mine": True}
ROUTER_KV = {"remote_host": "router", "remote_port": 2}
CLIENT_EC = {"ec_host": "client", "mine": True}
ROUTER_EC = {"ec_host": "router"}
TRUSTED_KV = {**CLIENT_KV, **ROUTER_KV}


def _chat(**extra: Any) -> dict[str, Any]:
    return {"messages": [], "max_tokens": 9, **extra}


@pytest.mark.parametrize("openai", [True, False])
@pytest.mark.parametrize(
    "where",
    [
        {"kv_transfer_params": CLIENT_KV, "ec_transfer_params": CLIENT_EC},
        {"vllm_xargs": {"kv_transfer_params": CLIENT_KV, "ec_transfer_params": CLIENT_EC}},
    ],
)
def test_trusted_prefill_keeps_the_clients_params_under_the_flags_and_routers(
    openai: bool, where: dict[str, Any]
) -> None:
    leg = build_prefill_request(
        _chat(**where),
        client_path=CHAT,
        params=PrefillParams(
            use_openai_format=openai,
            trust_client_transfer_params=True,
            kv_transfer_placement=KvTransferPlacement.TOP_LEVEL,
        ),
        inputs=LegInputs(
            token_ids=TOKENS, kv_transfer_params=ROUTER_KV, ec_transfer_params=ROUTER_EC
        ),
    )
    flags = {"do_remote_decode": True, "do_remote_prefill": False}
    assert leg.body["kv_transfer_params"] == {**TRUSTED_KV, **flags}
    assert leg.body["ec_transfer_params"] == {**CLIENT_EC, **ROUTER_EC}
    assert "vllm_xargs" not in leg.body


@pytest.mark.parametrize("openai", [True, False])
def test_trusted_decode_merges_the_routers_params_over_the_clients(openai: bool) -> None:
    params = DecodeParams(
        use_openai_format=openai,
        trust_client_transfer_params=True,
        kv_transfer_placement=KvTransferPlacement.TOP_LEVEL,
    )
    leg = _decode(
        _chat(kv_transfer_params=CLIENT_KV, ec_transfer_params=CLIENT_EC),
        CHAT,
        params,
        token_ids=TOKENS,
        kv_transfer_params=ROUTER_KV,
    )
    assert leg.body["kv_transfer_params"] == TRUSTED_KV
    assert leg.body["ec_transfer_params"] == CLIENT_EC
    assert leg.dropped == () if openai else "kv_transfer_params" not in leg.dropped


@pytest.mark.parametrize("openai", [True, False])
def test_trusted_encode_keeps_the_clients_params(openai: bool) -> None:
    leg = build_encode_request(
        _chat(kv_transfer_params=CLIENT_KV),
        client_path=CHAT,
        params=EncodeParams(use_openai_format=openai, trust_client_transfer_params=True),
        inputs=LegInputs(token_ids=TOKENS),
    )
    assert leg.body["kv_transfer_params"] == CLIENT_KV


@pytest.mark.parametrize(
    ("path", "body", "container"),
    [
        (CHAT, _chat(vllm_xargs={"kv_transfer_params": CLIENT_KV}), ("vllm_xargs",)),
        (
            GENERATE,
            {"token_ids": TOKENS, "sampling_params": {"extra_args": {"ec_transfer_params": {}}}},
            ("sampling_params", "extra_args"),
        ),
    ],
)
def test_untrusted_stripping_leaves_no_empty_container(
    path: str, body: dict[str, Any], container: tuple[str, ...]
) -> None:
    params = DecodeParams(use_openai_format=path != GENERATE)
    leg = _decode(body, path, params)
    outer = leg.body
    for key in container[:-1]:
        outer = outer[key]
    assert container[-1] not in outer
    assert leg.dropped


def test_a_clients_own_empty_vllm_xargs_is_left_alone() -> None:
    leg = _decode(_chat(vllm_xargs={}), CHAT, DecodeParams())
    assert leg.body["vllm_xargs"] == {}


@pytest.mark.parametrize("step", ["prefill", "decode"])
def test_untrusted_client_params_never_reach_a_leg(step: str) -> None:
    body = _chat(
        kv_transfer_params=CLIENT_KV,
        vllm_xargs={"ec_transfer_params": CLIENT_EC, "keep": 1},
    )
    if step == "prefill":
        built = build_prefill_request(
            body,
            client_path=CHAT,
            params=PrefillParams(),
            inputs=LegInputs(kv_transfer_params=ROUTER_KV),
        ).body
        assert built["kv_transfer_params"] == {
            **ROUTER_KV,
            "do_remote_decode": True,
            "do_remote_prefill": False,
        }
    else:
        built = _decode(body, CHAT, DecodeParams(), kv_transfer_params=ROUTER_KV).body
        assert built["kv_transfer_params"] == ROUTER_KV
    assert built["vllm_xargs"] == {"keep": 1}
    assert "ec_transfer_params" not in built


# ---- a Messages client's vllm_xargs, as every other client's ----


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, {"messages": []}),
        ("/v1/responses", {"input": "x"}),
        (MESSAGES, {"max_tokens": 5, "messages": []}),
    ],
)
def test_vllm_xargs_become_extra_args_for_every_client(path: str, body: dict[str, Any]) -> None:
    leg = _decode(
        {**body, "vllm_xargs": {"lora": "a", "n": 2}},
        path,
        _generate(OutputMode.TEXT, kv_transfer_placement=KvTransferPlacement.TOP_LEVEL),
        token_ids=TOKENS,
    )
    assert leg.body["sampling_params"]["extra_args"] == {"lora": "a", "n": 2}
    assert "vllm_xargs" not in leg.dropped


# ---- one shape for the router's inputs; a generate leg says it has a mode ----


@given(
    body=client_request_bodies,
    path=client_paths,
    inputs=router_leg_inputs,
    mode=st.sampled_from(MODES),
    openai=st.booleans(),
)
def test_inputs_object_builds_the_keyword_fronts_leg(
    body: dict[str, Any], path: str, inputs: LegInputs, mode: OutputMode, openai: bool
) -> None:
    params = DecodeParams(use_openai_format=openai, output_mode=mode)
    by_keywords = outcome(
        lambda: build_decode_request(
            body,
            client_path=path,
            params=params,
            token_ids=inputs.token_ids,
            kv_transfer_params=inputs.kv_transfer_params,
            request_id=inputs.request_id,
        )
    )
    by_inputs = outcome(
        lambda: build_decode_request(body, client_path=path, params=params, inputs=inputs)
    )
    assert by_inputs == by_keywords
    kind, leg = by_inputs
    if kind == "ok":
        # A generate leg, and only one, is a GenerateDecodeLeg: its output_mode is the step's.
        assert isinstance(leg, GenerateDecodeLeg) == (leg.route is Route.GENERATE)
        assert leg.output_mode is (mode if isinstance(leg, GenerateDecodeLeg) else None)


def test_inputs_and_keywords_together_are_refused() -> None:
    with pytest.raises(RequestError) as caught:
        build_decode_request(
            {"messages": []},
            client_path=CHAT,
            params=DecodeParams(),
            token_ids=TOKENS,
            inputs=LegInputs(token_ids=TOKENS),
        )
    assert caught.value.param == "inputs"
    with pytest.raises(RequestError):
        build_prefill_request(
            {},
            client_path=CHAT,
            params=PrefillParams(),
            inputs={"token_ids": TOKENS},  # type: ignore[arg-type]  # a wrong type on purpose
        )


def test_prefill_and_encode_take_the_same_inputs() -> None:
    inputs = LegInputs(token_ids=TOKENS, kv_transfer_params=ROUTER_KV, ec_transfer_params=ROUTER_EC)
    prefill = build_prefill_request(
        _chat(), client_path=CHAT, params=PrefillParams(use_openai_format=False), inputs=inputs
    )
    assert prefill.body["token_ids"] == TOKENS
    assert prefill.body["ec_transfer_params"] == ROUTER_EC
    encode = build_encode_request(
        _chat(), client_path=CHAT, params=EncodeParams(use_openai_format=False), inputs=inputs
    )
    assert encode.body["token_ids"] == TOKENS
    # The one rule: an encode leg carries what the router hands it, without the prefill flags.
    assert encode.body["kv_transfer_params"] == ROUTER_KV


def test_decode_request_transform_reads_the_contexts_inputs() -> None:
    context = TransformContext(
        client_path=CHAT,
        step=Step.DECODE,
        params=_generate(OutputMode.TEXT),
        inputs=LegInputs(token_ids=TOKENS, request_id="r-1"),
    )
    body = decode_request(_chat(), context)
    assert body["token_ids"] == TOKENS
    assert body["request_id"] == "r-1"

from __future__ import annotations

import copy
import json
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

import jsonschema
import msgspec
import pytest
from golden import FIXTURES, load_fixture
from helpers import outcome
from hypothesis import event, given
from hypothesis import strategies as st
from strategies import (
    client_paths,
    client_request_bodies,
    client_route_bodies,
    client_view_bodies,
    generate_request_bodies,
    parse_context_bodies,
    render_answers,
    render_client_bodies,
    router_decode_inputs,
    vllm_render_answers,
)

from disagg_transforms import (
    DEFAULT_LIMITS,
    TOP_LEVEL_CAPS,
    DecodeLeg,
    DecodeLegBytes,
    DecodeParams,
    DisaggTransformError,
    EncodeParams,
    KvTransferPlacement,
    Leg,
    LegInputs,
    OutputMode,
    PrefillParams,
    RequestError,
    Route,
    build_decode_request,
    build_decode_request_bytes,
    build_encode_request,
    build_prefill_request,
)
from disagg_transforms._request import client as client_module
from disagg_transforms._request import legs
from disagg_transforms._request.client import client_caps, read_client_request
from disagg_transforms._request.render import RenderAnswer
from disagg_transforms._routes import detect_route
from disagg_transforms._wire import keys as w
from disagg_transforms._wire.limits import check_client_body
from disagg_transforms._wire.raw import RawMembers, encode
from disagg_transforms.envelopes import GenerateRequest, ParseContext
from disagg_transforms.errors import UpstreamContractError

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
GENERATE = "/inference/v1/generate"
TOKENS = [11, 12, 13, 14]
ROUTER_KV = {"do_remote_decode": False, "do_remote_prefill": True, "remote_host": "10.0.0.1"}
SCHEMA = json.loads(
    (Path(__file__).parent / "fixtures" / "request-json-schema.json").read_text(encoding="utf-8")
)["body"]

TEXT = DecodeParams(use_openai_format=False)
DERENDER = DecodeParams(use_openai_format=False, output_mode=OutputMode.DERENDER)


def assert_generate_request(body: dict[str, Any], passthrough: Any = frozenset()) -> None:
    """The body is a valid vLLM 0.33 GenerateRequest (typed view, JSON schema, value rules).

    Every top-level key the library emits is a schema property; ``passthrough`` names the keys
    a generate client sent itself (kept as sent, whatever they are).
    """
    msgspec.convert(body, GenerateRequest)
    jsonschema.validate(body, SCHEMA)
    assert set(body) - set(passthrough) <= set(SCHEMA["properties"])
    assert body["token_ids"]
    assert all(isinstance(t, int) and t >= 0 for t in body["token_ids"])
    sampling = body["sampling_params"]
    assert isinstance(sampling, dict)
    assert body.get("output_mode", "tokens") in {"tokens", "text", "derender"}
    cap = sampling.get("max_tokens")
    if cap is not None:
        assert cap >= 1
        assert sampling.get("min_tokens", 0) <= cap
    assert not any(key in body for key in (*TOP_LEVEL_CAPS, "min_tokens"))


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def decode(body: Any, path: str = CHAT, params: DecodeParams = TEXT, **kw: Any) -> DecodeLeg:
    kw.setdefault("token_ids", TOKENS)
    return build_decode_request(body, client_path=path, params=params, **kw)


# ---- decode, chat client over generate ----


def test_chat_cap_precedence_reaches_sampling_params() -> None:
    leg = decode(chat(max_completion_tokens=200, max_tokens=50))
    assert leg.body["sampling_params"]["max_tokens"] == 200
    assert "max_tokens" not in leg.body
    assert "max_completion_tokens" not in leg.body
    assert leg.path == GENERATE
    assert leg.route is Route.GENERATE
    assert_generate_request(leg.body)


def test_chat_sampling_fields_reach_sampling_params() -> None:
    leg = decode(
        chat(
            temperature=0.7,
            top_p=0.9,
            seed=7,
            stop="\n\n",
            logprobs=True,
            top_logprobs=2,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object"}},
            },
            n=2,
            top_k=40,
            min_p=0.1,
            presence_penalty=0.5,
            frequency_penalty=0.25,
            repetition_penalty=1.1,
            stop_token_ids=[2],
            ignore_eos=False,
            logit_bias={"5": -1.0},
            skip_special_tokens=False,
            min_tokens=1,
            max_tokens=10,
        )
    )
    assert leg.body["sampling_params"] == {
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 7,
        "stop": "\n\n",
        "logprobs": 2,
        "structured_outputs": {"json": {"type": "object"}},
        "n": 2,
        "top_k": 40,
        "min_p": 0.1,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
        "repetition_penalty": 1.1,
        "stop_token_ids": [2],
        "ignore_eos": False,
        "logit_bias": {"5": -1.0},
        "skip_special_tokens": False,
        "min_tokens": 1,
        "max_tokens": 10,
    }
    assert_generate_request(leg.body)


def test_golden_decode_request_sampling_fields_match() -> None:
    golden = load_fixture("request-decode-derender.json")
    leg = decode(
        chat(
            temperature=0.7,
            top_p=0.9,
            seed=7,
            stop=["\n\n"],
            logprobs=True,
            top_logprobs=2,
            max_completion_tokens=256,
        ),
        params=DERENDER,
        token_ids=golden["token_ids"],
        request_id=golden["request_id"],
    )
    for key, value in leg.body["sampling_params"].items():
        assert golden["sampling_params"][key] == value
    assert leg.body["token_ids"] == golden["token_ids"]
    assert leg.body["output_mode"] == golden["output_mode"]
    assert_generate_request(leg.body)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"logprobs": False, "top_logprobs": 0}, None),
        ({"logprobs": True}, 0),
        ({"logprobs": None}, None),
        ({"logprobs": True, "logprob_token_ids": [3]}, None),
    ],
)
def test_chat_logprobs_rules(fields: dict[str, Any], expected: int | None) -> None:
    sampling = decode(chat(**fields)).body["sampling_params"]
    assert sampling.get("logprobs") == expected


@pytest.mark.parametrize(
    ("response_format", "structured"),
    [
        ({"type": "json_object"}, {"json_object": True}),
        ({"type": "text"}, None),
        (
            {"type": "structural_tag", "format": {"type": "x"}},
            {"structural_tag": json.dumps({"type": "structural_tag", "format": {"type": "x"}})},
        ),
    ],
)
def test_response_format_becomes_structured_outputs(
    response_format: dict[str, Any], structured: dict[str, Any] | None
) -> None:
    sampling = decode(chat(response_format=response_format)).body["sampling_params"]
    assert sampling.get("structured_outputs") == structured


def test_structured_outputs_and_vllm_xargs_are_mapped() -> None:
    sampling = decode(chat(structured_outputs={"regex": "a+"}, vllm_xargs={"k": 1})).body[
        "sampling_params"
    ]
    assert sampling["structured_outputs"] == {"regex": "a+"}
    assert sampling["extra_args"]["k"] == 1


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": "hot"}, "$.temperature"),
        ({"stop": [1]}, "$.stop[0]"),
        ({"response_format": {"type": "yaml"}}, "$.response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "$.response_format.json_schema"),
        ({"top_logprobs": 3}, "$.top_logprobs"),
        ({"logprob_token_ids": [1]}, "$.logprob_token_ids"),
        ({"echo": True}, "$.echo"),
        ({"use_beam_search": True}, "$.use_beam_search"),
        ({"logprobs": "yes"}, "$.logprobs"),
        ({"tools": "f"}, "$.tools"),
        ({"model": 5}, "$.model"),
    ],
)
def test_refused_chat_fields_are_named(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as caught:
        decode(chat(**fields), params=DERENDER)
    assert caught.value.param == param
    assert param.split(".")[1] in caught.value.message


def test_dropped_fields_are_reported() -> None:
    leg = decode(chat(user="u", metadata={"a": "b"}, tools=[]))
    assert leg.dropped == ("messages", "user", "metadata", "tools")
    assert not {"messages", "user", "metadata", "tools"} & set(leg.body)


def test_carried_fields() -> None:
    leg = decode(
        chat(cache_salt="s", priority=1, return_token_ids=True, request_id="client-id"),
    )
    assert leg.body["cache_salt"] == "s"
    assert leg.body["priority"] == 1
    assert leg.body["return_token_ids"] is True
    assert leg.body["request_id"] == "client-id"
    assert leg.body["model"] == "m"
    assert (
        decode(chat(request_id="client-id"), request_id="router-id").body["request_id"]
        == "router-id"
    )
    assert "request_id" not in decode(chat()).body


def test_sampling_params_always_present() -> None:
    leg = decode({"messages": []})
    assert leg.body["sampling_params"] == {}
    assert_generate_request(leg.body)


@pytest.mark.parametrize("token_ids", [None, []])
def test_generate_leg_needs_token_ids(token_ids: list[int] | None) -> None:
    with pytest.raises(RequestError) as caught:
        decode(chat(), token_ids=token_ids)
    assert caught.value.param == "$.token_ids"


def test_text_stream_keeps_stream_options() -> None:
    leg = decode(chat(stream=True, stream_options={"include_usage": True}))
    assert leg.stream is True
    assert leg.single_frame is False
    assert leg.body["stream"] is True
    assert leg.body["stream_options"] == {"include_usage": True}
    assert leg.output_mode is OutputMode.TEXT
    assert leg.body["output_mode"] == "text"


def test_derender_with_streaming_client_is_one_unstreamed_frame() -> None:
    leg = decode(chat(stream=True, stream_options={"include_usage": True}), params=DERENDER)
    assert leg.body["stream"] is False
    assert "stream_options" not in leg.body
    assert leg.stream is False
    assert leg.single_frame is True
    assert "stream_options" in leg.dropped
    assert_generate_request(leg.body)


def test_derender_parse_context_built_from_tools() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    leg = decode(
        chat(
            tools=tools,
            parallel_tool_calls=None,
            include_reasoning=False,
            chat_template_kwargs={"t": 1},
        ),
        params=DERENDER,
    )
    assert leg.body["parse_context"] == {
        "tools": tools,
        "tool_choice": "auto",
        "include_reasoning": False,
        "chat_template_kwargs": {"t": 1},
    }
    assert "tools" not in leg.dropped
    assert_generate_request(leg.body)


def test_derender_parse_context_from_render_wins() -> None:
    rendered_context = {"tools": [], "tool_choice": "none", "chat_template_kwargs": {}}
    leg = decode(
        chat(tools=[{"type": "function", "function": {"name": "f"}}]),
        params=DERENDER,
        parse_context=rendered_context,
    )
    assert leg.body["parse_context"] == rendered_context


def test_text_mode_writes_no_parse_context() -> None:
    leg = decode(chat(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="none"))
    assert "parse_context" not in leg.body
    assert {"tools", "tool_choice"} <= set(leg.dropped)


@pytest.mark.parametrize(
    ("wrap", "path", "use_openai", "expected"),
    [
        (True, CHAT, False, True),
        (False, CHAT, False, False),
        (True, CHAT, True, False),
        (True, RESPONSES, False, False),
        (True, GENERATE, False, False),
    ],
)
def test_wrap_chat_completion_flag(wrap: bool, path: str, use_openai: bool, expected: bool) -> None:
    params = DecodeParams(use_openai_format=use_openai, wrap_chat_completion=wrap)
    body = chat() if path != GENERATE else {"token_ids": [1], "sampling_params": {}}
    assert decode(body, path=path, params=params).wrap_chat_completion is expected


def test_rendered_request_is_merged() -> None:
    rendered = {
        "request_id": "chatcmpl-1",
        "token_ids": [5, 6],
        "sampling_params": {"max_tokens": 256, "temperature": 0.7, "skip_clone": True},
        "model": "m",
        "parse_context": {"tools": None, "chat_template_kwargs": {}},
        "kv_transfer_params": {"remote_host": "evil"},
    }
    leg = build_decode_request(
        chat(max_tokens=5, temperature=0.1, stream=True),
        client_path=CHAT,
        params=DERENDER,
        rendered=rendered,
        kv_transfer_params=ROUTER_KV,
    )
    # The client's own cap is written over render's; render's other sampling_params stay.
    assert leg.body["sampling_params"]["max_tokens"] == 5
    assert leg.body["sampling_params"]["temperature"] == 0.7
    assert leg.body["token_ids"] == [5, 6]
    assert leg.body["request_id"] == "chatcmpl-1"
    assert leg.body["output_mode"] == "derender"
    assert leg.body["parse_context"] == rendered["parse_context"]
    assert leg.body["kv_transfer_params"] == ROUTER_KV
    assert leg.single_frame is True
    assert rendered["kv_transfer_params"] == {"remote_host": "evil"}
    assert_generate_request(leg.body)


# ---- decode, other clients ----


def test_generate_client_keeps_every_field() -> None:
    body = {
        "request_id": "r",
        "token_ids": TOKENS,
        "model": "m",
        "sampling_params": {"max_tokens": 50, "temperature": 0.2, "extra_args": {"x": 1}},
        "cache_salt": "s",
        "priority": 0,
        "return_token_ids": True,
        "reasoning_ended": False,
        "stream": True,
        "stream_options": {"include_usage": True},
        "some_future_field": [1, 2],
    }
    leg = build_decode_request(
        body, client_path=GENERATE, params=DecodeParams(), kv_transfer_params=ROUTER_KV
    )
    for key, value in body.items():
        if key != "sampling_params":
            assert leg.body[key] == value
    assert leg.body["sampling_params"] == {
        "max_tokens": 50,
        "temperature": 0.2,
        "extra_args": {"x": 1, "kv_transfer_params": ROUTER_KV},
    }
    assert leg.body["output_mode"] == "text"
    assert leg.body["kv_transfer_params"] == ROUTER_KV
    assert leg.dropped == ()
    assert leg.wrap_chat_completion is False


def test_generate_client_top_level_cap_is_relocated_but_its_own_wins() -> None:
    leg = build_decode_request(
        {"token_ids": [1], "max_tokens": 9, "sampling_params": {"max_tokens": 50}},
        client_path=GENERATE,
        params=DecodeParams(),
    )
    assert leg.body["sampling_params"] == {"max_tokens": 50}
    assert "max_tokens" not in leg.body


@pytest.mark.parametrize("path", [CHAT, RESPONSES, MESSAGES])
def test_openai_format_leg_keeps_the_client_body(path: str) -> None:
    body = chat(
        max_tokens=5, temperature=0.3, stream=True, kv_transfer_params={"remote_host": "evil"}
    )
    leg = decode(body, path=path, params=DecodeParams(), kv_transfer_params=ROUTER_KV)
    assert leg.path == path
    assert leg.output_mode is None
    assert leg.stream is True
    expected = {**body, "kv_transfer_params": ROUTER_KV}
    assert leg.body == expected
    assert body["kv_transfer_params"] == {"remote_host": "evil"}


def test_completions_client_gets_prompt_token_ids_on_its_own_route() -> None:
    body = {"model": "m", "prompt": "hello", "max_tokens": 5}
    leg = decode(body, path=COMPLETIONS, params=TEXT, kv_transfer_params=ROUTER_KV)
    assert leg.path == COMPLETIONS
    assert leg.body == {
        "model": "m",
        "prompt": TOKENS,
        "max_tokens": 5,
        "kv_transfer_params": ROUTER_KV,
    }
    without = decode(body, path=COMPLETIONS, token_ids=None)
    assert without.body == body


@pytest.mark.parametrize("path", [RESPONSES, MESSAGES])
def test_responses_and_messages_caps_over_generate(path: str) -> None:
    key = "max_output_tokens" if path == RESPONSES else "max_tokens"
    body = {"model": "m", "input": "hi", key: 33, "temperature": 0.5}
    leg = decode(body, path=path)
    assert leg.body["sampling_params"] == {"temperature": 0.5, "max_tokens": 33}
    assert leg.dropped == ("input",)
    assert_generate_request(leg.body)


# ---- transfer params ----


@pytest.mark.parametrize(
    ("placement", "top", "extra"),
    [
        (KvTransferPlacement.BOTH, True, True),
        (KvTransferPlacement.TOP_LEVEL, True, False),
        (KvTransferPlacement.EXTRA_ARGS, False, True),
    ],
)
def test_kv_placement(placement: KvTransferPlacement, top: bool, extra: bool) -> None:
    params = DecodeParams(use_openai_format=False, kv_transfer_placement=placement)
    leg = decode(chat(), params=params, kv_transfer_params=ROUTER_KV)
    assert ("kv_transfer_params" in leg.body) is top
    extra_args = leg.body["sampling_params"].get("extra_args", {})
    assert ("kv_transfer_params" in extra_args) is extra


def test_client_transfer_params_are_stripped_everywhere() -> None:
    evil = {"remote_host": "evil"}
    body = {
        "token_ids": [1],
        "kv_transfer_params": evil,
        "ec_transfer_params": evil,
        "sampling_params": {
            "extra_args": {"kv_transfer_params": evil, "ec_transfer_params": evil, "k": 1}
        },
    }
    leg = build_decode_request(body, client_path=GENERATE, params=DecodeParams())
    assert "evil" not in json.dumps(leg.body)
    assert leg.body["sampling_params"]["extra_args"] == {"k": 1}
    assert set(leg.dropped) == {
        "kv_transfer_params",
        "ec_transfer_params",
        "sampling_params.extra_args.kv_transfer_params",
        "sampling_params.extra_args.ec_transfer_params",
    }
    chat_leg = decode(chat(vllm_xargs={"kv_transfer_params": evil}), params=DecodeParams())
    assert "evil" not in json.dumps(chat_leg.body)


def test_trusted_client_transfer_params_are_kept() -> None:
    mine = {"remote_host": "trusted"}
    params = DecodeParams(use_openai_format=False, trust_client_transfer_params=True)
    leg = decode(chat(kv_transfer_params=mine), params=params)
    assert leg.body["kv_transfer_params"] == mine
    assert leg.body["sampling_params"]["extra_args"]["kv_transfer_params"] == mine
    routed = decode(chat(kv_transfer_params=mine), params=params, kv_transfer_params=ROUTER_KV)
    assert routed.body["kv_transfer_params"] == ROUTER_KV


# ---- prefill and encode ----

PREFILL_KV = {"do_remote_decode": True, "do_remote_prefill": False}


@pytest.mark.parametrize(
    ("path", "cap_key"),
    [
        (CHAT, "max_tokens"),
        (RESPONSES, "max_output_tokens"),
        (MESSAGES, "max_tokens"),
        (COMPLETIONS, "max_tokens"),
    ],
)
def test_prefill_openai_format_single_token(path: str, cap_key: str) -> None:
    body = {
        "model": "m",
        cap_key: 500,
        "min_tokens": 3,
        "stream": True,
        "stream_options": {},
        "temperature": 0.4,
        "cache_salt": "s",
    }
    leg = build_prefill_request(
        body,
        client_path=path,
        params=PrefillParams(),
        inputs=LegInputs(token_ids=TOKENS, kv_transfer_params={"remote_engine_id": None}),
    )
    assert leg.path == path
    assert leg.body[cap_key] == 1
    assert "min_tokens" not in leg.body
    assert leg.body["stream"] is False
    assert "stream_options" not in leg.body
    assert leg.body["temperature"] == 0.4
    assert leg.body["cache_salt"] == "s"
    assert leg.body["kv_transfer_params"] == {**PREFILL_KV, "remote_engine_id": None}
    if path == COMPLETIONS:
        assert leg.body["prompt"] == TOKENS


@pytest.mark.parametrize("path", [CHAT, RESPONSES, MESSAGES, GENERATE])
def test_prefill_generate_single_token(path: str) -> None:
    body: dict[str, Any] = {
        "model": "m",
        "temperature": 0.4,
        "cache_salt": "s",
        "stream": True,
        "max_tokens": 100,
        "max_output_tokens": 100,
        "min_tokens": 2,
    }
    if path == GENERATE:
        body = {
            "token_ids": TOKENS,
            "sampling_params": {"max_tokens": 100, "min_tokens": 2, "temperature": 0.4},
            "cache_salt": "s",
            "output_mode": "text",
            "stream": True,
        }
    leg = build_prefill_request(
        body,
        client_path=path,
        params=PrefillParams(use_openai_format=False),
        inputs=LegInputs(token_ids=TOKENS, ec_transfer_params={"h": {"d": 1}}, request_id="rid"),
    )
    assert leg.path == GENERATE
    assert isinstance(leg, Leg)
    sampling = leg.body["sampling_params"]
    assert sampling["max_tokens"] == 1
    assert "min_tokens" not in sampling
    assert sampling["extra_args"]["kv_transfer_params"] == PREFILL_KV
    assert sampling["extra_args"]["ec_transfer_params"] == {"h": {"d": 1}}
    assert leg.body["kv_transfer_params"] == PREFILL_KV
    assert leg.body["stream"] is False
    assert leg.body["cache_salt"] == "s"
    assert leg.body["request_id"] == "rid"
    assert "output_mode" not in leg.body
    assert sampling["temperature"] == 0.4
    assert_generate_request(leg.body)


@pytest.mark.parametrize("path", [CHAT, RESPONSES, MESSAGES, COMPLETIONS, GENERATE])
@pytest.mark.parametrize("use_openai", [True, False])
def test_encode_has_no_transfer_params(path: str, use_openai: bool) -> None:
    body = {
        "model": "m",
        "token_ids": [1],
        "max_tokens": 9,
        "kv_transfer_params": {"remote_host": "evil"},
    }
    leg = build_encode_request(
        body,
        client_path=path,
        params=EncodeParams(use_openai_format=use_openai),
        inputs=LegInputs(token_ids=TOKENS),
    )
    assert "transfer_params" not in json.dumps(leg.body)
    if leg.route is Route.GENERATE:
        assert leg.body["sampling_params"]["max_tokens"] == 1
        assert_generate_request(leg.body)
    elif leg.route is Route.RESPONSES:
        assert leg.body["max_output_tokens"] == 1
    else:
        assert leg.body["max_tokens"] == 1


def test_encode_with_features() -> None:
    feats = {
        "mm_hashes": {"image": ["h"]},
        "mm_placeholders": {"image": [{"offset": 1, "length": 3}]},
        "kwargs_data": {"image": [None]},
    }
    leg = build_encode_request(
        {"model": "m"},
        client_path=GENERATE,
        params=EncodeParams(),
        inputs=LegInputs(token_ids=TOKENS, features=feats),
    )
    assert leg.body["features"] == feats
    assert_generate_request(leg.body)


def test_bad_client_path_is_a_request_error() -> None:
    with pytest.raises(RequestError):
        build_decode_request({}, client_path=None, params=DecodeParams())  # type: ignore[arg-type]


# ---- properties ----

_ALL_PARAMS = st.sampled_from(
    [
        DecodeParams(),
        TEXT,
        DERENDER,
        DecodeParams(use_openai_format=False, trust_client_transfer_params=True),
        DecodeParams(use_openai_format=False, kv_transfer_placement=KvTransferPlacement.EXTRA_ARGS),
    ]
)


# The keys the strategies put in client transfer params (the router's never use them here).
_CLIENT_TRANSFER_KEYS = frozenset({"remote_host", "remote_port"})


def placed_transfer_keys(body: dict[str, Any]) -> set[str]:
    """Keys of every transfer-params object a leg carries: top level, extra_args, vllm_xargs.

    Only these places steer a worker; a client's unrelated field that merely mentions
    "remote_host" is its own business and passes through.
    """
    sampling = body.get("sampling_params")
    holders = [
        body,
        body.get("vllm_xargs"),
        sampling.get("extra_args") if isinstance(sampling, dict) else None,
    ]
    keys: set[str] = set()
    for holder in holders:
        if isinstance(holder, dict):
            for name in ("kv_transfer_params", "ec_transfer_params"):
                params = holder.get(name)
                if isinstance(params, dict):
                    keys.update(params)
    return keys


@given(client_request_bodies, client_paths, _ALL_PARAMS, st.booleans())
def test_decode_builder_returns_a_leg_or_a_request_error(
    body: dict[str, Any], path: str, params: DecodeParams, with_tokens: bool
) -> None:
    before = copy.deepcopy(body)
    try:
        leg = decode(body, path=path, params=params, token_ids=TOKENS if with_tokens else None)
    except RequestError as error:
        assert error.param is not None
        assert body == before
        return
    assert body == before
    if leg.route is Route.GENERATE:
        assert_generate_request(leg.body, passthrough=body if path == GENERATE else ())
    else:
        untouched = {
            "kv_transfer_params",
            "ec_transfer_params",
            "vllm_xargs",
            "sampling_params",
            "prompt",
        }
        for key, value in body.items():
            if key not in untouched:
                assert leg.body[key] == value
    if not params.trust_client_transfer_params:
        assert not _CLIENT_TRANSFER_KEYS & placed_transfer_keys(leg.body)


@given(client_request_bodies, client_paths, st.booleans(), st.booleans())
def test_prefill_and_encode_return_a_leg_or_a_request_error(
    body: dict[str, Any], path: str, use_openai: bool, trusted: bool
) -> None:
    before = copy.deepcopy(body)
    for build in (build_prefill_request, build_encode_request):
        params_cls = PrefillParams if build is build_prefill_request else EncodeParams
        params = params_cls(use_openai_format=use_openai, trust_client_transfer_params=trusted)
        try:
            leg = build(body, client_path=path, params=params, inputs=LegInputs(token_ids=TOKENS))  # type: ignore[arg-type]
        except RequestError:
            continue
        assert body == before
        assert leg.body["stream"] is False
        if leg.route is Route.GENERATE:
            assert leg.body["sampling_params"]["max_tokens"] == 1
            assert_generate_request(leg.body, passthrough=body if path == GENERATE else ())
        if not trusted:
            assert not _CLIENT_TRANSFER_KEYS & placed_transfer_keys(leg.body)


# ---- Responses and Messages clients end to end ----

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}}


def responses_client(**fields: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "input": "Weather in Paris?",
        "max_output_tokens": 300,
        "temperature": 0.2,
        "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER}],
        "text": {"format": {"type": "json_schema", "name": "w", "schema": WEATHER}},
        **fields,
    }


def messages_client(**fields: Any) -> dict[str, Any]:
    return {
        "model": "claude",
        "max_tokens": 256,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "stop_sequences": ["\n\nHuman:"],
        "top_k": 20,
        "tools": [{"name": "get_weather", "input_schema": WEATHER}],
        "tool_choice": {"type": "any"},
        **fields,
    }


def test_responses_client_decode_leg_over_generate() -> None:
    body = responses_client(stream=True)
    before = copy.deepcopy(body)
    leg = decode(body, path=RESPONSES, params=DERENDER, kv_transfer_params=ROUTER_KV)
    assert body == before
    assert leg.body["sampling_params"] == {
        "temperature": 0.2,
        "structured_outputs": {"json": WEATHER},
        "max_tokens": 300,
        "extra_args": {"kv_transfer_params": ROUTER_KV},
    }
    assert leg.body["parse_context"] == {
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}],
        "tool_choice": "auto",
    }
    assert leg.body["stream"] is False
    assert leg.single_frame is True
    assert leg.wrap_chat_completion is False
    assert leg.dropped == ("input",)
    assert_generate_request(leg.body)


def test_responses_client_text_mode_reports_the_tools_dropped() -> None:
    leg = decode(responses_client(tool_choice="none"), path=RESPONSES)
    assert "parse_context" not in leg.body
    assert leg.dropped == ("input", "tools", "tool_choice")


def test_messages_client_decode_leg_over_generate() -> None:
    leg = decode(messages_client(), path=MESSAGES, params=DERENDER)
    assert leg.body["sampling_params"] == {
        "top_k": 20,
        "stop": ["\n\nHuman:"],
        "max_tokens": 256,
    }
    assert leg.body["parse_context"] == {
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}],
        "tool_choice": "required",
    }
    assert leg.body["model"] == "claude"
    assert leg.dropped == ("system", "messages")
    assert "max_tokens" not in leg.body
    assert_generate_request(leg.body)


@pytest.mark.parametrize(
    ("body", "path", "param"),
    [
        (responses_client(previous_response_id="resp_1"), RESPONSES, "$.previous_response_id"),
        (responses_client(tools=[{"type": "web_search"}]), RESPONSES, "$.tools[0].type"),
        ({"model": "claude", "messages": []}, MESSAGES, "$.max_tokens"),
        (messages_client(temperature="hot"), MESSAGES, "$.temperature"),
    ],
)
def test_responses_and_messages_refusals_through_every_builder(
    body: dict[str, Any], path: str, param: str
) -> None:
    for build, params in (
        (build_decode_request, TEXT),
        (build_prefill_request, PrefillParams(use_openai_format=False)),
        (build_encode_request, EncodeParams(use_openai_format=False)),
    ):
        with pytest.raises(RequestError) as caught:
            build(body, client_path=path, params=params, inputs=LegInputs(token_ids=TOKENS))  # type: ignore[arg-type]
        assert caught.value.param == param
        assert param in caught.value.message


def test_responses_prefill_caps_max_output_tokens_on_both_routes() -> None:
    body = responses_client(stream=True)
    openai = build_prefill_request(body, client_path=RESPONSES, params=PrefillParams())
    assert openai.body["max_output_tokens"] == 1
    assert "max_tokens" not in openai.body
    assert openai.body["text"] == body["text"]
    generate = build_prefill_request(
        body,
        client_path=RESPONSES,
        params=PrefillParams(use_openai_format=False),
        inputs=LegInputs(token_ids=TOKENS),
    )
    sampling = generate.body["sampling_params"]
    assert sampling["max_tokens"] == 1
    assert sampling["temperature"] == 0.2
    assert sampling["structured_outputs"] == {"json": WEATHER}
    assert "max_output_tokens" not in generate.body
    assert "parse_context" not in generate.body
    assert_generate_request(generate.body)


def test_messages_prefill_and_encode_over_generate() -> None:
    for build, params in (
        (build_prefill_request, PrefillParams(use_openai_format=False)),
        (build_encode_request, EncodeParams(use_openai_format=False)),
    ):
        leg = build(
            messages_client(),
            client_path=MESSAGES,
            params=params,  # type: ignore[arg-type]
            inputs=LegInputs(token_ids=TOKENS),
        )
        assert leg.body["sampling_params"]["max_tokens"] == 1
        assert leg.body["sampling_params"]["stop"] == ["\n\nHuman:"]
        assert_generate_request(leg.body)


@given(client_route_bodies, _ALL_PARAMS, st.booleans())
def test_every_client_route_body_gives_a_decode_leg_or_a_request_error(
    route_body: tuple[str, dict[str, Any]], params: DecodeParams, trusted: bool
) -> None:
    path, body = route_body
    params = msgspec.structs.replace(params, trust_client_transfer_params=trusted)
    before = copy.deepcopy(body)
    try:
        leg = decode(body, path=path, params=params, kv_transfer_params={"router": 1})
    except RequestError as error:
        assert error.param is not None
        assert error.param.startswith("$")
        assert body == before
        return
    assert body == before
    if leg.route is Route.GENERATE:
        assert_generate_request(leg.body)
        # Dropped: the client's own keys, or the path of a transfer param it nested.
        for key in leg.dropped:
            assert key in body or key.endswith(("kv_transfer_params", "ec_transfer_params"))
    if not trusted:
        assert not _CLIENT_TRANSFER_KEYS & placed_transfer_keys(leg.body)


@given(client_route_bodies, st.booleans(), st.booleans())
def test_every_client_route_body_gives_single_token_legs_or_a_request_error(
    route_body: tuple[str, dict[str, Any]], use_openai: bool, trusted: bool
) -> None:
    path, body = route_body
    before = copy.deepcopy(body)
    for build, params_cls in (
        (build_prefill_request, PrefillParams),
        (build_encode_request, EncodeParams),
    ):
        params = params_cls(use_openai_format=use_openai, trust_client_transfer_params=trusted)
        try:
            leg = build(body, client_path=path, params=params, inputs=LegInputs(token_ids=TOKENS))  # type: ignore[arg-type]
        except RequestError as error:
            assert error.param is not None
            continue
        assert body == before
        if leg.route is Route.GENERATE:
            assert leg.body["sampling_params"]["max_tokens"] == 1
            assert_generate_request(leg.body)
        if not trusted:
            assert not _CLIENT_TRANSFER_KEYS & placed_transfer_keys(leg.body)
    assert body == before


@pytest.mark.parametrize(
    ("path", "body"),
    [(CHAT, chat()), (RESPONSES, {"input": "hi"}), (MESSAGES, {"max_tokens": 5, "messages": []})],
)
def test_derender_leg_always_has_a_parse_context(path: str, body: dict[str, Any]) -> None:
    # vLLM refuses derender without parse_context on a server with a tool or reasoning parser.
    assert decode(body, path=path, params=DERENDER).body["parse_context"] == {}
    assert "parse_context" not in decode(body, path=path).body


# ---- the common generate leg: built without the general rules, the same leg ----

# A token-route decode step with any mode, trust and placement, for the properties below.
token_route_decode_params = st.builds(
    partial(DecodeParams, use_openai_format=False),
    output_mode=st.sampled_from([OutputMode.TEXT, OutputMode.DERENDER, OutputMode.AUTO]),
    trust_client_transfer_params=st.booleans(),
    kv_transfer_placement=st.sampled_from(list(KvTransferPlacement)),
)


@given(
    body=generate_request_bodies,
    inputs=router_decode_inputs,
    params=token_route_decode_params,
)
def test_the_common_generate_leg_is_the_general_one(
    body: dict[str, Any], inputs: LegInputs, params: DecodeParams
) -> None:
    # The common generate client's leg skips the general rules: the same leg (same bytes, key
    # order, mode, stream, dropped) or the same error, or None (then the general rules build it).
    kind, client = outcome(
        lambda: read_client_request(body, GENERATE, limits=inputs.limits, steps=(params,))
    )
    if kind != "ok":
        return
    fast = outcome(lambda: legs._common_generate(client, params, inputs))
    event("the common leg" if fast[0] != "ok" or fast[1] is not None else "the general rules")
    if fast == ("ok", None):
        return
    general = outcome(
        lambda: legs._decode_generate(
            client,
            params,
            legs._generate_core(legs._step_request(client, params, inputs)),
            legs._router_object(inputs.parse_context, "parse_context"),
        )
    )
    assert fast[0] == general[0]
    if fast[0] != "ok":
        assert fast == general
        return
    (leg, *rest), (general_leg, *general_rest) = fast[1], general[1]
    assert encode(leg) == encode(general_leg)
    assert rest == general_rest


_SERIALISED_SAMPLING = {
    "presence_penalty": 0.0,
    "temperature": 0.7,
    "seed": 7,
    "stop": [],
    "stop_token_ids": [],
    "output_kind": 2,
    "skip_clone": True,
    "bad_words": [],
}
# A GenerateRequest as vLLM 0.33 serialises it: every member, most of them null.
_SERIALISED_GENERATE = {
    "request_id": "chatcmpl-1",
    "token_ids": TOKENS,
    **dict.fromkeys(["token_offsets", "features", "content_parts"]),
    "sampling_params": _SERIALISED_SAMPLING,
    "model": "m",
    "max_tokens": 256,
    **dict.fromkeys(["reasoning_ended", "reasoning_parser_kwargs", "return_token_ids"]),
    "output_mode": "text",
    "parse_context": None,
    "stream": False,
    "stream_options": None,
    "cache_salt": "tenant-a",
    "priority": 0,
    **dict.fromkeys(["kv_transfer_params", "ec_transfer_params"]),
}


@pytest.mark.parametrize(
    "inputs", [LegInputs(), LegInputs(request_id="r", kv_transfer_params=ROUTER_KV)]
)
def test_vllm_s_own_generate_body_takes_the_common_leg(inputs: LegInputs) -> None:
    client = read_client_request(
        _SERIALISED_GENERATE, GENERATE, limits=inputs.limits, steps=(TEXT,)
    )
    assert legs._common_generate(client, TEXT, inputs) is not None


@given(
    pair=render_client_bodies,
    answer=render_answers,
    inputs=router_decode_inputs,
    params=token_route_decode_params,
)
def test_the_common_render_core_is_the_general_one(
    pair: tuple[str, dict[str, Any]],
    answer: dict[str, Any],
    inputs: LegInputs,
    params: DecodeParams,
) -> None:
    # A render answer of the common shape skips the general rules' core: the same body (bytes,
    # key order), mapping and transfer params, or the same error, or None (the general core).
    path, body = pair
    kind, client = outcome(
        lambda: read_client_request(body, path, limits=inputs.limits, steps=(params,))
    )
    if kind != "ok":
        return
    request = legs._step_request(client, params, msgspec.structs.replace(inputs, rendered=answer))
    fast = outcome(lambda: legs._common_render_core(request))
    event("the common core" if fast[0] != "ok" or fast[1] is not None else "the general core")
    if fast == ("ok", None):
        return
    general = outcome(lambda: legs._generate_core(request))
    assert fast[0] == general[0]
    if fast[0] != "ok":
        assert fast == general
        return
    core, general_core = fast[1], general[1]
    assert encode(core.body) == encode(general_core.body)
    assert (core.mapping, core.transfer) == (general_core.mapping, general_core.transfer)


def _general_read(data: bytes) -> RawMembers:
    """The render answer read as any body is (the exchange's read before the view)."""
    return RawMembers(data, UpstreamContractError, "the render answer", token_ids_key=w.TOKEN_IDS)


_REAL_ANSWERS = [
    (FIXTURES / "vllm-0.32-real" / "render-chat-response.json").read_bytes(),
    *(
        msgspec.json.encode(load_fixture(f"render-{api}-response.json"))
        for api in ("chat", "messages")
    ),
]


@pytest.mark.parametrize("data", _REAL_ANSWERS)
def test_vllm_s_render_answers_are_read_through_the_view(data: bytes) -> None:
    # The answers of vLLM 0.32 (captured) and 0.33 (its classes): the leg is written from the
    # answer's raw members, never decoded into a mapping, and is the general rules' leg.
    answer = RenderAnswer(data)
    assert answer.view is not None
    inputs = LegInputs(rendered=answer)
    client = b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":8}'
    viewed = build_decode_request_bytes(client, client_path=CHAT, params=TEXT, inputs=inputs)
    assert answer._decoded is None
    general = _general_read(data)
    inputs = LegInputs(rendered=general)
    assert viewed == build_decode_request_bytes(
        client, client_path=CHAT, params=TEXT, inputs=inputs
    )


def test_a_viewed_leg_writes_what_it_carried_from_the_client_as_sent() -> None:
    # The bytes leg looks for the client's own bytes only under the keys a rule carried: a
    # carried model and chat's own stream_options keep the client's spelling; with nothing
    # carried, every member is render's.
    answer = json.loads(_REAL_ANSWERS[0])
    answer["model"] = None
    data = msgspec.json.encode(answer)
    client = (
        b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":8,"model":"m" ,'
        b'"stream":true,"stream_options":{"include_usage" : true}}'
    )
    rendered = RenderAnswer(data)
    assert rendered.view is not None
    inputs = LegInputs(rendered=rendered)
    leg = build_decode_request_bytes(client, client_path=CHAT, params=TEXT, inputs=inputs)
    assert rendered._decoded is None  # written from the view
    assert b'"model":"m",' in leg.body
    assert leg.body.endswith(b',"stream_options":{"include_usage" : true}}')
    general = LegInputs(rendered=_general_read(data))
    slow = build_decode_request_bytes(client, client_path=CHAT, params=TEXT, inputs=general)
    assert leg == slow
    unstreamed = client.replace(b'"stream":true', b'"stream":false')
    leg = build_decode_request_bytes(unstreamed, client_path=CHAT, params=TEXT, inputs=inputs)
    slow = build_decode_request_bytes(unstreamed, client_path=CHAT, params=TEXT, inputs=general)
    assert leg == slow
    assert b"stream_options" not in leg.body


def test_a_viewed_leg_checks_the_stream_options_it_carries() -> None:
    # The client's stream_options on a streamed leg is a member a rule wrote: the viewed leg
    # checks it as the general rules check the leg, the same error at the same path.
    client = (
        b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":8,'
        b'"stream":true,"stream_options":{"include_usage":"yes"}}'
    )
    rendered = RenderAnswer(_REAL_ANSWERS[0])
    assert rendered.view is not None
    viewed = _attempt(
        lambda: build_decode_request_bytes(
            client, client_path=CHAT, params=TEXT, inputs=LegInputs(rendered=rendered)
        )
    )
    general = LegInputs(rendered=_general_read(_REAL_ANSWERS[0]))
    assert viewed == _attempt(
        lambda: build_decode_request_bytes(client, client_path=CHAT, params=TEXT, inputs=general)
    )
    assert viewed[0] == "RequestError"
    assert viewed[1][0] == "$.stream_options.include_usage"


def _attempt(call: Any) -> tuple[str, Any]:
    """``("ok", result)``, or the library error ``call`` raised: its class, param and message."""
    try:
        return "ok", call()
    except DisaggTransformError as error:
        return type(error).__name__, (error.param, str(error))


def _in_order(data: bytes) -> str:
    """A JSON document's value with its keys in their order, written one way."""
    return json.dumps(json.loads(data))


@given(
    pair=render_client_bodies | parse_context_bodies,
    answer=vllm_render_answers,
    inputs=router_decode_inputs,
    params=token_route_decode_params,
)
def test_the_viewed_render_leg_is_the_general_one(
    pair: tuple[str, dict[str, Any]],
    answer: tuple[bytes, bool],
    inputs: LegInputs,
    params: DecodeParams,
) -> None:
    # A render answer read through its view reads as the general read (the same members or the
    # same error), and the bytes leg built on it is the general rules' (every field, the body's
    # bytes and key order) or the same error. An answer spelt otherwise than compactly keeps its
    # own spelling where the leg passes a member on: the same JSON, in the same key order.
    data, compact = answer
    viewed = _attempt(lambda: RenderAnswer(data))
    general = _attempt(lambda: _general_read(data))
    assert viewed[0] == general[0]
    if viewed[0] != "ok":
        assert viewed == general
        return
    assert encode(dict(viewed[1])) == encode(dict(general[1]))
    path, body = pair
    try:
        client = msgspec.json.encode(body)
    except (TypeError, OverflowError):
        return  # not a JSON body: never handed in as bytes

    def leg(rendered: Any) -> DecodeLegBytes:
        given = msgspec.structs.replace(inputs, rendered=rendered)
        return build_decode_request_bytes(client, client_path=path, params=params, inputs=given)

    fresh = RenderAnswer(data)  # not yet read as a mapping, as the exchange hands it in
    fast, slow = _attempt(lambda: leg(fresh)), _attempt(lambda: leg(general[1]))
    # The general rules read the answer as a mapping; the viewed leg never decodes it.
    taken = fresh.view is not None and fresh._decoded is None and fast[0] == "ok"
    event("the viewed leg" if taken else "the general rules")
    assert fast[0] == slow[0]
    if fast[0] != "ok" or compact:
        assert fast == slow
        return
    fast_leg, slow_leg = fast[1], slow[1]
    unwritten = partial(msgspec.structs.replace, body=b"")
    assert unwritten(fast_leg) == unwritten(slow_leg)
    assert _in_order(fast_leg.body) == _in_order(slow_leg.body)


@given(
    pair=client_view_bodies,
    mode=st.sampled_from([OutputMode.TEXT, OutputMode.DERENDER, OutputMode.AUTO]),
)
def test_each_client_view_reads_what_its_mapper_reads(
    pair: tuple[str, Any], mode: OutputMode
) -> None:
    # An API's view gives its mapper's mapping and the caps exactly (repr: an int stays an int),
    # or None; the request read through it is the one read without it, or the same error.
    path, body = pair
    route = detect_route(path)
    # Read only within the limits, as read_client_request reads it (deeper bodies are refused).
    view = client_module._VIEWS.get(route)  # completions has none: the same read either way
    within = isinstance(body, dict) and outcome(lambda: check_client_body(body, DEFAULT_LIMITS))
    viewed = outcome(lambda: view(body)) if view and within == ("ok", None) else None
    event("the view" if viewed not in (None, ("ok", None)) else "the mapper")
    if viewed not in (None, ("ok", None)):
        mapper = client_module.CLIENT_MAPPERS[route]
        assert mapper is not None
        general = outcome(lambda: (mapper(body), client_caps(body, route)))
        assert repr(viewed) == repr(general)
    params = DecodeParams(use_openai_format=False, output_mode=mode)

    def read() -> tuple[str, Any]:
        return outcome(
            lambda: read_client_request(
                body, path, limits=DEFAULT_LIMITS, steps=(PrefillParams(), params)
            )
        )

    with mock.patch.dict(client_module._VIEWS, clear=True):
        without = read()
    assert repr(read()) == repr(without)


@given(
    pair=parse_context_bodies,
    mode=st.sampled_from([OutputMode.DERENDER, OutputMode.AUTO]),
)
def test_a_json_body_s_parse_context_is_of_the_leg_check_s_types(
    pair: tuple[str, Any], mode: OutputMode
) -> None:
    # Why a viewed leg on a JSON body does not check the parse_context its mapper built: read
    # from bytes, every body the read accepts gives one the leg check (GenerateRequest's
    # ParseContext) accepts too.
    path, body = pair
    try:
        data = msgspec.json.encode(body)
    except (TypeError, ValueError, OverflowError, RecursionError):
        return  # no JSON body (a lone surrogate, too deep...): never handed in as bytes
    params = DecodeParams(use_openai_format=False, output_mode=mode)
    read = outcome(
        lambda: read_client_request(
            RawMembers(data, RequestError, "the client body", token_ids_key=w.TOKEN_IDS),
            path,
            limits=DEFAULT_LIMITS,
            steps=(params,),
        )
    )
    context = None if read[0] != "ok" or read[1].mapping is None else read[1].mapping.parse_context
    event("refused" if read[0] != "ok" else "a parse_context" if context else "none")
    if context is not None:
        msgspec.convert(context, ParseContext)


def test_a_mapping_body_s_parse_context_is_still_checked_on_a_viewed_leg() -> None:
    # Only a JSON body's parse_context goes unchecked: a mapping's may hold what JSON cannot (a
    # key that is no string), and the viewed leg refuses it as the general rules do.
    answer = load_fixture("render-chat-response.json")
    answer["parse_context"] = None  # vLLM 0.33's common answer: the leg writes the client's
    data = msgspec.json.encode(answer)
    tool = {"type": "function", "function": {"name": "f"}, 1: 2}
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "tools": [tool]}
    params = DecodeParams(use_openai_format=False, output_mode=OutputMode.DERENDER)
    viewed = RenderAnswer(data)
    assert viewed.view is not None
    for rendered in (viewed, RenderAnswer(data).members()):
        with pytest.raises(RequestError, match=r"\$\.parse_context\.tools\[0\]"):
            build_decode_request(body, client_path=CHAT, params=params, rendered=rendered)
    assert viewed._decoded is None  # the viewed leg refused it, not the general rules

"""Which value a leg keeps when two sources give one (``docs/request-legs.md``)."""

from __future__ import annotations

from typing import Any

import pytest

from disagg_transforms import (
    DecodeParams,
    LegInputs,
    OutputMode,
    PrefillParams,
    RequestError,
    build_decode_request,
    build_prefill_request,
)
from disagg_transforms._request.messages import map_messages_request

CHAT = "/v1/chat/completions"
GENERATE = "/inference/v1/generate"
TOKENS = [11, 12, 13, 14]
TEXT = DecodeParams(use_openai_format=False)


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "client-model", "messages": [{"role": "user", "content": "hi"}], **fields}


def test_prefill_flags_win_over_the_router_and_the_client() -> None:
    # "Transfer params": the prefill flags are the last layer, over the router's and the client's.
    body = chat(kv_transfer_params={"do_remote_decode": False, "mine": 1})
    router = {"do_remote_decode": False, "do_remote_prefill": True, "remote_host": "h"}
    for use_openai in (True, False):
        params = PrefillParams(use_openai_format=use_openai, trust_client_transfer_params=True)
        leg = build_prefill_request(
            body,
            client_path=CHAT,
            params=params,
            inputs=LegInputs(token_ids=TOKENS, kv_transfer_params=router),
        )
        assert leg.body["kv_transfer_params"] == {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "mine": 1,
            "remote_host": "h",
        }


def test_a_trusted_client_top_level_transfer_param_is_preferred_over_a_nested_one() -> None:
    body = {
        "token_ids": TOKENS,
        "kv_transfer_params": {"from": "top"},
        "sampling_params": {"extra_args": {"kv_transfer_params": {"from": "extra_args"}}},
        "vllm_xargs": {"kv_transfer_params": {"from": "vllm_xargs"}},
    }
    params = DecodeParams(use_openai_format=False, trust_client_transfer_params=True)
    leg = build_decode_request(body, client_path=GENERATE, params=params)
    assert leg.body["kv_transfer_params"] == {"from": "top"}
    nested = {k: v for k, v in body.items() if k != "kv_transfer_params"}
    leg = build_decode_request(nested, client_path=GENERATE, params=params)
    assert leg.body["kv_transfer_params"] == {"from": "extra_args"}


def test_render_answer_keeps_its_model_and_the_client_request_id_overrides_its_own() -> None:
    # "With a /render answer": render's model is kept; the client's request_id, then the
    # router's, override render's.
    rendered = {"request_id": "render-id", "token_ids": TOKENS, "model": "render-model"}
    body = chat(request_id="client-id")
    leg = build_decode_request(body, client_path=CHAT, params=TEXT, rendered=rendered)
    assert (leg.body["model"], leg.body["request_id"]) == ("render-model", "client-id")
    leg = build_decode_request(
        body, client_path=CHAT, params=TEXT, rendered=rendered, request_id="router-id"
    )
    assert leg.body["request_id"] == "router-id"


def test_router_parse_context_wins_over_a_generate_client_own() -> None:
    body = {"token_ids": TOKENS, "parse_context": {"tools": [], "mine": True}}
    params = DecodeParams(use_openai_format=False, output_mode=OutputMode.DERENDER)
    router = {"chat_template_kwargs": {"enable_thinking": False}}
    leg = build_decode_request(body, client_path=GENERATE, params=params, parse_context=router)
    assert leg.body["parse_context"] == router
    leg = build_decode_request(body, client_path=GENERATE, params=params)
    assert leg.body["parse_context"] == body["parse_context"]


def test_a_generate_client_own_features_are_checked_and_kept() -> None:
    def features(offset: int) -> dict[str, Any]:
        return {
            "mm_hashes": {"image": ["h"]},
            "mm_placeholders": {"image": [{"offset": offset, "length": 2}]},
            "kwargs_data": {"image": [None]},
        }

    own, router = features(0), features(1)
    body = {"token_ids": TOKENS, "features": own}
    leg = build_decode_request(body, client_path=GENERATE, params=TEXT)
    assert leg.body["features"] == own
    leg = build_decode_request(body, client_path=GENERATE, params=TEXT, features=router)
    assert leg.body["features"] == router
    # Past the prompt's end: a generate client's own features are checked like the router's.
    past_the_end = {"token_ids": TOKENS, "features": features(len(TOKENS))}
    with pytest.raises(RequestError) as caught:
        build_decode_request(past_the_end, client_path=GENERATE, params=TEXT)
    assert caught.value.param is not None
    assert caught.value.param.startswith("$.features.mm_placeholders")


def test_messages_client_chat_template_kwargs_win_over_output_config_effort() -> None:
    body = {
        "max_tokens": 5,
        "output_config": {"effort": "high"},
        "chat_template_kwargs": {"reasoning_effort": "low", "enable_thinking": True},
    }
    mapping = map_messages_request(body)
    assert mapping.parse_context == {
        "chat_template_kwargs": {"reasoning_effort": "low", "enable_thinking": True}
    }
    alone = map_messages_request({"max_tokens": 5, "output_config": {"effort": "high"}})
    assert alone.parse_context == {"chat_template_kwargs": {"reasoning_effort": "high"}}


def test_messages_tool_defer_loading_reaches_the_chat_tool() -> None:
    tool = {"name": "w", "input_schema": {"type": "object"}, "defer_loading": True}
    mapping = map_messages_request({"max_tokens": 5, "tools": [tool]})
    assert mapping.parse_context is not None
    function = mapping.parse_context["tools"][0]["function"]
    assert function == {"name": "w", "parameters": {"type": "object"}, "defer_loading": True}

from __future__ import annotations

import contextlib
import copy
import json
from typing import Any

import pytest
from golden import RESPONSE_FIXTURES, load_fixture
from hypothesis import given
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion
from strategies import (
    GENERATE_ONLY_CHOICE_KEYS,
    GENERATE_ONLY_TOP_KEYS,
    generate_responses,
    json_values,
)

from disagg_transforms import (
    ConfigError,
    EnvelopeOptions,
    OutputMode,
    RequestError,
    UpstreamContractError,
    wrap_chat_completion,
    wrap_chat_completion_bytes,
)


def _assert_no_generate_only_key(wrapped: dict[str, Any]) -> None:
    # No worker value reaches the client: vLLM's own chat writes some of these keys null, and
    # so does the wrap; the transfer params and the generate bookkeeping are never written.
    assert not {"request_id", "output_mode", "kv_transfer_params", "ec_transfer_params"} & set(
        wrapped
    )
    assert all(wrapped.get(key) is None for key in GENERATE_ONLY_TOP_KEYS)
    for choice in wrapped["choices"]:
        assert all(choice.get(key) is None for key in GENERATE_ONLY_CHOICE_KEYS)


@pytest.mark.parametrize(("name", "mode"), RESPONSE_FIXTURES)
def test_golden_wrap_validates_and_drops_generate_only_fields(name: str, mode: OutputMode) -> None:
    response = load_fixture(name)
    before = copy.deepcopy(response)
    wrapped = wrap_chat_completion(response, requested=mode)
    assert response == before
    _assert_no_generate_only_key(wrapped)
    parsed = ChatCompletion.model_validate(wrapped)
    assert parsed.id == "chatcmpl-abc123"
    assert parsed.object == "chat.completion"
    assert parsed.usage is not None
    assert parsed.usage.total_tokens == 16


def test_text_parity_with_coupled_chat() -> None:
    response = load_fixture("response-text.json")
    response["choices"] = response["choices"][:1]
    wrapped = wrap_chat_completion(response, requested=OutputMode.TEXT)
    coupled = load_fixture("chat-completion-coupled.json")
    ours = ChatCompletion.model_validate(wrapped).model_dump(exclude_none=True)
    theirs = ChatCompletion.model_validate(coupled).model_dump(exclude_none=True)
    assert ours == theirs


def test_derender_message_moves_whole() -> None:
    response = load_fixture("response-derender-tool-call.json")
    response["choices"][0]["message"]["x_parser_note"] = {"kept": True}
    wrapped = wrap_chat_completion(response, requested=OutputMode.DERENDER)
    assert wrapped["choices"][0]["message"] == response["choices"][0]["message"]
    parsed = ChatCompletion.model_validate(wrapped)
    message = parsed.choices[0].message
    assert message.tool_calls is not None
    assert message.tool_calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert wrapped["choices"][0]["message"]["reasoning"] == "User wants weather."
    assert parsed.choices[0].finish_reason == "tool_calls"


def test_reasoning_content_option() -> None:
    response = load_fixture("response-derender-text.json")
    plain = wrap_chat_completion(response, requested=OutputMode.DERENDER)
    assert "reasoning_content" not in plain["choices"][0]["message"]
    exposed = wrap_chat_completion(
        response, requested=OutputMode.DERENDER, options=EnvelopeOptions(reasoning_content=True)
    )
    message = exposed["choices"][0]["message"]
    assert message["reasoning_content"] == message["reasoning"] == "Checked."
    assert "reasoning_content" not in response["choices"][0]["message"]


@pytest.mark.parametrize(
    ("name", "original"),
    [
        ("response-text-finish-abort.json", "abort"),
        ("response-text-finish-repetition.json", "repetition"),
    ],
)
def test_finish_reasons_the_sdk_rejects_are_mapped(name: str, original: str) -> None:
    wrapped = wrap_chat_completion(load_fixture(name), requested=OutputMode.TEXT)
    choice = wrapped["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["vllm_finish_reason"] == original
    passed = wrap_chat_completion(
        load_fixture(name),
        requested=OutputMode.TEXT,
        options=EnvelopeOptions(vllm_finish_reasons=True),
    )
    assert passed["choices"][0]["finish_reason"] == original
    assert "vllm_finish_reason" not in passed["choices"][0]


@pytest.mark.parametrize("reason", ["stop", "length", "tool_calls"])
def test_finish_reasons_the_sdk_accepts_pass(reason: str) -> None:
    response = load_fixture("response-text.json")
    response["choices"][0]["finish_reason"] = reason
    choice = wrap_chat_completion(response, requested=OutputMode.TEXT)["choices"][0]
    assert choice["finish_reason"] == reason
    assert "vllm_finish_reason" not in choice


def test_null_finish_reason_becomes_stop() -> None:
    response = load_fixture("response-text.json")
    response["choices"][0]["finish_reason"] = None
    choice = wrap_chat_completion(response, requested=OutputMode.TEXT)["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["vllm_finish_reason"] is None


@pytest.mark.parametrize(("top", "kept"), [(None, 0), (1, 1), (2, 2), (-1, 3), (9, 3)])
def test_text_logprobs_cut_to_client_top_logprobs(top: int | None, kept: int) -> None:
    response = load_fixture("response-text-logprobs.json")
    client = {"model": "m", "logprobs": True, "top_logprobs": top}
    wrapped = wrap_chat_completion(response, requested=OutputMode.TEXT, client_body=client)
    entry = wrapped["choices"][0]["logprobs"]["content"][0]
    assert [t["token"] for t in entry["top_logprobs"]] == ["Hello", "Hi", "Hey"][:kept]
    assert len(response["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 3
    ChatCompletion.model_validate(wrapped)


def test_no_client_body_keeps_every_top_logprob() -> None:
    wrapped = wrap_chat_completion(
        load_fixture("response-text-logprobs.json"), requested=OutputMode.TEXT
    )
    assert len(wrapped["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 3


@pytest.mark.parametrize("top", [True, "2", -2, 1.5])
def test_bad_client_top_logprobs_is_a_request_error(top: object) -> None:
    with pytest.raises(RequestError) as caught:
        wrap_chat_completion(
            load_fixture("response-text-logprobs.json"),
            requested=OutputMode.TEXT,
            client_body={"top_logprobs": top},
        )
    assert caught.value.param == "$.top_logprobs"


def test_choices_in_index_order() -> None:
    response = load_fixture("response-text.json")
    response["choices"].reverse()
    wrapped = wrap_chat_completion(response, requested=OutputMode.TEXT)
    assert [c["index"] for c in wrapped["choices"]] == [0, 1]
    assert wrapped["choices"][0]["message"]["content"] == "Hello!"


@pytest.mark.parametrize(
    ("request_id", "expected"),
    [
        ("generate-tokens-chatcmpl-x", "chatcmpl-x"),
        ("generate-tokens-r1", "chatcmpl-r1"),
        ("chatcmpl-y", "chatcmpl-y"),
        ("plain", "chatcmpl-plain"),
    ],
)
def test_id(request_id: str, expected: str) -> None:
    response = {**load_fixture("response-text.json"), "request_id": request_id}
    assert wrap_chat_completion(response, requested=OutputMode.TEXT)["id"] == expected


def test_created_and_model_fallbacks() -> None:
    response = {**load_fixture("response-text.json"), "created": None, "model": None}
    client = {"model": "client-model"}
    wrapped = wrap_chat_completion(
        response,
        requested=OutputMode.TEXT,
        client_body=client,
        options=EnvelopeOptions(clock=lambda: 1234.9),
    )
    assert wrapped["created"] == 1234
    assert wrapped["model"] == "client-model"
    wrapped = wrap_chat_completion(
        response,
        requested=OutputMode.TEXT,
        client_body=client,
        options=EnvelopeOptions(model="arg", clock=lambda: 1.0),
    )
    assert wrapped["model"] == "arg"
    del response["model"]
    with pytest.raises(UpstreamContractError) as caught:
        wrap_chat_completion(
            response, requested=OutputMode.TEXT, options=EnvelopeOptions(clock=lambda: 1.0)
        )
    assert caught.value.param == "$.model"


def test_prompt_logprobs_kept_when_present() -> None:
    response = load_fixture("response-text.json")
    # Null when the worker sent none, as vLLM's chat writes it.
    assert wrap_chat_completion(response, requested=OutputMode.TEXT)["prompt_logprobs"] is None
    response["prompt_logprobs"] = [None, {"7": {"logprob": -1.0, "rank": 1}}]
    wrapped = wrap_chat_completion(response, requested=OutputMode.TEXT)
    assert wrapped["prompt_logprobs"] == response["prompt_logprobs"]


@pytest.mark.parametrize(
    ("response", "mode"),
    [
        (
            {k: v for k, v in load_fixture("response-text.json").items() if k != "output_mode"},
            "text",
        ),
        (load_fixture("response-tokens.json"), "text"),
        (load_fixture("response-text.json"), "derender"),
        (load_fixture("response-derender-text.json"), "text"),
    ],
)
def test_echo_mismatch_is_an_upstream_error(response: dict[str, Any], mode: str) -> None:
    with pytest.raises(UpstreamContractError) as caught:
        wrap_chat_completion(response, requested=OutputMode(mode))
    assert caught.value.status_hint == 502
    assert caught.value.param == "$.output_mode"


def test_tokens_requested_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as caught:
        wrap_chat_completion(load_fixture("response-tokens.json"), requested=OutputMode.TOKENS)
    assert "no text" in caught.value.message


@pytest.mark.parametrize(
    ("mutate", "param"),
    [
        (lambda r: r.__setitem__("choices", {}), "$.choices"),
        (lambda r: r["choices"][1].pop("text"), "$.choices[1].text"),
        (lambda r: r["choices"][0].__setitem__("text", 5), "$.choices[0].text"),
        (lambda r: r["choices"][0].__setitem__("index", "0"), "$.choices[0].index"),
        (lambda r: r.pop("request_id"), "$"),
        (lambda r: r.__setitem__("usage", "lots"), "$.usage"),
        (lambda r: r.__setitem__("created", "now"), "$.created"),
    ],
)
def test_malformed_response_names_the_path(mutate: Any, param: str) -> None:
    response = load_fixture("response-text.json")
    mutate(response)
    with pytest.raises(UpstreamContractError) as caught:
        wrap_chat_completion(response, requested=OutputMode.TEXT)
    assert caught.value.param == param


def test_contract_error_names_the_path_once() -> None:
    # A member read on its own (usage) is reported at its path under the response, and the
    # message names it once, in front, as every other contract error does.
    response = load_fixture("response-text.json")
    response["usage"] = {**response["usage"], "prompt_tokens": "many"}
    with pytest.raises(UpstreamContractError) as caught:
        wrap_chat_completion(response, requested=OutputMode.TEXT)
    assert caught.value.param == "$.usage.prompt_tokens"
    assert caught.value.message == (
        "$.usage.prompt_tokens: the generate response breaks the contract: "
        "Expected `int`, got `str`"
    )


def test_derender_choice_without_message() -> None:
    response = load_fixture("response-derender-text.json")
    del response["choices"][0]["message"]
    with pytest.raises(UpstreamContractError) as caught:
        wrap_chat_completion(response, requested=OutputMode.DERENDER)
    assert caught.value.param == "$.choices[0].message"


@given(
    st.sampled_from(["text", "derender"]).flatmap(
        lambda m: st.tuples(st.just(m), generate_responses(m))
    )
)
def test_any_valid_response_wraps_under_the_sdk(case: tuple[str, dict[str, Any]]) -> None:
    mode, response = case
    before = copy.deepcopy(response)
    wrapped = wrap_chat_completion(
        response,
        requested=OutputMode(mode),
        options=EnvelopeOptions(model="fallback", clock=lambda: 7.0),
    )
    assert response == before
    _assert_no_generate_only_key(wrapped)
    ChatCompletion.model_validate(wrapped)
    assert [c["index"] for c in wrapped["choices"]] == sorted(
        c["index"] for c in response["choices"]
    )
    if mode == "derender":
        by_index = {c["index"]: c["message"] for c in response["choices"]}
        for choice in wrapped["choices"]:
            assert choice["message"] == by_index[choice["index"]]


@given(
    json_values
    | st.dictionaries(
        st.sampled_from(["output_mode", "choices", "request_id", "model"]), json_values
    )
)
def test_any_json_gives_a_result_or_a_typed_error(value: Any) -> None:
    before = copy.deepcopy(value)
    with contextlib.suppress(UpstreamContractError):
        wrap_chat_completion(
            value, requested=OutputMode.TEXT, options=EnvelopeOptions(model="m", clock=lambda: 0.0)
        )
    assert value == before


def test_a_lone_surrogate_in_a_derender_message_is_a_contract_error() -> None:
    # A dict answer can hold a str no JSON encoder accepts; msgspec.convert then raises
    # UnicodeEncodeError, which must surface as ours (found by the hostile-response property).
    answer = load_fixture("response-derender-text.json")
    answer["choices"][0]["message"]["\ud800"] = 1
    with pytest.raises(UpstreamContractError) as caught:
        wrap_chat_completion(answer, requested=OutputMode.DERENDER)
    assert (caught.value.param or "").startswith("$.choices[0].message")


def test_the_completion_is_laid_out_as_vllms_chat_writes_it() -> None:
    # vLLM 0.33's ChatCompletionResponse, choice and ChatMessage in field order, nulls written;
    # kv_transfer_params and ec_transfer_params never (no client sees them).
    coupled = load_fixture("chat-completion-coupled.json")
    response = load_fixture("response-text.json")
    response["choices"] = response["choices"][:1]
    wrapped = wrap_chat_completion(response, requested=OutputMode.TEXT)
    transfer = {"kv_transfer_params", "ec_transfer_params"}
    assert list(wrapped) == [key for key in coupled if key not in transfer]
    assert list(wrapped["choices"][0]) == list(coupled["choices"][0])
    assert wrapped["choices"][0]["message"] == coupled["choices"][0]["message"]
    for key in ("service_tier", "system_fingerprint", "prompt_token_ids", "prompt_text"):
        assert wrapped[key] is None


def test_created_cache_tokens_is_an_integer_as_vllms_chat_writes_it() -> None:
    # The generate route writes null; vLLM's chat serving writes the count (no generate answer
    # has it: 0). Whole and bytes alike.
    response = load_fixture("response-text.json")
    details = {"cached_tokens": 32, "created_cache_tokens": None, "multimodal_tokens": None}
    response["usage"] = {**response["usage"], "prompt_tokens_details": details}
    wrapped = wrap_chat_completion(response, requested=OutputMode.TEXT)
    assert wrapped["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 32,
        "created_cache_tokens": 0,
        "multimodal_tokens": None,
    }
    assert response["usage"]["prompt_tokens_details"] is details  # the input is not modified
    assert details["created_cache_tokens"] is None
    raw = wrap_chat_completion_bytes(json.dumps(response).encode(), requested=OutputMode.TEXT)
    assert json.loads(raw) == wrapped

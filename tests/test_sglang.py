"""SGLang as an engine: the /generate legs, the answers read back, and SGLang's own contract.

Facts from docs/sglang.md and the fixtures of SGLang 0.5.23
(``tests/fixtures/sglang-0.5.23/``); docs/sglang.md is the user's page.
"""

from __future__ import annotations

import copy
import json
import pathlib
from typing import Any

import pytest
import sglang_contract
from hypothesis import given
from hypothesis import strategies as st
from strategies import client_route_bodies, sglang_cumulative_streams, sglang_logprob_triples

from disagg_transforms import OutputMode
from disagg_transforms._engines import ENGINES, Engine, Meeting
from disagg_transforms._exchange.reply import EngineRelay
from disagg_transforms._request.sglang import (
    ROOM_MAX,
    Rendezvous,
    build_sglang_openai_request,
    build_sglang_request,
    new_rendezvous,
    prefill_body,
    sglang_client_leg,
)
from disagg_transforms._response.dispatch import stream_converter, wrap_envelope
from disagg_transforms._response.sglang import (
    SglangFailure,
    SglangStreamReader,
    generate_answer,
    prompt_logprobs,
    sglang_error_message,
)
from disagg_transforms._routes import Route
from disagg_transforms.errors import RequestError, UpstreamContractError

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "sglang-0.5.23"
CHAT = "/v1/chat/completions"
RENDEZVOUS = Rendezvous(
    rid="0" * 32, bootstrap_host="10.0.3.17", bootstrap_port=8998, bootstrap_room=7
)
PROMPT = [1084, 1104, 1101]
_MAX_EVENT = 1 << 20


def _fixture(name: str) -> Any:
    return json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))["body"]


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}, *()], **fields}


def _leg(body: dict[str, Any], path: str = CHAT) -> dict[str, Any]:
    return build_sglang_request(
        body, client_path=path, rendezvous=RENDEZVOUS, token_ids=PROMPT
    ).body


# --- the legs ---------------------------------------------------------------------------------


def test_the_leg_has_only_sglang_names_and_the_rendezvous() -> None:
    body = _chat(
        max_tokens=5,
        temperature=0.5,
        top_k=0,
        seed=3,
        min_tokens=2,
        stop=["x"],
        logprobs=True,
        top_logprobs=2,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": {}}},
    )
    before = copy.deepcopy(body)
    assert _leg(body) == {
        "rid": "0" * 32,
        "input_ids": PROMPT,
        "stream": False,
        "return_logprob": True,
        "top_logprobs_num": 2,
        "logprob_start_len": -1,
        "return_text_in_logprobs": True,
        "sampling_params": {
            "temperature": 0.5,
            "top_k": -1,
            "sampling_seed": 3,
            "stop": ["x"],
            "json_schema": "{}",
            "max_new_tokens": 5,
            "min_new_tokens": 2,
        },
        "bootstrap_host": "10.0.3.17",
        "bootstrap_port": 8998,
        "bootstrap_room": 7,
    }
    assert body == before


def test_the_cap_is_always_sent() -> None:
    # SGLang's default is 128 tokens: an absent cap is null, SGLang's "up to the context".
    assert _leg(_chat())["sampling_params"] == {"max_new_tokens": None}
    messages = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}
    assert _leg(messages, "/v1/messages")["sampling_params"] == {"max_new_tokens": 9}
    responses = {"model": "m", "input": "hi", "text": {"format": {"type": "json_object"}}}
    assert _leg(responses, "/v1/responses")["sampling_params"] == {
        "json_schema": '{"type": "object"}',
        "max_new_tokens": None,
    }


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"bad_words": ["x"]}, "$.bad_words"),
        ({"n": 2}, "$.n"),
        ({"allowed_token_ids": [1]}, "$.allowed_token_ids"),
        ({"structured_outputs": {"whitespace_pattern": " "}}, "$.structured_outputs"),
        ({"return_token_ids": True}, "$.return_token_ids"),
        ({"prompt_logprobs": -1}, "$.prompt_logprobs"),  # every token's: SGLang has none
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "$.tools"),
    ],
)
def test_a_field_with_no_sglang_place_is_refused_naming_it(
    fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(RequestError) as caught:
        _leg(_chat(**fields))
    assert caught.value.param is not None
    assert caught.value.param.startswith(param)
    assert caught.value.status_hint == 400


def test_a_tool_using_client_is_refused_naming_the_setting_that_serves_it() -> None:
    with pytest.raises(RequestError, match="use_openai_format: true") as caught:
        _leg(_chat(tools=[{"type": "function", "function": {"name": "f"}}]))
    assert caught.value.param == "$.tools"


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, _chat(tools=TOOLS, max_tokens=9)),
        ("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 9}),
        ("/v1/messages", {"model": "m", "max_tokens": 9, "messages": _chat()["messages"]}),
    ],
)
def test_a_client_on_sglangs_openai_route_keeps_its_body_and_gets_our_rendezvous(
    path: str, body: dict[str, Any]
) -> None:
    sent = {**body, "rid": "short", "bootstrap_room": 1, "bootstrap_host": "elsewhere"}
    sent["kv_transfer_params"] = {"remote_host": "10.0.0.66"}  # removed, as on every leg
    leg = build_sglang_openai_request(sent, client_path=path, rendezvous=RENDEZVOUS)
    assert leg.path == path
    assert leg.rid == RENDEZVOUS.rid
    assert leg.body == {
        **body,
        "rid": "0" * 32,
        "bootstrap_host": "10.0.3.17",
        "bootstrap_port": 8998,
        "bootstrap_room": 7,
    }
    assert sent["rid"] == "short"  # the client's body is never mutated


def test_a_responses_client_gets_the_cap_it_asked_for_on_sglang() -> None:
    # SGLang's Responses route keeps 2 tokens of max_output_tokens as headroom.
    body = {"model": "m", "input": "hi", "max_output_tokens": 10}
    leg = build_sglang_openai_request(body, client_path="/v1/responses", rendezvous=RENDEZVOUS)
    assert leg.body["max_output_tokens"] == 12
    assert body["max_output_tokens"] == 10


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, _chat(max_tokens=0), "$.max_tokens"),
        (CHAT, _chat(stream="yes"), "$.stream"),
        ("/generate", {"input_ids": [1]}, "client_path"),
    ],
)
def test_an_openai_route_leg_refuses_before_any_worker_call(
    path: str, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(RequestError) as caught:
        build_sglang_openai_request(body, client_path=path, rendezvous=RENDEZVOUS)
    assert caught.value.param == param


def test_prompt_logprobs_are_asked_of_the_prefill_alone() -> None:
    # SGLang's decode never sends prompt logprobs (its prefill computes them): its body is the
    # one it gets without them; the prefill's asks them from the first position on.
    leg = build_sglang_request(
        _chat(prompt_logprobs=2), client_path=CHAT, rendezvous=RENDEZVOUS, token_ids=PROMPT
    )
    assert leg.prompt_logprobs == 2
    assert leg.body == _leg(_chat())
    assert prefill_body(leg.body, 2) == {
        **leg.body,
        "return_logprob": True,
        "top_logprobs_num": 2,
        "logprob_start_len": 0,
        "return_text_in_logprobs": True,
    }
    assert _leg(_chat()) == _leg(_chat(prompt_logprobs=None))


@pytest.mark.parametrize(("top", "prompt", "asked"), [(5, 2, 5), (1, 3, 3), (0, 0, 0)])
def test_the_prefill_asks_the_larger_top_count_of_output_and_prompt(
    top: int, prompt: int, asked: int
) -> None:
    # One top_logprobs_num for both, and the decode takes its first token's from the prefill.
    leg = build_sglang_request(
        _chat(logprobs=True, top_logprobs=top, prompt_logprobs=prompt),
        client_path=CHAT,
        rendezvous=RENDEZVOUS,
        token_ids=PROMPT,
    )
    assert leg.body["top_logprobs_num"] == top
    assert leg.body["logprob_start_len"] == -1
    assert prefill_body(leg.body, prompt)["top_logprobs_num"] == asked


def test_streamed_prompt_logprobs_are_refused_as_vllm_refuses_them() -> None:
    with pytest.raises(RequestError, match="not available when `stream=True`") as caught:
        _leg(_chat(stream=True, prompt_logprobs=1))
    assert caught.value.param == "$.prompt_logprobs"
    # 0 is taken by vLLM in a stream, which never shows them: nothing to ask.
    leg = build_sglang_request(
        _chat(stream=True, prompt_logprobs=0),
        client_path=CHAT,
        rendezvous=RENDEZVOUS,
        token_ids=PROMPT,
    )
    assert leg.prompt_logprobs is None


@pytest.mark.parametrize("path", ["/v1/completions", CHAT])
def test_prompt_logprobs_on_sglangs_openai_route_are_refused_not_dropped(path: str) -> None:
    # SGLang's OpenAI requests have no such field and would ignore it.
    body = {**_chat(prompt_logprobs=1), "prompt": "x"}
    with pytest.raises(RequestError, match="has no prompt logprobs") as caught:
        build_sglang_openai_request(body, client_path=path, rendezvous=RENDEZVOUS)
    assert caught.value.param == "$.prompt_logprobs"
    leg = build_sglang_openai_request(
        {**body, "prompt_logprobs": None}, client_path=path, rendezvous=RENDEZVOUS
    )
    assert leg.body["prompt_logprobs"] is None


def test_a_completions_client_keeps_its_own_route() -> None:
    with pytest.raises(RequestError, match="completions client keeps its own route"):
        _leg({"model": "m", "prompt": "x"}, "/v1/completions")


@pytest.mark.parametrize("room", [0, ROOM_MAX + 1, -1, "5", 5.0, True])
def test_the_room_is_a_json_integer_in_range(room: object) -> None:
    bad = Rendezvous(rid="r", bootstrap_host="h", bootstrap_port=None, bootstrap_room=room)  # type: ignore[arg-type]
    with pytest.raises(RequestError, match="bootstrap_room"):
        build_sglang_request(_chat(), client_path=CHAT, rendezvous=bad, token_ids=PROMPT)


@pytest.mark.parametrize("bits", [0, (1 << 128) - 1])
def test_a_new_rendezvous_has_a_fixed_length_rid_and_a_room_in_range(bits: int) -> None:
    made = new_rendezvous("h", None, random_bits=lambda n: bits & ((1 << n) - 1))
    assert len(made.rid) == 32
    assert 1 <= made.bootstrap_room <= ROOM_MAX


def test_an_empty_prompt_is_refused() -> None:
    with pytest.raises(RequestError, match="at least one token"):
        build_sglang_request(_chat(), client_path=CHAT, rendezvous=RENDEZVOUS, token_ids=[])


_sampling = st.fixed_dictionaries(
    {},
    optional={
        "max_tokens": st.integers(1, 4096) | st.none(),
        "max_completion_tokens": st.integers(1, 4096),
        "min_tokens": st.integers(0, 4),
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0.01, 1),
        "top_k": st.sampled_from([-1, 0, 1, 50]),
        "min_p": st.floats(0, 1),
        "seed": st.integers(0, 2**31),
        "stop": st.text(min_size=1, max_size=3) | st.lists(st.text(min_size=1, max_size=3)),
        "stop_token_ids": st.lists(st.integers(0, 10**5), max_size=3),
        "presence_penalty": st.floats(-2, 2),
        "frequency_penalty": st.floats(-2, 2),
        "repetition_penalty": st.floats(0.1, 2),
        "ignore_eos": st.booleans(),
        "skip_special_tokens": st.booleans(),
        "include_stop_str_in_output": st.booleans(),
        "logprobs": st.booleans(),
        "top_logprobs": st.integers(0, 5),
        "stream": st.booleans(),
        "n": st.just(1),
        "response_format": st.sampled_from(
            [
                {"type": "text"},
                {"type": "json_object"},
                {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}},
            ]
        ),
        "priority": st.integers(-5, 5),
        "cache_salt": st.text(min_size=1, max_size=4),
        "prompt_logprobs": st.integers(-2, 5),
    },
)


@given(fields=_sampling, room=st.integers(1, ROOM_MAX))
def test_every_leg_passes_sglangs_own_contract(fields: dict[str, Any], room: int) -> None:
    contract = sglang_contract.contract()
    rendezvous = Rendezvous(
        rid="f" * 32, bootstrap_host="h", bootstrap_port=8998, bootstrap_room=room
    )
    try:
        leg = build_sglang_request(
            _chat(**fields), client_path=CHAT, rendezvous=rendezvous, token_ids=PROMPT
        )
    except RequestError:
        return  # refused before any worker call: nothing reaches SGLang
    parsed = contract.GenerateRequest.from_json_value(json.loads(json.dumps(leg.body)))
    assert parsed.bootstrap_room == room
    assert "max_new_tokens" in leg.body["sampling_params"]
    if leg.prompt_logprobs is not None:
        prefill = prefill_body(leg.body, leg.prompt_logprobs)
        contract.GenerateRequest.from_json_value(json.loads(json.dumps(prefill)))


@given(case=client_route_bodies)
def test_any_client_body_is_a_contract_valid_leg_or_a_request_error(
    case: tuple[str, dict[str, Any]],
) -> None:
    # Every route's bodies, with random values and unknown keys: never another error, and
    # nothing SGLang's own contract refuses reaches a worker.
    contract = sglang_contract.contract()
    path, body = case
    try:
        leg = build_sglang_request(body, client_path=path, rendezvous=RENDEZVOUS, token_ids=PROMPT)
    except RequestError:
        return
    contract.GenerateRequest.from_json_value(json.loads(json.dumps(leg.body)))


def test_the_fixture_requests_pass_the_contract_and_a_vllm_name_does_not() -> None:
    contract = sglang_contract.contract()
    for name in ("generate-request", "generate-request-stream", "generate-request-length"):
        contract.GenerateRequest.from_json_value(_fixture(name))
    with pytest.raises(contract.JsonContractError) as caught:
        contract.GenerateRequest.from_json_value(_fixture("error-400-contract-request"))
    assert str(caught.value) == _fixture("error-400-contract")["error"]


# --- the answers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "stop_ids", "finish", "stop_reason"),
    [
        ("generate-response-stop-token", (), "stop", None),
        ("generate-response-stop-token", (151645,), "stop", 151645),
        ("generate-response-stop-str", (), "stop", "."),
        ("generate-response-length", (), "length", None),
    ],
)
def test_finish_reasons(
    name: str, stop_ids: tuple[int, ...], finish: str, stop_reason: object
) -> None:
    answer = _fixture(name)
    read = generate_answer(answer, stop_token_ids=stop_ids)
    assert isinstance(read, dict)
    choice = read["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == (finish, stop_reason)
    assert choice["text"] == answer["text"]
    meta = answer["meta_info"]
    assert read["usage"] == {
        "prompt_tokens": meta["prompt_tokens"],
        "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
        "completion_tokens": meta["completion_tokens"],
        "prompt_tokens_details": {"cached_tokens": meta["cached_tokens"]},
    }


def test_every_envelope_is_rebuilt_from_an_sglang_answer() -> None:
    read = generate_answer(_fixture("generate-response-stop-token"))
    assert isinstance(read, dict)
    client = {"model": "m", "logprobs": True, "top_logprobs": 1}
    chat = wrap_envelope(
        Route.CHAT_COMPLETIONS, read, requested=OutputMode.TEXT, client_body=client
    )
    assert chat["choices"][0]["message"]["content"] == " Paris."
    assert chat["usage"]["prompt_tokens_details"] == {"cached_tokens": 16}
    content = chat["choices"][0]["logprobs"]["content"]
    assert [entry["logprob"] for entry in content][:2] == [-1.71, -0.93]
    assert len(content[0]["top_logprobs"]) == 1
    named = {"model": "m"}
    responses = wrap_envelope(Route.RESPONSES, read, requested=OutputMode.TEXT, client_body=named)
    assert responses["status"] == "completed"
    assert responses["usage"]["input_tokens_details"]["cached_tokens"] == 16
    message = wrap_envelope(Route.MESSAGES, read, requested=OutputMode.TEXT, client_body=named)
    assert message["stop_reason"] == "end_turn"
    assert message["usage"]["cache_read_input_tokens"] == 16


def _prefill_answer(tokens: list[Any], tops: list[Any]) -> bytes:
    meta = {"prompt_tokens": len(tokens), "input_token_logprobs": tokens}
    return json.dumps({"meta_info": {**meta, "input_top_logprobs": tops}}).encode()


def test_prompt_logprobs_read_as_vllm_writes_them() -> None:
    # SGLang's triples [logprob, id, text], the first position null; vLLM's dict per position,
    # the prompt's token first, then the top count, each with its rank.
    body = _prefill_answer(
        [[None, 7, "a"], [-0.25, 8, "b"], [-0.75, 9, "c"], [-3.0, 10, "d"]],
        [
            None,
            [[-0.25, 8, "b"], [-1.5, 1, "x"], [-2.5, 2, "y"]],
            [[-0.5, 1, "x"], [-0.75, 9, "c"], [-2.5, 2, "y"]],
            [[-0.5, 1, "x"], [-1.5, 2, "y"], [-2.5, 3, "z"]],
        ],
    )
    read = prompt_logprobs(body, 2)
    assert read == [
        None,
        {
            "8": {"logprob": -0.25, "rank": 1, "decoded_token": "b"},
            "1": {"logprob": -1.5, "rank": 2, "decoded_token": "x"},
        },
        {
            "9": {"logprob": -0.75, "rank": 2, "decoded_token": "c"},
            "1": {"logprob": -0.5, "rank": 1, "decoded_token": "x"},
        },
        # Less likely than every listed token: its rank is not known.
        {
            "10": {"logprob": -3.0, "rank": None, "decoded_token": "d"},
            "1": {"logprob": -0.5, "rank": 1, "decoded_token": "x"},
            "2": {"logprob": -1.5, "rank": 2, "decoded_token": "y"},
        },
    ]
    # The prompt's token keeps its place first, with its rank in the top list, as vLLM's dict.
    assert list(read[2] or {}) == ["9", "1"]


@pytest.mark.parametrize(
    ("token", "tops", "count", "rank"),
    [
        # Past the client's count but more likely than the list's last: counted (vLLM's >=).
        ([-1.0, 5, "t"], [[-0.5, 1, "x"], [-1.0, 5, "t"], [-2.0, 2, "y"]], 1, 2),
        # Tied with another listed token: vLLM counts the tie (>=) when not in its top count.
        ([-1.0, 5, "t"], [[-1.0, 1, "x"], [-1.0, 5, "t"], [-2.0, 2, "y"]], 1, 2),
        # Among the top count, its place wins, as vLLM writes the top list after the token.
        ([-1.0, 5, "t"], [[-1.0, 1, "x"], [-1.0, 5, "t"], [-2.0, 2, "y"]], 2, 2),
        ([-1.0, 5, "t"], [[-1.0, 5, "t"], [-1.0, 1, "x"], [-2.0, 2, "y"]], 2, 1),
        # Tied with the list's last: a token outside the list may tie too: not known.
        ([-2.0, 5, "t"], [[-0.5, 1, "x"], [-2.0, 2, "y"]], 2, None),
        # A certain token (logprob 0) listed last: the prompt's token is below it, not known.
        ([-1.0, 5, "t"], [[0.0, 1, "x"]], 1, None),
        # No list (a count of 0): not known.
        ([-0.1, 5, "t"], None, 0, None),
    ],
)
def test_a_prompt_tokens_rank_is_given_where_the_top_list_proves_it(
    token: list[Any], tops: list[Any] | None, count: int, rank: int | None
) -> None:
    read = prompt_logprobs(_prefill_answer([[None, 4, "s"], token], [None, tops]), count)
    assert read[1] is not None
    assert read[1]["5"]["rank"] == rank


def test_a_null_prompt_logprob_is_vllms_clamped_minus_infinity() -> None:
    # orjson writes -inf as null; vLLM clamps -inf to -9999.0.
    read = prompt_logprobs(_prefill_answer([[None, 4, "s"], [None, 5, "t"]], []), 0)
    assert read == [None, {"5": {"logprob": -9999.0, "rank": None, "decoded_token": "t"}}]


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        _prefill_answer([[-0.5, 4, "s"], [-1.0, 5, "t"]], []),  # the first position not null
        json.dumps({"meta_info": {"prompt_tokens": 3, "input_token_logprobs": []}}).encode(),
        json.dumps({"meta_info": {"prompt_tokens": 1}}).encode(),
    ],
)
def test_an_answer_without_every_prompt_logprob_breaks_the_contract(body: bytes) -> None:
    with pytest.raises(UpstreamContractError):
        prompt_logprobs(body, 1)


@pytest.mark.parametrize(
    ("name", "status"),
    [("generate-response-abort", 503), ("generate-response-abort-queued", 503)],
)
def test_an_abort_is_a_failure_not_a_choice(name: str, status: int) -> None:
    read = generate_answer(_fixture(name))
    assert isinstance(read, SglangFailure)
    assert read.status == status


def test_an_abort_with_a_status_keeps_it() -> None:
    answer = _fixture("generate-response-abort")
    answer["meta_info"]["finish_reason"] = {"type": "abort", "message": "m", "status_code": 400}
    assert generate_answer(answer) == SglangFailure(status=400, message="m")


@pytest.mark.parametrize(
    "finish", [None, {"type": "other"}, "stop"], ids=["null", "unknown-type", "a-string"]
)
def test_a_broken_finish_breaks_the_contract(finish: object) -> None:
    answer = _fixture("generate-response-stop-token")
    answer["meta_info"]["finish_reason"] = finish
    with pytest.raises(UpstreamContractError):
        generate_answer(answer)


@pytest.mark.parametrize(
    "name", ["error-400-contract", "error-400-value", "error-500-transfer-failed"]
)
def test_every_error_shape_gives_its_message(name: str) -> None:
    message = sglang_error_message(_fixture(name))
    assert message
    assert message.startswith(("unknown field", "The input", "Decode transfer failed"))


# --- the streams ------------------------------------------------------------------------------


def _read_stream(data: bytes, *, incremental: bool = False, step: int = 37) -> bytes:
    reader = SglangStreamReader(incremental=incremental, max_event_bytes=_MAX_EVENT)
    out = b"".join(reader.feed(data[i : i + step]) for i in range(0, len(data), step))
    return out + reader.close()


def _chat_stream(generate_sse: bytes) -> list[Any]:
    client = {"model": "m", "stream": True, "stream_options": {"include_usage": True}}
    converter = stream_converter(
        Route.CHAT_COMPLETIONS, requested=OutputMode.TEXT, client_body=client
    )
    out = converter.feed(generate_sse) + converter.close()
    events = [line[6:] for line in out.decode().split("\n\n") if line.startswith("data: ")]
    return [event if event == "[DONE]" else json.loads(event) for event in events]


@given(step=st.integers(1, 200))
def test_cumulative_and_incremental_streams_give_the_same_deltas(step: int) -> None:
    cumulative = (FIXTURES / "generate-stream-cumulative.sse").read_bytes()
    incremental = (FIXTURES / "generate-stream-incremental.sse").read_bytes()
    read = _read_stream(cumulative, step=step)
    assert read == _read_stream(incremental, incremental=True, step=step)
    events = _chat_stream(read)
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2])
    assert text == " Paris."
    assert events[-3]["choices"][0]["finish_reason"] == "stop"
    # created_cache_tokens as vLLM's chat stream writes it where the worker names none.
    details = {"cached_tokens": 16, "created_cache_tokens": 0}
    assert events[-2]["usage"]["prompt_tokens_details"] == details
    assert events[-1] == "[DONE]"


def _deltas(generate_sse: bytes) -> list[str]:
    chunks = [
        json.loads(line[6:])["choices"]
        for line in generate_sse.decode().split("\n\n")
        if line.startswith("data: {")
    ]
    return [choices[0]["text"] for choices in chunks if choices]


@given(stream=sglang_cumulative_streams(), step=st.integers(1, 64))
def test_any_cumulative_stream_gives_its_deltas(stream: tuple[list[str], bytes], step: int) -> None:
    deltas, data = stream
    assert _deltas(_read_stream(data, step=step)) == deltas


@pytest.mark.parametrize("route", [Route.CHAT_COMPLETIONS, Route.RESPONSES, Route.MESSAGES])
@given(
    stream=st.one_of(sglang_cumulative_streams(), sglang_cumulative_streams(broken=True)),
    step=st.integers(1, 400),
    client=st.sampled_from(
        [{}, {"return_token_ids": True}, {"stream_options": {"include_usage": True}}]
    ),
)
def test_the_exchange_relay_writes_what_reader_then_converter_write(
    route: Route, stream: tuple[list[str], bytes], step: int, client: dict[str, Any]
) -> None:
    # EngineRelay hands a plain chunk's text straight to the converter: the client's bytes are
    # those of the reader's generate SSE fed to the converter event by event, up to the same
    # breach, however the worker's stream is cut into reads.
    _, data = stream
    reads = [data[at : at + step] for at in range(0, len(data), step)]
    events = [event + b"\n\n" for event in data.split(b"\n\n") if event]
    body = {"model": "m", "stream": True, **client}

    def converter() -> Any:
        return stream_converter(route, requested=OutputMode.TEXT, client_body=body)

    def run(feed: Any, close: Any, pieces: list[bytes]) -> tuple[bytes, str | None]:
        out: list[bytes] = []
        try:
            for piece in pieces:
                out.extend(feed(piece))
            out.append(close())
        except UpstreamContractError as error:
            return b"".join(out), error.param
        return b"".join(out), None

    reader, relay_to = SglangStreamReader(max_event_bytes=_MAX_EVENT), converter()
    relay = EngineRelay(SglangStreamReader(max_event_bytes=_MAX_EVENT), converter())
    composed = run(
        lambda event: [relay_to.feed(reader.feed(event))],
        lambda: relay_to.feed(reader.close()) + relay_to.close(),
        events,
    )
    relayed = run(relay.feed_each, relay.close, reads)
    assert relayed == composed


@given(
    steps=st.lists(
        st.tuples(
            st.text("ab\u00e9", min_size=1, max_size=2),
            st.lists(sglang_logprob_triples, max_size=2),
        ),
        min_size=1,
        max_size=6,
    ),
    tops=st.booleans(),
    compact=st.booleans(),
    step=st.integers(1, 300),
)
def test_cumulative_logprobs_read_past_the_sent_ones_are_the_whole_arrays_cut(
    steps: list[tuple[str, list[tuple[float | None, int, str | None]]]],
    tops: bool,
    compact: bool,
    step: int,
) -> None:
    # Each event repeats every position's logprobs; the reader decodes only the new ones. The
    # same events with meta_info first are read whole (the slow path): the same chunks.
    text, fast, slow = "", [], []
    triples: list[list[Any]] = []
    for count, (delta, new) in enumerate(steps, 1):
        text, triples = text + delta, triples + [list(t) for t in new]
        finish = {"type": "length", "length": 9} if count == len(steps) else None
        meta: dict[str, Any] = {"id": "r", "finish_reason": finish, "completion_tokens": count}
        meta["output_token_logprobs"] = triples
        if tops:
            meta["output_top_logprobs"] = [None if t[1] % 3 else [t] for t in triples]
        ids = list(range(count))
        spell = (lambda v: json.dumps(v, separators=(",", ":"))) if compact else json.dumps
        fast.append(spell({"text": text, "output_ids": ids, "meta_info": meta}))
        slow.append(spell({"meta_info": meta, "text": text, "output_ids": ids}))

    def read(events: list[str]) -> bytes:
        data = b"".join(b"data: " + e.encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
        return _read_stream(data, step=step)

    assert read(fast) == read(slow)


def _sglang_events(texts: list[str], ids: list[Any], *, meta_first: bool = False) -> bytes:
    """A cumulative stream of ``texts`` as SGLang writes it; ``meta_first``: a layout read whole."""
    events = []
    for count, text in enumerate(texts, 1):
        finish = {"type": "length", "length": 9} if count == len(texts) else None
        meta = {"id": "r", "finish_reason": finish, "completion_tokens": count}
        event = {"text": text, "output_ids": ids[:count], "meta_info": meta}
        if meta_first:
            event = {"meta_info": meta, "text": text, "output_ids": ids[:count]}
        events.append(b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n")
    return b"".join([*events, b"data: [DONE]\n\n"])


def _fed_each(reader: SglangStreamReader, data: bytes) -> bytes:
    """``feed_each``'s events as generate SSE (a plain chunk written from its text)."""
    return b"".join(
        event if isinstance(event, bytes) else reader.plain_event(event)
        for event in reader.feed_each(data)
    )


@pytest.mark.parametrize(
    "delta", ['","output_ids":[', '],"meta_info":{"id":"x"}}', "\\", '"', '\\"', "a\\\\"]
)
@pytest.mark.parametrize("step", [1, 7, 4096])
def test_a_text_that_spells_sglangs_layout_reads_as_the_events_read_whole(
    delta: str, step: int
) -> None:
    # An event is read from where the last one's text ended, up to the IDs' head: a text that
    # holds that head, quotes or backslashes gives the chunks of the same events read whole.
    texts = ["a", "a" + delta, "a" + delta + "b", "a" + delta + "b" + delta]
    ids = list(range(len(texts)))
    data = _sglang_events(texts, ids)
    read = _read_stream(data, step=step)
    assert read == _read_stream(_sglang_events(texts, ids, meta_first=True), step=step)
    assert _deltas(read) == ["a", delta, "b", delta]
    reader = SglangStreamReader(max_event_bytes=_MAX_EVENT)
    each = [_fed_each(reader, data[at : at + step]) for at in range(0, len(data), step)]
    assert b"".join([*each, reader.close()]) == read


_META = b'"meta_info":{"id":"r","finish_reason":null}}'


@pytest.mark.parametrize("feed", ["feed", "feed_each"])
@pytest.mark.parametrize("together", [False, True])
@pytest.mark.parametrize(
    ("last", "error"),
    [
        (b'{"text":"ab"c","output_ids":[1,2],' + _META, "JSON"),
        (b'{"text":"ab\\","output_ids":[1,2],' + _META, "JSON"),
        (b'{"text":"a\nb","output_ids":[1,2],' + _META, "JSON"),
        (b'{"text":"ab","output_ids":[1,x],' + _META, "JSON"),
        (b'{"text":"ab","output_ids":[\n,2],' + _META, "JSON"),  # a line cut in the IDs read
        (b'{"text":"ab","output_ids":[1,2],' + _META + b"x", "JSON"),
        (b'{"text":"ab","output_ids":[1,2],' + _META[:-1] + b',"a":1}', None),
        (b'{"text":"ab","output_ids":[1,"2"],' + _META, None),
        (b'{"text":"ab","output_ids":[1,2],' + _META + b" ", None),
    ],
)
def test_an_event_past_the_first_is_read_whole_unless_in_sglangs_layout(
    last: bytes, error: str | None, feed: str, together: bool
) -> None:
    # Only an event in SGLang's own layout is read in part; any other is read whole, so one
    # that is not JSON breaks the contract, and one in another layout gives its delta. Either
    # feed, the events in one read or one a read.
    first = b'data: {"text":"a","output_ids":[1],' + _META + b"\n\n"
    reader = SglangStreamReader(max_event_bytes=_MAX_EVENT)
    read = reader.feed if feed == "feed" else lambda data: _fed_each(reader, data)
    reads = (
        [first + b"data: " + last + b"\n\n"] if together else [first, b"data: " + last + b"\n\n"]
    )
    if error is None:
        assert _deltas(b"".join(map(read, reads))) == ["a", "b"]
        return
    with pytest.raises(UpstreamContractError, match=error):
        b"".join(map(read, reads))


@given(stream=sglang_cumulative_streams(broken=True))
def test_any_event_that_does_not_extend_the_text_is_refused(
    stream: tuple[list[str], bytes],
) -> None:
    deltas, data = stream
    reader = SglangStreamReader(max_event_bytes=_MAX_EVENT)
    events = [event + b"\n\n" for event in data.split(b"\n\n") if event]
    sent = [reader.feed(event) for event in events[: len(deltas)]]
    assert _deltas(b"".join(sent)) == deltas
    with pytest.raises(UpstreamContractError, match="extend the text") as raised:
        reader.feed(events[len(deltas)])
    assert raised.value.param == "$.text"


def test_a_cumulative_event_that_does_not_extend_the_text_breaks_the_contract() -> None:
    events = [
        {"text": " Pa", "output_ids": [1, 2], "meta_info": {"id": "r", "finish_reason": None}},
        {"text": " Px", "output_ids": [1, 2, 3], "meta_info": {"id": "r", "finish_reason": None}},
    ]
    data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    with pytest.raises(UpstreamContractError, match="extend the text"):
        _read_stream(data)


@pytest.mark.parametrize(
    ("name", "code"), [("generate-stream-error", 400), ("generate-stream-abort-500", 500)]
)
def test_in_stream_errors_and_aborts_end_the_clients_stream(name: str, code: int) -> None:
    events = _chat_stream(_read_stream((FIXTURES / f"{name}.sse").read_bytes()))
    assert events[0]["error"]["code"] == code
    assert events[-1] == "[DONE]"


def test_a_stream_without_done_breaks_the_contract() -> None:
    data = (FIXTURES / "generate-stream-cumulative.sse").read_bytes()
    with pytest.raises(UpstreamContractError, match="DONE"):
        _read_stream(data.replace(b"data: [DONE]\n\n", b""))


def test_the_fixture_answers_pass_the_contract() -> None:
    contract = sglang_contract.contract()
    for name in (
        "generate-response-stop-token",
        "generate-response-stop-str",
        "generate-response-length",
        "generate-response-abort",
        "generate-response-prefill",
    ):
        contract.GenerateResponse.from_json_value(_fixture(name))


# --- the seam ---------------------------------------------------------------------------------


def test_every_engine_has_its_description() -> None:
    assert set(ENGINES) == set(Engine)
    vllm, sglang = ENGINES[Engine.VLLM], ENGINES[Engine.SGLANG]
    assert (vllm.meeting, sglang.meeting) == (Meeting.HANDOFF, Meeting.RENDEZVOUS)
    assert (vllm.token_path, sglang.token_path) == ("/inference/v1/generate", "/generate")
    assert sglang.abort_path == "/abort_request"
    answer = _fixture("generate-response-stop-str")
    read = sglang.read_answer(answer, ())
    assert isinstance(read, dict)
    assert vllm.read_answer(read, ()) == read
    assert vllm.stream_reader is None
    assert sglang.stream_reader is not None
    data = (FIXTURES / "generate-stream-cumulative.sse").read_bytes()
    reader = sglang.stream_reader(_MAX_EVENT, (), incremental=False)
    assert reader.feed(data) + reader.close() == _read_stream(data)


@pytest.mark.parametrize("route", [Route.RESPONSES, Route.MESSAGES])
def test_named_event_streams_end_with_the_usage_and_cached_tokens(route: Route) -> None:
    data = _read_stream((FIXTURES / "generate-stream-cumulative.sse").read_bytes())
    client = {"model": "m", "stream": True}
    converter = stream_converter(route, requested=OutputMode.TEXT, client_body=client)
    out = (converter.feed(data) + converter.close()).decode()
    events = [json.loads(line[6:]) for line in out.split("\n") if line.startswith("data: {")]
    last = events[-2] if route is Route.MESSAGES else events[-1]
    usage = last["usage"] if route is Route.MESSAGES else last["response"]["usage"]
    cached = (
        usage["cache_read_input_tokens"]
        if route is Route.MESSAGES
        else usage["input_tokens_details"]["cached_tokens"]
    )
    assert cached == 16


# --- SGLang's own clients ---------------------------------------------------------------------


def test_an_sglang_client_keeps_its_body_and_gets_our_rid_and_room() -> None:
    client = _fixture("generate-request")
    client["rid"] = "short"
    client["bootstrap_room"] = "1"
    leg = sglang_client_leg(client, rendezvous=RENDEZVOUS)
    assert leg.body == {
        **client,
        "rid": "0" * 32,
        "bootstrap_host": "10.0.3.17",
        "bootstrap_port": 8998,
        "bootstrap_room": 7,
    }
    assert client["rid"] == "short"
    sglang_contract.contract().GenerateRequest.from_json_value(leg.body)


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"sampling_params": {"max_tokens": 4}}, "$.sampling_params.max_tokens"),
        ({"input_ids": [[1], [2]]}, "$"),
        ({"sampling_params": {"n": 2}}, "$"),
        ({"input_ids": None}, "$.input_ids"),
    ],
)
def test_an_sglang_client_body_both_workers_would_refuse_is_refused_first(
    change: dict[str, Any], param: str
) -> None:
    with pytest.raises(RequestError) as caught:
        sglang_client_leg({**_fixture("generate-request"), **change}, rendezvous=RENDEZVOUS)
    assert caught.value.param == param


@given(value=st.floats(0, 2, allow_subnormal=False))
def test_a_float_reaches_sglang_as_the_client_wrote_it(value: float) -> None:
    # sglang-router 0.3.2 sends floats through f32 (0.7 arrives as 0.699999988079071).
    leg = _leg(_chat(temperature=value, top_p=0.9))
    encoded = json.dumps(leg)
    assert json.loads(encoded)["sampling_params"]["temperature"] == value
    assert '"top_p": 0.9' in encoded

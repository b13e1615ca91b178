from __future__ import annotations

import json
import re
from types import MappingProxyType
from typing import Any

import msgspec
import pytest
from golden import load_fixture
from helpers import outcome
from hypothesis import given, reject
from hypothesis import strategies as st
from strategies import (
    client_paths,
    client_request_bodies,
    client_view_bodies,
    generate_responses,
    generate_text_responses,
    hostile_json_bytes,
    router_leg_inputs,
)

from disagg_transforms import (
    DecodeParams,
    EnvelopeOptions,
    GenerateDecodeLeg,
    GenerateDecodeLegBytes,
    LegInputs,
    OutputMode,
    RequestError,
    UpstreamContractError,
    build_decode_request,
    build_decode_request_bytes,
    wrap_chat_completion,
    wrap_chat_completion_bytes,
)
from disagg_transforms._response import chat
from disagg_transforms._response.choices import RAW_CODEC
from disagg_transforms._wire.raw import (
    _SCAN_SLICE,
    MemberReader,
    RawMembers,
    RawTokenIds,
    encode,
    scan_token_ids,
)

GENERATE = "/inference/v1/generate"
TEXT = DecodeParams(use_openai_format=False, output_mode=OutputMode.TEXT)
_SPLIT = msgspec.json.Decoder(dict[str, msgspec.Raw])


def _loose(body: dict[str, Any]) -> bytes:
    # Not msgspec's own spelling (spaces, \u escapes): a re-encoded member would differ.
    # Infinity is not JSON: such a body cannot reach the bytes path as bytes.
    try:
        return json.dumps(body, indent=1, ensure_ascii=True, allow_nan=False).encode()
    except ValueError:
        reject()


@given(
    body=client_request_bodies,
    path=client_paths,
    inputs=router_leg_inputs,
    params=st.builds(
        DecodeParams,
        use_openai_format=st.booleans(),
        output_mode=st.sampled_from([OutputMode.TEXT, OutputMode.DERENDER]),
        trust_client_transfer_params=st.booleans(),
    ),
)
def test_decode_bytes_path_equals_dict_path(
    body: dict[str, Any], path: str, inputs: LegInputs, params: DecodeParams
) -> None:
    raw = _loose(body)
    decoded = json.loads(raw)
    ids = decoded.get("token_ids")
    if isinstance(ids, list) and any(
        type(item) in {int, float} and item > 2**63 - 1 for item in ids
    ):
        reject()  # only the dict path checks the range (the shape property in test_fuzz_harness)
    kind, by_dict = outcome(
        lambda: build_decode_request(decoded, client_path=path, params=params, inputs=inputs)
    )
    kind_b, by_bytes = outcome(
        lambda: build_decode_request_bytes(raw, client_path=path, params=params, inputs=inputs)
    )
    assert kind == kind_b
    if kind != "ok":
        assert by_dict == by_bytes  # the same param
        return
    assert json.loads(by_bytes.body) == json.loads(json.dumps(by_dict.body))
    assert (by_bytes.path, by_bytes.stream, by_bytes.single_frame, by_bytes.dropped) == (
        by_dict.path,
        by_dict.stream,
        by_dict.single_frame,
        by_dict.dropped,
    )
    assert isinstance(by_bytes, GenerateDecodeLegBytes) == isinstance(by_dict, GenerateDecodeLeg)
    assert by_bytes.output_mode is by_dict.output_mode
    # Same key order; a member the dict path passed through (the same object) keeps its bytes.
    out = _SPLIT.decode(by_bytes.body)
    assert list(out) == list(by_dict.body)
    members = _SPLIT.decode(raw)
    for key, value in by_dict.body.items():
        if key in decoded and value is decoded[key]:
            assert bytes(out[key]) == bytes(members[key])


@pytest.mark.parametrize("mode", ["text", "derender"])
@given(
    data=st.data(),
    top=st.none() | st.integers(-1, 4),
    client_form=st.sampled_from(["dict", "bytes", "read-only mapping"]),
    mode_as_string=st.booleans(),
)
def test_wrap_bytes_path_equals_dict_path(
    mode: str, data: st.DataObject, top: int | None, client_form: str, mode_as_string: bool
) -> None:
    response = data.draw(generate_responses(mode))
    client = {"model": "m", "top_logprobs": top}
    given_client: Any = {
        "dict": client,
        "bytes": json.dumps(client).encode(),
        "read-only mapping": MappingProxyType(client),
    }[client_form]
    raw = _loose(response)
    by_dict = wrap_chat_completion(
        json.loads(raw),
        requested=OutputMode(mode),
        client_body=client,
        options=EnvelopeOptions(clock=lambda: 7.0),
    )
    by_bytes = wrap_chat_completion_bytes(
        raw,
        # The wire string, as a router may pass it, takes the long way to an OutputMode.
        requested=mode if mode_as_string else OutputMode(mode),  # type: ignore[arg-type]
        client_body=given_client,
        options=EnvelopeOptions(clock=lambda: 7.0),
    )
    assert json.loads(by_bytes) == json.loads(json.dumps(by_dict))


# What may take a text answer off the common case's own way (or breaks it), one each.
_OFF_THE_COMMON_CASE: dict[str, Any] = {
    "logprobs": lambda r: r["choices"][0].update(logprobs={"content": []}),
    "null logprobs": lambda r: r["choices"][0].update(logprobs=None),
    "prompt logprobs": lambda r: r.update(prompt_logprobs=[None, {"1": {"logprob": -1.0}}]),
    # Drawn after "null usage" or "no usage" too: the usage is then this member alone.
    "created cache null": lambda r: r.update(
        usage={
            **(r.get("usage") or {}),
            "prompt_tokens_details": {"cached_tokens": 0, "created_cache_tokens": None},
        }
    ),
    "null usage": lambda r: r.update(usage=None),
    "no usage": lambda r: r.pop("usage"),
    "bad usage": lambda r: r.update(usage={"prompt_tokens": "many"}),
    "no model": lambda r: r.pop("model"),
    "no created": lambda r: r.pop("created"),
    "text not a string": lambda r: r["choices"][0].update(text=7),
    "no text": lambda r: r["choices"][0].pop("text"),
    "two choices": lambda r: r["choices"].append({**r["choices"][0], "index": 1}),
    "absent finish": lambda r: r["choices"][0].pop("finish_reason"),
}


def _in_vllm_order(response: dict[str, Any]) -> dict[str, Any]:
    # vLLM writes the choices last, and a choice's logprobs last (null when there are none).
    def choice(given: Any) -> Any:
        if not isinstance(given, dict):
            return given
        rest = {key: value for key, value in given.items() if key != "logprobs"}
        return {**rest, "logprobs": given.get("logprobs")}

    ordered = {key: value for key, value in response.items() if key != "choices"}
    if isinstance(response.get("choices"), list):
        ordered["choices"] = [choice(given) for given in response["choices"]]
    return ordered


# Of those, what the common text answer's own way still writes.
_STILL_COMMON = {
    "null logprobs",
    "created cache null",
    "null usage",
    "no model",
    "no created",
    "absent finish",
}


@given(
    response=generate_text_responses,
    changes=st.lists(st.sampled_from(sorted(_OFF_THE_COMMON_CASE)), max_size=2, unique=True),
    client=st.none()
    | st.fixed_dictionaries(
        {"top_logprobs": st.none() | st.integers(-1, 3)}, optional={"model": st.just("c")}
    ),
    options=st.builds(
        EnvelopeOptions,
        model=st.none() | st.just("served"),
        vllm_finish_reasons=st.booleans(),
        vllm_version=st.none() | st.sampled_from(["0.32.0", "0.33.0"]),
        clock=st.just(lambda: 7.0),
    ),
    one_line=st.booleans(),
)
def test_the_common_text_answer_s_fast_envelope_is_the_general_one(
    response: dict[str, Any],
    changes: list[str],
    client: Any,
    options: EnvelopeOptions,
    one_line: bool,
) -> None:
    # The bytes wrap reads the common text answer through its own view and splices its
    # envelope from bytes: the same bytes as the rules' dicts, or None (not that answer, or a
    # broken one: then the general way builds it, and reports what is broken).
    for change in changes:
        _OFF_THE_COMMON_CASE[change](response)
    # On one line, in vLLM's order, the answer ends as vLLM's does: the wrap tries the common
    # view first.
    raw = json.dumps(_in_vllm_order(response)).encode() if one_line else _loose(response)
    asked = chat._asked(client, OutputMode.TEXT)
    view = chat._general_view(raw, OutputMode.TEXT, asked.top)
    general = outcome(
        lambda: encode(
            chat._wrap(RAW_CODEC, view, requested=OutputMode.TEXT, asked=asked, options=options)
        )
    )
    fast = outcome(lambda: chat._text_completion(raw, asked, options))
    if fast != ("ok", None):
        assert fast == general
    elif set(changes) <= _STILL_COMMON:
        pytest.fail("the common text answer took the general way")
    wrapped = outcome(
        lambda: wrap_chat_completion_bytes(
            raw, requested=OutputMode.TEXT, client_body=client, options=options
        )
    )
    assert wrapped == general


def test_wrap_bytes_keeps_passthrough_bytes() -> None:
    response = load_fixture("response-derender-tool-call.json")
    raw = _loose(response)
    out = _SPLIT.decode(wrap_chat_completion_bytes(raw, requested=OutputMode.DERENDER))
    assert bytes(out["usage"]) == bytes(_SPLIT.decode(raw)["usage"])
    choice = msgspec.json.decode(out["choices"], type=list[dict[str, msgspec.Raw]])[0]
    given_choice = msgspec.json.decode(
        _SPLIT.decode(raw)["choices"], type=list[dict[str, msgspec.Raw]]
    )[0]
    assert bytes(choice["message"]) == bytes(given_choice["message"])


def test_wrap_bytes_writes_text_with_its_input_bytes() -> None:
    response = load_fixture("response-text.json")
    response["choices"][0]["text"] = "caf\u00e9 \U0001f600"
    raw = json.dumps(response).encode()  # ensure_ascii: the text is spelled with \u escapes
    out = wrap_chat_completion_bytes(raw, requested=OutputMode.TEXT)
    choices = list[dict[str, msgspec.Raw]]
    given = msgspec.json.decode(_SPLIT.decode(raw)["choices"], type=choices)[0]["text"]
    message = msgspec.json.decode(_SPLIT.decode(out)["choices"], type=choices)[0]["message"]
    content = _SPLIT.decode(message)["content"]
    assert bytes(content) == bytes(given)  # escapes and all, not re-encoded
    assert msgspec.json.decode(content) == "caf\u00e9 \U0001f600"


def _leg(body: bytes, **kwargs: Any) -> Any:
    return build_decode_request_bytes(
        body, client_path=GENERATE, params=TEXT, inputs=LegInputs(**kwargs)
    )


def _generate(token_ids: str) -> bytes:
    return b'{"token_ids": ' + token_ids.encode() + b', "model": "m"}'


def test_token_ids_pass_byte_for_byte() -> None:
    out = _SPLIT.decode(_leg(_generate("[1,  2,\n3]")).body)
    assert bytes(out["token_ids"]) == b"[1,  2,\n3]"


@pytest.mark.parametrize(
    ("token_ids", "param"),
    [
        ("[1, -2]", "$.token_ids[1]"),
        ("[1, [2]]", "$.token_ids[1]"),
        ("[[1]]", "$.token_ids[0]"),
        ("[1, {}]", "$.token_ids[1]"),
        ("[1, true]", "$.token_ids[1]"),
        ("[1, false]", "$.token_ids[1]"),
        ("[1, null]", "$.token_ids[1]"),
        ("[1, 2.5e-1]", "$.token_ids[1]"),
        ("[1, 2.5]", "$.token_ids[1]"),
        ('[1, "2"]', "$.token_ids[1]"),
        ("[]", "$.token_ids"),
        ("[ ]", "$.token_ids"),
        ("7", "$.token_ids"),
    ],
)
def test_bad_token_ids_are_refused_at_their_index(token_ids: str, param: str) -> None:
    with pytest.raises(RequestError) as caught:
        _leg(_generate(token_ids))
    assert caught.value.param == param


def test_long_and_whole_float_token_ids_are_kept() -> None:
    body = json.loads(_leg(_generate("[9223372036854775807, 5.0, 1E2, 1234567890123456789]")).body)
    assert body["token_ids"] == [2**63 - 1, 5, 100, 1234567890123456789]


@pytest.mark.parametrize("big", [2**63, 2**64 + 1, 10**40])
@pytest.mark.parametrize("whole_float", [False, True])
def test_a_large_token_id_passes_on_bytes_and_is_refused_on_dict(
    big: int, whole_float: bool
) -> None:
    # The bytes path proves the shape only; the worker knows its vocabulary. A whole float
    # beside it makes the array unprovable by the scan: the range is still not checked.
    ids = [1, 5.0, big] if whole_float else [1, big]
    raw = json.dumps(ids).encode()
    assert json.loads(_leg(_generate(raw.decode())).body)["token_ids"] == [int(i) for i in ids]
    with pytest.raises(RequestError) as caught:
        build_decode_request({"token_ids": ids}, client_path=GENERATE, params=TEXT)
    assert caught.value.param == f"$.token_ids[{len(ids) - 1}]"


@pytest.mark.parametrize(
    "array", ["[1]", "[0, 12,\n3]", "[ 7 ]", "[99999999999999999999999]", "[1,\t2\r]"]
)
def test_scan_proves_unsigned_integer_arrays(array: str) -> None:
    raw = _SPLIT.decode(_generate(array))["token_ids"]
    proved = scan_token_ids(raw)
    assert proved is not None
    assert proved.raw is raw


@pytest.mark.parametrize(
    "array",
    # Each refused by one test of the scan: the first byte, emptiness, or one of its bytes.
    [
        *('"[1]"', "7", "[]", "[ \n]", '[1, "2"]', "[1, {}]", "[1, [2]]", "[[1]]", "[true]"),
        *("[null]", "[1, -2]", "[1.5]", "[1E2]", "[1e2]"),
    ],
)
def test_scan_leaves_any_other_member_to_the_decode(array: str) -> None:
    assert scan_token_ids(_SPLIT.decode(_generate(array))["token_ids"]) is None


def _array_of_length(length: int, last: str) -> bytes:
    """``[7,7,...,last]`` exactly ``length`` bytes long (a leading 77 fixes the parity)."""
    fill = length - 2 - len(last)  # the bytes of the items before ``last`` and their commas
    head = ["77"] if fill % 2 else []
    sevens = (fill - 3 * len(head)) // 2
    array = ("[" + ",".join([*head, *["7"] * sevens, last]) + "]").encode()
    assert len(array) == length
    return array


# One slice long, the array is searched whole; a byte longer, a slice at a time.
@pytest.mark.parametrize("length", [_SCAN_SLICE, _SCAN_SLICE + 1])
@pytest.mark.parametrize("item", ["-1", "1.5", "1e2", "1E2", "null", "true", '"2"', "{}", "[2]"])
def test_the_scan_refuses_a_bad_last_item_whichever_way_it_searches(length: int, item: str) -> None:
    assert scan_token_ids(msgspec.Raw(_array_of_length(length, item))) is None
    assert scan_token_ids(msgspec.Raw(_array_of_length(length, "8"))) is not None


@pytest.mark.parametrize("at", [1, _SCAN_SLICE - 2, _SCAN_SLICE, _SCAN_SLICE + 2, -1])
@pytest.mark.parametrize("item", ["-1", "1.5", "1e2", "null", '"2"'])
def test_the_scan_refuses_a_bad_item_anywhere_in_a_long_array(at: int, item: str) -> None:
    # The scan searches a long array a slice at a time: an item on or across a slice's edge
    # (the slices start after the "[") is found. Item i of "[7,7,..." starts at byte 1 + 2i.
    ids = ["7"] * _SCAN_SLICE
    index = (at - 1) // 2 if at > 0 else len(ids) + at
    ids[index] = item
    assert scan_token_ids(msgspec.Raw(("[" + ",".join(ids) + "]").encode())) is None
    ids[index] = "7"
    assert scan_token_ids(msgspec.Raw(("[" + ",".join(ids) + "]").encode())) is not None


@pytest.mark.parametrize(
    "body",
    [b"", b"{", b"[1]", b'"x"', b"null", b'{"a": "\xff"}', b'{"a": 1}{'],
)
def test_bad_request_bytes_are_a_request_error_at_root(body: bytes) -> None:
    with pytest.raises(RequestError) as caught:
        _leg(body, token_ids=[1])
    assert caught.value.param == "$"


def test_non_bytes_body_is_refused() -> None:
    with pytest.raises(RequestError):
        build_decode_request_bytes({"a": 1}, client_path=GENERATE, params=TEXT)  # type: ignore[arg-type]


def test_bytearray_body_is_copied_before_use() -> None:
    buffer = bytearray(_generate("[1, 2]"))
    leg = _leg(buffer)  # type: ignore[arg-type]
    buffer[:] = b"x" * len(buffer)
    assert json.loads(leg.body)["token_ids"] == [1, 2]


@pytest.mark.parametrize("body", [b"", b"[1]", b'{"request_id": "\xff"}', b"{"])
def test_bad_response_bytes_are_an_upstream_error(body: bytes) -> None:
    with pytest.raises(UpstreamContractError) as caught:
        wrap_chat_completion_bytes(body, requested=OutputMode.TEXT)
    assert caught.value.param == "$"


def test_wrap_bytes_checks_the_echo_first() -> None:
    body = b'{"output_mode": "tokens", "choices": 5}'
    with pytest.raises(UpstreamContractError) as caught:
        wrap_chat_completion_bytes(body, requested=OutputMode.TEXT)
    assert caught.value.param == "$.output_mode"


def test_wrap_bytes_refuses_logprobs_that_are_not_an_object() -> None:
    response = load_fixture("response-text.json")
    response["choices"][0]["logprobs"] = [1]
    with pytest.raises(UpstreamContractError) as caught:
        wrap_chat_completion_bytes(json.dumps(response).encode(), requested=OutputMode.TEXT)
    assert caught.value.param == "$.choices[0].logprobs"


@pytest.mark.parametrize("bad", [b"\xff", b"\xe6\x97", b"\xc3(", b"\xed\xa0\x80"])
@pytest.mark.parametrize("offset", [0, 1, 2, 3])
def test_utf8_is_checked_across_the_check_s_slices(bad: bytes, offset: int) -> None:
    # A bad sequence on the boundary of the 32 KiB slices the check decodes one at a time.
    head = b'{"text": "' + "é".encode() * (((1 << 15) - 12 - offset) // 2)
    body = head + b"x" * (1 << 15) + b"\xe6\x97\xa5" + bad + b'"}'
    cut = head + bad + b'"}'
    for data in (body, cut):
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            expected = f"at byte {exc.start})"
        with pytest.raises(UpstreamContractError, match=re.escape(expected)) as caught:
            wrap_chat_completion_bytes(data, requested=OutputMode.TEXT)
        assert caught.value.param == "$"


def _text_response(text: str, **extra: Any) -> dict[str, Any]:
    response: dict[str, Any] = load_fixture("response-text.json")
    response["choices"][0]["text"] = text
    response.update(extra)
    return response


@pytest.mark.parametrize(
    ("client", "error", "param"),
    [
        (b"", UpstreamContractError, "client_body"),
        (b"{", UpstreamContractError, "client_body"),
        (b"[1]", UpstreamContractError, "client_body"),
        (b'"x"', UpstreamContractError, "client_body"),
        (b'{"top_logprobs": "2"}', RequestError, "$.top_logprobs"),
        (b'{"top_logprobs": -2}', RequestError, "$.top_logprobs"),
    ],
)
@pytest.mark.parametrize("logprobs", [False, True])
def test_a_bad_client_body_is_refused_whatever_the_answer(
    client: bytes, error: type[Exception], param: str, logprobs: bool
) -> None:
    # The client's bytes are read on every answer, the common text answer's own way included
    # (one without logprobs needs neither its top_logprobs nor, naming a model, its model).
    response = _text_response("hi")
    response["choices"] = response["choices"][:1]
    if logprobs:
        response["choices"][0]["logprobs"] = {"content": []}
    raw = json.dumps(_in_vllm_order(response), separators=(",", ":")).encode()
    with pytest.raises(error) as caught:
        wrap_chat_completion_bytes(raw, requested=OutputMode.TEXT, client_body=client)
    assert caught.value.param == param  # type: ignore[attr-defined]


@pytest.mark.parametrize("bad", [b"\xff", b"\xc3(", b"\xed\xa0\x80"])
def test_invalid_utf8_the_wrap_would_pass_on_is_refused_at_its_input_byte(bad: bytes) -> None:
    raw = json.dumps(_text_response("caf\u00e9 MARK"), ensure_ascii=False).encode()
    raw = raw.replace(b"MARK", bad)  # inside the text, which moves across undecoded
    with pytest.raises(UpstreamContractError, match=rf"at byte {raw.index(bad)}\)") as caught:
        wrap_chat_completion_bytes(raw, requested=OutputMode.TEXT)
    assert caught.value.param == "$"


@pytest.mark.parametrize("bad", [b"\xff", b"\xed\xa0\x80"])
@pytest.mark.parametrize("where", ["text", "usage"])
def test_invalid_utf8_in_a_one_choice_answer_is_refused_at_its_input_byte(
    bad: bytes, where: str
) -> None:
    # The common text answer (one choice) checks what it writes undecoded: text and usage.
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2, "x_new": "MARK"}
    response = _text_response("caf\u00e9 MARK", usage=usage)
    response["choices"] = response["choices"][:1]
    raw = json.dumps(response, ensure_ascii=False).encode()
    at = raw.rindex(b"MARK") if where == "text" else raw.index(b"MARK")  # usage comes first
    raw = raw[:at] + bad + raw[at + 4 :]  # text: moves across undecoded; usage: x_new is skipped
    with pytest.raises(UpstreamContractError, match=rf"at byte {at}\)"):
        wrap_chat_completion_bytes(raw, requested=OutputMode.TEXT)


_MARK = "MARK"
_DETAILS = {"cached_tokens": 0, "x_note": _MARK}
_LOGPROBS_ENTRY = {"token": "a", "logprob": -0.5, "bytes": None, "top_logprobs": []}


@pytest.mark.parametrize(
    ("mode", "where", "top", "param"),
    [
        # Members the general way decodes through a typed view (docs/bytes.md).
        (
            "text",
            {"usage": {"prompt_tokens": 1, "prompt_tokens_details": _DETAILS}},
            None,
            "$.usage",
        ),
        (
            "text",
            {"prompt_logprobs": [None, {"7": {"decoded_token": _MARK}}]},
            None,
            "$.prompt_logprobs",
        ),
        (
            "derender",
            {"message": {"role": "assistant", "content": _MARK}},
            None,
            "$.choices[0].message",
        ),
        # Logprobs cut to the client's top_logprobs: keys split, an unusual shape decoded.
        ("text", {"logprobs": {"content": [], _MARK: 1}}, 2, "$.choices[0].logprobs"),
        ("text", {"logprobs": {"content": [], _MARK: 1}}, 25, "$.choices[0].logprobs"),
        (
            "text",
            {"logprobs": {"content": [{**_LOGPROBS_ENTRY, _MARK: 1}]}},
            2,
            "$.choices[0].logprobs",
        ),
        ("text", {"logprobs": {"content": _MARK}}, 2, "$.choices[0].logprobs"),
        ("text", {"logprobs": {"content": [_MARK]}}, 25, "$.choices[0].logprobs"),
    ],
)
@pytest.mark.parametrize("bad", [b"\xff", b"\xc3(", b"\xed\xa0\x80"])
def test_invalid_utf8_in_a_decoded_member_is_a_contract_error_at_its_path(
    mode: str, where: dict[str, Any], top: int | None, param: str, bad: bytes
) -> None:
    # msgspec refuses a string that is not UTF-8 in what it decodes with its own DecodeError:
    # such a member is the worker's broken answer, an UpstreamContractError naming the member.
    response = load_fixture(
        "response-text.json" if mode == "text" else "response-derender-text.json"
    )
    response["choices"] = response["choices"][:1]
    for key, value in where.items():
        (response["choices"][0] if key in {"message", "logprobs"} else response)[key] = value
    raw = json.dumps(response).encode().replace(_MARK.encode(), bad)
    client = None if top is None else {"top_logprobs": top}
    with pytest.raises(UpstreamContractError, match="UTF-8") as caught:
        wrap_chat_completion_bytes(raw, requested=OutputMode(mode), client_body=client)
    assert caught.value.param == param


@pytest.mark.parametrize(("text", "shown"), [(5, "5 (an integer)"), ([1], "an array of 1 items")])
def test_text_that_is_not_a_string_is_refused_on_both_paths(text: object, shown: str) -> None:
    response = _text_response("x")
    response["choices"][0]["text"] = text
    raw = json.dumps(response).encode()
    for call in (
        lambda: wrap_chat_completion(response, requested=OutputMode.TEXT),
        lambda: wrap_chat_completion_bytes(raw, requested=OutputMode.TEXT),
    ):
        with pytest.raises(UpstreamContractError, match=re.escape(f"got {shown}")) as caught:
            call()
        assert caught.value.param == "$.choices[0].text"


def test_invalid_utf8_in_what_the_wrap_drops_is_not_read() -> None:
    # Only what is passed on must be UTF-8: a worker's dropped member is never read.
    dropped = {"kv_transfer_params": {"note": "MARK"}}
    clean = json.dumps(_text_response("hi", **dropped)).encode()
    broken = clean.replace(b"MARK", b"\xffMARK")
    out = wrap_chat_completion_bytes(
        broken, requested=OutputMode.TEXT, options=EnvelopeOptions(clock=lambda: 7.0)
    )
    out.decode("utf-8")
    assert out == wrap_chat_completion_bytes(
        clean, requested=OutputMode.TEXT, options=EnvelopeOptions(clock=lambda: 7.0)
    )


@given(
    mode=st.sampled_from(["text", "derender"]),
    data=st.data(),
    bad=st.sampled_from([b"\xff", b"\xc3", b"\x80", b"\xed\xa0\x80"]),
    top=st.none() | st.sampled_from([0, 2, 25]),
    strings=st.booleans(),
)
def test_wrap_bytes_output_is_utf8_or_refused(
    mode: str, data: st.DataObject, bad: bytes, top: int | None, *, strings: bool
) -> None:
    # A bad byte inside any string of the answer (a key, text, a message, logprobs, usage,
    # prompt logprobs, a dropped member): the wrap writes UTF-8 or raises ours, never msgspec's.
    response = data.draw(generate_responses(mode))
    if strings:  # strings where the general way decodes usage and prompt logprobs
        response["usage"]["prompt_tokens_details"] = {"cached_tokens": 0, "x_note": "n"}
        response["prompt_logprobs"] = [None, {"7": {"logprob": -1.0, "decoded_token": "d"}}]
    raw = _loose(_in_vllm_order(response))
    # Unescaped quotes alternate, opening and closing: the bad byte opens one string.
    quotes = [at for at in range(len(raw)) if raw[at] == ord('"') and raw[at - 1] != ord("\\")]
    at = data.draw(st.sampled_from(quotes[::2])) + 1
    broken = raw[:at] + bad + raw[at:]
    client = None if top is None else json.dumps({"top_logprobs": top}).encode()
    try:
        out = wrap_chat_completion_bytes(broken, requested=OutputMode(mode), client_body=client)
    except UpstreamContractError as error:
        assert error.param is not None
        assert error.param.startswith("$")
        return
    out.decode("utf-8")


def test_long_valid_utf8_body_is_accepted() -> None:
    response = load_fixture("response-text.json")
    response["choices"][0]["text"] = "日本é" * 50_000
    raw = json.dumps(response, ensure_ascii=False).encode()
    out = json.loads(wrap_chat_completion_bytes(raw, requested=OutputMode.TEXT))
    assert out["choices"][0]["message"]["content"] == "日本é" * 50_000


def _alternatives(n: int) -> list[dict[str, Any]]:
    return [{"token": f"t{i}", "logprob": -1.5 * i, "bytes": [116, 48 + i]} for i in range(n)]


def _entry(n: int, **extra: Any) -> dict[str, Any]:
    return {
        "token": "é",
        "logprob": -0.25,
        "bytes": None,
        "top_logprobs": _alternatives(n),
        **extra,
    }


@pytest.mark.parametrize(
    "logprobs",
    [
        {"content": [_entry(5), _entry(3)]},  # the view vLLM sends: cut while decoding
        {"content": [{"top_logprobs": _alternatives(4), "token": "a"}, _entry(2)]},
        {"content": [_entry(5), _entry(1)]},  # a list shorter than the cut: the general cut
        {"content": [_entry(5), _entry(5, rank=1)]},  # a key the view does not know
        {"content": [_entry(5), {**_entry(0), "top_logprobs": None}]},
        {"content": [_entry(5), 7]},
        {"content": None},
        {"content": [_entry(5)], "refusal": None},
        {},
    ],
)
@pytest.mark.parametrize("top", [0, 2, 25])
def test_text_logprobs_cut_on_bytes_equals_the_dict_cut(logprobs: dict[str, Any], top: int) -> None:
    response = load_fixture("response-text.json")
    response["choices"][0]["logprobs"] = logprobs
    response["choices"].append({**response["choices"][0], "index": 1, "logprobs": None})
    client = {"model": "m", "top_logprobs": top}
    by_dict = wrap_chat_completion(response, requested=OutputMode.TEXT, client_body=client)
    for raw in (json.dumps(response).encode(), _loose(response)):
        by_bytes = wrap_chat_completion_bytes(
            raw, requested=OutputMode.TEXT, client_body=json.dumps(client).encode()
        )
        assert json.loads(by_bytes) == json.loads(json.dumps(by_dict))


def test_a_broken_response_is_refused_after_a_failed_cutting_decode() -> None:
    response = load_fixture("response-text.json")
    response["choices"][0]["index"] = "zero"
    response["choices"][0]["logprobs"] = {"content": [_entry(5)]}
    with pytest.raises(UpstreamContractError) as caught:
        wrap_chat_completion_bytes(
            json.dumps(response).encode(),
            requested=OutputMode.TEXT,
            client_body={"top_logprobs": 2},
        )
    assert caught.value.param == "$.choices[0].index"


def test_bad_client_top_logprobs_is_refused_after_the_echo_check() -> None:
    response = load_fixture("response-text.json")
    response["output_mode"] = "tokens"
    raw = json.dumps(response).encode()
    with pytest.raises(UpstreamContractError) as caught:
        wrap_chat_completion_bytes(raw, requested=OutputMode.TEXT, client_body={"top_logprobs": -5})
    assert caught.value.param == "$.output_mode"
    with pytest.raises(RequestError):
        wrap_chat_completion_bytes(
            json.dumps(load_fixture("response-text.json")).encode(),
            requested=OutputMode.TEXT,
            client_body={"top_logprobs": -5},
        )


_IN_A_STRING = bytes(range(0x20, 0x100)).replace(b'"', b"").replace(b"\\", b"")


@given(
    text=st.lists(st.sampled_from(list(_IN_A_STRING)), max_size=12).map(bytes),
    key=st.sampled_from(["model", "cache_salt", "x"]),
)
def test_request_bytes_are_refused_exactly_when_not_utf8(text: bytes, key: str) -> None:
    # No pass over the body checks UTF-8: msgspec's check of the strings it decodes must
    # refuse exactly what a strict decode refuses, naming the same byte.
    body = b'{"token_ids": [1, 22], "' + key.encode() + b'": "' + text + b'"}'
    try:
        body.decode()
    except UnicodeDecodeError as exc:
        with pytest.raises(RequestError) as caught:
            _leg(body)
        assert caught.value.param == "$"
        assert str(caught.value).endswith(f"({exc.reason} at byte {exc.start})")
        return
    result = outcome(lambda: _leg(body))
    assert result[1] != "$"


def test_a_number_no_parser_reads_is_named_as_such() -> None:
    # 1e400 is valid JSON syntax but no float: the error says so, at the element's path (it
    # used to say "nesting too deep" for any member that failed to decode).
    with pytest.raises(RequestError) as caught:
        build_decode_request_bytes(
            b'{"token_ids": [1e400]}',
            client_path="/inference/v1/generate",
            params=DecodeParams(use_openai_format=False, output_mode=OutputMode.TEXT),
        )
    assert caught.value.param == "$.token_ids[0]"
    assert "out of range" in str(caught.value)


def test_encode_writes_proved_token_ids_as_their_bytes_and_refuses_other_objects() -> None:
    # The encoder's hook writes a proved array wherever it sits; any other unknown object is
    # refused as msgspec refuses it.
    proved = scan_token_ids(msgspec.Raw(b"[1, 2,3]"))
    assert proved is not None
    assert (
        encode({"token_ids": proved, "nested": [proved]})
        == b'{"token_ids":[1, 2,3],"nested":[[1, 2,3]]}'
    )
    with pytest.raises(TypeError, match="Encoding objects of type object is unsupported"):
        encode({"x": object()})


def _members(data: object, key: str, *, whole: bool) -> RawMembers:
    return RawMembers(data, RequestError, "the client body", token_ids_key=key, whole=whole)


def _read_as_split(members: RawMembers) -> list[tuple[str, str]]:
    """A body's members, in order, each as read (proved token IDs by their bytes)."""
    return [
        (key, repr(bytes(value.raw) if type(value) is RawTokenIds else value))
        for key, value in members.items()
    ]


# A client body's bytes as the exchange may get them: any of the views' bodies, hostile or
# broken (hostile_json_bytes), some opening with token IDs (their key spelt plainly or escaped).
_TOKEN_IDS_FIRST = (b"", b'{"token_ids":[1,2],', b'{"token\\u005fids":[3],', b'{"token_ids":"x",')


# Reads more keys than a leg asks for, as a leg's reader does (the keys of every carried value).
_OWN_MEMBERS = MemberReader(("model", "stream_options", "request_id", "priority"))


@given(
    data=hostile_json_bytes(client_view_bodies.map(lambda pair: pair[1])),
    first=st.sampled_from(_TOKEN_IDS_FIRST),
    key=st.sampled_from(["token_ids", ""]),
)
def test_a_client_body_decoded_whole_reads_as_split(data: bytes, first: bytes, key: str) -> None:
    # A body decoded whole (a client of an API without token IDs) and split only when its
    # bytes are asked for reads as any body split first: the same members in the same order,
    # the same depth bound and bytes written, or the same error.
    if first and data.startswith(b"{") and len(data) > 2:
        data = first + data[1:]
    try:
        read = _members(data, key, whole=True)
    except RequestError as error:
        with pytest.raises(RequestError) as general_error:
            _members(data, key, whole=False)
        assert (general_error.value.param, str(general_error.value)) == (error.param, str(error))
        return
    general = _members(data, key, whole=False)
    # Only a body with token IDs was split first.
    assert (read._members is None) == (key not in general)
    assert _read_as_split(read) == _read_as_split(general)
    assert read._brackets == general._brackets
    for keys in (None, ("model", "stream_options", "request_id")):
        written = read.encode(dict(read), keys, _OWN_MEMBERS)
        assert written == general.encode(dict(general), keys)

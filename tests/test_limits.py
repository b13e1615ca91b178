"""Every limit at the limit and one past it: depth, body size, token count, n,
cache_salt, placeholder spans, caps."""

from __future__ import annotations

import json
import time
from functools import partial
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import json_scalars, json_values

from disagg_transforms import (
    DEFAULT_LIMITS,
    ConfigError,
    DecodeParams,
    EncodeParams,
    EnvelopeOptions,
    LegInputs,
    Limits,
    OutputMode,
    PrefillParams,
    RequestError,
    UpstreamContractError,
    apply_sampling_caps,
    build_decode_request,
    build_decode_request_bytes,
    build_encode_request,
    build_prefill_request,
    check_output_mode_echo,
    wrap_chat_completion_bytes,
)
from disagg_transforms._routes import Route
from disagg_transforms._wire import keys as w
from disagg_transforms._wire import limits as _limits
from disagg_transforms._wire.limits import _is_flat, check_body_size, check_client_body, check_depth
from disagg_transforms._wire.raw import RawMembers, nesting_within
from disagg_transforms._wire.validate import CONVERT_FROM, whole_number

CHAT = "/v1/chat/completions"
GENERATE_LEG = DecodeParams(use_openai_format=False)


def nested(depth: int) -> object:
    """A value of exactly ``depth`` levels: ``depth - 1`` lists around an empty dict."""
    value: object = {}
    for _ in range(depth - 1):
        value = [value]
    return value


def decode(body: dict[str, Any], **kwargs: Any) -> Any:
    return build_decode_request(
        body, client_path=CHAT, params=GENERATE_LEG, token_ids=[1, 2], **kwargs
    )


def test_defaults_are_documented_values() -> None:
    assert (
        Limits(max_depth=128, max_body_bytes=64 * 1024 * 1024, max_token_ids=1 << 20, max_n=16384)
        == DEFAULT_LIMITS
    )


@pytest.mark.parametrize("limit", [1, 2, 128])
def test_depth_at_the_limit_passes_and_one_past_is_refused(limit: int) -> None:
    check_depth(nested(limit), limit)
    with pytest.raises(RequestError, match=f"limit of {limit} levels") as error:
        check_depth(nested(limit + 1), limit)
    assert error.value.param is not None
    assert error.value.param.startswith("$[0]") or error.value.param == "$"


def test_depth_names_the_path_and_survives_any_nesting() -> None:
    body = {"a": [{"b": nested(10_000)}]}
    with pytest.raises(RequestError) as error:
        check_depth(body, 5)
    assert error.value.param == "$.a[0].b[0][0]"
    check_depth([1, 2, 3] * 1000, 1)  # a flat token array is depth 1


@pytest.mark.parametrize(
    "item", [[1], {"a": 1}, (1,), [[]]], ids=["array", "object", "tuple", "nested"]
)
def test_a_long_flat_array_passes_and_a_container_at_its_end_is_walked(item: object) -> None:
    flat: list[Any] = [7, 2**70, "x", None, 1.5, True] * 20_000
    check_depth({"token_ids": flat}, 2)
    with pytest.raises(RequestError) as caught:
        check_depth({"token_ids": [*flat, item]}, 2)
    assert caught.value.param == f"$.token_ids[{len(flat)}]"


@pytest.mark.parametrize("length", [0, 1, CONVERT_FROM - 1, CONVERT_FROM, 5 * CONVERT_FROM])
@pytest.mark.parametrize("at", ["start", "middle", "end", None])
def test_is_flat_on_both_sides_of_the_msgspec_threshold(length: int, at: str | None) -> None:
    scalars: list[Any] = [7, 2**70, "x", None, 1.5, True]
    array = (scalars * (length // len(scalars) + 1))[:length]
    if at is None:
        assert _is_flat(array)
        assert _is_flat(tuple(array))
        return
    index = {"start": 0, "middle": length // 2, "end": length}[at]
    array.insert(index, {"a": 1})
    assert not _is_flat(array)


def test_depth_limit_on_the_legs() -> None:
    limits = Limits(max_depth=3)
    decode({"messages": [{"role": "user", "content": "hi"}]}, limits=limits)
    too_deep = {"messages": [{"role": "user", "content": [{"type": "text"}]}]}
    for build in (decode, _prefill, _encode):
        with pytest.raises(RequestError, match=r"Limits\.max_depth") as error:
            build(too_deep, limits=limits)
        assert error.value.param == "$.messages[0].content"


@pytest.mark.parametrize(
    ("member", "ok"),
    # At max_depth 3 a member may nest 2 levels; a body whose members open at most 2 brackets
    # is proved shallow without the walk (the proved token array opens one). Brackets in a
    # string only make the count high: the walk then runs and finds the body shallow.
    [
        ("[[]]", True),
        ("[[[]]]", False),
        ('"[[[[[[]]]]]]"', True),
        ("[1,2,[{}]]", False),
        ('[{"a": "{[{[{["}]', True),
        ('{"a": [{"b": "]]]]]"}]}', False),
    ],
)
def test_depth_limit_on_short_bytes_bodies(member: str, ok: bool) -> None:
    body = b'{"token_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9], "x": ' + member.encode() + b"}"
    build = partial(
        build_decode_request_bytes,
        body,
        client_path="/inference/v1/generate",
        params=GENERATE_LEG,
        inputs=LegInputs(limits=Limits(max_depth=3)),
    )
    if ok:
        build()
        return
    with pytest.raises(RequestError, match=r"Limits\.max_depth") as error:
        build()
    assert (error.value.param or "").startswith("$.x")


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _holds_a_bracket(value: object) -> bool:
    """Whether a string of ``value`` (a key too) holds a bracket."""
    if isinstance(value, str):
        return any(bracket in value for bracket in "[]{}")
    if isinstance(value, dict):
        return any(map(_holds_a_bracket, value)) or any(map(_holds_a_bracket, value.values()))
    return isinstance(value, list) and any(map(_holds_a_bracket, value))


# Compact with raw UTF-8, escaped non-ASCII with spaces, indented: each writes the same value.
_WRITERS = (
    lambda value: json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode(),
    lambda value: json.dumps(value).encode(),
    lambda value: json.dumps(value, indent=1).encode(),
)
_deep_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=2) | st.dictionaries(st.text(), children),
    max_leaves=30,
)


@given(
    json_values | _deep_values, st.integers(min_value=0, max_value=10), st.sampled_from(_WRITERS)
)
def test_the_depth_read_from_bytes_is_the_values_depth(value: Any, limit: int, write: Any) -> None:
    # Never within when the value is deeper (the walk it replaces would refuse); exact unless a
    # string holds a bracket, where the walk decides.
    within = nesting_within(write(value), limit)
    if within:
        assert _depth(value) <= limit
    if not _holds_a_bracket(value):
        assert within == (_depth(value) <= limit)


_WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": 'Weather in a city, "quoted" \\ and \\" escaped',
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
# 30 tools open 180 brackets, past what the count proves at the default limit; 7 levels deep.
_MANY_TOOLS = {"messages": [{"role": "user", "content": "hi"}], "tools": [_WEATHER_TOOL] * 30}


def test_a_body_with_many_brackets_is_proved_shallow_without_the_walk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = orjson.dumps(_MANY_TOOLS)
    members = RawMembers(data, RequestError, "the client body", token_ids_key=w.TOKEN_IDS)
    assert data.count(b"[") + data.count(b"{") > DEFAULT_LIMITS.max_depth
    assert members.nests_within(7)
    assert not members.nests_within(6)

    def walked(*_args: object, **_kwargs: object) -> None:
        msg = "walked"
        raise AssertionError(msg)

    monkeypatch.setattr(_limits, "check_depth", walked)
    check_client_body(members, DEFAULT_LIMITS)
    with pytest.raises(AssertionError, match="walked"):
        check_client_body(members, Limits(max_depth=6))


@pytest.mark.parametrize("description", ["plain", "a [bracket] in a string"])
def test_a_body_with_many_brackets_is_refused_where_the_dict_path_refuses(
    description: str,
) -> None:
    tool = {
        "type": "function",
        "function": {**_WEATHER_TOOL["function"], "description": description},
    }
    deeper = {"type": "function", "function": {"name": "f", "parameters": {"a": [[{}]]}}}
    body = {**_MANY_TOOLS, "tools": [*([tool] * 29), deeper]}
    refusals = []
    for build in (_decode_dict, _decode_bytes):
        for limits in (Limits(max_depth=6), Limits(max_depth=7)):
            with pytest.raises(RequestError, match=r"Limits\.max_depth") as error:
                build(body, limits=limits)
            refusals.append((error.value.param, str(error.value)))
        build(body, limits=Limits(max_depth=8))
    assert refusals[:2] == refusals[2:]
    assert refusals[1][0] == "$.tools[29].function.parameters.a[0][0]"


# A client with tools: its decode leg parses them (auto is derender).
_TOOLS_LEG = DecodeParams(use_openai_format=False, output_mode=OutputMode.AUTO)


def _decode_dict(body: dict[str, Any], *, limits: Limits) -> Any:
    inputs = LegInputs(token_ids=[1, 2], limits=limits)
    return build_decode_request(body, client_path=CHAT, params=_TOOLS_LEG, inputs=inputs)


def _decode_bytes(body: dict[str, Any], *, limits: Limits) -> Any:
    inputs = LegInputs(token_ids=[1, 2], limits=limits)
    data = orjson.dumps(body)
    return build_decode_request_bytes(data, client_path=CHAT, params=_TOOLS_LEG, inputs=inputs)


def test_depth_limit_counts_token_ids_the_scan_did_not_prove() -> None:
    with pytest.raises(RequestError, match=r"Limits\.max_depth") as error:
        build_decode_request_bytes(
            b'{"token_ids": [[[1]]]}',
            client_path="/inference/v1/generate",
            params=GENERATE_LEG,
            inputs=LegInputs(limits=Limits(max_depth=3)),
        )
    assert error.value.param == "$.token_ids[0][0]"


def _prefill(body: dict[str, Any], **kwargs: Any) -> Any:
    return build_prefill_request(
        body,
        client_path=CHAT,
        params=PrefillParams(use_openai_format=False),
        inputs=LegInputs(token_ids=[1], **kwargs),
    )


def _encode(body: dict[str, Any], **kwargs: Any) -> Any:
    return build_encode_request(
        body, client_path=CHAT, params=EncodeParams(), inputs=LegInputs(**kwargs)
    )


def test_depth_limit_on_a_response() -> None:
    ok = {"output_mode": "text", "x": nested(127)}
    check_output_mode_echo(ok, OutputMode.TEXT)
    with pytest.raises(UpstreamContractError, match=r"Limits\.max_depth"):
        check_output_mode_echo({"output_mode": "text", "x": nested(128)}, OutputMode.TEXT)


def test_body_size_at_the_limit_and_past() -> None:
    limits = Limits(max_body_bytes=10)
    check_body_size(b"x" * 10, limits, error=RequestError)
    with pytest.raises(UpstreamContractError, match=r"11 bytes, over the limit of 10") as error:
        check_body_size(b"x" * 11, limits, error=UpstreamContractError)
    assert error.value.param == "$"


@pytest.mark.parametrize("where", ["router", "generate client", "completions prompt"])
def test_token_count_at_the_limit_and_past(where: str) -> None:
    limits = Limits(max_token_ids=4)

    def build(count: int) -> Any:
        ids = list(range(count))
        if where == "router":
            return decode({}, limits=limits) if count == 2 else decode_ids(ids, limits)
        if where == "generate client":
            return build_decode_request(
                {"token_ids": ids},
                client_path="/inference/v1/generate",
                params=GENERATE_LEG,
                limits=limits,
            )
        return build_decode_request(
            {"prompt": "x"},
            client_path="/v1/completions",
            params=DecodeParams(),
            token_ids=ids,
            limits=limits,
        )

    build(4)
    with pytest.raises(RequestError, match=r"5 token IDs, over the limit of 4") as error:
        build(5)
    assert error.value.param in ("$.token_ids", "$.prompt")


def decode_ids(ids: list[int], limits: Limits) -> Any:
    return build_decode_request(
        {}, client_path=CHAT, params=GENERATE_LEG, token_ids=ids, limits=limits
    )


@pytest.mark.parametrize(("key", "path"), [("n", "$.n"), ("sampling", "$.sampling_params.n")])
def test_n_in_range(key: str, path: str) -> None:
    def body(n: object) -> dict[str, Any]:
        return {"n": n} if key == "n" else {"sampling_params": {"n": n}}

    for good in (1, 16384, 16384.0):
        decode(body(good))
    for bad in (0, 16385, -1, 2**64, True, "2", 1.5):
        with pytest.raises(RequestError) as error:
            decode(body(bad))
        assert error.value.param == path
    decode(body(8), limits=Limits(max_n=8))
    with pytest.raises(RequestError, match="at most 8"):
        decode(body(9), limits=Limits(max_n=8))


_N_VALUES = st.one_of(
    st.integers(min_value=-3, max_value=20),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([None, True, False, "2", [1], {"n": 1}, 16384, 16385, 2**64]),
)


@given(_N_VALUES, _N_VALUES, st.integers(min_value=1, max_value=20))
def test_the_common_n_is_the_general_rule(n: object, nested: object, max_n: int) -> None:
    # check_client_body takes an int in range without the rule's call: the same outcome as
    # whole_number, for n at the top level and in sampling_params (docs/performance.md).
    limits = Limits(max_n=max_n)

    def outcome(check: Any) -> object:
        try:
            check()
        except RequestError as error:
            return (str(error), error.param)
        return None

    body = {"n": n, "sampling_params": {"n": nested}}
    expected = (
        outcome(lambda: whole_number(n, "$.n", minimum=1, maximum=max_n)) if n is not None else None
    )
    if expected is None and nested is not None:
        path = "$.sampling_params.n"
        expected = outcome(lambda: whole_number(nested, path, minimum=1, maximum=max_n))
    assert outcome(lambda: check_client_body(body, limits)) == expected


def test_cache_salt_length_and_characters() -> None:
    decode({"cache_salt": "a"})
    decode({"cache_salt": "s" * 128})
    for bad in ("", "s" * 129, "a@b", "a/b", "a\\b", "a\x00b", 7, ["x"]):
        with pytest.raises(RequestError) as error:
            decode({"cache_salt": bad})
        assert error.value.param == "$.cache_salt"
        assert "got" in str(error.value)


@pytest.mark.parametrize(
    "length", [2**63, 2**64, 10**18, 10**5000], ids=["2^63", "2^64", "1e18", "1e5000"]
)
def test_an_attacker_sized_placeholder_length_is_refused_without_allocating(length: int) -> None:
    features = {
        "mm_hashes": {"image": ["h"]},
        "mm_placeholders": {"image": [{"offset": 0, "length": length}]},
    }
    start = time.perf_counter()
    with pytest.raises(RequestError) as error:
        decode({}, features=features)
    assert time.perf_counter() - start < 1.0
    assert error.value.param == "$.features.mm_placeholders.image[0].length"


def test_a_placeholder_at_the_end_of_the_prompt_passes_and_one_past_fails() -> None:
    def span(offset: int, length: int) -> dict[str, Any]:
        return {
            "mm_hashes": {"image": ["h"]},
            "mm_placeholders": {"image": [{"offset": offset, "length": length}]},
        }

    decode({}, features=span(0, 2))
    with pytest.raises(RequestError):
        decode({}, features=span(0, 3))
    with pytest.raises(RequestError):
        decode({}, features=span(2, 0))


def test_caps_at_int64_and_past() -> None:
    top = 2**63 - 1
    assert apply_sampling_caps({"max_tokens": top}, Route.CHAT_COMPLETIONS) == {
        "sampling_params": {"max_tokens": top}
    }
    with pytest.raises(RequestError, match="at most") as error:
        apply_sampling_caps({"max_tokens": top + 1}, Route.CHAT_COMPLETIONS)
    assert error.value.param == "$.max_tokens"


# Messages name the field and the value (kills mutmut's message mutants in echo.py).


def test_echo_messages_name_what_came_back() -> None:
    with pytest.raises(UpstreamContractError, match=r"must be a JSON object, got an array"):
        check_output_mode_echo([], OutputMode.TEXT)  # type: ignore[arg-type]
    with pytest.raises(UpstreamContractError, match=r"the worker answered \"tokens\""):
        check_output_mode_echo({"output_mode": "tokens"}, OutputMode.TEXT)
    with pytest.raises(UpstreamContractError, match=r'no output_mode \(read as "tokens"\)'):
        check_output_mode_echo({"choices": []}, OutputMode.DERENDER)
    with pytest.raises(UpstreamContractError, match=r"is not a generate response at all"):
        check_output_mode_echo({}, OutputMode.DERENDER)
    with pytest.raises(ConfigError, match=r"expected one of tokens, text, derender, got \"bogus\""):
        check_output_mode_echo({}, "bogus")  # type: ignore[arg-type]


# Exact messages: each names the limit, the JSON path and the value.


def test_body_size_message_names_the_limit() -> None:
    with pytest.raises(RequestError) as error:
        check_body_size(b"x" * 11, Limits(max_body_bytes=10), error=RequestError)
    assert error.value.message == (
        "$: the body is 11 bytes, over the limit of 10 (Limits.max_body_bytes)"
    )


def test_token_count_message_names_the_limit() -> None:
    with pytest.raises(RequestError) as error:
        decode_ids([1] * 5, Limits(max_token_ids=4))
    assert error.value.message == (
        "$.token_ids: 5 token IDs, over the limit of 4 (Limits.max_token_ids)"
    )


_LENGTH = "expected 1 to 128 characters (vLLM's cache_salt limit)"
_FORBIDDEN = "(vLLM refuses @, /, \\ and NUL)"


@pytest.mark.parametrize(
    ("salt", "message"),
    [
        (7, "expected a string, got 7 (an integer)"),
        (["x"], "expected a string, got an array of 1 items"),
        ("", f'{_LENGTH}, got "" (a string)'),
        ("s" * 129, f'{_LENGTH}, got "{"s" * 60}\\u2026" (a string)'),
        ("a@b", f"must not contain '@' {_FORBIDDEN}, got \"a@b\" (a string)"),
        ("a/b", f"must not contain '/' {_FORBIDDEN}, got \"a/b\" (a string)"),
        ("a\\b", f"must not contain '\\\\' {_FORBIDDEN}, got \"a\\\\b\" (a string)"),
        ("a\x00b", f"must not contain '\\x00' {_FORBIDDEN}, got \"a\\u0000b\" (a string)"),
    ],
)
def test_cache_salt_messages_name_the_rule_and_the_value(salt: object, message: str) -> None:
    with pytest.raises(RequestError) as error:
        check_client_body({"cache_salt": salt}, DEFAULT_LIMITS)
    assert error.value.message == f"$.cache_salt: {message}"
    assert error.value.param == "$.cache_salt"


def test_bytes_entry_points_hold_the_body_size_limit_at_and_past() -> None:
    body = b'{"token_ids":[1,2,3],"sampling_params":{},"max_tokens":5}'
    params = DecodeParams(use_openai_format=False)
    at_limit = Limits(max_body_bytes=len(body))
    leg = build_decode_request_bytes(
        body, client_path="/inference/v1/generate", params=params, inputs=LegInputs(limits=at_limit)
    )
    assert b'"max_tokens":5' in leg.body
    with pytest.raises(RequestError) as caught:
        build_decode_request_bytes(
            body,
            client_path="/inference/v1/generate",
            params=params,
            inputs=LegInputs(limits=Limits(max_body_bytes=len(body) - 1)),
        )
    assert caught.value.param == "$"
    assert "Limits.max_body_bytes" in str(caught.value)
    assert caught.value.status_hint == 413

    answer = (
        b'{"request_id":"generate-tokens-r","model":"m","created":1,"output_mode":"text",'
        b'"choices":[{"index":0,"finish_reason":"stop","text":"hi"}]}'
    )
    wrapped = wrap_chat_completion_bytes(
        answer,
        requested=OutputMode.TEXT,
        options=EnvelopeOptions(limits=Limits(max_body_bytes=len(answer))),
    )
    assert b'"content":"hi"' in wrapped
    with pytest.raises(UpstreamContractError) as caught_upstream:
        wrap_chat_completion_bytes(
            answer,
            requested=OutputMode.TEXT,
            options=EnvelopeOptions(limits=Limits(max_body_bytes=len(answer) - 1)),
        )
    assert caught_upstream.value.param == "$"


@pytest.mark.parametrize("spaces", [b"", b"  "])
def test_bytes_decode_leg_holds_the_token_count_at_and_past(spaces: bytes) -> None:
    # The bytes path counts the scanned token array without decoding it.
    body = b'{"token_ids":[1,' + spaces + b'22,333],"sampling_params":{}}'
    params = DecodeParams(use_openai_format=False)
    leg = build_decode_request_bytes(
        body,
        client_path="/inference/v1/generate",
        params=params,
        inputs=LegInputs(limits=Limits(max_token_ids=3)),
    )
    assert b"[1," + spaces + b"22,333]" in leg.body
    with pytest.raises(RequestError) as caught:
        build_decode_request_bytes(
            body,
            client_path="/inference/v1/generate",
            params=params,
            inputs=LegInputs(limits=Limits(max_token_ids=2)),
        )
    assert (
        str(caught.value) == "$.token_ids: 3 token IDs, over the limit of 2 (Limits.max_token_ids)"
    )


def test_bytes_token_count_shortcut_is_exact_at_its_bound() -> None:
    # "[1,2,3]" is the shortest 3-ID array (2N + 1 bytes): the byte-length shortcut must still
    # count it against a limit of 2.
    body = b'{"token_ids":[1,2,3],"sampling_params":{}}'
    with pytest.raises(RequestError, match="3 token IDs, over the limit of 2"):
        build_decode_request_bytes(
            body,
            client_path="/inference/v1/generate",
            params=DecodeParams(use_openai_format=False),
            inputs=LegInputs(limits=Limits(max_token_ids=2)),
        )

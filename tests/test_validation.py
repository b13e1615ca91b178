from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from disagg_transforms import (
    DecodeParams,
    RequestError,
    build_decode_request,
    build_decode_request_bytes,
    parse_pipeline_params,
)
from disagg_transforms._wire import validate
from disagg_transforms._wire.validate import CONVERT_FROM, features, token_ids
from disagg_transforms.exchange import ClientReply, Exchange

GENERATE = "/inference/v1/generate"


def test_token_ids_plain_ints_pass_without_copy() -> None:
    ids = [0, 1, 2**63 - 1]
    assert token_ids(ids) is ids


def test_token_ids_whole_floats_become_ints() -> None:
    result = token_ids([1, 5.0])
    assert result == [1, 5]
    assert all(type(item) is int for item in result)


@pytest.mark.parametrize("bad", [True, 1.5, "3", None, -1, 2**63, 1e19, [1], {"a": 1}], ids=repr)
def test_token_ids_bad_item_names_its_index(bad: object) -> None:
    with pytest.raises(RequestError) as caught:
        token_ids([1, 2, 3, bad])
    assert caught.value.param == "$.token_ids[3]"


_ITEMS = st.one_of(
    st.integers(-3, 2**64),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.just(2**63 - 1),
)


@given(items=st.lists(_ITEMS, max_size=20), padding=st.sampled_from([0, CONVERT_FROM]))
def test_token_ids_fast_path_agrees_with_an_item_by_item_check(
    items: list[Any], padding: int
) -> None:
    ids = [7] * padding + items  # long enough, or not, for the msgspec check
    first_bad = next(
        (
            index
            for index, item in enumerate(ids)
            if isinstance(item, bool)
            or not (isinstance(item, int) or (isinstance(item, float) and item.is_integer()))
            or not 0 <= item <= 2**63 - 1
        ),
        None,
    )
    if first_bad is not None:
        with pytest.raises(RequestError) as caught:
            token_ids(ids)
        assert caught.value.param == f"$.token_ids[{first_bad}]"
        return
    result = token_ids(ids)
    assert result == ids
    assert all(type(item) is int for item in result)
    assert (result is ids) == all(type(item) is int for item in ids)


@pytest.mark.parametrize("bad", ["123", None, 5, {"a": 1}])
def test_token_ids_not_a_list(bad: object) -> None:
    with pytest.raises(RequestError) as caught:
        token_ids(bad)
    assert caught.value.param == "$.token_ids"


def _features(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "mm_hashes": {"image": ["h0", "h1"]},
        "mm_placeholders": {"image": [{"offset": 1, "length": 2}, {"offset": 4, "length": 1}]},
        "kwargs_data": {"image": ["b64", None]},
    }
    base.update(overrides)
    return base


def test_valid_features_pass_unchanged() -> None:
    value = _features()
    assert features(value, 5) is value


def test_span_ending_exactly_at_the_prompt_end_is_allowed() -> None:
    value = _features(
        mm_placeholders={"image": [{"offset": 0, "length": 3}, {"offset": 3, "length": 2}]}
    )
    assert features(value, 5) is value


@pytest.mark.parametrize(
    ("overrides", "n", "param"),
    [
        (
            {
                "mm_placeholders": {
                    "image": [{"offset": 1, "length": 2}, {"offset": 5, "length": 1}]
                }
            },
            5,
            "$.features.mm_placeholders.image[1].offset",
        ),
        (
            {
                "mm_placeholders": {
                    "image": [{"offset": 1, "length": 2}, {"offset": 4, "length": 2}]
                }
            },
            5,
            "$.features.mm_placeholders.image[1].length",
        ),
        (
            {
                "mm_placeholders": {
                    "image": [{"offset": -1, "length": 2}, {"offset": 4, "length": 1}]
                }
            },
            5,
            "$.features.mm_placeholders.image[0].offset",
        ),
        (
            {
                "mm_placeholders": {
                    "image": [{"offset": 1, "length": -2}, {"offset": 4, "length": 1}]
                }
            },
            5,
            "$.features.mm_placeholders.image[0].length",
        ),
        (
            {
                "mm_placeholders": {
                    "image": [
                        {"offset": 1, "length": 2},
                        {"offset": 2, "length": 2},
                        {"offset": 2, "length": 1.5},
                    ]
                }
            },
            5,
            "$.features.mm_placeholders.image",
        ),
        (
            {"mm_placeholders": {"image": [{"offset": 1, "length": 2}]}},
            5,
            "$.features.mm_placeholders.image",
        ),
        ({"kwargs_data": {"image": ["b64"]}}, 5, "$.features.kwargs_data.image"),
        ({"kwargs_data": {"image": ["b64", ""]}}, 5, "$.features.kwargs_data.image[1]"),
        ({"kwargs_data": {"image": ["b64", 3]}}, 5, "$.features.kwargs_data.image[1]"),
        ({"kwargs_data": []}, 5, "$.features.kwargs_data"),
        ({"mm_hashes": {"image": ["h0", 7]}}, 5, "$.features.mm_hashes.image[1]"),
        ({"mm_hashes": {"image": "h0"}}, 5, "$.features.mm_hashes.image"),
        ({"mm_hashes": []}, 5, "$.features.mm_hashes"),
        ({"mm_placeholders": None}, 5, "$.features.mm_placeholders"),
        (
            {"mm_placeholders": {"image": [{"offset": 1, "length": 2}, 3]}},
            5,
            "$.features.mm_placeholders.image[1]",
        ),
        (
            {
                "mm_placeholders": {
                    "image": [{"offset": 1, "length": 2}, {"offset": 4, "length": 1}],
                    "audio": [],
                }
            },
            5,
            "$.features.mm_placeholders.audio",
        ),
    ],
)
def test_bad_features_name_the_path(overrides: dict[str, Any], n: int, param: str) -> None:
    with pytest.raises(RequestError) as caught:
        features(_features(**overrides), n)
    assert caught.value.param == param


def test_features_not_an_object() -> None:
    with pytest.raises(RequestError) as caught:
        features([], 5)
    assert caught.value.param == "$.features"


# ---- through the builder: a generate client's own fields are validated too ----


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"token_ids": [1, True], "sampling_params": {}}, "$.token_ids[1]"),
        (
            {"token_ids": [1, 2], "sampling_params": {"temperature": "hot"}},
            "$.sampling_params.temperature",
        ),
        ({"token_ids": [1, 2], "sampling_params": {"stop": [1]}}, "$.sampling_params.stop[0]"),
        ({"token_ids": [1, 2], "sampling_params": {}, "priority": "high"}, "$.priority"),
        ({"token_ids": [1, 2], "sampling_params": {}, "stream": "yes"}, "$.stream"),
        (
            {
                "token_ids": [1, 2],
                "sampling_params": {},
                "features": {
                    "mm_hashes": {"image": ["h"]},
                    "mm_placeholders": {"image": [{"offset": 2, "length": 1}]},
                },
            },
            "$.features.mm_placeholders.image[0].offset",
        ),
        ({"token_ids": [], "sampling_params": {}}, "$.token_ids"),
        ({"sampling_params": {}}, "$.token_ids"),
    ],
)
def test_generate_client_body_errors_carry_the_path(body: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as caught:
        build_decode_request(body, client_path=GENERATE, params=DecodeParams())
    assert caught.value.param == param


def test_type_error_message_names_the_bad_value() -> None:
    with pytest.raises(RequestError) as caught:
        build_decode_request(
            {"token_ids": [1], "sampling_params": {"temperature": "hot"}},
            client_path=GENERATE,
            params=DecodeParams(),
        )
    assert '"hot"' in caught.value.message


@pytest.mark.parametrize("bad", [[], "x", 3, None])
def test_non_object_client_body_is_refused(bad: object) -> None:
    with pytest.raises(RequestError) as caught:
        build_decode_request(bad, client_path=GENERATE, params=DecodeParams())  # type: ignore[arg-type]
    assert caught.value.param == "$"


@pytest.mark.parametrize(
    ("body", "path", "params"),
    [
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "logit_bias": {"7": "x"},
            },
            "$.logit_bias",
            DecodeParams(use_openai_format=False),
        ),
        (
            {"token_ids": [1], "sampling_params": {"logit_bias": {"1": [2]}}},
            "$.sampling_params.logit_bias",
            DecodeParams(),
        ),
    ],
)
def test_a_bad_value_under_an_object_key_is_reported_at_a_real_json_path(
    body: dict[str, Any], path: str, params: DecodeParams
) -> None:
    # msgspec hides a dict's key as "[...]"; the error names the object, a path a client can use.
    client_path = "/v1/chat/completions" if "messages" in body else "/inference/v1/generate"
    with pytest.raises(RequestError) as caught:
        build_decode_request(body, client_path=client_path, params=params, token_ids=[1])
    assert caught.value.param == path
    assert caught.value.message.startswith(f"{path}: ")
    assert "[...]" not in caught.value.message


@given(key=st.text(max_size=6), value=st.text() | st.lists(st.integers(), max_size=2))
def test_any_bad_logit_bias_value_names_the_object(key: str, value: object) -> None:
    body = {"token_ids": [1], "sampling_params": {"logit_bias": {key: value}}}
    with pytest.raises(RequestError) as caught:
        build_decode_request(body, client_path="/inference/v1/generate", params=DecodeParams())
    assert caught.value.param == "$.sampling_params.logit_bias"


# A body that is JSON but no object is named by its JSON type, in words.


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (b"[1, 2]", "an array"),
        (b" \n [ ]", "an array"),
        (b'"x"', "a string"),
        (b"42", "a number"),
        (b"-1.5e3", "a number"),
        (b"true", "a boolean"),
        (b"false", "a boolean"),
        (b"null", "null"),
    ],
)
def test_a_body_that_is_no_object_is_named_by_its_json_type(body: bytes, kind: str) -> None:
    expected = f"$: the client body must be a JSON object, got {kind}"
    with pytest.raises(RequestError) as error:
        build_decode_request_bytes(body, client_path="/v1/chat/completions", params=DecodeParams())
    assert error.value.message == expected
    ex = Exchange(parse_pipeline_params({"decode": {}}), "/v1/chat/completions", [], body)
    reply = ex.next_event()
    assert isinstance(reply, ClientReply)
    assert (reply.status, json.loads(reply.body)["error"]["message"]) == (400, expected)


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner),
    max_leaves=6,
)


@pytest.mark.parametrize(
    "view",
    [
        bool,
        float,
        str,
        validate.ARRAY,
        validate.STRINGS,
        validate.OBJECT,
        validate.STRING_OR_STRINGS,
        validate.STRING_OR_OBJECT,
    ],
)
@given(value=_JSON_VALUES)
def test_a_typed_read_accepts_what_msgspec_accepts(view: Any, value: object) -> None:
    # The typed reads take a value of the exact types without msgspec (docs/bytes.md): they
    # must accept and refuse exactly what msgspec does (null reads as not set).
    if value is None:
        assert validate.typed({"key": value}, "key", view) is None
        return
    try:
        msgspec.convert(value, view)
    except msgspec.ValidationError:
        with pytest.raises(RequestError, match=r"^\$\.key"):
            validate.typed({"key": value}, "key", view)
    else:
        assert validate.typed({"key": value}, "key", view) is value


def test_a_client_body_with_a_key_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(RequestError, match="expected string keys") as error:
        validate.client_object({"model": "m", 1: 2})
    assert error.value.param == "$"


def test_an_object_is_read_as_sent_and_anything_else_is_refused_at_its_path() -> None:
    inner = {"a": 1}
    assert validate.obj({"k": inner}, "k", "$.outer") is inner
    assert validate.obj({"k": None}, "k") is None
    assert validate.obj({}, "k") is None
    for bad in ([inner], "x", 0, False):
        with pytest.raises(RequestError) as caught:
            validate.obj({"k": bad}, "k", "$.outer")
        assert caught.value.param == "$.outer.k"
        assert caught.value.message.startswith("$.outer.k: expected an object, got")

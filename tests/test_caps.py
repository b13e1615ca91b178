from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from strategies import cap_bodies

from disagg_transforms import (
    TOP_LEVEL_CAPS,
    RequestError,
    Route,
    apply_sampling_caps,
    apply_single_token_cap,
)


def test_chat_max_completion_tokens_wins_and_both_leave_the_top_level() -> None:
    body = {"max_completion_tokens": 200, "max_tokens": 50, "model": "m"}
    result = apply_sampling_caps(body, Route.CHAT_COMPLETIONS)
    assert result == {"model": "m", "sampling_params": {"max_tokens": 200}}


def test_chat_null_max_completion_tokens_falls_back_to_max_tokens() -> None:
    body = {"max_completion_tokens": None, "max_tokens": 50}
    assert apply_sampling_caps(body, Route.CHAT_COMPLETIONS) == {
        "sampling_params": {"max_tokens": 50}
    }


@pytest.mark.parametrize(
    ("route", "key"),
    [
        (Route.COMPLETIONS, "max_tokens"),
        (Route.MESSAGES, "max_tokens"),
        (Route.RESPONSES, "max_output_tokens"),
    ],
)
def test_each_route_reads_its_own_cap(route: Route, key: str) -> None:
    body = {"max_tokens": 7, "max_output_tokens": 9, "max_completion_tokens": 11}
    expected = body[key]
    assert apply_sampling_caps(body, route) == {"sampling_params": {"max_tokens": expected}}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"max_completion_tokens": 3, "max_tokens": 4, "max_output_tokens": 5}, 3),
        ({"max_tokens": 4, "max_output_tokens": 5}, 4),
        ({"max_output_tokens": 5}, 5),
    ],
)
def test_generate_top_level_precedence(body: dict[str, Any], expected: int) -> None:
    result = apply_sampling_caps(body, Route.GENERATE)
    assert result == {"sampling_params": {"max_tokens": expected}}


def test_existing_sampling_params_max_tokens_wins() -> None:
    body = {"max_tokens": 9, "sampling_params": {"max_tokens": 50, "temperature": 0.5}}
    result = apply_sampling_caps(body, Route.GENERATE)
    assert result == {"sampling_params": {"max_tokens": 50, "temperature": 0.5}}


def test_min_tokens_moves_with_the_cap() -> None:
    result = apply_sampling_caps({"max_tokens": 10, "min_tokens": 3}, Route.COMPLETIONS)
    assert result == {"sampling_params": {"max_tokens": 10, "min_tokens": 3}}


def test_min_tokens_above_the_cap_names_both() -> None:
    with pytest.raises(RequestError) as caught:
        apply_sampling_caps({"max_tokens": 2, "min_tokens": 3}, Route.COMPLETIONS)
    assert "min_tokens" in caught.value.message
    assert "max_tokens" in caught.value.message
    assert caught.value.param == "$.min_tokens"


@pytest.mark.parametrize("body", [{}, {"max_tokens": None}, {"max_output_tokens": None}])
def test_null_or_absent_cap_writes_no_max_tokens(body: dict[str, Any]) -> None:
    assert apply_sampling_caps(body, Route.RESPONSES) == {"sampling_params": {}}


def test_whole_float_is_accepted_as_int() -> None:
    result = apply_sampling_caps({"max_tokens": 50.0}, Route.COMPLETIONS)
    assert result["sampling_params"]["max_tokens"] == 50
    assert type(result["sampling_params"]["max_tokens"]) is int


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, False, "10", [], {}])
def test_bad_caps_are_refused_with_the_path(bad: object) -> None:
    with pytest.raises(RequestError) as caught:
        apply_sampling_caps({"max_tokens": bad}, Route.COMPLETIONS)
    assert caught.value.param == "$.max_tokens"


def test_bad_existing_sampling_params_cap_is_refused() -> None:
    with pytest.raises(RequestError) as caught:
        apply_sampling_caps({"sampling_params": {"max_tokens": 0}}, Route.GENERATE)
    assert caught.value.param == "$.sampling_params.max_tokens"


@pytest.mark.parametrize("bad", [[], "x", 3])
def test_non_object_sampling_params_is_refused(bad: object) -> None:
    with pytest.raises(RequestError) as caught:
        apply_sampling_caps({"sampling_params": bad}, Route.GENERATE)
    assert caught.value.param == "$.sampling_params"


def test_non_object_body_is_refused() -> None:
    with pytest.raises(RequestError) as caught:
        apply_sampling_caps([], Route.GENERATE)  # type: ignore[arg-type]
    assert caught.value.param == "$"


@given(cap_bodies)
def test_caps_are_idempotent_and_leave_no_top_level_cap(body: dict[str, Any]) -> None:
    for route in Route:
        before = copy.deepcopy(body)
        try:
            once = apply_sampling_caps(body, route)
        except RequestError:
            continue
        assert body == before
        assert not any(key in once for key in (*TOP_LEVEL_CAPS, "min_tokens"))
        assert isinstance(once["sampling_params"], dict)
        assert apply_sampling_caps(once, route) == once


# ---- single-token rewrite (prefill and encode) ----


def test_single_token_chat() -> None:
    body = {
        "model": "m",
        "max_tokens": 100,
        "max_completion_tokens": 100,
        "min_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.3,
    }
    result = apply_single_token_cap(body, Route.CHAT_COMPLETIONS)
    assert result == {
        "model": "m",
        "max_tokens": 1,
        "max_completion_tokens": 1,
        "stream": False,
        "temperature": 0.3,
    }


def test_single_token_chat_does_not_add_max_completion_tokens() -> None:
    result = apply_single_token_cap({"model": "m"}, Route.CHAT_COMPLETIONS)
    assert result == {"model": "m", "max_tokens": 1, "stream": False}


@pytest.mark.parametrize("route", [Route.COMPLETIONS, Route.MESSAGES])
def test_single_token_max_tokens_routes(route: Route) -> None:
    result = apply_single_token_cap({"max_tokens": 500, "min_tokens": 2}, route)
    assert result == {"max_tokens": 1, "stream": False}


def test_single_token_responses_caps_max_output_tokens() -> None:
    result = apply_single_token_cap({"max_output_tokens": 500}, Route.RESPONSES)
    assert result == {"max_output_tokens": 1, "stream": False}


def test_single_token_generate_creates_sampling_params() -> None:
    result = apply_single_token_cap({"token_ids": [1]}, Route.GENERATE)
    assert result == {"token_ids": [1], "stream": False, "sampling_params": {"max_tokens": 1}}


def test_single_token_generate_keeps_other_sampling_keys() -> None:
    body = {
        "max_tokens": 9,
        "min_tokens": 1,
        "sampling_params": {"max_tokens": 50, "min_tokens": 3, "extra_args": {"a": 1}},
        "stream_options": {"include_usage": True},
    }
    result = apply_single_token_cap(body, Route.GENERATE)
    assert result == {
        "stream": False,
        "sampling_params": {"max_tokens": 1, "extra_args": {"a": 1}},
    }


# ---- boundaries and exact messages ----


@pytest.mark.parametrize("route", list(Route))
def test_a_cap_of_one_is_the_smallest_accepted(route: Route) -> None:
    key = "max_output_tokens" if route is Route.RESPONSES else "max_tokens"
    assert apply_sampling_caps({key: 1}, route) == {"sampling_params": {"max_tokens": 1}}
    with pytest.raises(RequestError) as caught:
        apply_sampling_caps({key: 0}, route)
    assert caught.value.message == f"$.{key}: expected an integer at least 1, got 0 (an integer)"


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"min_tokens": -1}, "$.min_tokens"),
        ({"sampling_params": {"min_tokens": -1}}, "$.sampling_params.min_tokens"),
    ],
)
def test_min_tokens_zero_passes_and_a_negative_is_refused(body: dict[str, Any], path: str) -> None:
    zero = {"min_tokens": 0} if "min_tokens" in body else {"sampling_params": {"min_tokens": 0}}
    assert apply_sampling_caps(zero, Route.COMPLETIONS) == {"sampling_params": {"min_tokens": 0}}
    with pytest.raises(RequestError) as caught:
        apply_sampling_caps(body, Route.COMPLETIONS)
    assert caught.value.param == path
    assert caught.value.message == f"{path}: expected an integer at least 0, got -1 (an integer)"


def test_min_tokens_equal_to_the_cap_passes_and_one_more_is_refused() -> None:
    body = {"max_tokens": 2, "min_tokens": 2}
    assert apply_sampling_caps(body, Route.COMPLETIONS) == {
        "sampling_params": {"max_tokens": 2, "min_tokens": 2}
    }
    with pytest.raises(RequestError) as caught:
        apply_sampling_caps({"max_tokens": 2, "min_tokens": 3}, Route.COMPLETIONS)
    assert caught.value.message == (
        "$.min_tokens: min_tokens 3 (an integer) exceeds the output cap max_tokens 2 ($.max_tokens)"
    )
    with pytest.raises(RequestError) as caught:
        apply_sampling_caps({"sampling_params": {"max_tokens": 2, "min_tokens": 3}}, Route.GENERATE)
    assert caught.value.message == (
        "$.sampling_params.min_tokens: min_tokens 3 (an integer) exceeds the output cap "
        "max_tokens 2 ($.sampling_params.max_tokens)"
    )


def test_single_token_non_object_body_is_refused() -> None:
    with pytest.raises(RequestError) as caught:
        apply_single_token_cap([], Route.COMPLETIONS)  # type: ignore[arg-type]
    assert caught.value.param == "$"
    assert caught.value.message == "$: expected an object, got an array of 0 items"

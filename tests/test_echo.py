from __future__ import annotations

import copy
from typing import Any

import pytest
from golden import load_fixture
from hypothesis import given
from strategies import json_values

from disagg_transforms import ConfigError, OutputMode, UpstreamContractError, check_output_mode_echo


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        ("response-text.json", OutputMode.TEXT),
        ("response-derender-text.json", OutputMode.DERENDER),
        ("response-tokens.json", OutputMode.TOKENS),
    ],
)
def test_matching_echo_passes(name: str, mode: OutputMode) -> None:
    check_output_mode_echo(load_fixture(name), mode)


def test_missing_echo_reads_as_tokens() -> None:
    check_output_mode_echo({"choices": []}, OutputMode.TOKENS)
    with pytest.raises(UpstreamContractError) as caught:
        check_output_mode_echo({"choices": []}, OutputMode.TEXT)
    error = caught.value
    assert error.status_hint == 502
    assert error.param == "$.output_mode"
    assert 'requested "text"' in error.message
    assert "no output_mode" in error.message
    assert "predates output_mode" in error.message
    assert "vLLM >= 0.32.0" in error.message


def test_other_echo_names_both_modes() -> None:
    with pytest.raises(UpstreamContractError) as caught:
        check_output_mode_echo(load_fixture("response-tokens.json"), OutputMode.DERENDER)
    assert 'requested "derender"' in caught.value.message
    assert '"tokens"' in caught.value.message


def test_wire_string_is_accepted_as_requested_mode() -> None:
    check_output_mode_echo({"output_mode": "text"}, "text")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        check_output_mode_echo({"output_mode": "text"}, "words")  # type: ignore[arg-type]


@given(json_values)
def test_any_json_gives_none_or_a_typed_error(value: Any) -> None:
    before = copy.deepcopy(value)
    try:
        check_output_mode_echo(value, OutputMode.TEXT)
    except UpstreamContractError as error:
        assert error.param in {"$", "$.output_mode"}
    else:
        assert value["output_mode"] == "text"
    assert value == before


def test_missing_echo_message_in_full() -> None:
    with pytest.raises(UpstreamContractError) as caught:
        check_output_mode_echo({"choices": []}, OutputMode.TEXT)
    assert caught.value.message == (
        '$.output_mode: requested "text", the worker\'s response carries no output_mode '
        '(read as "tokens"): the worker predates output_mode and answers token IDs only; '
        'upgrade it ("text" needs vLLM >= 0.32.0)'
    )
    with pytest.raises(UpstreamContractError) as caught:
        check_output_mode_echo({}, OutputMode.DERENDER)
    assert caught.value.param == "$"
    assert caught.value.message == (
        '$: requested "derender", the worker\'s response is not a generate response at all '
        "(no choices, or another API's envelope): check that the leg is sent to "
        '/inference/v1/generate ("derender" needs vLLM >= 0.33.0)'
    )


def test_bad_requested_mode_is_a_config_error_on_output_mode() -> None:
    with pytest.raises(ConfigError) as caught:
        check_output_mode_echo({}, "bogus")  # type: ignore[arg-type]
    assert caught.value.param == "output_mode"
    assert caught.value.message == (
        'requested output_mode: expected one of tokens, text, derender, got "bogus" (a string)'
    )

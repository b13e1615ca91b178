from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from strategies import config_mappings, step_names

from disagg_transforms import (
    ConditionalDecodeParams,
    ConfigError,
    DecodeParams,
    EncodeParams,
    KvTransferPlacement,
    OutputMode,
    PrefillParams,
    Step,
    parse_pipeline_params,
    parse_step_params,
    validate_output_mode,
)


def test_output_mode_values_are_wire_strings() -> None:
    assert [m.value for m in OutputMode] == ["tokens", "text", "derender", "auto"]


def test_validate_output_mode_default_is_text() -> None:
    assert validate_output_mode() is OutputMode.TEXT
    assert validate_output_mode(None) is OutputMode.TEXT


@pytest.mark.parametrize("value", ["text", "derender", OutputMode.TEXT, OutputMode.DERENDER])
def test_validate_output_mode_accepts(value: object) -> None:
    assert validate_output_mode(value) == value


def test_validate_output_mode_refuses_tokens_with_reason() -> None:
    with pytest.raises(ConfigError) as caught:
        validate_output_mode("tokens")
    assert caught.value.param == "output_mode"
    assert '"tokens"' in str(caught.value)
    assert "0.32.0" in str(caught.value)
    assert "0.33.0" in str(caught.value)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("Text", '"Text"'),
        ("", '""'),
        ("derender ", '"derender "'),
        (1, "1"),
        (True, "true"),
        (["text"], "array"),
        ({"mode": "text"}, "object"),
        (1.5, "1.5"),
    ],
)
def test_validate_output_mode_refuses(value: object, shown: str) -> None:
    with pytest.raises(ConfigError) as caught:
        validate_output_mode(value)
    assert caught.value.param == "output_mode"
    assert "output_mode" in str(caught.value)
    assert shown in str(caught.value)


@pytest.mark.parametrize(
    ("step", "cls", "expected"),
    [
        ("encode", EncodeParams, {"use_openai_format": True}),
        (
            "prefill",
            PrefillParams,
            {"use_openai_format": True, "kv_transfer_placement": KvTransferPlacement.BOTH},
        ),
        (
            "decode",
            DecodeParams,
            {
                "use_openai_format": True,
                "output_mode": OutputMode.TEXT,
                "wrap_chat_completion": False,
                "kv_transfer_placement": KvTransferPlacement.BOTH,
            },
        ),
        ("conditional-decode", ConditionalDecodeParams, {}),
    ],
)
def test_defaults(step: str, cls: type, expected: dict[str, Any]) -> None:
    params = parse_step_params(step, {})
    assert type(params) is cls
    assert params.step is Step(step)
    assert msgspec.structs.asdict(params) == {
        **expected,
        "trust_client_transfer_params": False,
    }


def test_results_are_frozen() -> None:
    params = parse_step_params("decode", {})
    with pytest.raises(AttributeError):
        params.output_mode = OutputMode.DERENDER  # type: ignore[misc]
    assert hash(params) == hash(parse_step_params("decode", {}))


def test_every_key_is_read() -> None:
    params = parse_step_params(
        "decode",
        {
            "use_openai_format": False,
            "output_mode": "derender",
            "wrap_chat_completion": True,
            "kv_transfer_placement": "extra_args",
            "trust_client_transfer_params": True,
        },
    )
    assert params == DecodeParams(
        use_openai_format=False,
        output_mode=OutputMode.DERENDER,
        wrap_chat_completion=True,
        kv_transfer_placement=KvTransferPlacement.EXTRA_ARGS,
        trust_client_transfer_params=True,
    )
    prefill = parse_step_params("prefill", {"kv_transfer_placement": "top_level"})
    assert isinstance(prefill, PrefillParams)
    assert prefill.kv_transfer_placement is KvTransferPlacement.TOP_LEVEL
    cond = parse_step_params("conditional-decode", {"trust_client_transfer_params": True})
    assert cond == ConditionalDecodeParams(trust_client_transfer_params=True)


BOOL_KEYS = [
    ("encode", "use_openai_format"),
    ("prefill", "use_openai_format"),
    ("decode", "use_openai_format"),
    ("decode", "wrap_chat_completion"),
    ("encode", "trust_client_transfer_params"),
    ("prefill", "trust_client_transfer_params"),
    ("decode", "trust_client_transfer_params"),
    ("conditional-decode", "trust_client_transfer_params"),
]


@pytest.mark.parametrize(("step", "key"), BOOL_KEYS)
@pytest.mark.parametrize(
    ("value", "shown"),
    [("true", '"true"'), (1, "1"), (0, "0"), (None, "null"), ("false", '"false"')],
)
def test_strict_bools(step: str, key: str, value: object, shown: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_step_params(step, {key: value})
    assert caught.value.param == f"{step}.{key}"
    message = str(caught.value)
    assert step in message
    assert key in message
    assert shown in message


@pytest.mark.parametrize("value", ["tokens", "TEXT", "json", 3, None, ["text"]])
def test_decode_output_mode_refused(value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_step_params("decode", {"output_mode": value})
    assert caught.value.param == "decode.output_mode"
    assert "decode.output_mode" in str(caught.value)


@pytest.mark.parametrize("step", ["prefill", "decode"])
@pytest.mark.parametrize("value", ["Both", "top-level", "", 1, True, None])
def test_placement_refused(step: str, value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_step_params(step, {"kv_transfer_placement": value})
    assert caught.value.param == f"{step}.kv_transfer_placement"
    assert '"both"' in str(caught.value)


@pytest.mark.parametrize("value", [True, False, "true", None])
def test_conditional_decode_refuses_use_openai_format(value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_step_params("conditional-decode", {"use_openai_format": value})
    assert caught.value.param == "conditional-decode.use_openai_format"
    assert "conditional-decode" in str(caught.value)
    assert "use_openai_format" in str(caught.value)


@pytest.mark.parametrize(
    ("step", "key"),
    [
        ("encode", "output_mode"),
        ("encode", "kv_transfer_placement"),
        ("prefill", "output_mode"),
        ("prefill", "wrap_chat_completion"),
        ("decode", "use_openai_fromat"),
        ("conditional-decode", "output_mode"),
        ("decode", ""),
    ],
)
def test_unknown_keys_refused(step: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_step_params(step, {key: True})
    assert caught.value.param == f"{step}.{key}"
    assert "unknown key" in str(caught.value)
    assert f'"{key}"' in str(caught.value)


def test_non_string_key_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_step_params("decode", {1: True})  # type: ignore[dict-item]
    assert "unknown key 1" in str(caught.value)


@pytest.mark.parametrize("step", ["render", "Decode", "", "conditional_decode"])
def test_unknown_step_refused(step: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_step_params(step, {})
    assert caught.value.param == "step"
    assert f'"{step}"' in str(caught.value)


def test_params_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_step_params("decode", ["output_mode"])  # type: ignore[call-overload]
    assert caught.value.param == "decode"


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="output_mode"):
        parse_step_params("decode", {"output_mode": "tokens"})


@given(step_names, config_mappings)
def test_parse_step_params_returns_params_or_config_error(step: str, params: Any) -> None:
    try:
        parsed = parse_step_params(step, params)
    except ConfigError as error:
        assert error.param is not None
        assert error.status_hint == 500
    else:
        assert parsed.step.value == step
        # Every key given is reflected, with its exact value.
        for key, value in params.items():
            assert getattr(parsed, key) == value


def test_pipeline_flag_fills_steps_but_not_conditional_decode() -> None:
    parsed = parse_pipeline_params(
        {
            "conditional-decode": {},
            "encode": {},
            "prefill": {"use_openai_format": True},
            "decode": {"output_mode": "derender"},
        },
        use_openai_format=False,
    )
    assert list(parsed) == [Step.CONDITIONAL_DECODE, Step.ENCODE, Step.PREFILL, Step.DECODE]
    assert parsed[Step.CONDITIONAL_DECODE] == ConditionalDecodeParams()
    assert parsed[Step.ENCODE] == EncodeParams(use_openai_format=False)
    # A step's own value wins over the pipeline's.
    assert parsed[Step.PREFILL] == PrefillParams(use_openai_format=True)
    assert parsed[Step.DECODE] == DecodeParams(
        use_openai_format=False, output_mode=OutputMode.DERENDER
    )


def test_pipeline_without_flag_uses_step_defaults() -> None:
    parsed = parse_pipeline_params({"decode": {}})
    assert parsed == {Step.DECODE: DecodeParams()}


def test_pipeline_flag_must_be_bool() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_pipeline_params({"decode": {}}, use_openai_format="false")
    assert caught.value.param == "pipeline.use_openai_format"


def test_pipeline_step_errors_name_the_step() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_pipeline_params({"conditional-decode": {"use_openai_format": False}})
    assert caught.value.param == "conditional-decode.use_openai_format"
    with pytest.raises(ConfigError) as caught:
        parse_pipeline_params({"render": {}})
    assert caught.value.param == "step"


def test_direct_construction_is_checked_and_coerced() -> None:
    params = DecodeParams(
        kv_transfer_placement="top_level",  # type: ignore[arg-type]
        output_mode="derender",  # type: ignore[arg-type]
    )
    assert params.kv_transfer_placement is KvTransferPlacement.TOP_LEVEL
    assert params.output_mode is OutputMode.DERENDER
    with pytest.raises(ConfigError) as caught:
        PrefillParams(use_openai_format="false")  # type: ignore[arg-type]
    assert caught.value.param == "prefill.use_openai_format"
    with pytest.raises(ConfigError):
        DecodeParams(output_mode=OutputMode.TOKENS)


# Exact messages: each names the step, the key, what is accepted and the bad value.


def test_placement_message_lists_the_accepted_values() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_step_params("prefill", {"kv_transfer_placement": "Both"})
    assert caught.value.message == (
        'prefill.kv_transfer_placement: expected one of "both", "top_level", "extra_args", '
        'got "Both" (a string)'
    )


def test_unknown_step_message_lists_the_steps() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_step_params("render", {})
    assert caught.value.message == (
        'step: expected one of "encode", "prefill", "decode", "conditional-decode", '
        'got "render" (a string)'
    )


def test_non_mapping_params_message() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_step_params("decode", ["output_mode"])  # type: ignore[call-overload]
    assert caught.value.message == "decode: params must be a mapping, got an array of 1 items"


def test_conditional_decode_use_openai_format_message_says_why() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_step_params("conditional-decode", {"use_openai_format": False})
    assert caught.value.message == (
        "conditional-decode.use_openai_format: conditional-decode takes no use_openai_format "
        "(got false (a boolean)): it probes the client's own route with the body the client sent"
    )


def test_unknown_key_message_lists_the_accepted_keys() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_step_params("decode", {"use_openai_fromat": False})
    assert caught.value.message == (
        'decode.use_openai_fromat: unknown key "use_openai_fromat" (a string); decode accepts '
        "kv_transfer_placement, output_mode, trust_client_transfer_params, use_openai_format, "
        "wrap_chat_completion"
    )


class _PosingKey:
    """A non-string key that hashes and compares equal to a real key (a hostile loader)."""

    def __hash__(self) -> int:
        return hash("output_mode")

    def __eq__(self, other: object) -> bool:
        return other == "output_mode"


def test_a_key_posing_as_a_string_is_an_unknown_key() -> None:
    # Only str keys are looked up: anything else would reach the struct as a keyword.
    with pytest.raises(ConfigError) as caught:
        parse_step_params("decode", {_PosingKey(): "text"})  # type: ignore[dict-item]
    assert "unknown key a _PosingKey" in caught.value.message


@pytest.mark.parametrize(
    ("steps", "shown"), [([], "an array of 0 items"), ("decode", '"decode" (a string)')]
)
def test_pipeline_steps_must_be_a_mapping(steps: object, shown: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_pipeline_params(steps)  # type: ignore[arg-type]
    assert caught.value.param == "pipeline"
    assert caught.value.message == (
        f"pipeline: steps must be a mapping of step name to params, got {shown}"
    )


@pytest.mark.parametrize(
    ("step", "cls"),
    [
        ("encode", EncodeParams),
        ("prefill", PrefillParams),
        ("decode", DecodeParams),
        ("conditional-decode", ConditionalDecodeParams),
    ],
)
def test_every_field_of_a_step_struct_is_a_checked_key(step: str, cls: type[Any]) -> None:
    # The accepted keys are the struct's fields, and each one refuses a value of the wrong type.
    fields = sorted(field.name for field in msgspec.structs.fields(cls))
    with pytest.raises(ConfigError) as caught:
        parse_step_params(step, {"nope": 1})
    assert caught.value.message.endswith(f"{step} accepts {', '.join(fields)}")
    for name in fields:
        with pytest.raises(ConfigError) as wrong:
            parse_step_params(step, {name: ["wrong"]})
        assert wrong.value.param == f"{step}.{name}"


def test_a_step_own_key_is_reported_before_a_shared_one() -> None:
    # With two bad values, the step's own key is named first, whatever order the config has.
    bad = {"trust_client_transfer_params": "yes", "output_mode": "bad"}
    with pytest.raises(ConfigError) as caught:
        parse_step_params("decode", bad)
    assert caught.value.param == "decode.output_mode"

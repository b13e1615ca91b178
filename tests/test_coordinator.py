"""llm-d's coordinator config document: parse_coordinator_config and check-config on it."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from strategies import json_values

from disagg_transforms import (
    ConditionalDecodeParams,
    ConfigError,
    CoordinatorConfig,
    DecodeParams,
    EcConnector,
    KvConnector,
    PrefillParams,
    Step,
    parse_coordinator_config,
)
from disagg_transforms._cli.main import main
from disagg_transforms._coordinator import coordinator_config_errors, is_coordinator_document

FIXTURES = Path(__file__).parent / "fixtures" / "llm-d"
MIB = 1024 * 1024


def _fixture(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((FIXTURES / name).read_text())
    return document


def _without_media_step(document: dict[str, Any]) -> dict[str, Any]:
    trimmed = copy.deepcopy(document)
    steps = trimmed["pipeline"]["steps"]
    trimmed["pipeline"]["steps"] = [s for s in steps if s["type"] != "replace-media-urls"]
    return trimmed


def _doc(*steps: dict[str, Any], **sections: Any) -> dict[str, Any]:
    pipeline = {"steps": list(steps) or [{"type": "decode"}], **sections.pop("pipeline", {})}
    return {"pipeline": pipeline, **sections}


def _refused(document: object) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_coordinator_config(document)  # type: ignore[arg-type]
    return caught.value


# --- llm-d's own examples -------------------------------------------------------------------


def test_pd_only_example_reads_as_written() -> None:
    config = parse_coordinator_config(_fixture("pd-only.yaml"))
    assert list(config.pipeline) == [Step.CONDITIONAL_DECODE, Step.PREFILL, Step.DECODE]
    assert isinstance(config.pipeline[Step.CONDITIONAL_DECODE], ConditionalDecodeParams)
    assert isinstance(config.pipeline[Step.PREFILL], PrefillParams)
    assert config.gateway_url == "http://inference-gateway.llm-d.svc:80"
    assert config.render_url is None
    assert (config.host, config.port) == ("0.0.0.0", 8080)  # noqa: S104 - Go's ":8080"
    assert config.kv_connector is KvConnector.NIXL
    assert config.ec_connector is EcConnector.SHARED_STORAGE
    assert config.max_request_body_bytes == 64 * MIB
    assert config.drain_timeout == 25.0
    assert config.first_byte_timeout == 60.0
    assert [line.split(":")[0] for line in config.warnings] == [
        "log_level",
        "server.read_timeout",
        "server.write_timeout",
        "gateway.max_idle_conns_per_host",
        "gateway.idle_conn_timeout",
    ]


@pytest.mark.parametrize("name", ["coord-disaggregation.yaml", "e2e-nixl.yaml"])
def test_examples_with_media_step_are_refused_naming_it(name: str) -> None:
    error = _refused(_fixture(name))
    assert error.param == "pipeline.steps[0].type"
    assert "replace-media-urls" in error.message


@pytest.mark.parametrize("name", ["coord-disaggregation.yaml", "e2e-nixl.yaml"])
def test_examples_without_media_step_read(name: str) -> None:
    config = parse_coordinator_config(_without_media_step(_fixture(name)))
    assert list(config.pipeline) == [
        step
        for step in (Step.CONDITIONAL_DECODE, Step.ENCODE, Step.PREFILL, Step.DECODE)
        if name == "coord-disaggregation.yaml" or step is not Step.CONDITIONAL_DECODE
    ]
    assert config.kv_connector is KvConnector.NIXL
    assert config.ec_connector is EcConnector.NIXL
    assert config.render_url is not None
    assert config.render_url.startswith("http://")
    assert "pipeline.steps[1].params.max_parallel: ignored" in " ".join(config.warnings) or (
        "pipeline.steps[2].params.max_parallel: ignored" in " ".join(config.warnings)
    )


def test_e2e_example_drain_timeout() -> None:
    config = parse_coordinator_config(_without_media_step(_fixture("e2e-nixl.yaml")))
    assert config.drain_timeout == 1.0


# --- the command line -----------------------------------------------------------------------


def test_check_config_starts_on_llm_d_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(FIXTURES / "pd-only.yaml")]) == 0
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    assert out[0] == "valid"
    assert "kv_connector         kv-nixl" in out
    assert "listen               0.0.0.0:8080" in out
    assert any(line.startswith("conditional-decode ") for line in out)
    warnings = captured.err.splitlines()
    assert len(warnings) == 5
    assert all(": warning: " in line for line in warnings)
    assert any("log_level" in line for line in warnings)


def test_check_config_exits_2_one_line_per_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = _doc(
        {"type": "replace-media-urls"},
        {"type": "decode"},
        pipeline={"kv_connector": "kv-lmcache"},
        server={"listen_addr": "nowhere"},
    )
    path = tmp_path / "coordinator.yaml"
    path.write_text(yaml.safe_dump(document))
    assert main(["check-config", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3
    assert all(line.startswith(f"{path}: ") for line in lines)
    joined = "\n".join(lines)
    for named in ("pipeline.steps[0].type", "pipeline.kv_connector", "server.listen_addr"):
        assert named in joined


def test_check_config_coordinator_document_as_a_process(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.yaml"
    path.write_text((FIXTURES / "coord-disaggregation.yaml").read_text())
    script = Path(sys.executable).parent / "disagg-transforms"
    done = subprocess.run(  # noqa: S603 - our own script, fixed arguments
        [str(script), "check-config", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    expected = (
        f"{path}: pipeline.steps[0].type: replace-media-urls is not carried out: the proxy "
        "downloads no images: a client's http(s) image URL would reach the workers as sent; "
        "remove the step (clients then send data: URLs)"
    )
    assert done.stderr.splitlines() == [expected]


def test_the_project_document_shape_still_checks(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"steps": {"decode": {}}}))
    assert main(["check-config", str(path)]) == 0
    path.write_text(yaml.safe_dump({"steps": {"decode": {"output_mode": "tokens"}}}))
    assert main(["check-config", str(path)]) == 2


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({"pipeline": {"steps": []}}, True),
        ({"pipeline": {"steps": {"decode": {}}}}, False),
        ({"steps": {"decode": {}}}, False),
        ({"pipeline": []}, False),
        ([], False),
    ],
)
def test_is_coordinator_document(document: object, expected: bool) -> None:
    assert is_coordinator_document(document) is expected


# --- key by key -----------------------------------------------------------------------------


def test_defaults_are_the_coordinators() -> None:
    config = parse_coordinator_config(_doc())
    assert config == CoordinatorConfig(
        pipeline=config.pipeline,
        render_url=None,
        gateway_url=None,
        host="0.0.0.0",  # noqa: S104 - Go's ":8080"
        port=8080,
        max_request_body_bytes=64 * MIB,
        kv_connector=KvConnector.SHARED_STORAGE,
        ec_connector=EcConnector.SHARED_STORAGE,
        drain_timeout=25.0,
        first_byte_timeout=60.0,
        warnings=(),
    )
    assert dict(config.pipeline) == {Step.DECODE: DecodeParams()}


_RENDER = {"type": "render", "params": {"address": "http://r"}}
_CONDITIONAL = {"type": "conditional-decode"}


@pytest.mark.parametrize(
    ("steps", "render_first"),
    [((_RENDER, _CONDITIONAL), True), ((_CONDITIONAL, _RENDER), False), ((_RENDER,), True)],
)
def test_render_and_conditional_decode_run_in_the_documents_order(
    steps: tuple[dict[str, Any], ...], render_first: bool
) -> None:
    # As llm-d's coordinator: the steps run in the order listed (its examples: render first).
    document = _doc(*steps, {"type": "prefill"}, {"type": "decode"})
    config = parse_coordinator_config(document)
    assert config.render_first is render_first
    assert list(config.pipeline)[-2:] == [Step.PREFILL, Step.DECODE]


def test_pipeline_is_read_only() -> None:
    config = parse_coordinator_config(_doc())
    with pytest.raises(TypeError):
        config.pipeline[Step.PREFILL] = PrefillParams()  # type: ignore[index]


@pytest.mark.parametrize(
    ("listen", "host", "port"),
    [
        (":9000", "0.0.0.0", 9000),  # noqa: S104
        ("127.0.0.1:8080", "127.0.0.1", 8080),
        ("[::1]:8081", "::1", 8081),
        ("coordinator:80", "coordinator", 80),
    ],
)
def test_listen_addr(listen: str, host: str, port: int) -> None:
    config = parse_coordinator_config(_doc(server={"listen_addr": listen}))
    assert (config.host, config.port) == (host, port)


@pytest.mark.parametrize("listen", ["8080", ":", ":99999", "host:port", 8080, "[::1]8080"])
def test_listen_addr_refused(listen: object) -> None:
    assert _refused(_doc(server={"listen_addr": listen})).param == "server.listen_addr"


@pytest.mark.parametrize(("size", "expected"), [(1, MIB), (0, 64 * MIB), (128, 128 * MIB)])
def test_body_size_in_mib(size: int, expected: int) -> None:
    config = parse_coordinator_config(_doc(server={"max_request_body_size": size}))
    assert config.max_request_body_bytes == expected


@pytest.mark.parametrize("size", [-1, 1.5, "64", True, False, 0.0, 2**63])
def test_body_size_refused(size: object) -> None:
    error = _refused(_doc(server={"max_request_body_size": size}))
    assert error.param == "server.max_request_body_size"


@pytest.mark.parametrize(
    ("duration", "seconds"),
    [("30s", 30.0), ("1m30s", 90.0), ("300ms", 0.3), ("1h", 3600.0), ("1.5s", 1.5), ("0", 0.0)],
)
def test_durations_are_go_strings(duration: str, seconds: float) -> None:
    config = parse_coordinator_config(_doc(server={"shutdown_timeout": duration}))
    assert config.drain_timeout == pytest.approx(seconds)


@pytest.mark.parametrize("duration", ["30", "abc", 30, "-5s", "5 s", True])
def test_durations_refused(duration: object) -> None:
    error = _refused(_doc(gateway={"timeout": duration}))
    assert error.param == "gateway.timeout"


def test_gateway_timeout_zero_is_no_limit() -> None:
    config = parse_coordinator_config(_doc(gateway={"timeout": "0s"}))
    assert config.first_byte_timeout is None


def test_gateway_address() -> None:
    config = parse_coordinator_config(_doc(gateway={"address": "https://gw:443"}))
    assert config.gateway_url == "https://gw:443"
    assert _refused(_doc(gateway={"address": "gw:80"})).param == "gateway.address"


def test_render_address_is_the_render_url() -> None:
    document = _doc({"type": "render", "params": {"address": "http://r:8000"}}, {"type": "decode"})
    assert parse_coordinator_config(document).render_url == "http://r:8000"
    missing = _doc({"type": "render"}, {"type": "decode"})
    assert _refused(missing).param == "pipeline.steps[0].params.address"


@pytest.mark.parametrize("limit", ["max_total_tokens", "max_total_placeholder_tokens"])
def test_render_limits_refused_unless_zero(limit: str) -> None:
    render = {"type": "render", "params": {"address": "http://r", limit: 0}}
    parse_coordinator_config(_doc(render, {"type": "decode"}))
    render["params"][limit] = 4096  # type: ignore[index]
    error = _refused(_doc(render, {"type": "decode"}))
    assert error.param == f"pipeline.steps[0].params.{limit}"


@pytest.mark.parametrize(
    ("pipeline", "kv", "ec"),
    [
        ({}, KvConnector.SHARED_STORAGE, EcConnector.SHARED_STORAGE),
        ({"kv_connector": "kv-nixl"}, KvConnector.NIXL, EcConnector.SHARED_STORAGE),
        ({"ec_connector": "ec-nixl"}, KvConnector.SHARED_STORAGE, EcConnector.NIXL),
    ],
)
def test_connectors(pipeline: dict[str, Any], kv: KvConnector, ec: EcConnector) -> None:
    config = parse_coordinator_config(_doc(pipeline=pipeline))
    assert (config.kv_connector, config.ec_connector) == (kv, ec)


def test_step_connectors_override_the_pipelines() -> None:
    document = _doc(
        {"type": "prefill", "params": {"kv_connector": "kv-nixl"}},
        {"type": "decode", "params": {"kv_connector": "kv-nixl"}},
    )
    assert parse_coordinator_config(document).kv_connector is KvConnector.NIXL


def test_kv_sglang_is_sglangs_rendezvous() -> None:
    document = _doc(
        {"type": "prefill", "params": {"kv_connector": "kv-sglang"}},
        {"type": "decode"},
        pipeline={"kv_connector": "kv-sglang"},
    )
    assert coordinator_config_errors(document) == []
    assert parse_coordinator_config(document).kv_connector is KvConnector.SGLANG


def test_step_connectors_must_agree() -> None:
    document = _doc(
        {"type": "prefill", "params": {"kv_connector": "kv-nixl"}},
        {"type": "decode"},
    )
    assert _refused(document).param == "pipeline.steps[1].params.kv_connector"


@pytest.mark.parametrize(
    ("document", "param", "named"),
    [
        (_doc(pipeline={"kv_connector": "kv-lmcache"}), "pipeline.kv_connector", "kv-lmcache"),
        (_doc(pipeline={"ec_connector": "ec-example"}), "pipeline.ec_connector", "ec-example"),
        (
            _doc({"type": "prefill", "params": {"kv_connector": "kv-lmcache"}}, {"type": "decode"}),
            "pipeline.steps[0].params.kv_connector",
            "kv-lmcache",
        ),
        (
            _doc({"type": "replace-media-urls"}, {"type": "decode"}),
            "pipeline.steps[0].type",
            "replace-media-urls",
        ),
        (
            _doc({"type": "prefill-decode"}),
            "pipeline.steps[0].type",
            "prefill-decode",
        ),
        (
            _doc({"type": "async-broker"}, {"type": "decode"}),
            "pipeline.steps[0].type",
            "async-broker",
        ),
        (
            _doc(pipeline={"forward_response_headers": ["x-disagg-slice"]}),
            "pipeline.forward_response_headers",
            "forward",
        ),
        ({"pipeline": {"steps": [{"type": "decode"}]}, "sever": {}}, "sever", "sever"),
        (_doc(server={"listen": ":80"}), "server.listen", "listen"),
        (
            _doc({"type": "decode", "params": {"output_mode": "tokens"}}),
            "pipeline.steps[0].params.output_mode",
            "tokens",
        ),
        (
            _doc({"type": "decode", "params": {"bogus": 1}}),
            "pipeline.steps[0].params.bogus",
            "bogus",
        ),
        (
            _doc(
                {"type": "conditional-decode", "params": {"use_openai_format": True}},
                {"type": "decode"},
            ),
            "pipeline.steps[0].params.use_openai_format",
            "conditional-decode",
        ),
        (_doc({"type": "decode", "extra": 1}), "pipeline.steps[0].extra", "extra"),
        (_doc({"type": "prefill"}), "pipeline.steps", "no decode step"),
        (_doc({"type": "decode"}, {"type": "prefill"}), "pipeline.steps[1].type", "after decode"),
        (_doc({"type": "decode"}, {"type": "decode"}), "pipeline.steps[1].type", "second"),
        (
            _doc(pipeline={"use_openai_format": False}),
            "pipeline.steps",
            "render",
        ),
        (_doc(pipeline={"use_openai_format": "false"}), "pipeline.use_openai_format", "false"),
    ],
)
def test_refused_names_the_key(document: dict[str, Any], param: str, named: str) -> None:
    error = _refused(document)
    assert error.param == param
    assert error.message.startswith(f"{param}: ")
    assert named in error.message


def test_pipeline_use_openai_format_fills_the_steps_but_not_conditional_decode() -> None:
    document = _doc(
        {"type": "render", "params": {"address": "http://r"}},
        {"type": "conditional-decode"},
        {"type": "prefill", "params": {"use_openai_format": True}},
        {"type": "decode", "params": {"output_mode": "derender"}},
        pipeline={"use_openai_format": False},
    )
    config = parse_coordinator_config(document)
    prefill, decode = config.pipeline[Step.PREFILL], config.pipeline[Step.DECODE]
    assert isinstance(prefill, PrefillParams)
    assert isinstance(decode, DecodeParams)
    assert prefill.use_openai_format is True
    assert decode.use_openai_format is False
    assert decode.output_mode.value == "derender"


def test_process_keys_warn_once_each() -> None:
    document = _doc(
        {"type": "render", "params": {"address": "http://r", "timeout": "30s"}},
        {"type": "encode", "params": {"max_parallel": 8}},
        {"type": "decode"},
        log_level=5,
        tracing=True,
        server={"metrics_port": 9090, "secure_serving": True, "read_timeout": "30s"},
    )
    config = parse_coordinator_config(document)
    named = [line.split(": ignored")[0] for line in config.warnings]
    assert sorted(named) == sorted(
        [
            "log_level",
            "tracing",
            "server.metrics_port",
            "server.secure_serving",
            "server.read_timeout",
            "pipeline.steps[0].params.timeout",
            "pipeline.steps[1].params.max_parallel",
        ]
    )


def test_plain_http_needs_no_warning() -> None:
    config = parse_coordinator_config(_doc(server={"secure_serving": False}))
    assert config.warnings == ()


def test_errors_are_all_listed() -> None:
    document = _doc(
        {"type": "replace-media-urls"},
        {"type": "decode", "params": {"output_mode": "tokens"}},
        server={"shutdown_timeout": "soon", "max_request_body_size": -1},
    )
    params = [error.param for error in coordinator_config_errors(document)]
    assert sorted(params) == sorted(  # type: ignore[type-var]
        [
            "pipeline.steps[0].type",
            "pipeline.steps[1].params.output_mode",
            "server.shutdown_timeout",
            "server.max_request_body_size",
        ]
    )


_KEYS = st.sampled_from(
    [
        "pipeline",
        "steps",
        "server",
        "gateway",
        "type",
        "params",
        "render",
        "decode",
        "prefill",
        "address",
        "listen_addr",
        "timeout",
        "kv_connector",
        "use_openai_format",
    ]
)
_DOCUMENTS = st.recursive(
    json_values,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_KEYS, children, max_size=4),
    max_leaves=20,
)


@given(document=_DOCUMENTS)
def test_any_document_gives_a_result_or_a_config_error(document: object) -> None:
    try:
        config = parse_coordinator_config(document)  # type: ignore[arg-type]
    except ConfigError as error:
        assert error.param is not None
        assert error.message.startswith(f"{error.param}: ")
    else:
        assert Step.DECODE in config.pipeline


@given(
    steps=st.lists(
        st.fixed_dictionaries(
            {
                "type": st.sampled_from(
                    ["render", "conditional-decode", "encode", "prefill", "decode"]
                )
            },
            optional={"params": st.dictionaries(_KEYS, json_values, max_size=3)},
        ),
        max_size=6,
    ),
    pipeline=st.dictionaries(_KEYS, json_values, max_size=3),
)
def test_any_step_list_gives_a_result_or_a_config_error(
    steps: list[dict[str, Any]], pipeline: dict[str, Any]
) -> None:
    document = {"pipeline": {**pipeline, "steps": steps}}
    try:
        parse_coordinator_config(document)
    except ConfigError as error:
        assert error.param is not None

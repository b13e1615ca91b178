"""llm-d's sidecar seat, without I/O: the headers' worker targets and the allow-list."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.requests import Request
from strategies import host_names, ipv4_networks, worker_ports

from disagg_transforms import (
    ConfigError,
    RequestError,
    Step,
    WorkerNotAllowedError,
    anthropic_error_body,
    openai_error_body,
    parse_pipeline_params,
)
from disagg_transforms.integrations.proxy import SidecarSeat, _Seat, sidecar_errors
from disagg_transforms.integrations.sidecar import (
    ENCODE_HEADER,
    PREFILL_HEADER,
    WorkerHosts,
    WorkerTarget,
    worker_targets,
)


def test_a_header_names_workers_in_order() -> None:
    value = " 10.0.0.7:8000 , prefill-1.pool.svc:8001,[fd00::1]:80"
    assert worker_targets(value, PREFILL_HEADER) == (
        WorkerTarget("10.0.0.7", 8000),
        WorkerTarget("prefill-1.pool.svc", 8001),
        WorkerTarget("fd00::1", 80),
    )
    assert [t.url for t in worker_targets(value, PREFILL_HEADER)] == [
        "http://10.0.0.7:8000",
        "http://prefill-1.pool.svc:8001",
        "http://[fd00::1]:80",
    ]


@pytest.mark.parametrize("value", [None, "", "  "])
def test_an_absent_or_blank_header_names_no_worker(value: str | None) -> None:
    assert worker_targets(value, PREFILL_HEADER) == ()


@pytest.mark.parametrize(
    "value",
    [
        "http://10.0.0.7:8000",  # a scheme
        "10.0.0.7",  # no port
        "10.0.0.7:0",
        "10.0.0.7:65536",
        "10.0.0.7:80x",
        "10.0.0.7:8000/v1",  # a path
        "user@10.0.0.7:8000",
        "fd00::1:80",  # IPv6 outside brackets
        "[not-v6]:80",
        "a b:80",
        ":80",
        "10.0.0.7:8000,",  # an empty entry
        "10.0.0.7:8000,nope",  # every entry is checked, used or not
    ],
)
def test_a_malformed_header_is_a_request_error(value: str) -> None:
    with pytest.raises(RequestError) as caught:
        worker_targets(value, PREFILL_HEADER)
    assert caught.value.param == PREFILL_HEADER
    assert caught.value.status_hint == 400


def test_the_allow_list_matches_addresses_networks_and_names_as_written() -> None:
    hosts = WorkerHosts("10.0.0.0/8, 192.168.1.5 ,Prefill-0.Pool.svc,fd00::/8")
    assert hosts.allows("10.200.3.4")
    assert hosts.allows("192.168.1.5")
    assert not hosts.allows("192.168.1.6")
    assert hosts.allows("prefill-0.pool.svc")  # case-insensitive
    assert hosts.allows("fd00::1")
    # A name is never resolved: "localhost" is not 127.0.0.1, nor an address a name.
    assert not hosts.allows("localhost")
    assert not WorkerHosts("127.0.0.1").allows("localhost")
    assert not WorkerHosts("localhost").allows("127.0.0.1")
    # An IPv4 address written as IPv6 is not in an IPv4 network.
    assert not hosts.allows("::ffff:10.0.0.1")


@pytest.mark.parametrize(
    "text", ["", "10.0.0.0/8,", "10.0.0.1/8", "10.0.0.0/33", "http://h", "a_b", "h:80", "a b"]
)
def test_a_bad_allow_list_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        WorkerHosts(text)
    assert caught.value.param == "allowed_worker_hosts"


def test_a_target_off_the_list_is_refused_with_403_in_each_shape() -> None:
    hosts = WorkerHosts("10.0.0.0/8")
    hosts.check(worker_targets("10.1.1.1:80", PREFILL_HEADER), PREFILL_HEADER)
    targets = worker_targets("10.1.1.1:80,11.0.0.1:80", PREFILL_HEADER)
    with pytest.raises(WorkerNotAllowedError) as caught:
        hosts.check(targets, PREFILL_HEADER)
    error = caught.value
    assert (error.param, error.status_hint, error.retryable) == (PREFILL_HEADER, 403, False)
    assert "11.0.0.1:80" in error.message
    assert openai_error_body(error)["error"]["type"] == "PermissionDeniedError"
    assert anthropic_error_body(error)["error"]["type"] == "permission_error"


@given(ipv4_networks, st.data())
def test_an_address_is_allowed_exactly_when_a_network_holds_it(
    network: ipaddress.IPv4Network, data: st.DataObject
) -> None:
    address = data.draw(st.ip_addresses(v=4))
    assert WorkerHosts(str(network)).allows(str(address)) == (address in network)
    inside = network[data.draw(st.integers(0, network.num_addresses - 1))]
    assert WorkerHosts(f"other.host,{network}").allows(str(inside))


@given(host_names, worker_ports)
def test_a_named_target_reads_back_and_matches_its_name_in_any_case(name: str, port: int) -> None:
    (target,) = worker_targets(f" {name.upper()}:{port} ", PREFILL_HEADER)
    assert target == WorkerTarget(name.upper(), port)
    assert target.url == f"http://{name.upper()}:{port}"
    assert WorkerHosts(name).allows(target.host)
    assert not WorkerHosts(f"x{name}").allows(target.host)


def test_the_sidecar_seat_refuses_worker_urls_and_needs_a_prefill_step() -> None:
    pd = parse_pipeline_params({"prefill": {}, "decode": {}})
    assert sidecar_errors(pd, decode_url="http://127.0.0.1:8200") == []
    given = {"decode_url": "http://d:1", "prefill_url": "http://p:1", "gateway_url": "http://g:1"}
    assert [error.param for error in sidecar_errors(pd, **given)] == ["prefill", "gateway"]
    decode_only = parse_pipeline_params({"decode": {}})
    [error] = sidecar_errors(decode_only, decode_url="http://d:1")
    assert error.message.startswith("--prefill-from-header: the pipeline has no prefill step")
    [error] = sidecar_errors(pd)
    assert error.param == "decode"
    # A generate pipeline renders on the decode worker (the render URL's default).
    generate = parse_pipeline_params({"prefill": {}, "decode": {}}, use_openai_format=False)
    assert sidecar_errors(generate, decode_url="http://d:1") == []


def _seat_request(headers: dict[str, str]) -> Request:
    raw = [(name.encode(), value.encode()) for name, value in headers.items()]
    return Request(
        {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": raw}
    )


def test_the_seat_sends_encode_to_the_first_encoder_named_and_skips_it_when_none_is() -> None:
    config = parse_pipeline_params(
        {"encode": {}, "prefill": {}, "decode": {}}, use_openai_format=False
    )
    seat = _Seat(SidecarSeat(), config, {"decode": "http://127.0.0.1:8200"})
    both = {PREFILL_HEADER: "10.0.0.1:8000", ENCODE_HEADER: "10.0.0.2:9000, 10.0.0.3:9000"}
    pipeline, urls = seat.choose(_seat_request(both))
    assert list(pipeline) == list(config)
    assert urls == {
        "decode": "http://127.0.0.1:8200",
        "prefill": "http://10.0.0.1:8000",
        "encode": "http://10.0.0.2:9000",
    }
    pipeline, urls = seat.choose(_seat_request({PREFILL_HEADER: "10.0.0.1:8000"}))
    assert Step.ENCODE not in pipeline
    assert "encode" not in urls
    # No prefill named: decode only, whatever the encoder header says.
    pipeline, urls = seat.choose(_seat_request({ENCODE_HEADER: "10.0.0.2:9000"}))
    assert list(pipeline) == [Step.DECODE]
    assert urls == {"decode": "http://127.0.0.1:8200"}

"""Properties over the whole public API under hostile input (``docs/security.md``).

Every public callable that takes a body is listed once in a table below; each property runs
over every entry. The properties: no input is mutated; nothing but our own errors escapes
(``ConfigError`` only for config-type arguments, which are always valid here); the same input
gives the same output twice; on OpenAI-format legs no client field is lost; client transfer
params never reach a leg unless trusted; no generate-only field reaches a client.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import (
    GENERATE_ONLY_CHOICE_KEYS,
    GENERATE_ONLY_TOP_KEYS,
    all_route_bodies,
    hostile,
    hostile_generate_responses,
    hostile_json_bytes,
    hostile_route_bodies,
    hostile_sse_streams,
    hostile_values,
)

from disagg_transforms import (
    AnthropicStreamConverter,
    ChatStreamConverter,
    DecodeParams,
    DisaggTransformError,
    EncodeParams,
    EnvelopeOptions,
    KvTransferPlacement,
    Leg,
    LegInputs,
    OutputMode,
    Pipeline,
    PrefillParams,
    RequestError,
    ResponsesStreamConverter,
    Route,
    Step,
    TransformContext,
    UpstreamContractError,
    apply_sampling_caps,
    apply_single_token_cap,
    build_decode_request,
    build_encode_request,
    build_prefill_request,
    check_output_mode_echo,
    decode_request,
    parse_pipeline_params,
    parse_step_params,
    sampling_caps,
    single_frame_anthropic_events,
    single_frame_anthropic_stream,
    single_frame_chat_chunks,
    single_frame_chat_stream,
    single_frame_responses_events,
    single_frame_responses_stream,
    strip_client_transfer_params,
    wrap_anthropic_message,
    wrap_chat_completion,
    wrap_response,
    wrap_responses_response,
)
from disagg_transforms._wire.sse import SseParser

ROUTER_KV = {"remote_host": "router-host", "remote_port": 1}
ROUTER_EC = {"remote_host": "router-ec"}
CLOCK = lambda: 1_700_000_000.0  # noqa: E731 - a fixed "now" keeps outputs comparable
TRANSFER_KEYS = ("kv_transfer_params", "ec_transfer_params")


def snapshot(value: object) -> list[tuple[Any, ...]]:
    """A flat, order-preserving picture of ``value`` built without recursion.

    Containers are recorded with their identity, type and size, leaves by type and ``repr``
    (so NaN equals NaN): two snapshots differ iff something was added, removed, replaced or
    reordered, at any depth.
    """
    out: list[tuple[Any, ...]] = []
    pending: list[object] = [value]
    while pending:
        node = pending.pop()
        if isinstance(node, Mapping):
            out.append(("map", id(node), len(node)))
            for key, item in node.items():
                out.append(("key", type(key).__name__, repr(key)))
                pending.append(item)
        elif isinstance(node, (list, tuple)):
            out.append(("seq", id(node), len(node)))
            pending.extend(node)
        else:
            out.append(("leaf", type(node).__name__, _leaf(node)))
    return out


def _leaf(node: object) -> str:
    if isinstance(node, int) and node.bit_length() > 10_000:  # repr refuses > 4300 digits
        return f"int:{hash(node)}"
    return repr(node)


def shape(value: object) -> list[object]:
    """Like :func:`snapshot` without identities: equal iff the values are equal JSON."""
    return [item[::2] if item[0] in ("map", "seq") else item for item in snapshot(value)]


# ---- the table of dict entry points: name -> call(body) ----------------------------------

DECODE = DecodeParams(output_mode=OutputMode.TEXT, use_openai_format=False)
DERENDER = DecodeParams(output_mode=OutputMode.DERENDER, use_openai_format=False)
PREFILL = PrefillParams(use_openai_format=False)


def _legs(path: str) -> dict[str, Callable[[Any], object]]:
    tokens = [1, 2, 3]
    return {
        f"decode-openai {path}": lambda b: build_decode_request(
            b, client_path=path, params=DecodeParams(), kv_transfer_params=ROUTER_KV
        ),
        f"decode-generate {path}": lambda b: build_decode_request(
            b, client_path=path, params=DECODE, token_ids=tokens, kv_transfer_params=ROUTER_KV
        ),
        f"decode-derender {path}": lambda b: build_decode_request(
            b, client_path=path, params=DERENDER, token_ids=tokens
        ),
        f"prefill-openai {path}": lambda b: build_prefill_request(
            b,
            client_path=path,
            params=PrefillParams(),
            inputs=LegInputs(ec_transfer_params=ROUTER_EC),
        ),
        f"prefill-generate {path}": lambda b: build_prefill_request(
            b,
            client_path=path,
            params=PREFILL,
            inputs=LegInputs(token_ids=tokens, kv_transfer_params=ROUTER_KV),
        ),
        f"encode {path}": lambda b: build_encode_request(
            b,
            client_path=path,
            params=EncodeParams(use_openai_format=False),
            inputs=LegInputs(token_ids=tokens),
        ),
        f"caps {path}": lambda b: apply_sampling_caps(b, Route(path)),
        f"single-token {path}": lambda b: apply_single_token_cap(b, Route(path)),
    }


ROUTES = [route.value for route in Route]
REQUEST_ENTRY_POINTS: dict[str, Callable[[Any], object]] = {
    name: call for path in ROUTES for name, call in _legs(path).items()
}
_M = EnvelopeOptions(model="m")
_CHAT_CONTEXT = TransformContext(
    client_path=Route.CHAT_COMPLETIONS.value,
    step=Step.DECODE,
    params=DECODE,
    inputs=LegInputs(token_ids=[1, 2], kv_transfer_params=ROUTER_KV),
)
_PIPELINE = Pipeline(
    request=[sampling_caps(), strip_client_transfer_params, decode_request],
    response=[wrap_response],
)
REQUEST_ENTRY_POINTS |= {
    "transform sampling_caps": lambda b: sampling_caps()(b, _CHAT_CONTEXT),
    "transform strip_client_transfer_params": lambda b: strip_client_transfer_params(
        b, _CHAT_CONTEXT
    ),
    "transform decode_request": lambda b: decode_request(b, _CHAT_CONTEXT),
    "Pipeline.run_request": lambda b: _PIPELINE.run_request(b, _CHAT_CONTEXT),
}


def _responses(mode: OutputMode) -> dict[str, Callable[[Any, Any], object]]:
    def context(path: str) -> TransformContext:
        params = DecodeParams(output_mode=mode, use_openai_format=False, wrap_chat_completion=True)
        return TransformContext(client_path=path, step=Step.DECODE, params=params)

    return {
        "echo": lambda r, _c: check_output_mode_echo(r, mode),
        "wrap_chat_completion": lambda r, c: wrap_chat_completion(
            r, requested=mode, client_body=c, options=EnvelopeOptions(clock=CLOCK)
        ),
        "single_frame_chat_chunks": lambda r, c: single_frame_chat_chunks(
            r, requested=mode, client_body=c, options=EnvelopeOptions(clock=CLOCK)
        ),
        "single_frame_chat_stream": lambda r, c: single_frame_chat_stream(
            r, requested=mode, client_body=c, options=EnvelopeOptions(clock=CLOCK)
        ),
        "wrap_responses_response": lambda r, c: wrap_responses_response(
            r, requested=mode, client_body=c, options=EnvelopeOptions(clock=CLOCK)
        ),
        "single_frame_responses_events": lambda r, c: single_frame_responses_events(
            r, requested=mode, client_body=c, options=EnvelopeOptions(clock=CLOCK)
        ),
        "single_frame_responses_stream": lambda r, c: single_frame_responses_stream(
            r, requested=mode, client_body=c, options=EnvelopeOptions(clock=CLOCK)
        ),
        "wrap_anthropic_message": lambda r, c: wrap_anthropic_message(
            r, requested=mode, client_body=c
        ),
        "single_frame_anthropic_events": lambda r, c: single_frame_anthropic_events(
            r, requested=mode, client_body=c
        ),
        "single_frame_anthropic_stream": lambda r, c: single_frame_anthropic_stream(
            r, requested=mode, client_body=c
        ),
        "transform wrap_response": lambda r, c: wrap_response(
            r, msgspec.structs.replace(context(Route.CHAT_COMPLETIONS.value), client_body=c)
        ),
        "Pipeline.run_response": lambda r, _c: _PIPELINE.run_response(
            r, context(Route.MESSAGES.value)
        ),
    }


def _run_stream(converter: object, data: bytes, cut: int) -> bytes:
    """Feed ``data`` in two pieces split at ``cut``, then close; the bytes sent on."""
    assert isinstance(
        converter, (ChatStreamConverter, ResponsesStreamConverter, AnthropicStreamConverter)
    )
    return converter.feed(data[:cut]) + converter.feed(data[cut:]) + converter.close()


def _sse_payloads(data: bytes, cut: int) -> bytes:
    parser = SseParser()
    return b"\x00".join([*parser.feed(data[:cut]), *parser.feed(data[cut:]), *parser.close()])


STREAM_ENTRY_POINTS: dict[str, Callable[[bytes, int, Any], bytes]] = {
    "ChatStreamConverter": lambda d, cut, c: _run_stream(
        ChatStreamConverter(requested=OutputMode.TEXT, client_body=c, options=_M, created=1),
        d,
        cut,
    ),
    "ResponsesStreamConverter": lambda d, cut, c: _run_stream(
        ResponsesStreamConverter(requested=OutputMode.TEXT, client_body=c, options=_M, created=1),
        d,
        cut,
    ),
    "AnthropicStreamConverter": lambda d, cut, c: _run_stream(
        AnthropicStreamConverter(requested=OutputMode.TEXT, client_body=c, options=_M), d, cut
    ),
    "SseParser": lambda d, cut, _c: _sse_payloads(d, cut),
}


def _ours(call: Callable[[], object]) -> tuple[str, Any]:
    """Call; the outcome as ("ok", result) or ("error", (type, message, param))."""
    try:
        return "ok", call()
    except DisaggTransformError as error:
        assert isinstance(error, (RequestError, UpstreamContractError)), repr(error)
        assert error.param, repr(error)  # every error names where
        return "error", (type(error), str(error), error.param)


def _same(first: tuple[str, object], second: tuple[str, object]) -> bool:
    if first[0] != second[0]:
        return False
    if first[0] == "error":
        return first[1] == second[1]
    return shape(_plain(first[1])) == shape(_plain(second[1]))


def _plain(result: object) -> object:
    return msgspec.structs.asdict(result) if isinstance(result, msgspec.Struct) else result


# ---- the properties ---------------------------------------------------------------------

# The tables hold ~80 entry points, each its own test: a share of the profile's examples each
# keeps the `ci` profile inside CI's time while `fuzz` still runs thousands per entry point.
PER_ENTRY_POINT = settings(max_examples=max(20, settings().max_examples // 8))


@pytest.mark.parametrize("name", sorted(REQUEST_ENTRY_POINTS))
@PER_ENTRY_POINT
@given(case=hostile_route_bodies | st.tuples(st.just(""), hostile_values))
def test_request_entry_points_hold_under_hostile_bodies(name: str, case: tuple[str, Any]) -> None:
    call = REQUEST_ENTRY_POINTS[name]
    body = case[1]
    before = snapshot(body)
    first = _ours(lambda: call(body))
    assert snapshot(body) == before, "the body was mutated"
    assert _same(first, _ours(lambda: call(body))), "two calls gave different outcomes"


@pytest.mark.parametrize("mode", [OutputMode.TEXT, OutputMode.DERENDER])
@pytest.mark.parametrize("name", sorted(_responses(OutputMode.TEXT)))
@PER_ENTRY_POINT
@given(
    case=hostile_generate_responses,
    client=st.none()
    | hostile(
        st.dictionaries(
            st.sampled_from(["top_logprobs", "model", "stop_sequences", "tools", "stream_options"]),
            hostile_values,
            max_size=3,
        )
    ),
)
def test_response_entry_points_hold_under_hostile_responses(
    mode: OutputMode, name: str, case: tuple[Any, str], client: Any
) -> None:
    call = _responses(mode)[name]
    response = case[0]
    before, client_before = snapshot(response), snapshot(client)
    first = _ours(lambda: call(response, client))
    assert snapshot(response) == before, "the response was mutated"
    assert snapshot(client) == client_before, "the client body was mutated"
    assert _same(first, _ours(lambda: call(response, client)))
    if first[0] == "ok":
        assert_no_generate_only_field(first[1])


@pytest.mark.parametrize("name", sorted(STREAM_ENTRY_POINTS))
@PER_ENTRY_POINT
@given(data=hostile_sse_streams(), cut=st.integers(0, 200), client=st.none() | hostile_values)
def test_stream_entry_points_hold_under_hostile_bytes(
    name: str, data: bytes, cut: int, client: Any
) -> None:
    call = STREAM_ENTRY_POINTS[name]
    before = snapshot(client)
    first = _ours(lambda: call(data, cut, client))
    assert snapshot(client) == before
    second = _ours(lambda: call(data, 0, client))
    # Output bytes depend only on the input bytes, not on how they were split; an error may
    # differ (one read decodes every event it completes before converting the first).
    assert first[0] == second[0]
    if first[0] == "ok":
        assert first == second
    if first[0] == "ok" and name != "SseParser":
        assert isinstance(first[1], bytes)
        for event in _events(first[1]):
            assert_no_generate_only_field(event)


def _events(stream: bytes) -> Iterator[object]:
    for line in stream.split(b"\n"):
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            yield msgspec.json.decode(line[6:])


def assert_no_generate_only_field(result: object) -> None:
    """No generate-only key anywhere a client sees: top level, choices, nested responses."""
    pending = [_plain(result)]
    while pending:
        node = pending.pop()
        if isinstance(node, bytes):
            pending.extend(_events(node))
        elif isinstance(node, list):
            pending.extend(node)
        elif isinstance(node, dict):
            # A key vLLM's own answer writes null may be there, null; no worker value may.
            leaked = {
                key
                for key in set(node) & {*GENERATE_ONLY_TOP_KEYS, *GENERATE_ONLY_CHOICE_KEYS}
                if node[key] is not None
            }
            # A client's own tool arguments may use any key; everything else may not.
            assert not leaked - {"metrics"} or "arguments" in node, leaked
            pending.extend(v for k, v in node.items() if k not in ("input", "arguments"))


@given(
    step=st.sampled_from(["encode", "prefill", "decode", "conditional-decode"]),
    params=hostile_values,
)
def test_parse_step_params_raises_only_config_errors(step: str, params: Any) -> None:
    before = snapshot(params)
    try:
        parse_step_params(step, params)
    except DisaggTransformError as error:
        assert error.status_hint == 500
    assert snapshot(params) == before


@given(params=hostile_values)
def test_parse_pipeline_params_raises_only_config_errors(params: Any) -> None:
    before = snapshot(params)
    try:
        parse_pipeline_params(params)
    except DisaggTransformError as error:
        assert error.status_hint == 500
    assert snapshot(params) == before


# ---- request-side contracts: nothing lost, no client transfer param ----------------------


@given(case=all_route_bodies, trusted=st.booleans(), step=st.sampled_from(["decode", "prefill"]))
def test_openai_legs_keep_every_client_field(
    case: tuple[str, dict[str, Any]], trusted: bool, step: str
) -> None:
    path, body = case
    if step == "decode":
        call: Callable[[], Leg] = lambda: build_decode_request(  # noqa: E731
            body, client_path=path, params=DecodeParams(trust_client_transfer_params=trusted)
        )
    else:
        call = lambda: build_prefill_request(  # noqa: E731
            body, client_path=path, params=PrefillParams(trust_client_transfer_params=trusted)
        )
    outcome = _ours(call)
    if outcome[0] == "error":
        return
    leg = outcome[1].body
    rewritten = (
        {
            "max_tokens",
            "max_completion_tokens",
            "max_output_tokens",
            "min_tokens",
            "stream",
            "stream_options",
        }
        if step == "prefill"
        else set()
    )
    for key, value in body.items():
        if key in TRANSFER_KEYS or key in rewritten or key in ("vllm_xargs", "sampling_params"):
            continue
        assert key in leg, key
        assert shape(leg[key]) == shape(value), key


@given(
    case=all_route_bodies,
    openai=st.booleans(),
    placement=st.sampled_from(list(KvTransferPlacement)),
    builder=st.sampled_from(["decode", "prefill", "encode"]),
)
def test_client_transfer_params_never_reach_an_untrusted_leg(
    case: tuple[str, dict[str, Any]], openai: bool, placement: KvTransferPlacement, builder: str
) -> None:
    path, body = case
    tokens = [1, 2, 3]
    if builder == "decode":
        params: Any = DecodeParams(use_openai_format=openai, kv_transfer_placement=placement)
        call: Callable[[], Leg] = lambda: build_decode_request(  # noqa: E731
            body, client_path=path, params=params, token_ids=tokens, kv_transfer_params=ROUTER_KV
        )
        allowed: dict[str, Any] = {"kv_transfer_params": ROUTER_KV}
    elif builder == "prefill":
        params = PrefillParams(use_openai_format=openai, kv_transfer_placement=placement)
        call = lambda: build_prefill_request(  # noqa: E731
            body,
            client_path=path,
            params=params,
            inputs=LegInputs(
                token_ids=tokens, kv_transfer_params=ROUTER_KV, ec_transfer_params=ROUTER_EC
            ),
        )
        allowed = {
            "kv_transfer_params": {
                "do_remote_decode": True,
                "do_remote_prefill": False,
                **ROUTER_KV,
            },
            "ec_transfer_params": ROUTER_EC,
        }
    else:
        params = EncodeParams(use_openai_format=openai)
        call = lambda: build_encode_request(  # noqa: E731
            body, client_path=path, params=params, inputs=LegInputs(token_ids=tokens)
        )
        allowed = {}
    outcome = _ours(call)
    if outcome[0] == "error":
        return
    leg = outcome[1].body
    holders = [
        leg,
        (leg.get("sampling_params") or {}).get("extra_args") or {},
        leg.get("vllm_xargs") or {},
    ]
    for holder in holders:
        for key in TRANSFER_KEYS:
            if key in holder:
                assert holder[key] == allowed.get(key), (key, holder[key])


# ---- the byte parsers the fuzz harness also drives --------------------------------------


@given(data=hostile_json_bytes())
def test_hostile_json_bytes_into_every_dict_entry_point(data: bytes) -> None:
    # What a router does with a body it received: decode it, then hand it over.
    try:
        value = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return
    calls = [
        *(functools.partial(call, value) for call in REQUEST_ENTRY_POINTS.values()),
        *(functools.partial(call, value, None) for call in _responses(OutputMode.TEXT).values()),
    ]
    for call in calls:
        _ours(call)


def test_nan_and_huge_numbers_in_dicts_are_refused() -> None:
    body = {"messages": [], "temperature": math.nan, "max_tokens": 2**70}
    outcome = _ours(
        lambda: build_decode_request(
            body, client_path="/v1/chat/completions", params=DECODE, token_ids=[1]
        )
    )
    assert outcome[0] == "error"
    assert outcome[1][2] == "$.max_tokens"

"""Request legs: the bodies of the encode, prefill and decode requests a router sends to workers.

Each builder takes the client's body (never mutated), the client's path and the step's params,
and returns where to send the leg and its body. A leg on the client's own OpenAI-style route keeps
the client's body and adds the transfer params; a leg on the generate route is a generate body
with the client's cap and sampling fields where vLLM reads them (``sampling_params``). See
``docs/request-legs.md`` for worked examples and the field table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from disagg_transforms import _limits, _raw, _validate
from disagg_transforms import _wire as w
from disagg_transforms._chat_map import map_chat_request, map_completions_request
from disagg_transforms._client_map import ClientMapper, ClientMapping
from disagg_transforms._describe import describe
from disagg_transforms._limits import DEFAULT_LIMITS, Limits
from disagg_transforms._messages_map import map_messages_request
from disagg_transforms._responses_map import map_responses_request
from disagg_transforms.caps import TOP_LEVEL_CAPS, apply_sampling_caps, apply_single_token_cap
from disagg_transforms.config import (
    DecodeParams,
    EncodeParams,
    KvTransferPlacement,
    OutputMode,
    PrefillParams,
)
from disagg_transforms.envelopes import GenerateRequest
from disagg_transforms.errors import RequestError
from disagg_transforms.routes import Route, detect_route, resolve_format

__all__ = (
    "DecodeLeg",
    "DecodeLegBytes",
    "Leg",
    "build_decode_request",
    "build_decode_request_bytes",
    "build_encode_request",
    "build_prefill_request",
)

CLIENT_MAPPERS: Mapping[Route, ClientMapper] = {
    Route.CHAT_COMPLETIONS: map_chat_request,
    Route.COMPLETIONS: map_completions_request,
    Route.RESPONSES: map_responses_request,
    Route.MESSAGES: map_messages_request,
}
"""The one table a generate leg picks a non-generate client's field mapper from."""

_TRANSFER_KEYS = (w.KV_TRANSFER_PARAMS, w.EC_TRANSFER_PARAMS)
_PREFILL_KV: Mapping[str, Any] = {w.DO_REMOTE_DECODE: True, w.DO_REMOTE_PREFILL: False}
# Carried from a non-generate client onto its generate leg, when set (not null).
_CARRIED_AS_IS = (w.MODEL, w.CACHE_SALT, w.PRIORITY, w.RETURN_TOKEN_IDS)


class Leg(msgspec.Struct, frozen=True, kw_only=True):
    """An encode or prefill request: where to send it and its body."""

    path: str
    """The path to POST to (``route.value``)."""
    route: Route
    """The route the leg speaks (its wire format)."""
    body: dict[str, Any]
    """The JSON body (a new dict; the client's body is never mutated)."""


class DecodeLeg(Leg, frozen=True, kw_only=True):
    """A decode request and how its answer must be handled."""

    stream: bool
    """The leg streams (SSE)."""
    single_frame: bool
    """The client streams but the leg does not (derender): its answer comes in one frame."""
    wrap_chat_completion: bool
    """The answer must be rebuilt into the chat envelope (chat client, generate leg, step on)."""
    output_mode: OutputMode | None
    """The requested ``output_mode`` on the generate route; ``None`` on an OpenAI-format leg."""
    dropped: tuple[str, ...]
    """Client keys left out of the leg, on the documented list (``docs/request-legs.md``)."""


class _Transfer(msgspec.Struct, frozen=True, kw_only=True):
    """The transfer params a leg carries, and the client keys stripped on the way."""

    kv: Mapping[str, Any] | None
    ec: Mapping[str, Any] | None
    stripped: tuple[str, ...]


def _client_route(client_path: object) -> Route:
    if not isinstance(client_path, str):
        msg = f"client_path: expected the client's request path, got {describe(client_path)}"
        raise RequestError(msg, param="client_path")
    return detect_route(client_path)


def _router_object(value: object, name: str) -> Mapping[str, Any] | None:
    return None if value is None else _validate.mapping(value, f"$.{name}")


def _take_transfer(
    body: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, tuple[object, str]], list[str]]:
    """Remove every transfer param from a body: (cleaned body, values found, where found).

    Looked for at the top level, in ``sampling_params.extra_args`` and in ``vllm_xargs`` (which
    vLLM turns into ``extra_args``): any of them would steer a worker. A value found is kept with
    its JSON path; a top-level value is preferred over a nested one.
    """
    result = {k: v for k, v in body.items() if k not in _TRANSFER_KEYS}
    found = {k: (body[k], f"$.{k}") for k in _TRANSFER_KEYS if body.get(k) is not None}
    where = [k for k in _TRANSFER_KEYS if k in body]
    for outer, inner in ((w.SAMPLING_PARAMS, w.EXTRA_ARGS), (w.VLLM_XARGS, None)):
        container = _validate.obj(body, outer)
        if container is None:
            continue
        path = outer
        args: Mapping[str, Any] | None = container
        if inner is not None:
            args = _validate.obj(container, inner, f"$.{outer}")
            path = f"{outer}.{inner}"
        if args is None or not any(k in args for k in _TRANSFER_KEYS):
            continue
        for key in _TRANSFER_KEYS:
            if key in args:
                where.append(f"{path}.{key}")
                if args[key] is not None:
                    found.setdefault(key, (args[key], f"$.{path}.{key}"))
        cleaned = {k: v for k, v in args.items() if k not in _TRANSFER_KEYS}
        result[outer] = cleaned if inner is None else {**container, inner: cleaned}
    return result, found, where


def strip_transfer_params(body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` without any transfer param (top level, ``extra_args``, ``vllm_xargs``).

    Shared with the built-in transform and the LiteLLM callbacks; ``body`` is not mutated.

    Raises:
        RequestError: ``body`` (or a container the params hide in) is not a JSON object.
    """
    return _take_transfer(_validate.mapping(body, "$"))[0]


def _transfer(
    body: Mapping[str, Any],
    *,
    trusted: bool,
    kv: Mapping[str, Any] | None,
    ec: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], _Transfer]:
    """Strip the client's transfer params and decide the ones the leg carries (router's win)."""
    cleaned, found, where = _take_transfer(body)
    client = (
        {key: _validate.mapping(value, path) for key, (value, path) in found.items()}
        if trusted
        else {}
    )
    final_kv = kv if kv is not None else client.get(w.KV_TRANSFER_PARAMS)
    final_ec = ec or client.get(w.EC_TRANSFER_PARAMS)
    stripped = () if trusted else tuple(where)
    return cleaned, _Transfer(kv=final_kv, ec=final_ec, stripped=stripped)


def _place_top_level(body: dict[str, Any], transfer: _Transfer) -> dict[str, Any]:
    for key, value in ((w.KV_TRANSFER_PARAMS, transfer.kv), (w.EC_TRANSFER_PARAMS, transfer.ec)):
        if value is not None:
            body[key] = dict(value)
    return body


def _place_generate(
    body: dict[str, Any], transfer: _Transfer, placement: KvTransferPlacement
) -> dict[str, Any]:
    if placement is not KvTransferPlacement.EXTRA_ARGS:
        _place_top_level(body, transfer)
    if placement is KvTransferPlacement.TOP_LEVEL:
        return body
    values = {
        key: dict(value)
        for key, value in ((w.KV_TRANSFER_PARAMS, transfer.kv), (w.EC_TRANSFER_PARAMS, transfer.ec))
        if value is not None
    }
    if values:
        sampling = body[w.SAMPLING_PARAMS]
        extra = sampling.get(w.EXTRA_ARGS) or {}
        body[w.SAMPLING_PARAMS] = {**sampling, w.EXTRA_ARGS: {**extra, **values}}
    return body


def _token_ids(
    token_ids: object, fallback: object, *, required: bool
) -> list[int] | _raw.RawTokenIds | None:
    value = token_ids if token_ids is not None else fallback
    if isinstance(value, _raw.RawTokenIds):
        return value  # the bytes path proved it a non-empty array of unsigned integers
    if value is None:
        if required:
            msg = f"$.{w.TOKEN_IDS}: required on the generate route (the rendered prompt)"
            raise RequestError(msg, param=f"$.{w.TOKEN_IDS}")
        return None
    # Decoded from bytes the scan could not prove: checked as a dict's, the range the worker's.
    unbounded = isinstance(value, _raw.UnprovedTokenIds)
    checked = _validate.token_ids(value, maximum=None if unbounded else _validate.MAX_TOKEN_ID)
    if required and not checked:
        msg = f"$.{w.TOKEN_IDS}: must hold at least one token ID, got an empty array"
        raise RequestError(msg, param=f"$.{w.TOKEN_IDS}")
    return checked


class _Inputs(msgspec.Struct, frozen=True, kw_only=True):
    """What the router hands a builder besides the client's body, its path and the step's params.

    ``kv`` and ``ec`` are checked (and merged, for prefill) when this is built; ``features`` and
    ``rendered`` only when a generate leg reads them (an OpenAI-format leg ignores them).
    """

    token_ids: Sequence[int] | None
    features: object
    rendered: object
    request_id: str | None
    kv: Mapping[str, Any] | None
    ec: Mapping[str, Any] | None
    limits: Limits


class _Core(msgspec.Struct, frozen=True, kw_only=True):
    """A generate body before the step-specific part (stream, output mode, single-token cap)."""

    body: dict[str, Any]
    mapping: ClientMapping | None
    """The client's field mapping (``None`` for a client already on the generate route)."""
    transfer: _Transfer


def _generate_core(
    body: Mapping[str, Any], client_route: Route, inputs: _Inputs, *, trusted: bool
) -> _Core:
    features = _router_object(inputs.features, w.FEATURES)
    rendered = _router_object(inputs.rendered, "rendered")
    mapping = None
    if client_route is Route.GENERATE:
        leg = apply_sampling_caps(body, Route.GENERATE)
    else:
        mapping = CLIENT_MAPPERS[client_route](body)
        if rendered is not None:
            leg = apply_sampling_caps(_validate.mapping(rendered, "$"), Route.GENERATE)
        else:
            caps = {k: body[k] for k in (*TOP_LEVEL_CAPS, w.MIN_TOKENS) if k in body}
            sampling = apply_sampling_caps(caps, client_route)[w.SAMPLING_PARAMS]
            leg = {w.SAMPLING_PARAMS: {**mapping.sampling_params, **sampling}}
        for key in _CARRIED_AS_IS:
            if body.get(key) is not None:
                leg.setdefault(key, body[key])
        # The client's transfer params are judged below; the rendered ones came from it too.
        for key in _TRANSFER_KEYS:
            if body.get(key) is not None:
                leg.setdefault(key, body[key])
        if body.get(w.REQUEST_ID) is not None:
            leg[w.REQUEST_ID] = body[w.REQUEST_ID]
    if inputs.request_id is not None:
        leg[w.REQUEST_ID] = inputs.request_id
    ids = _token_ids(inputs.token_ids, leg.get(w.TOKEN_IDS), required=True)
    leg[w.TOKEN_IDS] = ids
    given_features = features if features is not None else leg.get(w.FEATURES)
    if given_features is not None:
        leg[w.FEATURES] = _validate.features(given_features, len(ids or ()))
    leg, transfer = _transfer(leg, trusted=trusted, kv=inputs.kv, ec=inputs.ec)
    return _Core(body=leg, mapping=mapping, transfer=transfer)


def _check_generate(body: Mapping[str, Any]) -> None:
    # One typed read of the whole leg: a wrong type anywhere is refused at its JSON path.
    # token_ids were checked by _token_ids (the bytes path keeps them as bytes): not re-read.
    _validate.convert({**body, w.TOKEN_IDS: []}, GenerateRequest, "$")


def _leg_stream(body: Mapping[str, Any], mode: OutputMode | None) -> tuple[bool, bool]:
    """Return (leg streams, client streams)."""
    client_streams = _validate.typed(body, w.STREAM, bool) is True
    return client_streams and mode is not OutputMode.DERENDER, client_streams


def _decode_generate(
    body: Mapping[str, Any],
    client_route: Route,
    params: DecodeParams,
    core: _Core,
    parse_context: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], bool, bool, tuple[str, ...]]:
    leg = _place_generate(core.body, core.transfer, params.kv_transfer_placement)
    mode = params.output_mode
    streams, client_streams = _leg_stream(body, mode)
    dropped = list(core.transfer.stripped)
    leg[w.OUTPUT_MODE] = mode.value
    leg[w.STREAM] = streams
    options = leg.pop(w.STREAM_OPTIONS, None)
    if client_route is not Route.GENERATE:
        options = body.get(w.STREAM_OPTIONS)
    if options is not None and streams:
        leg[w.STREAM_OPTIONS] = options
    elif w.STREAM_OPTIONS in body:
        dropped.append(w.STREAM_OPTIONS)
    mapping = core.mapping
    if mapping is not None:
        dropped.extend(mapping.dropped)
    if mode is OutputMode.DERENDER:
        context = parse_context if parse_context is not None else leg.get(w.PARSE_CONTEXT)
        if context is None and mapping is not None:
            # Always one, even empty: a server with a tool or reasoning parser refuses a
            # derender request without parse_context.
            context = mapping.parse_context or {}
        if context is not None:
            leg[w.PARSE_CONTEXT] = dict(_validate.mapping(context, f"$.{w.PARSE_CONTEXT}"))
    elif mapping is not None:
        dropped.extend(mapping.context_keys)
    return leg, streams, client_streams, tuple(dict.fromkeys(dropped))


def build_decode_request(  # noqa: PLR0913 - the router hands in what it has, by keyword
    client_body: Mapping[str, Any],
    *,
    client_path: str,
    params: DecodeParams,
    token_ids: Sequence[int] | None = None,
    kv_transfer_params: Mapping[str, Any] | None = None,
    features: Mapping[str, Any] | None = None,
    rendered: Mapping[str, Any] | None = None,
    request_id: str | None = None,
    parse_context: Mapping[str, Any] | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> DecodeLeg:
    """Build the decode leg for a client request (SPEC §4.2).

    Args:
        client_body: the client's JSON body (never mutated).
        client_path: the path the client called (it decides the client's route).
        params: the decode step's params.
        token_ids: the rendered prompt; required on the generate route unless ``rendered`` or a
            generate client's own body has them.
        kv_transfer_params: what the router's KV connector supplies for decode.
        features: multimodal features for the prompt (generate route).
        rendered: a ``GenerateRequest`` from vLLM's ``/render`` for this request: the leg is
            built from it (its ``sampling_params`` kept) instead of mapping the client's fields.
        request_id: the router's request ID (else the client's, else none).
        parse_context: the one ``/render`` returned (derender mode).
        limits: the bounds on the body (``docs/security.md``).

    Raises:
        RequestError: the body (or what the router handed in) cannot make a valid leg or is
            past a limit; ``param`` is the JSON path of the offending value.
    """
    body, client_route, route = _routes(client_body, client_path, params.use_openai_format, limits)
    inputs = _Inputs(
        token_ids=token_ids,
        features=features,
        rendered=rendered,
        request_id=request_id,
        kv=_router_object(kv_transfer_params, w.KV_TRANSFER_PARAMS),
        ec=None,
        limits=limits,
    )
    trusted = params.trust_client_transfer_params
    if route is not Route.GENERATE:
        leg, transfer = _openai_leg(body, route, inputs, trusted=trusted)
        placed = _place_top_level(leg, transfer)
        _limits.check_token_count(placed, limits)
        streams = _validate.typed(body, w.STREAM, bool) is True
        return DecodeLeg(
            path=route.value,
            route=route,
            body=placed,
            stream=streams,
            single_frame=False,
            wrap_chat_completion=False,
            output_mode=None,
            dropped=transfer.stripped,
        )
    core = _generate_core(body, client_route, inputs, trusted=trusted)
    leg, streams, client_streams, dropped = _decode_generate(
        body, client_route, params, core, _router_object(parse_context, w.PARSE_CONTEXT)
    )
    _check_generate(leg)
    _limits.check_token_count(leg, limits)
    return DecodeLeg(
        path=route.value,
        route=route,
        body=leg,
        stream=streams,
        single_frame=client_streams and not streams,
        wrap_chat_completion=params.wrap_chat_completion and client_route is Route.CHAT_COMPLETIONS,
        output_mode=params.output_mode,
        dropped=dropped,
    )


class DecodeLegBytes(msgspec.Struct, frozen=True, kw_only=True):
    """A decode request built on the bytes path: as :class:`DecodeLeg`, with a JSON body."""

    path: str
    """The path to POST to (``route.value``)."""
    route: Route
    """The route the leg speaks (its wire format)."""
    body: bytes
    """The leg's JSON body; every client member the leg keeps unchanged has its input bytes."""
    stream: bool
    """As :attr:`DecodeLeg.stream`."""
    single_frame: bool
    """As :attr:`DecodeLeg.single_frame`."""
    wrap_chat_completion: bool
    """As :attr:`DecodeLeg.wrap_chat_completion`."""
    output_mode: OutputMode | None
    """As :attr:`DecodeLeg.output_mode`."""
    dropped: tuple[str, ...]
    """As :attr:`DecodeLeg.dropped`."""


def build_decode_request_bytes(  # noqa: PLR0913 - the router hands in what it has, by keyword
    client_body: bytes,
    *,
    client_path: str,
    params: DecodeParams,
    token_ids: Sequence[int] | None = None,
    kv_transfer_params: Mapping[str, Any] | None = None,
    features: Mapping[str, Any] | None = None,
    rendered: Mapping[str, Any] | None = None,
    request_id: str | None = None,
    parse_context: Mapping[str, Any] | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> DecodeLegBytes:
    """Build the decode leg from the client's JSON bytes, never decoding ``token_ids``.

    The same leg as :func:`build_decode_request` (same rules, same errors), written as JSON
    bytes: the body is split into raw top-level members, ``token_ids`` is proved clean by a byte
    scan instead of a decode (the other members are decoded for the rules), and every member
    the leg keeps unchanged is written with its input bytes, in the input's key order. See
    ``docs/bytes.md``.

    Raises:
        RequestError: as :func:`build_decode_request`; also ``param`` ``$`` when the body is not
            bytes, not valid JSON, not a JSON object, not UTF-8, or over
            ``limits.max_body_bytes``.
    """
    if isinstance(client_body, bytes):
        _limits.check_body_size(client_body, limits, error=RequestError)
    members = _raw.RawMembers(
        client_body, RequestError, "the client body", token_ids_key=w.TOKEN_IDS
    )
    leg = build_decode_request(
        members,
        client_path=client_path,
        params=params,
        token_ids=token_ids,
        kv_transfer_params=kv_transfer_params,
        features=features,
        rendered=rendered,
        request_id=request_id,
        parse_context=parse_context,
        limits=limits,
    )
    return DecodeLegBytes(
        path=leg.path,
        route=leg.route,
        body=members.encode(leg.body),
        stream=leg.stream,
        single_frame=leg.single_frame,
        wrap_chat_completion=leg.wrap_chat_completion,
        output_mode=leg.output_mode,
        dropped=leg.dropped,
    )


def _routes(
    client_body: Mapping[str, Any], client_path: str, use_openai_format: bool, limits: Limits
) -> tuple[Mapping[str, Any], Route, Route]:
    """The checked client body, the client's route and the leg's route (every builder's start)."""
    body = _validate.mapping(client_body, "$")
    _limits.check_client_body(body, limits)
    client_route = _client_route(client_path)
    return body, client_route, resolve_format(use_openai_format, client_path)


def _openai_leg(
    body: Mapping[str, Any], route: Route, inputs: _Inputs, *, trusted: bool
) -> tuple[dict[str, Any], _Transfer]:
    leg, transfer = _transfer(body, trusted=trusted, kv=inputs.kv, ec=inputs.ec)
    if route is Route.COMPLETIONS:
        ids = _token_ids(inputs.token_ids, None, required=False)
        if ids is not None and ids:
            leg[w.PROMPT] = ids
    return leg, transfer


def _single_token_leg(
    client_body: Mapping[str, Any],
    client_path: str,
    params: EncodeParams | PrefillParams,
    placement: KvTransferPlacement,
    inputs: _Inputs,
) -> Leg:
    limits = inputs.limits
    body, client_route, route = _routes(client_body, client_path, params.use_openai_format, limits)
    trusted = params.trust_client_transfer_params
    if route is not Route.GENERATE:
        leg, transfer = _openai_leg(body, route, inputs, trusted=trusted)
        leg = apply_single_token_cap(_place_top_level(leg, transfer), route)
        _limits.check_token_count(leg, limits)
        return Leg(path=route.value, route=route, body=leg)
    core = _generate_core(body, client_route, inputs, trusted=trusted)
    # A prefill or encode answer is never read for text: tokens mode, the route's default.
    leg = {k: v for k, v in core.body.items() if k != w.OUTPUT_MODE}
    leg = apply_single_token_cap(_place_generate(leg, core.transfer, placement), Route.GENERATE)
    _check_generate(leg)
    _limits.check_token_count(leg, limits)
    return Leg(path=route.value, route=route, body=leg)


def build_prefill_request(  # noqa: PLR0913 - the router hands in what it has, by keyword
    client_body: Mapping[str, Any],
    *,
    client_path: str,
    params: PrefillParams,
    token_ids: Sequence[int] | None = None,
    kv_transfer_params: Mapping[str, Any] | None = None,
    ec_transfer_params: Mapping[str, Any] | None = None,
    features: Mapping[str, Any] | None = None,
    rendered: Mapping[str, Any] | None = None,
    request_id: str | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> Leg:
    """Build the prefill leg (SPEC §4.4): the client's request capped at one output token.

    ``kv_transfer_params`` is ``{"do_remote_decode": true, "do_remote_prefill": false}`` merged
    with what the router's connector supplies (the router's keys win); ``ec_transfer_params`` is
    written when the router supplies a non-empty one. Client sampling fields stay, so the
    prefill's cache key matches decode's. Other arguments as for :func:`build_decode_request`.
    """
    kv = _router_object(kv_transfer_params, w.KV_TRANSFER_PARAMS)
    inputs = _Inputs(
        token_ids=token_ids,
        features=features,
        rendered=rendered,
        request_id=request_id,
        kv={**_PREFILL_KV, **(kv or {})},
        ec=_router_object(ec_transfer_params, w.EC_TRANSFER_PARAMS),
        limits=limits,
    )
    return _single_token_leg(client_body, client_path, params, params.kv_transfer_placement, inputs)


def build_encode_request(  # noqa: PLR0913 - the router hands in what it has, by keyword
    client_body: Mapping[str, Any],
    *,
    client_path: str,
    params: EncodeParams,
    token_ids: Sequence[int] | None = None,
    features: Mapping[str, Any] | None = None,
    rendered: Mapping[str, Any] | None = None,
    request_id: str | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> Leg:
    """Build an encode leg (SPEC §4.4): capped at one token, with no transfer params.

    Client-supplied transfer params are stripped unless the step trusts them. Arguments as for
    :func:`build_decode_request`.
    """
    inputs = _Inputs(
        token_ids=token_ids,
        features=features,
        rendered=rendered,
        request_id=request_id,
        kv=None,
        ec=None,
        limits=limits,
    )
    return _single_token_leg(client_body, client_path, params, KvTransferPlacement.BOTH, inputs)

"""Request legs: the bodies of the encode, prefill and decode requests a router sends to workers.

Each builder takes the client's body (never mutated), the client's path and the step's params,
and returns where to send the leg and its body. A leg on the client's own OpenAI-style route keeps
the client's body and adds the transfer params; a leg on the generate route is a generate body
with the client's cap and sampling fields where vLLM reads them (``sampling_params``). See
``docs/request-legs.md`` for worked examples and the field table.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, Generic, TypeAlias, TypeVar, get_type_hints

import msgspec
from msgspec import UNSET

from disagg_transforms._config import (
    DERENDER_MODE,
    TOKENS_MODE,
    TOP_LEVEL_PLACEMENT,
    DecodeParams,
    EncodeParams,
    KvTransferPlacement,
    OutputMode,
    PrefillParams,
)
from disagg_transforms._request.caps import (
    CAP_KEYS,
    apply_sampling_caps,
    apply_single_token_cap,
)
from disagg_transforms._request.client import ClientRequest, own_output_mode, read_client_request
from disagg_transforms._request.fields import CARRIED_AS_IS, TRANSFER_KEYS
from disagg_transforms._request.mapping import ClientMapping
from disagg_transforms._request.render import RenderAnswer, common_sampling
from disagg_transforms._routes import (
    CHAT_ROUTE,
    GENERATE_ROUTE,
    ROUTE_PATH,
    Route,
    detect_route,
    leg_route,
)
from disagg_transforms._wire import keys as w
from disagg_transforms._wire import limits as _limits
from disagg_transforms._wire import raw as _raw
from disagg_transforms._wire import validate as _validate
from disagg_transforms._wire.describe import describe
from disagg_transforms._wire.limits import DEFAULT_LIMITS, Limits
from disagg_transforms.envelopes import GenerateRequest
from disagg_transforms.errors import RequestError, RequestTooLargeError, UpstreamContractError

__all__ = (
    "DecodeLeg",
    "DecodeLegBytes",
    "GenerateDecodeLeg",
    "GenerateDecodeLegBytes",
    "Leg",
    "LegInputs",
    "build_decode_request",
    "build_decode_request_bytes",
    "build_encode_request",
    "build_prefill_request",
    "strip_transfer_params",
)

_PREFILL_KV: Mapping[str, Any] = {w.DO_REMOTE_DECODE: True, w.DO_REMOTE_PREFILL: False}
# Where transfer params hide: the top level (None), sampling_params.extra_args, vllm_xargs.
_Places: TypeAlias = tuple[tuple[str, str | None], ...]
_XARGS: _Places = ((w.VLLM_XARGS, None),)
_EVERYWHERE: _Places = ((w.SAMPLING_PARAMS, w.EXTRA_ARGS), *_XARGS)
# Whether a client's envelope always ends with usage (a Responses `response.completed`, an
# Anthropic `message_delta`): its streamed leg asks for it (docs/request-legs.md, "Streaming").
USAGE_AT_END: Mapping[Route, bool] = {
    Route.CHAT_COMPLETIONS: False,
    Route.COMPLETIONS: False,
    Route.RESPONSES: True,
    Route.MESSAGES: True,
    Route.GENERATE: False,
}
_DETOKENIZE = f"{w.SAMPLING_PARAMS}.{w.DETOKENIZE}"
# Paths only an error reads, formatted once rather than per leg.
_PARSE_CONTEXT_PATH: Final = f"$.{w.PARSE_CONTEXT}"
_STREAM_OPTIONS_PATH: Final = f"$.{w.STREAM_OPTIONS}"
# Each mode's wire text, read without the descriptor call a member's `.value` costs.
_MODE_TEXT: Mapping[OutputMode, str] = {mode: mode.value for mode in OutputMode}


class LegInputs(msgspec.Struct, frozen=True, kw_only=True):
    """What the router hands a leg builder for one request, besides the client's body.

    The one shape of the router's inputs: every leg builder takes one as ``inputs=``
    (:func:`build_decode_request` also builds one from its keywords), and the built-in
    transforms read it from the :class:`~disagg_transforms.hooks.TransformContext`. Every field
    defaults to not given.
    """

    token_ids: Sequence[int] | None = None
    """The rendered prompt."""
    kv_transfer_params: Mapping[str, Any] | None = None
    """What the router's KV connector supplies for this leg."""
    ec_transfer_params: Mapping[str, Any] | None = None
    """What the router's encoder-cache connector supplies for this leg."""
    features: Mapping[str, Any] | None = None
    """Multimodal features of the prompt (generate route)."""
    rendered: Mapping[str, Any] | None = None
    """The ``GenerateRequest`` vLLM's ``/render`` answered for this request."""
    request_id: str | None = None
    """The router's request ID (else the client's, else none)."""
    parse_context: Mapping[str, Any] | None = None
    """The ``parse_context`` ``/render`` returned (derender decode legs)."""
    limits: Limits = DEFAULT_LIMITS
    """The bounds on the body (``docs/security.md``)."""


def _inputs(given: object, **keywords: Any) -> LegInputs:  # noqa: ANN401 - any keyword value
    """The router's inputs, from ``inputs=`` or from the builder's keywords (not both)."""
    if type(given) is LegInputs and not keywords:
        return given  # the builders that take no keywords: nothing to compare
    from_keywords = LegInputs(**keywords)
    if given is None:
        return from_keywords
    if not isinstance(given, LegInputs):
        msg = f"inputs: expected a LegInputs, got {describe(given)}"
        raise RequestError(msg, param="inputs")
    if from_keywords != LegInputs():
        msg = "inputs: pass the router's inputs as keywords or as one LegInputs, not both"
        raise RequestError(msg, param="inputs")
    return given


_BodyT = TypeVar("_BodyT")
_LegParams: TypeAlias = EncodeParams | PrefillParams | DecodeParams


class _LegFields(msgspec.Struct, Generic[_BodyT], frozen=True, kw_only=True):
    """Where to send a leg and its body: the fields every leg has, its body a dict or bytes."""

    path: str
    """The path to POST to (``route.value``)."""
    route: Route
    """The route the leg speaks (its wire format)."""
    body: _BodyT
    """The JSON body: a new dict (the client's body is never mutated); on the bytes path, JSON
    bytes in which every client member the leg keeps unchanged has its input bytes."""


class _DecodeLegFields(_LegFields[_BodyT], frozen=True, kw_only=True):
    """A decode leg's fields, shared by :class:`DecodeLeg` and :class:`DecodeLegBytes`."""

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


class Leg(_LegFields[dict[str, Any]], frozen=True, kw_only=True):
    """An encode or prefill request: where to send it and its body (a dict)."""


# msgspec takes one base that adds fields: Leg adds none of its own, so a DecodeLeg is both a
# Leg and a struct with the decode fields DecodeLegBytes has too.
class DecodeLeg(_DecodeLegFields[dict[str, Any]], Leg, frozen=True, kw_only=True):
    """A decode request and how its answer must be handled.

    A leg on the generate route is a :class:`GenerateDecodeLeg`, whose ``output_mode`` is never
    ``None``: ``isinstance(leg, GenerateDecodeLeg)`` narrows it for the wraps.
    """


class GenerateDecodeLeg(DecodeLeg, frozen=True, kw_only=True):
    """A decode leg on the generate route: its answer is checked and wrapped for ``output_mode``."""

    output_mode: OutputMode
    """The requested ``output_mode``: what the wraps and converters take as ``requested``."""


class DecodeLegBytes(_DecodeLegFields[bytes], frozen=True, kw_only=True):
    """A decode request built on the bytes path: as :class:`DecodeLeg`, with a JSON body.

    It is not a :class:`Leg` (its body is bytes). A leg on the generate route is a
    :class:`GenerateDecodeLegBytes`.
    """


class GenerateDecodeLegBytes(DecodeLegBytes, frozen=True, kw_only=True):
    """A bytes-path decode leg on the generate route: as :class:`GenerateDecodeLeg`."""

    output_mode: OutputMode
    """As :attr:`GenerateDecodeLeg.output_mode`."""


class _Transfer(msgspec.Struct, frozen=True, kw_only=True):
    """The transfer params a leg carries, and where the client had put its own."""

    kv: Mapping[str, Any] | None
    ec: Mapping[str, Any] | None
    stripped: tuple[str, ...]
    """The client's transfer params removed from the leg (its JSON paths, ``$.`` left off)."""

    def given(self) -> dict[str, dict[str, Any]]:
        """Each param the leg carries, by its wire key: a new dict per call and param."""
        values = {}
        if self.kv is not None:
            values[w.KV_TRANSFER_PARAMS] = dict(self.kv)
        if self.ec is not None:
            values[w.EC_TRANSFER_PARAMS] = dict(self.ec)
        return values


class _Request(msgspec.Struct, frozen=True, kw_only=True):
    """The client's request and how one step treats it: what every leg builder reads."""

    client: ClientRequest
    route: Route
    """The route the leg speaks."""
    inputs: LegInputs
    trusted: bool
    """The step keeps the client's own transfer params (else they are stripped)."""
    flags: Mapping[str, Any] | None
    """The prefill step's KV flags, winning over every other value; ``None`` on other steps."""


def _router_object(value: object, name: str) -> Mapping[str, Any] | None:
    return None if value is None else _validate.mapping(value, f"$.{name}")


def _containers(
    body: Mapping[str, Any], where: _Places
) -> Iterator[tuple[str, str | None, Mapping[str, Any], Mapping[str, Any]]]:
    """Each object of ``where`` holding a transfer param: (outer key, inner key, outer, itself)."""
    for outer, inner in where:
        container = _validate.obj(body, outer)
        if container is None:
            continue
        args = container if inner is None else _validate.obj(container, inner, f"$.{outer}")
        if args is not None and any(k in args for k in TRANSFER_KEYS):
            yield outer, inner, container, args


def _find_transfer(
    body: Mapping[str, Any], where: _Places
) -> tuple[dict[str, tuple[object, str]], tuple[str, ...]]:
    """The client's transfer params: {key: (value, JSON path)} and where each set one was.

    A top-level value is preferred over a nested one; a null one says nothing and is ignored.
    """
    found = {k: (body[k], f"$.{k}") for k in TRANSFER_KEYS if body.get(k) is not None}
    paths = list(found)
    for outer, inner, _, args in _containers(body, where):
        for key in TRANSFER_KEYS:
            if args.get(key) is not None:
                path = f"{outer}.{key}" if inner is None else f"{outer}.{inner}.{key}"
                paths.append(path)
                found.setdefault(key, (args[key], f"$.{path}"))
    return found, tuple(paths)


def _strip_transfer(body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` without a transfer param anywhere; a container this emptied goes too."""
    result = dict(body)  # a C-speed copy, then the two keys out: cheaper than a filter
    for key in TRANSFER_KEYS:
        result.pop(key, None)
    for outer, inner, container, args in _containers(body, _EVERYWHERE):
        cleaned = {k: v for k, v in args.items() if k not in TRANSFER_KEYS}
        if inner is not None:
            rest = {k: v for k, v in container.items() if k != inner}
            result[outer] = {**rest, inner: cleaned} if cleaned else rest
        elif cleaned:
            result[outer] = cleaned
        else:
            del result[outer]
    return result


def strip_transfer_params(body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` without any transfer param (top level, ``extra_args``, ``vllm_xargs``).

    Shared with the built-in transform and the LiteLLM callbacks; ``body`` is not mutated.

    Raises:
        RequestError: ``body`` (or a container the params hide in) is not a JSON object.
    """
    return _strip_transfer(_validate.mapping(body, "$"))


def _merged(*layers: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The layers merged, later ones winning; ``None`` when none was given."""
    merged = None
    for layer in layers:  # a loop, not comprehensions: most legs merge one layer or none
        if layer is not None:
            merged = {**merged, **layer} if merged is not None else dict(layer)
    return merged


def _transfer(request: _Request, where: _Places) -> _Transfer:
    """The transfer params a leg carries: one rule for every leg.

    The prefill flags win, then the router's values, then the client's (kept only when the step
    trusts them; else reported as stripped). See ``docs/request-legs.md``, "Transfer params".
    """
    found, paths = _find_transfer(request.client.body, where)
    client = (
        {key: _validate.mapping(value, path) for key, (value, path) in found.items()}
        if request.trusted
        else {}
    )
    kv = _router_object(request.inputs.kv_transfer_params, w.KV_TRANSFER_PARAMS)
    ec = _router_object(request.inputs.ec_transfer_params, w.EC_TRANSFER_PARAMS)
    return _Transfer(
        kv=_merged(client.get(w.KV_TRANSFER_PARAMS), kv, request.flags),
        ec=_merged(client.get(w.EC_TRANSFER_PARAMS), ec),
        stripped=() if request.trusted else paths,
    )


def _place_top_level(body: dict[str, Any], transfer: _Transfer) -> dict[str, Any]:
    body.update(transfer.given())
    return body


def _place_generate(
    body: dict[str, Any], transfer: _Transfer, placement: KvTransferPlacement
) -> dict[str, Any]:
    if placement is not KvTransferPlacement.EXTRA_ARGS:
        _place_top_level(body, transfer)
    if placement is KvTransferPlacement.TOP_LEVEL:
        return body
    values = transfer.given()
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


class _Core(msgspec.Struct, frozen=True, kw_only=True):
    """A generate body before the step-specific part (stream, output mode, single-token cap)."""

    body: dict[str, Any]
    mapping: ClientMapping | None
    """The client's field mapping (``None`` for a client already on the generate route)."""
    transfer: _Transfer


# A render answer's members a rule reads or removes: its common body takes them null.
_RULED_RENDER = (*CAP_KEYS, *TRANSFER_KEYS, w.FEATURES, w.VLLM_XARGS)
_REMOVED_FROM_RENDER = (*CAP_KEYS, *TRANSFER_KEYS)


def _common_render(
    rendered: object, body: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """A common render answer and its ``sampling_params``; ``None`` off the common case.

    The common answer is an object with ``sampling_params`` an object holding a plain cap (or
    none), no ``min_tokens`` and no transfer params (``extra_args`` null or empty), and none of
    :data:`_RULED_RENDER` set; the client's body holds no transfer params.
    """
    if not isinstance(rendered, dict):
        return None
    sampling = rendered.get(w.SAMPLING_PARAMS)
    if type(sampling) is not dict or not common_sampling(sampling):
        return None
    for key in _RULED_RENDER:
        if rendered.get(key) is not None:
            return None
    return None if _sends_transfer(body) else (rendered, sampling)


def _sends_transfer(body: Mapping[str, Any]) -> bool:
    """Whether the client's body holds transfer params (top level or ``vllm_xargs``)."""
    xargs = body.get(w.VLLM_XARGS)
    for key in TRANSFER_KEYS:
        if body.get(key) is not None or (xargs is not None and key in xargs):
            return True
    return False


def _carry(leg: dict[str, Any], body: Mapping[str, Any], view: object = None) -> tuple[str, ...]:
    """Carry the client's own keys onto a leg built from render's answer or its mapping.

    A key is carried where the leg's value (read from ``view`` when given: the view of the
    render answer a leg of raw members is written from, which holds every carried key) is
    null. Returns the keys carried, in the order written.
    """
    carried: tuple[str, ...] = ()
    for key in CARRIED_AS_IS:
        if (
            body.get(key) is not None
            and (leg.get(key) if view is None else getattr(view, key)) is None
        ):
            leg[key] = body[key]
            carried += (key,)
    if body.get(w.REQUEST_ID) is not None:
        leg[w.REQUEST_ID] = body[w.REQUEST_ID]
        carried += (w.REQUEST_ID,)
    return carried


def _common_render_core(request: _Request) -> _Core | None:
    """The generate body built on a common render answer, as :func:`_generate_core` builds it.

    For a common answer (:func:`_common_render`), when the router hands in no prompt or
    features: the answer with the client's caps in ``sampling_params``, the client's carried
    keys and request ID, and no transfer params. ``None`` for any other request
    (``test_the_common_render_core_is_the_general_one``).
    """
    client, inputs = request.client, request.inputs
    body, caps, mapping, rendered = client.body, client.caps, client.mapping, _rendered(inputs)
    if (
        caps is None
        or mapping is None
        or inputs.token_ids is not None
        or inputs.features is not None
        or request.flags is not None
    ):
        return None
    common = _common_render(rendered, body)
    if common is None:
        return None
    answer, sampling = common
    leg = dict(answer)  # a C-speed copy, then the few keys out: cheaper than a filter
    for key in _REMOVED_FROM_RENDER:
        leg.pop(key, None)
    leg[w.SAMPLING_PARAMS] = {**sampling, **caps}
    _carry(leg, body)
    if inputs.request_id is not None:
        leg[w.REQUEST_ID] = inputs.request_id
    leg[w.TOKEN_IDS] = _token_ids(None, leg.get(w.TOKEN_IDS), required=True)
    kv = _router_object(inputs.kv_transfer_params, w.KV_TRANSFER_PARAMS)
    ec = _router_object(inputs.ec_transfer_params, w.EC_TRANSFER_PARAMS)
    transfer = _Transfer(kv=_merged(kv), ec=_merged(ec), stripped=())
    return _Core(body=leg, mapping=mapping, transfer=transfer)


def _rendered(inputs: LegInputs) -> object:
    """The render answer as the general rules read it: a mapping of its decoded members."""
    rendered = inputs.rendered
    return rendered.members() if type(rendered) is RenderAnswer else rendered


def _viewed_render_leg(
    request: _Request, params: DecodeParams
) -> tuple[tuple[dict[str, Any], OutputMode, bool, bool, tuple[str, ...]], tuple[str, ...]] | None:
    """The decode leg on a render answer read through its view, as the general rules build it.

    For an answer its view proved of the common shape (:class:`RenderAnswer`), when the router
    hands in no prompt, features or ``parse_context`` and the client sends no transfer params,
    the rules of :func:`_common_render_core` and :func:`_decode_generate` keep most of the
    answer as it is: the leg is its raw members, the few a rule writes replaced (``output_mode``,
    ``stream``, the caps in ``sampling_params`` when render holds others, the carried keys, the
    derender ``parse_context``), the transfer params and ``stream_options`` out. Every member
    left as vLLM wrote it was proved of its type by the view; what a rule wrote is checked
    here (:func:`_check_written`). ``None`` for any other request. docs/performance.md, "The
    render answer read as a typed view".

    Returned with the leg: the keys under which it may hold the client's own values (those
    carried, and ``stream_options`` when the client's were kept), which the bytes leg writes as
    the client sent them (read by :data:`_FROM_THE_CLIENT`).
    """
    client, inputs = request.client, request.inputs
    answer = inputs.rendered
    assert type(answer) is RenderAnswer  # noqa: S101 - called for one
    view = answer.view
    body, caps, mapping, mode = client.body, client.caps, client.mapping, client.output_mode
    if (
        view is None
        or caps is None
        or mapping is None
        or mode is None
        or inputs.token_ids is not None
        or inputs.features is not None
        or inputs.parse_context is not None
        or request.flags is not None
        or _sends_transfer(body)
    ):
        return None
    sampling = getattr(view, w.SAMPLING_PARAMS)
    if sampling.detokenize is False and mode is not TOKENS_MODE:
        return None  # the rule rewrites sampling_params: the general rules
    raw = answer.raw
    leg: dict[str, Any] = dict(raw)  # the answer's order; each member as vLLM wrote it
    for key in TRANSFER_KEYS:
        del leg[key]  # null in a viewed answer
    leg[w.TOKEN_IDS] = answer.token_ids
    # The members a rule wrote that need the leg's check (_check_written), in the order
    # written: most legs on a common answer write none but their mode and stream.
    carried = _carry(leg, body, view)
    written = list(carried)
    kv, ec = inputs.kv_transfer_params, inputs.ec_transfer_params
    placed = kv is not None or ec is not None
    extra_args = placed and params.kv_transfer_placement is not TOP_LEVEL_PLACEMENT
    if extra_args or not _holds(sampling, caps):
        # Written over render's: the general rules' merge of the decoded members.
        answered = _raw.decode_member(raw[w.SAMPLING_PARAMS], "$", UpstreamContractError)
        leg[w.SAMPLING_PARAMS] = {**answered, **caps}
        written.append(w.SAMPLING_PARAMS)
    if inputs.request_id is not None:
        leg[w.REQUEST_ID] = inputs.request_id
        written.append(w.REQUEST_ID)
    if placed:
        transfer = _Transfer(
            kv=_merged(_router_object(kv, w.KV_TRANSFER_PARAMS)),
            ec=_merged(_router_object(ec, w.EC_TRANSFER_PARAMS)),
            stripped=(),
        )
        leg = _place_generate(leg, transfer, params.kv_transfer_placement)
        written.extend(key for key in TRANSFER_KEYS if key in leg)  # none was left: placed
    streams, client_streams = _leg_stream(body, mode)
    leg[w.OUTPUT_MODE] = _MODE_TEXT[mode]
    leg[w.STREAM] = streams
    # The rule reads render's stream_options, decoded (and takes them out of the leg), only
    # for a streamed leg: an unstreamed one carries none, whatever render's are.
    options = getattr(view, w.STREAM_OPTIONS)
    leg[w.STREAM_OPTIONS] = (
        None
        if options is None or not streams
        else _raw.decode_member(raw[w.STREAM_OPTIONS], "$", UpstreamContractError)
    )
    dropped = []
    kept = _stream_options(body, client.route, leg, streams=streams)
    if not kept and body.get(w.STREAM_OPTIONS) is not None:
        dropped.append(w.STREAM_OPTIONS)
    dropped.extend(mapping.dropped)
    if mode is DERENDER_MODE:
        written.extend(_derender_context(leg, view, client))
    else:
        dropped.extend(mapping.context_keys)
    _check_written(leg, written)
    from_client = (*carried, w.STREAM_OPTIONS) if kept else carried
    return (leg, mode, streams, client_streams, tuple(dict.fromkeys(dropped))), from_client


def _holds(sampling: object, caps: Mapping[str, Any]) -> bool:
    """Whether the viewed ``sampling_params`` already holds each cap, of the same type."""
    for key, value in caps.items():
        held = getattr(sampling, key)
        if type(held) is not type(value) or held != value:
            return False
    return True


# The bytes of what a leg on a viewed render answer may hold of the client's own: the carried
# keys, its request ID and stream_options.
_FROM_THE_CLIENT: Final = _raw.MemberReader((*CARRIED_AS_IS, w.REQUEST_ID, w.STREAM_OPTIONS))


def _derender_context(leg: dict[str, Any], view: Any, client: ClientRequest) -> tuple[str, ...]:  # noqa: ANN401 - a struct made at import
    """Write the client's ``parse_context`` on a viewed leg whose answer holds none.

    Returned: the key when :func:`_check_written` must read what was written. A context built
    from a JSON body is of the check's types already (each mapper types what it puts in, and a
    JSON object is a dict of str keys): only a mapping handed in as the body can hold what the
    check refuses (docs/performance.md, "Calls that parse their arguments").
    """
    if getattr(view, w.PARSE_CONTEXT, None) is not None:
        return ()  # render's, as vLLM wrote it
    assert client.mapping is not None  # noqa: S101 - a viewed leg has its mapping
    context = client.mapping.parse_context or {}
    leg[w.PARSE_CONTEXT] = dict(_validate.mapping(context, _PARSE_CONTEXT_PATH))
    return () if type(client.body) is _raw.RawMembers else (w.PARSE_CONTEXT,)


def _check_written(leg: Mapping[str, Any], written: list[str]) -> None:
    """What :func:`_check_generate` reads of a leg on a viewed render answer.

    A member still as vLLM wrote it was proved of its type by the view; the members a rule
    wrote (``written``, and a streamed leg's ``stream_options``; its mode, stream and the proved
    token IDs need no check) are read as on any leg, in the leg's order (the first wrong one is
    the one named), by :data:`_WRITTEN`.
    """
    if w.STREAM_OPTIONS in leg:
        written.append(w.STREAM_OPTIONS)
    if len(written) == 1:
        checked = {written[0]: leg[written[0]]}
    elif written:
        checked = {key: value for key, value in leg.items() if key in written}
    else:
        return
    _validate.convert(checked, _WRITTEN, "$")


# GenerateRequest with no member required (the leg's token IDs and sampling_params are there,
# proved): the members a rule wrote read with the leg check's types, so its errors, without
# building the defaults of a whole request (0.77 against 0.35 us for a stream_options).
_WRITTEN: Final = msgspec.defstruct(
    "_Written",
    [(key, hint, UNSET) for key, hint in get_type_hints(GenerateRequest).items()],
    kw_only=True,
)


def _generate_core(request: _Request) -> _Core:
    client, inputs = request.client, request.inputs
    body, mapping, caps = client.body, client.mapping, client.caps
    assert caps is not None  # noqa: S101 - the request was read for a generate leg
    features = _router_object(inputs.features, w.FEATURES)
    rendered = _router_object(_rendered(inputs), "rendered")
    where = _EVERYWHERE
    if client.route is Route.GENERATE:
        leg = dict(body)  # a C-speed copy, then the few cap keys out: cheaper than a filter
        for key in CAP_KEYS:
            leg.pop(key, None)
        leg[w.SAMPLING_PARAMS] = dict(caps)
    else:
        assert mapping is not None  # noqa: S101 - every other route has its mapper
        # A non-generate client's `sampling_params` is an unknown key (dropped), not a hiding place.
        where = _XARGS
        if rendered is not None:
            # Render's sampling_params are the base; the client's cap is written over render's
            # max_tokens, which render leaves out when it equals the engine default (16).
            leg = apply_sampling_caps(_validate.mapping(rendered, "$"), Route.GENERATE)
            leg[w.SAMPLING_PARAMS] = {**leg[w.SAMPLING_PARAMS], **caps}
        else:
            leg = {w.SAMPLING_PARAMS: {**mapping.sampling_params, **caps}}
        _carry(leg, body)
    if inputs.request_id is not None:
        leg[w.REQUEST_ID] = inputs.request_id
    ids = _token_ids(inputs.token_ids, leg.get(w.TOKEN_IDS), required=True)
    leg[w.TOKEN_IDS] = ids
    given_features = features if features is not None else leg.get(w.FEATURES)
    if given_features is not None:
        leg[w.FEATURES] = _validate.features(given_features, len(ids or ()))
    transfer = _transfer(request, where)
    return _Core(body=_strip_transfer(leg), mapping=mapping, transfer=transfer)


def _check_generate(body: Mapping[str, Any]) -> None:
    # One typed read of the whole leg: a wrong type anywhere is refused at its JSON path.
    # token_ids were checked by _token_ids (the bytes path keeps them as bytes): not re-read.
    _validate.convert({**body, w.TOKEN_IDS: []}, GenerateRequest, "$")


def _leg_stream(body: Mapping[str, Any], mode: OutputMode | None) -> tuple[bool, bool]:
    """Return (leg streams, client streams)."""
    client_streams = _validate.typed(body, w.STREAM, bool) is True
    return client_streams and mode is not DERENDER_MODE, client_streams


def _stream_options(
    body: Mapping[str, Any], client_route: Route, leg: dict[str, Any], *, streams: bool
) -> bool:
    """Write the streamed leg's ``stream_options``; return whether the client's own were kept.

    The base is what the leg already holds (render's answer, a generate client's own), else a
    chat client's; a client whose envelope ends with usage always asks for it. An unstreamed
    leg carries none: usage comes in the one answer anyway.
    """
    options = leg.pop(w.STREAM_OPTIONS, None)
    own = client_route is CHAT_ROUTE or client_route is GENERATE_ROUTE
    if options is None and own:
        options = body.get(w.STREAM_OPTIONS)
    if USAGE_AT_END[client_route]:
        given = {} if options is None else _validate.mapping(options, _STREAM_OPTIONS_PATH)
        options = {**given, w.INCLUDE_USAGE: True}
    if streams and options is not None:
        leg[w.STREAM_OPTIONS] = options
        return own
    return False


def _decode_generate(
    client: ClientRequest,
    params: DecodeParams,
    core: _Core,
    parse_context: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], OutputMode, bool, bool, tuple[str, ...]]:
    body, client_route, mode = client.body, client.route, client.output_mode
    assert mode is not None  # noqa: S101 - the request was read for a generate decode leg
    leg = _place_generate(core.body, core.transfer, params.kv_transfer_placement)
    # A generate client's own mode is sent as it asked, as the worker itself would get it.
    own = own_output_mode(body, client_route) is not None
    streams, client_streams = _leg_stream(body, None if own else mode)
    dropped = list(core.transfer.stripped)
    leg[w.OUTPUT_MODE] = _MODE_TEXT[mode]
    leg[w.STREAM] = streams
    kept = _stream_options(body, client_route, leg, streams=streams)
    if not kept and body.get(w.STREAM_OPTIONS) is not None:
        dropped.append(w.STREAM_OPTIONS)
    sampling = leg[w.SAMPLING_PARAMS]
    if sampling.get(w.DETOKENIZE) is False and mode is not OutputMode.TOKENS:
        # vLLM refuses text and derender without detokenizing (400): the mode wins.
        leg[w.SAMPLING_PARAMS] = {k: v for k, v in sampling.items() if k != w.DETOKENIZE}
        dropped.append(_DETOKENIZE)
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
            leg[w.PARSE_CONTEXT] = dict(_validate.mapping(context, _PARSE_CONTEXT_PATH))
    elif mapping is not None:
        dropped.extend(mapping.context_keys)
    return leg, mode, streams, client_streams, tuple(dict.fromkeys(dropped))


# A generate client's members a rule rewrites beyond the copy: the common leg takes them null.
_RULED_MEMBERS = (w.FEATURES, w.PARSE_CONTEXT, w.STREAM_OPTIONS, w.VLLM_XARGS, *TRANSFER_KEYS)
_RULED_SAMPLING = frozenset({w.DETOKENIZE, w.EXTRA_ARGS})
# What the common leg leaves out of the body: the caps (read into sampling_params) and the null
# members the general rules remove.
_NOT_CARRIED = (*CAP_KEYS, *TRANSFER_KEYS, w.STREAM_OPTIONS)


def _common_generate(
    client: ClientRequest, params: DecodeParams, inputs: LegInputs
) -> tuple[dict[str, Any], OutputMode, bool, bool, tuple[str, ...]] | None:
    """The decode leg of a generate client's common body, as the general rules build it.

    The common body sets none of :data:`_RULED_MEMBERS` and no ``detokenize`` or
    ``extra_args`` in ``sampling_params``, and the router hands in no prompt, features, render
    answer or ``parse_context``: its leg is the body with the caps moved into
    ``sampling_params``, the router's transfer params placed, its mode and stream written, and
    nothing dropped. ``None`` for any other request: the general rules (:func:`_generate_core`,
    :func:`_decode_generate`) build it. docs/performance.md, "The common generate leg".
    """
    body, caps, mode = client.body, client.caps, client.output_mode
    assert caps is not None  # noqa: S101 - the request was read for a generate leg
    assert mode is not None  # noqa: S101 - the request was read for a generate decode leg
    if not (
        inputs.token_ids is None
        and inputs.features is None
        and inputs.rendered is None
        and inputs.parse_context is None
        and _RULED_SAMPLING.isdisjoint(caps)
    ):
        return None
    get = body.get
    for key in _RULED_MEMBERS:
        if get(key) is not None:
            return None
    stream = get(w.STREAM)
    if stream is not None and type(stream) is not bool:
        return None  # the general rules refuse it
    leg = dict(body)  # a C-speed copy, then the few keys out: cheaper than a filter
    for key in _NOT_CARRIED:
        leg.pop(key, None)
    leg[w.SAMPLING_PARAMS] = dict(caps)
    if inputs.request_id is not None:
        leg[w.REQUEST_ID] = inputs.request_id
    leg[w.TOKEN_IDS] = _token_ids(None, get(w.TOKEN_IDS), required=True)
    kv = _router_object(inputs.kv_transfer_params, w.KV_TRANSFER_PARAMS)
    ec = _router_object(inputs.ec_transfer_params, w.EC_TRANSFER_PARAMS)
    if kv is not None or ec is not None:
        transfer = _Transfer(kv=_merged(kv), ec=_merged(ec), stripped=())
        leg = _place_generate(leg, transfer, params.kv_transfer_placement)
    # A generate client's own mode streams as it asked; the step's derender never streams.
    client_streams = stream is True
    own = own_output_mode(body, Route.GENERATE) is not None
    streams = client_streams and (own or mode is not OutputMode.DERENDER)
    leg[w.OUTPUT_MODE] = _MODE_TEXT[mode]
    leg[w.STREAM] = streams
    return leg, mode, streams, client_streams, ()


def build_decode_request(  # noqa: PLR0913 - the documented keyword front; `inputs=` is the one shape
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
    inputs: LegInputs | None = None,
) -> DecodeLeg:
    """Build the decode leg for a client request (``docs/request-legs.md``).

    Args:
        client_body: the client's JSON body (never mutated).
        client_path: the path the client called (it decides the client's route).
        params: the decode step's params.
        token_ids: the rendered prompt; required on the generate route unless ``rendered`` or a
            generate client's own body has them.
        kv_transfer_params: what the router's KV connector supplies for decode.
        features: multimodal features for the prompt (generate route).
        rendered: a ``GenerateRequest`` from vLLM's ``/render`` for this request: the leg is
            built from it (its ``sampling_params`` kept, the client's cap written over them)
            instead of mapping the client's fields.
        request_id: the router's request ID (else the client's, else none).
        parse_context: the one ``/render`` returned (derender mode).
        limits: the bounds on the body (``docs/security.md``).
        inputs: all of the above as one :class:`LegInputs` (then pass none of them).

    Returns:
        A :class:`GenerateDecodeLeg` (``output_mode`` set) on the generate route, else a
        :class:`DecodeLeg` whose ``output_mode`` is ``None``.

    Raises:
        RequestError: the body (or what the router handed in) cannot make a valid leg or is
            past a limit; ``param`` is the JSON path of the offending value (``inputs`` when
            both ``inputs`` and a keyword were given).
    """
    given = _inputs(
        inputs,
        token_ids=token_ids,
        kv_transfer_params=kv_transfer_params,
        features=features,
        rendered=rendered,
        request_id=request_id,
        parse_context=parse_context,
        limits=limits,
    )
    return decode_leg(_read(client_body, client_path, params, given), params, given)


def decode_leg(client: ClientRequest, params: DecodeParams, inputs: LegInputs) -> DecodeLeg:
    """The decode leg of a request read once (what :func:`build_decode_request` returns)."""
    fields, _ = _decode_fields(client, params, inputs)
    # Only a generate leg has an output_mode to check and wrap the answer for.
    kind = DecodeLeg if fields["output_mode"] is None else GenerateDecodeLeg
    return kind(**fields)


def _decode_fields(
    client: ClientRequest, params: DecodeParams, inputs: LegInputs
) -> tuple[dict[str, Any], tuple[str, ...] | None]:
    """The fields of the decode leg, its body a dict (one builder for both kinds of leg).

    Also, for a leg written from a viewed render answer's raw members, the keys under which it
    may hold the client's own values (else ``None``: any key may).
    """
    request = _step_request(client, params, inputs)
    body, client_route, route = client.body, client.route, request.route
    generate = route is GENERATE_ROUTE
    mode = viewed = None
    if not generate:
        leg, transfer = _openai_leg(request)
        leg = _place_top_level(leg, transfer)
        _limits.check_token_count(leg, inputs.limits)
        streams = client_streams = _validate.typed(body, w.STREAM, bool) is True
        dropped = transfer.stripped
    else:
        common = viewed = None
        if client_route is GENERATE_ROUTE:
            common = _common_generate(client, params, inputs)
        elif type(inputs.rendered) is RenderAnswer:
            viewed = _viewed_render_leg(request, params)
            common = None if viewed is None else viewed[0]
        if common is None:
            core = _common_render_core(request) or _generate_core(request)
            common = _decode_generate(
                client, params, core, _router_object(inputs.parse_context, w.PARSE_CONTEXT)
            )
        leg, mode, streams, client_streams, dropped = common
        if viewed is None:  # a viewed leg checked what its rules wrote
            _check_generate(leg)
        _limits.check_token_count(leg, inputs.limits)
    fields = {
        "path": ROUTE_PATH[route],
        "route": route,
        "body": leg,
        "stream": streams,
        "single_frame": client_streams and not streams,
        "wrap_chat_completion": (
            generate and params.wrap_chat_completion and client_route is CHAT_ROUTE
        ),
        "output_mode": mode,
        "dropped": dropped,
    }
    return fields, None if viewed is None else viewed[1]


def build_decode_request_bytes(
    client_body: bytes,
    *,
    client_path: str,
    params: DecodeParams,
    inputs: LegInputs | None = None,
) -> DecodeLegBytes:
    """Build the decode leg from the client's JSON bytes, never decoding ``token_ids``.

    The same leg as :func:`build_decode_request` (same rules, same errors; the router's inputs
    come as one :class:`LegInputs`, ``inputs=``), written as JSON bytes: the body is split into
    raw top-level members, ``token_ids`` is proved clean by a byte scan instead of a decode (the
    other members are decoded for the rules), and every member the leg keeps unchanged is
    written with its input bytes, in the input's key order. See ``docs/bytes.md``.

    Raises:
        RequestError: as :func:`build_decode_request`; also ``param`` ``$`` when the body is not
            bytes, not valid JSON, not a JSON object or not UTF-8;
            :class:`~disagg_transforms.errors.RequestTooLargeError` (413) when it is over
            ``inputs.limits.max_body_bytes``.
    """
    given = _inputs(inputs)
    if isinstance(client_body, bytes):
        _limits.check_body_size(client_body, given.limits, error=RequestTooLargeError)
    # Only a generate client sends token IDs: any other's body is decoded whole.
    whole = isinstance(client_path, str) and detect_route(client_path) is not GENERATE_ROUTE
    members = _raw.RawMembers(
        client_body, RequestError, "the client body", token_ids_key=w.TOKEN_IDS, whole=whole
    )
    fields, from_client = _decode_fields(_read(members, client_path, params, given), params, given)
    # The bytes leg has the dict leg's fields, its body written as JSON bytes. A leg written
    # from a render answer holds the client's own values only where a rule carried them.
    fields["body"] = members.encode(fields["body"], from_client, _FROM_THE_CLIENT)
    kind = DecodeLegBytes if fields["output_mode"] is None else GenerateDecodeLegBytes
    return kind(**fields)


def _read(
    client_body: object, client_path: object, params: _LegParams, inputs: LegInputs
) -> ClientRequest:
    """The client's request read for the one leg a public builder builds."""
    return read_client_request(client_body, client_path, limits=inputs.limits, steps=(params,))


def _step_request(client: ClientRequest, params: _LegParams, inputs: LegInputs) -> _Request:
    """How one step treats the client's request (every builder's start)."""
    return _Request(
        client=client,
        route=leg_route(params.use_openai_format, client.route),
        inputs=inputs,
        trusted=params.trust_client_transfer_params,
        # The prefill flags win over every other value (docs/request-legs.md, "Transfer params").
        flags=_PREFILL_KV if isinstance(params, PrefillParams) else None,
    )


def _openai_leg(request: _Request) -> tuple[dict[str, Any], _Transfer]:
    transfer = _transfer(request, _EVERYWHERE)
    leg = _strip_transfer(request.client.body)
    if request.route is Route.COMPLETIONS:
        ids = _token_ids(request.inputs.token_ids, None, required=False)
        if ids:
            leg[w.PROMPT] = ids
    return leg, transfer


def single_token_leg(
    client: ClientRequest, params: EncodeParams | PrefillParams, inputs: LegInputs
) -> Leg:
    """The prefill or encode leg of a request read once (what their builders return)."""
    request = _step_request(client, params, inputs)
    route = request.route
    if route is not Route.GENERATE:
        leg, transfer = _openai_leg(request)
        leg = apply_single_token_cap(_place_top_level(leg, transfer), route)
        _limits.check_token_count(leg, inputs.limits)
        return Leg(path=ROUTE_PATH[route], route=route, body=leg)
    core = _generate_core(request)
    placement = (
        params.kv_transfer_placement
        if isinstance(params, PrefillParams)
        else KvTransferPlacement.BOTH
    )
    # A prefill or encode answer is never read for text: tokens mode, the route's default.
    leg = {k: v for k, v in core.body.items() if k != w.OUTPUT_MODE}
    leg = apply_single_token_cap(_place_generate(leg, core.transfer, placement), Route.GENERATE)
    _check_generate(leg)
    _limits.check_token_count(leg, inputs.limits)
    return Leg(path=ROUTE_PATH[route], route=route, body=leg)


def build_prefill_request(
    client_body: Mapping[str, Any],
    *,
    client_path: str,
    params: PrefillParams,
    inputs: LegInputs | None = None,
) -> Leg:
    """Build the prefill leg: the client's request capped at one output token.

    ``kv_transfer_params`` is ``{"do_remote_decode": true, "do_remote_prefill": false}`` over
    what the router's connector supplies, over the client's own when the step trusts them;
    ``ec_transfer_params`` likewise without the flags. Client sampling fields stay, so the
    prefill's cache key matches decode's. The router's inputs come as one :class:`LegInputs`
    (``inputs=``), read as :func:`build_decode_request` reads them (its ``parse_context`` is
    not read: prefill answers carry no text).
    """
    given = _inputs(inputs)
    return single_token_leg(_read(client_body, client_path, params, given), params, given)


def build_encode_request(
    client_body: Mapping[str, Any],
    *,
    client_path: str,
    params: EncodeParams,
    inputs: LegInputs | None = None,
) -> Leg:
    """Build an encode leg: capped at one token.

    It carries the transfer params ``inputs`` hands in and, when the step trusts them, the
    client's own (the router's win); untrusted client copies are stripped. The router's inputs
    come as one :class:`LegInputs` (``inputs=``), read as :func:`build_decode_request` reads
    them.
    """
    given = _inputs(inputs)
    return single_token_leg(_read(client_body, client_path, params, given), params, given)

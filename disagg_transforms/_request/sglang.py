"""SGLang legs: the one ``/generate`` body both workers of an SGLang P/D pair get.

SGLang meets prefill and decode by rendezvous, not by hand-off: the router sends the same body to
both at once, with ``bootstrap_host``/``bootstrap_port``/``bootstrap_room`` added, and the same
``rid`` (the abort handle). The client's fields are read by the client API's mapper into vLLM's
``sampling_params`` names (:class:`ClientRequest`), then renamed here to the keys SGLang knows;
a field SGLang has no place for is refused naming it, never dropped (``docs/sglang.md``).
The randomness of ``rid`` and ``bootstrap_room`` is the host's: it passes a bit generator.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import msgspec

from disagg_transforms._config import DecodeParams, OutputMode
from disagg_transforms._request.client import ClientRequest, read_client_request
from disagg_transforms._request.fields import asks_for_tools
from disagg_transforms._request.legs import strip_transfer_params
from disagg_transforms._routes import ROUTE_PATH, Route
from disagg_transforms._wire import keys as w
from disagg_transforms._wire import limits as _limits
from disagg_transforms._wire import validate as _validate
from disagg_transforms._wire.describe import describe
from disagg_transforms._wire.limits import DEFAULT_LIMITS, Limits
from disagg_transforms.errors import RequestError

__all__ = (
    "ROOM_MAX",
    "Rendezvous",
    "SglangLeg",
    "build_sglang_openai_request",
    "build_sglang_request",
    "new_rendezvous",
    "prefill_body",
    "sglang_client_leg",
    "sglang_openai_leg",
)

ROOM_MAX: Final = 2**63 - 1
"""The largest ``bootstrap_room``: SGLang's contract and NPU buffers are signed 64-bit."""
_RID_BITS: Final = 128
_RID_HEX: Final = _RID_BITS // 4
_ROOM_BITS: Final = 63

# Clients whose answer is rebuilt from SGLang's (the envelope routes); a completions client
# keeps its own route (SGLang's OpenAI server, with the rendezvous fields).
_CLIENT_ROUTES: Final = (Route.CHAT_COMPLETIONS, Route.RESPONSES, Route.MESSAGES)
# vLLM sampling names SGLang spells the same (docs/sglang.md, "Field by field").
_SAME = frozenset(
    {
        w.TEMPERATURE,
        w.TOP_P,
        w.MIN_P,
        w.PRESENCE_PENALTY,
        w.FREQUENCY_PENALTY,
        w.REPETITION_PENALTY,
        w.STOP,
        w.STOP_TOKEN_IDS,
        w.IGNORE_EOS,
        w.SKIP_SPECIAL_TOKENS,
        w.SPACES_BETWEEN_SPECIAL_TOKENS,
        w.LOGIT_BIAS,
        w.STREAM_INTERVAL,
    }
)
_RENAMED: Mapping[str, str] = {
    w.MAX_TOKENS: w.MAX_NEW_TOKENS,
    w.MIN_TOKENS: w.MIN_NEW_TOKENS,
    w.SEED: w.SAMPLING_SEED,
    w.INCLUDE_STOP_STR_IN_OUTPUT: w.NO_STOP_TRIM,
}
# vLLM's structured-output keys and SGLang's (one constraint per request on both).
_STRUCTURED: Mapping[str, str] = {
    w.REGEX: w.REGEX,
    w.GRAMMAR: w.EBNF,
    w.CHOICE: w.CHOICE,
    w.STRUCTURAL_TAG: w.STRUCTURAL_TAG,
}
# SGLang 0.5.23's sampling keys (its contract's SamplingParams): any other is refused by SGLang.
_SGLANG_SAMPLING_KEYS: Final = frozenset(
    {
        w.MAX_NEW_TOKENS,
        w.STOP,
        w.STOP_TOKEN_IDS,
        "stop_regex",
        w.TEMPERATURE,
        w.TOP_P,
        w.TOP_K,
        w.MIN_P,
        w.FREQUENCY_PENALTY,
        w.PRESENCE_PENALTY,
        w.REPETITION_PENALTY,
        w.MIN_NEW_TOKENS,
        w.N,
        w.JSON_SCHEMA,
        w.REGEX,
        w.EBNF,
        w.STRUCTURAL_TAG,
        w.IGNORE_EOS,
        w.SKIP_SPECIAL_TOKENS,
        w.SPACES_BETWEEN_SPECIAL_TOKENS,
        w.NO_STOP_TRIM,
        w.STREAM_INTERVAL,
        w.LOGIT_BIAS,
        w.SAMPLING_SEED,
        "custom_params",
        "beam_width",
        "watermark",
        w.CHOICE,
    }
)
# The client routes SGLang's OpenAI server answers with the rendezvous fields (its
# PDRoutingFields): the client keeps its own route there.
_OPENAI_ROUTES: Final = (Route.CHAT_COMPLETIONS, Route.COMPLETIONS, Route.RESPONSES, Route.MESSAGES)
# SGLang's Responses route keeps 2 tokens of max_output_tokens as headroom for BOS/EOS
# (docs/sglang.md, "Tools"): the leg asks 2 more, so the client gets the cap it asked for.
_RESPONSES_HEADROOM: Final = 2
# What SGLang's chat route sends for a JSON object format.
_ANY_OBJECT_SCHEMA: Final = '{"type": "object"}'


class Rendezvous(msgspec.Struct, frozen=True, kw_only=True):
    """How one request's prefill and decode meet: the same ``rid`` and room on both legs."""

    rid: str
    """The request's id on both workers, and the handle ``/abort_request`` takes. SGLang aborts
    every request whose rid starts with it: ids of one fixed length are never each other's
    prefix."""
    bootstrap_host: str
    """The prefill worker's host, as the decode worker reaches it."""
    bootstrap_port: int | None
    """The prefill's bootstrap port (``None``: the decode's own, the same on both)."""
    bootstrap_room: int
    """The rendezvous id: a JSON integer in ``1..ROOM_MAX``, new per request."""


def new_rendezvous(
    bootstrap_host: str, bootstrap_port: int | None, *, random_bits: Callable[[int], int]
) -> Rendezvous:
    """A fresh :class:`Rendezvous`: a 32-hex-digit ``rid`` and a room in ``1..ROOM_MAX``.

    ``random_bits`` is the host's generator (e.g. ``secrets.randbits``): the core keeps no state.
    """
    room = random_bits(_ROOM_BITS) % ROOM_MAX + 1
    rid = format(random_bits(_RID_BITS), f"0{_RID_HEX}x")
    return Rendezvous(
        rid=rid, bootstrap_host=bootstrap_host, bootstrap_port=bootstrap_port, bootstrap_room=room
    )


class SglangLeg(msgspec.Struct, frozen=True, kw_only=True):
    """The ``/generate`` call both workers of the pair get, and what its answer is read with."""

    path: str
    """``/generate``."""
    body: dict[str, Any]
    """The one body of both legs (a new dict)."""
    stream: bool
    """The legs stream (SSE)."""
    rid: str
    """The request's ``rid``: what ``/abort_request`` is sent with."""
    stop_token_ids: tuple[int, ...]
    """The stop tokens the request named: a match is a ``stop_reason``, an EOS is not."""
    dropped: tuple[str, ...]
    """Client keys left out of the leg, on the documented list (``docs/sglang.md``)."""
    prompt_logprobs: int | None = None
    """The prompt logprobs the client asked for (vLLM's ``prompt_logprobs``: the top count);
    ``None``: none. The prefill computes them (:func:`prefill_body`), the decode never does."""


def build_sglang_request(
    client_body: Mapping[str, Any],
    *,
    client_path: str,
    rendezvous: Rendezvous,
    token_ids: Sequence[int],
    limits: Limits = DEFAULT_LIMITS,
) -> SglangLeg:
    """Build the ``/generate`` body of both legs of an SGLang P/D request (``docs/sglang.md``).

    Args:
        client_body: the client's chat, Responses or Messages body (never mutated).
        client_path: the path the client called.
        rendezvous: the request's ``rid`` and room and the prefill's bootstrap address.
        token_ids: the rendered prompt.
        limits: the bounds on the body.

    Raises:
        RequestError: a client field has no SGLang place (``param`` its JSON path), the client
            asks for tools (SGLang's ``/generate`` returns text only), the route has no
            envelope rebuilt from ``/generate``, or the rendezvous is out of range.
    """
    client = read_client_request(
        client_body,
        client_path,
        limits=limits,
        steps=(DecodeParams(use_openai_format=False, output_mode=OutputMode.AUTO),),
    )
    return sglang_leg(client, rendezvous, token_ids, limits)


def sglang_leg(
    client: ClientRequest, rendezvous: Rendezvous, token_ids: Sequence[int], limits: Limits
) -> SglangLeg:
    """The SGLang leg of a request read once (what :func:`build_sglang_request` returns)."""
    return with_prompt(unprompted_sglang_leg(client, rendezvous), token_ids, limits)


def with_prompt(leg: SglangLeg, token_ids: Sequence[int], limits: Limits) -> SglangLeg:
    """``leg`` (a new body) with the rendered prompt as its ``input_ids``.

    Raises:
        RequestError: the prompt is empty or not token IDs, or over the limits.
    """
    body = {**leg.body, w.INPUT_IDS: _input_ids(token_ids)}
    _limits.check_token_count(body, limits)
    return msgspec.structs.replace(leg, body=body)


def unprompted_sglang_leg(client: ClientRequest, rendezvous: Rendezvous) -> SglangLeg:
    """The SGLang leg of a request read once, but its prompt (:func:`with_prompt` adds it).

    What SGLang has no place for is refused here, before the prompt is rendered: an exchange
    builds it with the request, before any worker call.

    Raises:
        RequestError: as :func:`build_sglang_request`.
    """
    if client.route not in _CLIENT_ROUTES:
        names = ", ".join(route.value for route in _CLIENT_ROUTES)
        msg = (
            f"client_path: an SGLang /generate leg rebuilds the answer for {names} clients, got "
            f"{client.path!r}; a completions client keeps its own route (use_openai_format)"
        )
        raise RequestError(msg, param="client_path")
    mapping, caps = client.mapping, client.caps
    assert mapping is not None  # noqa: S101 - read for a generate leg: every envelope route maps
    assert caps is not None  # noqa: S101 - likewise
    if asks_for_tools(mapping.parse_context):
        param = f"$.{w.TOOLS}"
        msg = (
            f"{param}: SGLang's /generate returns text only, so a tool-using client is served "
            "on its own route by SGLang's OpenAI server: configure the decode step with "
            "use_openai_format: true"
        )
        raise RequestError(msg, param=param)
    sampling = {**mapping.sampling_params, **caps}
    body: dict[str, Any] = {
        w.RID: _rid(rendezvous.rid),
        w.STREAM: _validate.typed(client.body, w.STREAM, bool) is True,
    }
    prompt_logprobs = _prompt_logprobs(
        sampling.pop(w.PROMPT_LOGPROBS, None), stream=body[w.STREAM], client_body=client.body
    )
    body[w.SAMPLING_PARAMS] = _sampling(sampling, body, client.body)
    for key in (w.CACHE_SALT, w.PRIORITY):
        if client.body.get(key) is not None:
            body[key] = client.body[key]
    if client.body.get(w.RETURN_TOKEN_IDS):
        raise _no_place(w.RETURN_TOKEN_IDS, client.body)
    body.update(_rendezvous_fields(rendezvous))
    stop_ids = body[w.SAMPLING_PARAMS].get(w.STOP_TOKEN_IDS) or ()
    return SglangLeg(
        path=w.SGLANG_GENERATE_PATH,
        body=body,
        stream=body[w.STREAM],
        rid=rendezvous.rid,
        stop_token_ids=tuple(stop_ids),
        dropped=(*mapping.dropped, *mapping.context_keys),
        prompt_logprobs=prompt_logprobs,
    )


def _rid(rid: object) -> str:
    if not isinstance(rid, str) or not rid:
        msg = f"rendezvous.rid: expected a non-empty string, got {describe(rid)}"
        raise RequestError(msg, param="rendezvous.rid")
    return rid


def _input_ids(token_ids: object) -> list[int]:
    ids = _validate.token_ids(token_ids, "token_ids")
    if not ids:
        msg = "token_ids: the rendered prompt must hold at least one token ID, got an empty array"
        raise RequestError(msg, param="token_ids")
    return ids


def _rendezvous_fields(rendezvous: Rendezvous) -> dict[str, Any]:
    room = rendezvous.bootstrap_room
    if type(room) is not int or not 1 <= room <= ROOM_MAX:
        msg = f"rendezvous.bootstrap_room: expected an integer in 1..2^63-1, got {describe(room)}"
        raise RequestError(msg, param="rendezvous.bootstrap_room")
    return {
        w.BOOTSTRAP_HOST: rendezvous.bootstrap_host,
        w.BOOTSTRAP_PORT: rendezvous.bootstrap_port,
        w.BOOTSTRAP_ROOM: room,
    }


def _no_place(
    key: str, client_body: Mapping[str, Any], why: str = "has no place for this field"
) -> RequestError:
    """A client field SGLang has no place for, named where the client wrote it."""
    given = key.partition(".")[0] in client_body
    path = f"$.{key}" if given else f"$.{w.SAMPLING_PARAMS}.{key}"
    msg = f"{path}: SGLang's /generate {why} (docs/sglang.md)"
    return RequestError(msg, param=path)


def _sampling(
    sampling: Mapping[str, Any], body: dict[str, Any], client_body: Mapping[str, Any]
) -> dict[str, Any]:
    """SGLang's ``sampling_params`` from vLLM's; logprob switches go to ``body``'s top level."""
    out: dict[str, Any] = {}
    for key, value in sampling.items():
        if key in _SAME:
            out[key] = value
        elif key in _RENAMED:
            out[_RENAMED[key]] = value
        elif key == w.TOP_K:
            out[key] = -1 if value == 0 else value  # vLLM's "off" is 0 or -1; SGLang's only -1
        elif key == w.N:
            if value != 1:
                raise _no_place(key, client_body, "answers n > 1 as a batch, not one choice")
        elif key == w.LOGPROBS:
            body.update(_logprobs(value, client_body))
        elif key == w.STRUCTURED_OUTPUTS:
            out.update(_structured(value, client_body))
        else:
            raise _no_place(key, client_body)
    # SGLang's default cap is 128 where vLLM's chat default is the context: always sent, null
    # being SGLang's "up to the context".
    out.setdefault(w.MAX_NEW_TOKENS, None)
    return out


def _logprobs(count: object, client_body: Mapping[str, Any]) -> dict[str, Any]:
    if type(count) is not int or count < 0:
        raise _no_place(w.TOP_LOGPROBS, client_body, "has no every-token alternatives (-1)")
    return {
        w.RETURN_LOGPROB: True,
        w.TOP_LOGPROBS_NUM: count,
        w.LOGPROB_START_LEN: -1,
        w.RETURN_TEXT_IN_LOGPROBS: True,
    }


def _prompt_logprobs(count: object, *, stream: bool, client_body: Mapping[str, Any]) -> int | None:
    """The prompt logprobs asked for, checked as vLLM 0.33 checks them; ``None``: none to get.

    vLLM refuses them in a stream (but 0, which a stream never shows: nothing to ask SGLang).
    """
    if count is None or (stream and count == 0):
        return None
    if type(count) is not int or count < -1:
        path = f"$.{w.PROMPT_LOGPROBS}"
        msg = f"{path}: `prompt_logprobs` must be a positive value or -1, got {describe(count)}"
        raise RequestError(msg, param=path)
    if count == -1:
        raise _no_place(w.PROMPT_LOGPROBS, client_body, "has no every-token alternatives (-1)")
    if stream:
        path = f"$.{w.PROMPT_LOGPROBS}"
        msg = f"{path}: `prompt_logprobs` are not available when `stream=True`."
        raise RequestError(msg, param=path)
    return count


def prefill_body(body: Mapping[str, Any], prompt_logprobs: int) -> dict[str, Any]:
    """The prefill's ``/generate`` body (a new dict) when the client asked for prompt logprobs.

    In SGLang's P/D the prefill computes the prompt's logprobs and the decode returns none, so
    only the prefill's body asks for them, from the first position on. ``top_logprobs_num`` is
    one count for the prompt and the output, and the decode takes its first token's top
    logprobs from the prefill's: the prefill asks the larger of the two (the answer is cut to
    the client's count when read). ``docs/sglang.md``, "Prompt logprobs".
    """
    top = body.get(w.TOP_LOGPROBS_NUM)
    return {
        **body,
        w.RETURN_LOGPROB: True,
        w.TOP_LOGPROBS_NUM: max(top if type(top) is int else 0, prompt_logprobs),
        w.LOGPROB_START_LEN: 0,
        w.RETURN_TEXT_IN_LOGPROBS: True,
    }


def _structured(value: object, client_body: Mapping[str, Any]) -> dict[str, Any]:
    given = _validate.mapping(value, f"$.{w.SAMPLING_PARAMS}.{w.STRUCTURED_OUTPUTS}")
    out: dict[str, Any] = {}
    for key, constraint in given.items():
        if constraint is None or constraint is False:
            continue
        if key == w.JSON_KEY:
            text = constraint if isinstance(constraint, str) else None
            out[w.JSON_SCHEMA] = text or msgspec.json.encode(constraint).decode()
        elif key == w.JSON_OBJECT:
            out[w.JSON_SCHEMA] = _ANY_OBJECT_SCHEMA
        elif key in _STRUCTURED:
            out[_STRUCTURED[key]] = constraint
        else:
            where = f"{w.STRUCTURED_OUTPUTS}.{key}"
            raise _no_place(where, client_body)
    return out


def sglang_client_leg(
    client_body: Mapping[str, Any], *, rendezvous: Rendezvous, limits: Limits = DEFAULT_LIMITS
) -> SglangLeg:
    """Both legs of a client that speaks SGLang's own ``/generate`` (``docs/sglang.md``).

    The client's body as sent, with ``rid`` and the rendezvous fields ours, whatever the client
    sent in them (a rid of another length could be a prefix of a request in flight). What both
    workers would refuse is refused here, before the room is taken: a sampling key SGLang does
    not know, a batch (each item needs its own room), or no single prompt.

    Raises:
        RequestError: as above, ``param`` the JSON path; or the rendezvous is out of range.
    """
    body = dict(_validate.client_object(client_body))
    _limits.check_client_body(body, limits)
    sampling = _validate.obj(body, w.SAMPLING_PARAMS) or {}
    for key in sampling:
        if key not in _SGLANG_SAMPLING_KEYS:
            path = f"$.{w.SAMPLING_PARAMS}.{key}"
            msg = f"{path}: not a key of SGLang's sampling_params"
            raise RequestError(msg, param=path)
    prompt = body.get(w.INPUT_IDS)
    batch = isinstance(prompt, list) and any(isinstance(item, list) for item in prompt)
    if batch or isinstance(body.get(w.TEXT), list) or sampling.get(w.N, 1) != 1:
        msg = "$: a batch (a list of prompts, or n > 1) needs a room per item: send one prompt"
        raise RequestError(msg, param="$")
    if prompt is None and not isinstance(body.get(w.TEXT), str):
        msg = f"$.{w.INPUT_IDS}: one prompt is needed, as input_ids or text"
        raise RequestError(msg, param=f"$.{w.INPUT_IDS}")
    body[w.RID] = _rid(rendezvous.rid)
    body.update(_rendezvous_fields(rendezvous))
    stream = _validate.typed(body, w.STREAM, bool) is True
    stop_ids = _validate.typed(sampling, w.STOP_TOKEN_IDS, list[int], f"$.{w.SAMPLING_PARAMS}")
    return SglangLeg(
        path=w.SGLANG_GENERATE_PATH,
        body=body,
        stream=stream,
        rid=rendezvous.rid,
        stop_token_ids=tuple(stop_ids or ()),
        dropped=(),
    )


def build_sglang_openai_request(
    client_body: Mapping[str, Any],
    *,
    client_path: str,
    rendezvous: Rendezvous,
    limits: Limits = DEFAULT_LIMITS,
) -> SglangLeg:
    """Build both legs of a client served on its own route by SGLang's OpenAI server.

    What serves a tool-using client on an SGLang pipeline (``docs/sglang.md``, "Tools"): the
    client's chat, completions, Responses or Messages body (its transfer params removed), with
    ``rid`` and the rendezvous fields ours, whatever the client sent in them, on its own path.

    Raises:
        RequestError: the body is not a JSON object or is past a limit, a field every route of
            the client's API refuses (the cap not a positive integer, ``stream`` not a
            boolean), the route is not one SGLang's OpenAI server answers, or the rendezvous
            is out of range.
    """
    client = read_client_request(
        client_body, client_path, limits=limits, steps=(), every_field=True
    )
    if client.route not in _OPENAI_ROUTES:
        names = ", ".join(route.value for route in _OPENAI_ROUTES)
        msg = (
            f"client_path: SGLang's OpenAI server answers {names} with the rendezvous fields, "
            f"got {client.path!r}"
        )
        raise RequestError(msg, param="client_path")
    body = strip_transfer_params(client.body)
    leg = sglang_openai_leg(body, path=ROUTE_PATH[client.route], rendezvous=rendezvous)
    _limits.check_token_count(leg.body, limits)
    return leg


def sglang_openai_leg(
    client_body: Mapping[str, Any], *, path: str, rendezvous: Rendezvous
) -> SglangLeg:
    """Both legs of a client served on its own route (``path``) by SGLang's OpenAI server.

    The client's body (its transfer params already removed) with ``rid`` and the rendezvous
    fields, which SGLang's OpenAI requests take (``docs/sglang.md``): SGLang's server reads the
    API's own fields, tools included, so nothing is renamed here but a Responses cap, sent 2
    higher: SGLang's Responses route keeps 2 tokens of it as headroom.

    Raises:
        RequestError: the rendezvous is out of range, ``stream`` is not a boolean, or the client
            asks for prompt logprobs, which SGLang's OpenAI server has no field for.
    """
    body = dict(client_body)
    stream = _validate.typed(body, w.STREAM, bool) is True
    asked = _prompt_logprobs(body.get(w.PROMPT_LOGPROBS), stream=stream, client_body=body)
    if asked is not None:  # SGLang's OpenAI requests would ignore it: never dropped unsaid
        param = f"$.{w.PROMPT_LOGPROBS}"
        msg = (
            f"{param}: SGLang's OpenAI {path} has no prompt logprobs; they come from its "
            "/generate prefill, for chat clients on the token route (docs/sglang.md)"
        )
        raise RequestError(msg, param=param)
    cap = body.get(w.MAX_OUTPUT_TOKENS)
    if path == Route.RESPONSES.value and type(cap) is int:
        body[w.MAX_OUTPUT_TOKENS] = cap + _RESPONSES_HEADROOM
    body[w.RID] = _rid(rendezvous.rid)
    body.update(_rendezvous_fields(rendezvous))
    return SglangLeg(
        path=path,
        body=body,
        stream=stream,
        rid=rendezvous.rid,
        stop_token_ids=(),
        dropped=(),
    )

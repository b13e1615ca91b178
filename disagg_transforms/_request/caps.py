"""Output caps: move the client's cap to where the generate route reads it, or cap a leg at 1.

The generate route reads the output cap only from ``sampling_params.max_tokens``; a top-level
``max_tokens`` / ``max_completion_tokens`` / ``max_output_tokens`` is silently ignored and the
worker falls back to its own default (16 on older vLLM, which truncates answers).
:func:`apply_sampling_caps` relocates the cap; :func:`apply_single_token_cap` is the prefill and
encode rewrite that makes a worker compute the prompt's KV and emit one token.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from disagg_transforms._routes import Route
from disagg_transforms._wire import keys as w
from disagg_transforms._wire import validate as _validate
from disagg_transforms._wire.describe import describe
from disagg_transforms.errors import RequestError

__all__ = (
    "CAP_KEYS",
    "TOP_LEVEL_CAPS",
    "apply_sampling_caps",
    "apply_single_token_cap",
    "sampling_caps",
)

TOP_LEVEL_CAPS: tuple[str, ...] = (w.MAX_COMPLETION_TOKENS, w.MAX_TOKENS, w.MAX_OUTPUT_TOKENS)
"""Every top-level output-cap key of any API; none survives on a generate leg."""

# Where each client route keeps its cap at the top level, in precedence order (the first
# non-null wins; chat follows vLLM's own `max_completion_tokens` before `max_tokens`).
_CAP_PRECEDENCE: Mapping[Route, tuple[str, ...]] = {
    Route.CHAT_COMPLETIONS: (w.MAX_COMPLETION_TOKENS, w.MAX_TOKENS),
    Route.COMPLETIONS: (w.MAX_TOKENS,),
    Route.MESSAGES: (w.MAX_TOKENS,),
    Route.RESPONSES: (w.MAX_OUTPUT_TOKENS,),
    Route.GENERATE: TOP_LEVEL_CAPS,
}

CAP_KEYS: tuple[str, ...] = (*TOP_LEVEL_CAPS, w.MIN_TOKENS)
"""What a generate leg moves from the top level into ``sampling_params``: caps, ``min_tokens``."""

# Each cap key's JSON path at the top level and in sampling_params, built once.
_PATHS: Mapping[str, str] = {key: f"$.{key}" for key in CAP_KEYS}
_NESTED_PATHS: Mapping[str, str] = {key: f"$.{w.SAMPLING_PARAMS}.{key}" for key in CAP_KEYS}

# The top-level cap field each route reads, set to 1 on a single-token leg; None: the generate
# route reads `sampling_params.max_tokens` only. Chat also honours `max_completion_tokens`, but
# only a body that carries it gets it (never added: a strict server would refuse an undefined
# field).
_SINGLE_TOKEN_CAP: Mapping[Route, str | None] = {
    Route.CHAT_COMPLETIONS: w.MAX_TOKENS,
    Route.COMPLETIONS: w.MAX_TOKENS,
    Route.MESSAGES: w.MAX_TOKENS,
    Route.RESPONSES: w.MAX_OUTPUT_TOKENS,
    Route.GENERATE: None,
}


def _cap(value: object, path: str) -> int | None:
    # vLLM requires an integer >= 1 (a whole float counts); null means "the rest of the context".
    if value is None:
        return None
    return _validate.whole_number(value, path, minimum=1, maximum=_validate.MAX_TOKEN_ID)


def _sampling_params(body: Mapping[str, Any]) -> dict[str, Any]:
    found = _validate.obj(body, w.SAMPLING_PARAMS)
    return {} if found is None else dict(found)


def apply_sampling_caps(body: Mapping[str, Any], route: Route) -> dict[str, Any]:
    """Move the client's output cap and ``min_tokens`` under ``sampling_params``.

    Args:
        body: the body being turned into a generate leg (never mutated).
        route: the client's route, whose top-level cap keys are read: chat
            ``max_completion_tokens`` (when not null) then ``max_tokens``; completions and
            messages ``max_tokens``; responses ``max_output_tokens``; generate (a cap put at the
            top level by mistake) ``max_completion_tokens``, ``max_tokens``, ``max_output_tokens``.

    Returns:
        A shallow copy of ``body`` with every top-level cap key and ``min_tokens`` removed and a
        ``sampling_params`` object (``{}`` at least). An existing ``sampling_params.max_tokens``
        wins over any top-level cap; a null or absent cap writes no ``max_tokens``.

    Raises:
        RequestError: a cap of 0, a negative, a float with a fraction, a bool or a string; a
            ``min_tokens`` that is not a non-negative integer or exceeds the cap; a
            ``sampling_params`` that is not an object.

    >>> body = {"max_completion_tokens": 200, "max_tokens": 50}
    >>> apply_sampling_caps(body, Route.CHAT_COMPLETIONS)
    {'sampling_params': {'max_tokens': 200}}
    """
    body = _validate.mapping(body, "$")
    result = dict(body)  # a C-speed copy, then the few cap keys out: cheaper than a filter
    for key in CAP_KEYS:
        result.pop(key, None)
    result[w.SAMPLING_PARAMS] = sampling_caps(body, route)
    return result


def sampling_caps(body: Mapping[str, Any], route: Route) -> dict[str, Any]:
    """The ``sampling_params`` :func:`apply_sampling_caps` writes, without copying the body.

    Raises:
        RequestError: as :func:`apply_sampling_caps`.
    """
    body = _validate.mapping(body, "$")
    sampling = _sampling_params(body)
    if w.MAX_TOKENS in sampling:
        cap_key, cap_path = w.MAX_TOKENS, _NESTED_PATHS[w.MAX_TOKENS]
        cap = _cap(sampling[w.MAX_TOKENS], cap_path)
        sampling[w.MAX_TOKENS] = cap
    else:
        cap = None
        for key in _CAP_PRECEDENCE[route]:
            cap = _cap(body.get(key), _PATHS[key])
            if cap is not None:
                cap_key, cap_path = key, _PATHS[key]
                sampling[w.MAX_TOKENS] = cap
                break
    if w.MIN_TOKENS in sampling:
        min_path, min_value = _NESTED_PATHS[w.MIN_TOKENS], sampling[w.MIN_TOKENS]
    else:
        min_path, min_value = _PATHS[w.MIN_TOKENS], body.get(w.MIN_TOKENS)
    if min_value is not None:
        minimum = _validate.whole_number(min_value, min_path, minimum=0)
        sampling[w.MIN_TOKENS] = minimum
        if cap is not None and minimum > cap:
            msg = (
                f"{min_path}: min_tokens {describe(min_value)} exceeds the output cap "
                f"{cap_key} {cap} ({cap_path})"
            )
            raise RequestError(msg, param=min_path)
    return sampling


def apply_single_token_cap(body: Mapping[str, Any], route: Route) -> dict[str, Any]:
    """Rewrite a prefill or encode leg's body so the worker emits exactly one token.

    Args:
        body: the leg's body (never mutated).
        route: the route the leg is sent to. Chat: ``max_tokens`` = 1 and, only when the body
            carries it, ``max_completion_tokens`` = 1; completions and messages:
            ``max_tokens`` = 1; responses: ``max_output_tokens`` = 1; generate:
            ``sampling_params.max_tokens`` = 1 (``sampling_params`` created when absent) and every
            top-level cap removed.

    Returns:
        A shallow copy with the cap set, ``min_tokens`` removed (top level and
        ``sampling_params``), ``stream`` false and ``stream_options`` removed.

    Raises:
        RequestError: ``body`` or its ``sampling_params`` is not an object.

    >>> apply_single_token_cap({"max_output_tokens": 500, "stream": True}, Route.RESPONSES)
    {'stream': False, 'max_output_tokens': 1}
    """
    body = _validate.mapping(body, "$")
    result = {k: v for k, v in body.items() if k not in (w.MIN_TOKENS, w.STREAM_OPTIONS)}
    result[w.STREAM] = False
    cap_key = _SINGLE_TOKEN_CAP[route]
    if cap_key is None:
        sampling = {k: v for k, v in _sampling_params(body).items() if k != w.MIN_TOKENS}
        sampling[w.MAX_TOKENS] = 1
        for key in TOP_LEVEL_CAPS:
            result.pop(key, None)
        result[w.SAMPLING_PARAMS] = sampling
        return result
    result[cap_key] = 1
    if route is Route.CHAT_COMPLETIONS and w.MAX_COMPLETION_TOKENS in body:
        result[w.MAX_COMPLETION_TOKENS] = 1
    return result


CAP_VIEW: Any = Annotated[int, msgspec.Meta(ge=1, le=_validate.MAX_TOKEN_ID)] | None
"""A client view's type for a cap the caps read as sent (an int in range, or null)."""
MIN_TOKENS_VIEW: Any = Annotated[int, msgspec.Meta(ge=0)] | None
"""A client view's type for a ``min_tokens`` the caps read as sent."""


def viewed_caps(cap: int | None, minimum: int | None) -> dict[str, Any] | None:
    """What :func:`sampling_caps` gives a cap and ``min_tokens`` a view proved in range.

    ``None`` when ``min_tokens`` exceeds the cap: the caps refuse it.
    """
    if minimum is not None and cap is not None and minimum > cap:
        return None
    caps: dict[str, Any] = {} if cap is None else {w.MAX_TOKENS: cap}
    if minimum is not None:
        caps[w.MIN_TOKENS] = minimum
    return caps

"""Built-in transforms: the library's own functions in the shape of pipeline steps.

Each one has the :class:`~disagg_transforms.hooks.RequestTransform` or
:class:`~disagg_transforms.hooks.ResponseTransform` shape, ``(body, context) -> dict``, reads
what it needs from the :class:`~disagg_transforms.hooks.TransformContext` (the client's path,
the step's params, the router's per-request :class:`~disagg_transforms.hooks.LegInputs`, the
client's body), never mutates ``body`` and raises only the library's errors. They mix freely
with third-party transforms in a :class:`~disagg_transforms.hooks.Pipeline`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, final

from disagg_transforms._config import DecodeParams, OutputMode
from disagg_transforms._request.caps import apply_sampling_caps
from disagg_transforms._request.client import decode_output_mode
from disagg_transforms._request.legs import build_decode_request, strip_transfer_params
from disagg_transforms._response.dispatch import wrap_envelope
from disagg_transforms._response.echo import check_output_mode_echo
from disagg_transforms._routes import Route, resolve_format
from disagg_transforms.errors import ConfigError
from disagg_transforms.hooks import TransformContext

__all__ = (
    "SamplingCaps",
    "decode_request",
    "sampling_caps",
    "strip_client_transfer_params",
    "wrap_response",
)


@final
@dataclasses.dataclass(frozen=True, repr=False)
class SamplingCaps:
    """Request transform: :func:`~disagg_transforms.apply_sampling_caps` as a step.

    Build it with :func:`sampling_caps`. The caps are read the way ``route`` keeps them, or the
    way the client's own route does when ``route`` is ``None``. Immutable; equal, hashed and
    pickled by its route.
    """

    route: Route | None = None
    """The route whose cap keys are read (``None``: the client's route)."""

    def __post_init__(self) -> None:
        untyped: object = self.route  # a host's config may hand over anything
        if untyped is not None and not isinstance(untyped, Route):
            msg = f"sampling_caps: route must be a Route or None, got {untyped!r}"
            raise ConfigError(msg, param="route")

    def __call__(self, body: Mapping[str, Any], context: TransformContext, /) -> dict[str, Any]:
        """Move the body's output cap under ``sampling_params.max_tokens``."""
        return apply_sampling_caps(body, self.route or context.client_route)

    def __repr__(self) -> str:
        return f"sampling_caps({self.route})"


def sampling_caps(route: Route | None = None) -> SamplingCaps:
    """The cap-relocation request transform (``docs/request-legs.md``, "Caps and errors").

    Args:
        route: the route whose top-level cap keys are read (``Route.GENERATE`` for a body that
            is already a generate body); ``None`` reads them as the client's route keeps them.

    Raises:
        ConfigError: ``route`` is neither a :class:`~disagg_transforms.Route` nor None.
    """
    return SamplingCaps(route)


def strip_client_transfer_params(
    body: Mapping[str, Any], context: TransformContext, /
) -> dict[str, Any]:
    """Request transform: remove client-supplied transfer params (``docs/security.md``).

    ``kv_transfer_params`` and ``ec_transfer_params`` are removed from the top level,
    ``sampling_params.extra_args`` and ``vllm_xargs``, unless the context's step params set
    ``trust_client_transfer_params`` (then a copy of the body comes back unchanged).
    """
    params = context.params
    if params is not None and params.trust_client_transfer_params:
        return dict(body)
    return strip_transfer_params(body)


def _decode_params(context: TransformContext, transform: str) -> DecodeParams:
    params = context.params
    if isinstance(params, DecodeParams):
        return params
    msg = (
        f"{transform}: the context must carry the decode step's DecodeParams, got "
        f"{type(params).__name__}"
    )
    raise ConfigError(msg, param="params")


def decode_request(body: Mapping[str, Any], context: TransformContext, /) -> dict[str, Any]:
    """Request transform: the client's body becomes the decode leg's body.

    :func:`~disagg_transforms.build_decode_request` (its rules: ``docs/request-legs.md``) with
    the context's client path, ``DecodeParams`` and :class:`~disagg_transforms.hooks.LegInputs`.
    Only the body comes back:
    a host that needs the leg's path, streaming flags or dropped keys calls
    ``build_decode_request`` itself.

    Raises:
        ConfigError: the context carries no ``DecodeParams``.
        RequestError: as :func:`~disagg_transforms.build_decode_request`.
    """
    params = _decode_params(context, "decode_request")
    leg = build_decode_request(
        body, client_path=context.client_path, params=params, inputs=context.inputs
    )
    return leg.body


def wrap_response(body: Mapping[str, Any], context: TransformContext, /) -> dict[str, Any]:
    """Response transform: a non-streamed decode answer becomes the client's envelope.

    Driven by the context's ``DecodeParams`` and client path. On the generate route the echo is
    checked (``docs/responses.md``) against ``params.output_mode``, then a chat client gets a
    ``chat.completion`` when ``wrap_chat_completion`` is on (else the generate response as it
    came), a Responses client a ``response`` object, an Anthropic client a ``message``, and a
    generate client the generate response. A leg on an OpenAI-format route comes back as it is.
    The context's ``client_body`` supplies ``top_logprobs``, tools and the model fallback.

    Raises:
        ConfigError: the context carries no ``DecodeParams``.
        UpstreamContractError: the echo check fails, or the answer is malformed.
    """
    params = _decode_params(context, "wrap_response")
    if resolve_format(params.use_openai_format, context.client_path) is not Route.GENERATE:
        return dict(body)
    mode, route = params.output_mode, context.client_route
    if mode is OutputMode.AUTO:
        # The mode the decode leg chose for this client's request.
        client = context.client_body or {}
        mode = decode_output_mode(client, client_path=context.client_path, params=params)
    if route in (Route.RESPONSES, Route.MESSAGES) or (
        route is Route.CHAT_COMPLETIONS and params.wrap_chat_completion
    ):
        return wrap_envelope(route, body, requested=mode, client_body=context.client_body)
    check_output_mode_echo(body, mode)
    return dict(body)

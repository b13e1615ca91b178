"""Hooks: transforms as plain callables, composed in an immutable pipeline the host owns.

A *transform* takes a body and a :class:`TransformContext` and returns a new body
(:class:`RequestTransform` for request bodies, :class:`ResponseTransform` for answers). A
:class:`Pipeline` runs a tuple of them first to last, each output feeding the next. Nothing runs
unless the host lists it: there is no module-level registry, and the entry-point group
``disagg_transforms.transforms`` is only *listed* by :func:`available_transforms` and loaded by
name, in the host's order, by :func:`load_transforms`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Protocol, final

import msgspec

from disagg_transforms._config import Step, StepParams
from disagg_transforms._plugins import ENTRY_POINT_GROUP, available_transforms, load_transforms
from disagg_transforms._request.legs import LegInputs
from disagg_transforms._routes import Route, detect_route
from disagg_transforms._wire.describe import describe, describe_error
from disagg_transforms._wire.json_copy import json_copy
from disagg_transforms.errors import (
    ConfigError,
    DisaggTransformError,
    RequestError,
    TransformError,
    UpstreamContractError,
)

__all__ = (
    "ENTRY_POINT_GROUP",
    "LegInputs",
    "Pipeline",
    "RequestTransform",
    "ResponseTransform",
    "TransformContext",
    "available_transforms",
    "load_transforms",
)


class TransformContext(msgspec.Struct, frozen=True, kw_only=True):
    """What a transform may know about the request besides its body; the host builds it.

    Frozen, so one context can be handed to every transform (and every thread) safely.
    """

    client_path: str
    """The path the client called, e.g. ``/v1/chat/completions``."""
    step: Step
    """The leg this body belongs to."""
    params: StepParams | None = None
    """The step's parsed params, when the host has them."""
    extra: Mapping[str, Any] = MappingProxyType({})
    """The host's own data, opaque to the library (request ids, tenant, deadlines...)."""
    client_body: Mapping[str, Any] | None = None
    """The client's original request, for response transforms (its ``top_logprobs``, model)."""
    inputs: LegInputs = msgspec.field(default_factory=LegInputs)
    """The router's per-request inputs to the leg builders (token IDs, ``/render`` answer...),
    the same object a router passes them as ``inputs=``."""

    @property
    def client_route(self) -> Route:
        """The route the client spoke (``detect_route(client_path)``)."""
        return detect_route(self.client_path)


class RequestTransform(Protocol):
    """**Protocol:** turns a request body into the next request body.

    It must not mutate ``body`` it was not given ownership of; inside a :class:`Pipeline` the
    body is the pipeline's own copy, so returning it changed is fine. Reject a body by raising
    :class:`~disagg_transforms.errors.RequestError`.
    """

    def __call__(self, body: Mapping[str, Any], context: TransformContext, /) -> dict[str, Any]:
        """Return the transformed body."""
        ...


class ResponseTransform(Protocol):
    """**Protocol:** turns a worker's answer (or the envelope built from it) into the next one.

    Same rules as :class:`RequestTransform`; reject an answer by raising
    :class:`~disagg_transforms.errors.UpstreamContractError`.
    """

    def __call__(self, body: Mapping[str, Any], context: TransformContext, /) -> dict[str, Any]:
        """Return the transformed body."""
        ...


def _transform_name(transform: object) -> str:
    # functools.partial and callable instances have no __qualname__ of their own.
    target = getattr(transform, "func", transform)
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    module = getattr(target, "__module__", None) or type(target).__module__
    return f"{module}.{qualname}"


def _checked(transforms: Iterable[object], side: str) -> tuple[Any, ...]:
    if isinstance(transforms, (str, bytes, Mapping)) or not isinstance(transforms, Iterable):
        msg = f"Pipeline.{side}: expected a sequence of transforms, got {describe(transforms)}"
        raise ConfigError(msg, param=f"pipeline.{side}")
    items = tuple(transforms)
    for index, item in enumerate(items):
        if not callable(item):
            param = f"pipeline.{side}[{index}]"
            msg = f"{param}: expected a callable (body, context) -> dict, got {describe(item)}"
            raise ConfigError(msg, param=param)
    return items


def _run(
    transforms: tuple[RequestTransform | ResponseTransform, ...],
    body: Mapping[str, Any],
    context: TransformContext,
    side: str,
) -> dict[str, Any]:
    untyped: object = body  # hosts hand over whatever they parsed; check before trusting it
    if not isinstance(untyped, Mapping):
        msg = f"$: the {side} body must be a JSON object, got {describe(untyped)}"
        error = RequestError if side == "request" else UpstreamContractError
        raise error(msg, param="$")
    current: dict[str, Any] = json_copy(untyped)  # the one copy: the caller's body is never seen
    for transform in transforms:
        try:
            result: object = transform(current, context)
        except DisaggTransformError:
            raise
        except Exception as exc:
            name = _transform_name(transform)
            msg = f"{side} transform {name} failed: {describe_error(exc)}"
            raise TransformError(msg, transform=name) from exc
        if not isinstance(result, dict):
            name = _transform_name(transform)
            msg = f"{side} transform {name} returned {describe(result)}, expected a dict body"
            raise TransformError(msg, transform=name)
        current = result
    return current


@final
@dataclasses.dataclass(frozen=True, init=False, repr=False)
class Pipeline:
    """An immutable, ordered pair of transform tuples, owned by the host.

    Transforms run first to last, each output feeding the next. The caller's body is copied
    once, at the start of a run, so no transform can change it. "Adding" returns a new
    pipeline; nothing about a pipeline changes after it is built, so one instance can serve
    every thread. Pipelines with the same transforms in the same order are equal, hash alike
    and pickle.

    Args:
        request: the request transforms, in order.
        response: the response transforms, in order.

    Raises:
        ConfigError: an item is not callable.
    """

    request: tuple[RequestTransform, ...]
    """The request transforms, in the order they run."""
    response: tuple[ResponseTransform, ...]
    """The response transforms, in the order they run."""

    def __init__(
        self,
        request: Iterable[RequestTransform] = (),
        response: Iterable[ResponseTransform] = (),
    ) -> None:
        # A frozen dataclass sets its fields this way in its own __init__ too; this one takes
        # any iterable and checks each item, which a generated __init__ would not.
        object.__setattr__(self, "request", _checked(request, "request"))
        object.__setattr__(self, "response", _checked(response, "response"))

    def run_request(self, body: Mapping[str, Any], context: TransformContext) -> dict[str, Any]:
        """Run the request transforms over a copy of ``body``; ``body`` is left untouched.

        Raises:
            RequestError: ``body`` is not a mapping, or a transform rejected it.
            TransformError: a transform raised an error that is not one of ours, or returned
                something other than a dict; the original is chained as ``__cause__``.
            DisaggTransformError: any of this library's errors a transform raised, unchanged.
        """
        return _run(self.request, body, context, "request")

    def run_response(self, body: Mapping[str, Any], context: TransformContext) -> dict[str, Any]:
        """Run the response transforms over a copy of ``body``; ``body`` is left untouched.

        Raises:
            UpstreamContractError: ``body`` is not a mapping, or a transform refused it.
            TransformError: as for :meth:`run_request`.
            DisaggTransformError: any of this library's errors a transform raised, unchanged.
        """
        return _run(self.response, body, context, "response")

    def with_request(self, *transforms: RequestTransform) -> Pipeline:
        """A new pipeline with ``transforms`` appended to the request side."""
        return Pipeline((*self.request, *transforms), self.response)

    def with_response(self, *transforms: ResponseTransform) -> Pipeline:
        """A new pipeline with ``transforms`` appended to the response side."""
        return Pipeline(self.request, (*self.response, *transforms))

    def __add__(self, other: object) -> Pipeline:
        """A new pipeline running this one's transforms, then ``other``'s, on each side."""
        if not isinstance(other, Pipeline):
            return NotImplemented
        return Pipeline((*self.request, *other.request), (*self.response, *other.response))

    def __repr__(self) -> str:
        request = ", ".join(map(_transform_name, self.request))
        response = ", ".join(map(_transform_name, self.response))
        return f"Pipeline(request=[{request}], response=[{response}])"

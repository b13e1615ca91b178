"""Hooks: transforms as plain callables, composed in an immutable pipeline the host owns.

A *transform* takes a body and a :class:`TransformContext` and returns a new body
(:class:`RequestTransform` for request bodies, :class:`ResponseTransform` for answers). A
:class:`Pipeline` runs a tuple of them first to last, each output feeding the next. Nothing runs
unless the host lists it: there is no module-level registry, and the entry-point group
``disagg_transforms.transforms`` is only *listed* by :func:`available_transforms` and loaded by
name, in the host's order, by :func:`load_transforms`.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping, Sequence
from importlib.metadata import EntryPoint, entry_points
from types import MappingProxyType
from typing import Any, Protocol, final

import msgspec

from disagg_transforms._config import Step, StepParams
from disagg_transforms._request.legs import LegInputs
from disagg_transforms._routes import Route, detect_route
from disagg_transforms._wire.describe import describe
from disagg_transforms._wire.json_copy import json_copy
from disagg_transforms.errors import (
    ConfigError,
    DisaggTransformError,
    PluginLoadError,
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

ENTRY_POINT_GROUP = "disagg_transforms.transforms"
"""The entry-point group third-party distributions publish their transforms in."""

_MAX_REASON = 200


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


def _reason(exc: BaseException) -> str:
    try:
        text = " ".join(str(exc).split())
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the original error
        text = ""
    if len(text) > _MAX_REASON:
        text = text[:_MAX_REASON] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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
            msg = f"{side} transform {name} failed: {_reason(exc)}"
            raise TransformError(msg, transform=name) from exc
        if not isinstance(result, dict):
            name = _transform_name(transform)
            msg = f"{side} transform {name} returned {describe(result)}, expected a dict body"
            raise TransformError(msg, transform=name)
        current = result
    return current


@final
class Pipeline:
    """An immutable, ordered pair of transform tuples, owned by the host.

    Transforms run first to last, each output feeding the next. The caller's body is copied
    once, at the start of a run, so no transform can change it. "Adding" returns a new
    pipeline; nothing about a pipeline changes after it is built, so one instance can serve
    every thread.

    Args:
        request: the request transforms, in order.
        response: the response transforms, in order.

    Raises:
        ConfigError: an item is not callable.
    """

    __slots__ = ("_request", "_response")

    _request: tuple[RequestTransform, ...]
    _response: tuple[ResponseTransform, ...]

    def __init__(
        self,
        request: Iterable[RequestTransform] = (),
        response: Iterable[ResponseTransform] = (),
    ) -> None:
        object.__setattr__(self, "_request", _checked(request, "request"))
        object.__setattr__(self, "_response", _checked(response, "response"))

    @property
    def request(self) -> tuple[RequestTransform, ...]:
        """The request transforms, in the order they run."""
        return self._request

    @property
    def response(self) -> tuple[ResponseTransform, ...]:
        """The response transforms, in the order they run."""
        return self._response

    def run_request(self, body: Mapping[str, Any], context: TransformContext) -> dict[str, Any]:
        """Run the request transforms over a copy of ``body``; ``body`` is left untouched.

        Raises:
            RequestError: ``body`` is not a mapping, or a transform rejected it.
            TransformError: a transform raised an error that is not one of ours, or returned
                something other than a dict; the original is chained as ``__cause__``.
            DisaggTransformError: any of this library's errors a transform raised, unchanged.
        """
        return _run(self._request, body, context, "request")

    def run_response(self, body: Mapping[str, Any], context: TransformContext) -> dict[str, Any]:
        """Run the response transforms over a copy of ``body``; ``body`` is left untouched.

        Raises:
            UpstreamContractError: ``body`` is not a mapping, or a transform refused it.
            TransformError: as for :meth:`run_request`.
            DisaggTransformError: any of this library's errors a transform raised, unchanged.
        """
        return _run(self._response, body, context, "response")

    def with_request(self, *transforms: RequestTransform) -> Pipeline:
        """A new pipeline with ``transforms`` appended to the request side."""
        return Pipeline((*self._request, *transforms), self._response)

    def with_response(self, *transforms: ResponseTransform) -> Pipeline:
        """A new pipeline with ``transforms`` appended to the response side."""
        return Pipeline(self._request, (*self._response, *transforms))

    def __add__(self, other: object) -> Pipeline:
        """A new pipeline running this one's transforms, then ``other``'s, on each side."""
        if not isinstance(other, Pipeline):
            return NotImplemented
        return Pipeline((*self._request, *other.request), (*self._response, *other.response))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Pipeline):
            return NotImplemented
        return self._request == other.request and self._response == other.response

    def __hash__(self) -> int:
        return hash((self._request, self._response))

    def __repr__(self) -> str:
        request = ", ".join(map(_transform_name, self._request))
        response = ", ".join(map(_transform_name, self._response))
        return f"Pipeline(request=[{request}], response=[{response}])"

    def __setattr__(self, name: str, value: object) -> None:
        msg = f"Pipeline is immutable: use with_request/with_response to get a new one ({name})"
        raise AttributeError(msg)

    def __delattr__(self, name: str) -> None:
        msg = f"Pipeline is immutable ({name})"
        raise AttributeError(msg)

    def __reduce__(self) -> tuple[Any, ...]:
        # Slots plus a refusing __setattr__ defeat default pickling; rebuild through __init__.
        return (Pipeline, (self._request, self._response))


def _group() -> list[EntryPoint]:
    return list(entry_points(group=ENTRY_POINT_GROUP))


def _distribution(entry_point: EntryPoint) -> str | None:
    dist = entry_point.dist
    return None if dist is None else f"{dist.name} {dist.version}"


def available_transforms() -> dict[str, EntryPoint]:
    """List the installed transform plugins by name, importing none of them.

    When two distributions publish the same name, the first one on ``sys.path`` is listed;
    :func:`load_transforms` refuses such a name as ambiguous.

    Returns:
        Entry-point name → its :class:`importlib.metadata.EntryPoint`, sorted by name.
    """
    found: dict[str, EntryPoint] = {}
    for entry_point in _group():
        found.setdefault(entry_point.name, entry_point)
    return dict(sorted(found.items()))


def _load_one(name: str, candidates: Sequence[EntryPoint], installed: Iterable[str]) -> Any:  # noqa: ANN401 - entry points load anything; checked below
    if not candidates:
        listed = ", ".join(sorted(set(installed))) or "none"
        msg = (
            f"transform plugin {name!r} is not installed: no distribution publishes it in the "
            f"entry-point group {ENTRY_POINT_GROUP!r} (installed: {listed})"
        )
        raise PluginLoadError(msg, plugin=name)
    distributions = sorted({_distribution(ep) or "an unknown distribution" for ep in candidates})
    if len(candidates) > 1:
        msg = f"transform plugin {name!r} is ambiguous: published by {', '.join(distributions)}"
        raise PluginLoadError(msg, plugin=name)
    entry_point = candidates[0]
    dist = _distribution(entry_point)
    where = f"{name!r} ({entry_point.value}, from {dist or 'an unknown distribution'})"
    try:
        loaded: object = entry_point.load()
    except Exception as exc:
        msg = f"transform plugin {where} failed to load: {_reason(exc)}"
        raise PluginLoadError(msg, plugin=name, distribution=dist) from exc
    if not callable(loaded):
        msg = f"transform plugin {where} is not callable: it is {describe(loaded)}"
        raise PluginLoadError(msg, plugin=name, distribution=dist)
    try:
        inspect.signature(loaded).bind(None, None)
    except TypeError:
        msg = f"transform plugin {where} does not take (body, context)"
        raise PluginLoadError(msg, plugin=name, distribution=dist) from None
    except ValueError:
        pass  # some builtins have no signature to check; calling them will tell
    return loaded


def load_transforms(names: Sequence[str]) -> tuple[RequestTransform | ResponseTransform, ...]:
    """Import the named transform plugins, and only those, in the order given.

    Call it once while the router starts; importing is idempotent, so calling it again (or in
    every worker process) returns the same objects.

    Args:
        names: entry-point names in the group ``disagg_transforms.transforms``.

    Returns:
        The loaded transforms, one per name, in ``names`` order.

    Raises:
        PluginLoadError: a name is not installed, is published twice, fails to import, or is
            not a callable taking ``(body, context)``; it names the plugin and its distribution.
        ConfigError: ``names`` is a string rather than a sequence of names.
    """
    untyped: object = names
    if isinstance(untyped, (str, bytes)) or not isinstance(untyped, Sequence):
        msg = f"transforms: expected a list of entry-point names, got {describe(untyped)}"
        raise ConfigError(msg, param="transforms")
    group = _group()
    loaded: list[RequestTransform | ResponseTransform] = []
    for name in names:
        candidates = [ep for ep in group if ep.name == name]
        loaded.append(_load_one(name, candidates, (ep.name for ep in group)))
    return tuple(loaded)

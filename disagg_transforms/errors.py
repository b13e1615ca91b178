"""The errors this library raises, and how a router turns them into a response body.

Every error is a :class:`DisaggTransformError`; catch that one class to catch them all::

    DisaggTransformError        (never raised itself)
    ├── ConfigError             ValueError too; bad step params, raised at startup    (500)
    │   └── PluginLoadError     a transform plugin named by the host cannot be loaded (500)
    ├── RequestError            ValueError too; the client's body cannot be served   (400)
    │   └── RequestTooLargeError    the client's body is over Limits.max_body_bytes       (413)
    ├── TransformError          a pipeline transform failed with a foreign error      (500)
    ├── UpstreamContractError   a worker answered outside the contract                (502)
    └── WorkerNotAllowedError   a request names a worker outside the router's allow-list (403)

Each error carries ``param`` (the JSON path such as ``$.sampling_params.max_tokens``, or the
config key such as ``decode.output_mode``), ``status_hint`` (the HTTP status a router would
answer with) and ``retryable`` (always false: the same body gets the same answer; a worker's
transport failure, which is not a library error, is what a router retries).
:func:`openai_error_body` and :func:`anthropic_error_body` turn any of them into the body the
client's SDK reads; :func:`error_body` builds such a body from a status and a message, for a
worker's 4xx/5xx answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from typing import Any, ClassVar

from disagg_transforms._routes import Route

__all__ = (
    "ANTHROPIC_ERROR_TYPES",
    "ConfigError",
    "DisaggTransformError",
    "PluginLoadError",
    "RequestError",
    "RequestTooLargeError",
    "TransformError",
    "UpstreamContractError",
    "WorkerNotAllowedError",
    "anthropic_error_body",
    "error_body",
    "openai_error_body",
)


class DisaggTransformError(Exception):
    """Root of every error this library raises; only its subclasses are raised.

    Attributes:
        param: The JSON path or config key of the offending field, or ``None``.
        status_hint: The HTTP status a router would answer with.
        error_type: The ``type`` string of the OpenAI-style error body.
        retryable: Whether sending the same request again can help: false for every library
            error (the same input gets the same answer).
    """

    status_hint: ClassVar[int] = 500
    error_type: ClassVar[str] = "InternalServerError"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str, *, param: str | None = None) -> None:
        if type(self) is DisaggTransformError:
            msg = "DisaggTransformError is abstract: raise one of its subclasses"
            raise TypeError(msg)
        super().__init__(message)
        self.message = message
        self.param = param

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only `param` would be lost by the default pickling of exceptions.
        return (_rebuild, (type(self), self.message, self.param))


def _rebuild(
    cls: type[DisaggTransformError], message: str, param: str | None
) -> DisaggTransformError:
    return cls(message, param=param)


class ConfigError(DisaggTransformError, ValueError):
    """A step's configuration is invalid; raised while the router starts."""

    status_hint: ClassVar[int] = 500
    error_type: ClassVar[str] = "InternalServerError"


class RequestError(DisaggTransformError, ValueError):
    """The client's body cannot be turned into a valid leg."""

    status_hint: ClassVar[int] = 400
    error_type: ClassVar[str] = "BadRequestError"


class RequestTooLargeError(RequestError):
    """The client's body is larger than ``Limits.max_body_bytes``; refused before it is parsed."""

    status_hint: ClassVar[int] = 413


class UpstreamContractError(DisaggTransformError):
    """A worker's answer breaks the contract (wrong ``output_mode`` echo, malformed body)."""

    status_hint: ClassVar[int] = 502
    error_type: ClassVar[str] = "BadGatewayError"


class WorkerNotAllowedError(DisaggTransformError):
    """A request names a worker the router may not call; refused before any worker call.

    In llm-d's sidecar seat: a prefill or encode target outside ``--allowed-worker-hosts``.
    ``param`` is the header that named it. Anthropic's type for it is ``permission_error``.
    """

    status_hint: ClassVar[int] = 403
    error_type: ClassVar[str] = "PermissionDeniedError"


class TransformError(DisaggTransformError):
    """A transform in a pipeline raised an error that is not one of ours, or returned a non-dict.

    The original exception is chained as ``__cause__``; a transform that raises one of this
    library's errors is not wrapped.

    Attributes:
        transform: The qualified name of the transform that failed.
    """

    status_hint: ClassVar[int] = 500
    error_type: ClassVar[str] = "InternalServerError"

    def __init__(self, message: str, *, transform: str, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.transform = transform

    def __reduce__(self) -> tuple[Any, ...]:
        kwargs = {"param": self.param, "transform": self.transform}
        return (_rebuild_with, (type(self), self.message, kwargs))


class PluginLoadError(ConfigError):
    """A transform plugin the host asked for is missing, fails to import, or is not a transform.

    Raised by :func:`disagg_transforms.hooks.load_transforms` while the router starts; the
    import error, if any, is chained as ``__cause__``.

    Attributes:
        plugin: The entry-point name the host asked for.
        distribution: The distribution that publishes it (``"name version"``), or ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        plugin: str,
        distribution: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message, param=param)
        self.plugin = plugin
        self.distribution = distribution

    def __reduce__(self) -> tuple[Any, ...]:
        kwargs = {"param": self.param, "plugin": self.plugin, "distribution": self.distribution}
        return (_rebuild_with, (type(self), self.message, kwargs))


def _rebuild_with(
    cls: type[DisaggTransformError], message: str, kwargs: dict[str, Any]
) -> DisaggTransformError:
    # Subclasses with keyword-only attributes of their own pickle through this.
    return cls(message, **kwargs)


ANTHROPIC_ERROR_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
"""Anthropic's error ``type`` by HTTP status; other 4xx are ``invalid_request_error``, other 5xx
``api_error`` (see docs/errors.md)."""

_ANTHROPIC_KINDS = frozenset({*ANTHROPIC_ERROR_TYPES.values(), "billing_error", "timeout_error"})
"""Every ``type`` Anthropic's errors use, the ones no status maps to included."""

_OPENAI_TYPES: dict[int, str] = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    409: "ConflictError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}
"""The OpenAI-shaped ``type`` by HTTP status, in vLLM's exception-class style (the openai SDK's
class names where it has one); other 4xx are ``BadRequestError``, other 5xx
``InternalServerError`` (see docs/errors.md)."""

_MIN_ERROR_STATUS, _MAX_ERROR_STATUS = 400, 599


def _anthropic_type(status: int) -> str:
    fallback = "invalid_request_error" if status < HTTPStatus.INTERNAL_SERVER_ERROR else "api_error"
    return ANTHROPIC_ERROR_TYPES.get(status, fallback)


def _openai_type(status: int) -> str:
    fallback = (
        "BadRequestError" if status < HTTPStatus.INTERNAL_SERVER_ERROR else "InternalServerError"
    )
    return _OPENAI_TYPES.get(status, fallback)


def error_body(
    api_route: Route,
    *,
    status: int,
    message: str,
    param: str | None = None,
    error_type: str | None = None,
) -> dict[str, Any]:
    """Build the error body a client of ``api_route`` reads, for an HTTP ``status``.

    ``Route.MESSAGES`` gets Anthropic's ``{"type": "error", "error": {"type", "message"}}``
    (``param`` has no place in it); every other route gets OpenAI's and vLLM's
    ``{"error": {"message", "type", "param", "code"}}``. ``error_type`` replaces the type
    derived from ``status`` (Anthropic's table, or vLLM's class-style name such as
    ``BadRequestError``); on ``Route.MESSAGES`` only one of Anthropic's own types does.

    Args:
        api_route: the route the client called (its error shape is the one returned).
        status: the HTTP status of the answer, 400 to 599.
        message: the human-readable message.
        param: the offending field (OpenAI shape only).
        error_type: the ``type`` string, when the derived one will not do.

    Raises:
        ConfigError: ``status`` is not an integer from 400 to 599 (``param`` is ``"status"``).
    """
    untyped: object = status  # a router may hand over a worker's status as it parsed it
    if type(untyped) is not int or not _MIN_ERROR_STATUS <= untyped <= _MAX_ERROR_STATUS:
        msg = f"status: expected an HTTP error status from 400 to 599, got {untyped!r}"
        raise ConfigError(msg, param="status")
    if api_route == Route.MESSAGES:
        # A type outside Anthropic's table (vLLM's class-style names) gives way to the status's.
        known = error_type is not None and error_type in _ANTHROPIC_KINDS
        kind = error_type if known else _anthropic_type(status)
        return {"type": "error", "error": {"type": kind, "message": message}}
    kind = _openai_type(status) if error_type is None else error_type
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def openai_error_body(error: DisaggTransformError) -> dict[str, Any]:
    """Build the ``{"error": {...}}`` body a router sends for ``error``.

    The shape is the one vLLM answers with on every route: ``message``, ``type`` (vLLM's
    exception-class style, e.g. ``BadRequestError``), ``param`` and ``code`` (the HTTP status).
    """
    return error_body(
        Route.CHAT_COMPLETIONS,
        status=error.status_hint,
        message=error.message,
        param=error.param,
        error_type=error.error_type,
    )


def anthropic_error_body(error: DisaggTransformError) -> dict[str, Any]:
    """Build the ``{"type": "error", "error": {...}}`` body an Anthropic Messages client reads.

    The ``type`` follows Anthropic's table by ``error.status_hint``: ``invalid_request_error``
    for a :class:`RequestError`, ``api_error`` for the 500 and 502 errors.
    """
    return error_body(Route.MESSAGES, status=error.status_hint, message=error.message)

"""The errors this library raises, and how a router turns them into a response body.

Every error is a :class:`DisaggTransformError`; catch that one class to catch them all::

    DisaggTransformError        (never raised itself)
    ├── ConfigError             ValueError too; bad step params, raised at startup    (500)
    │   └── PluginLoadError     a transform plugin named by the host cannot be loaded (500)
    ├── RequestError            ValueError too; the client's body cannot be served   (400)
    ├── TransformError          a pipeline transform failed with a foreign error      (500)
    └── UpstreamContractError   a worker answered outside the contract                (502)

Each error carries ``param`` (the JSON path such as ``$.sampling_params.max_tokens``, or the
config key such as ``decode.output_mode``) and ``status_hint`` (the HTTP status a router would
answer with). :func:`openai_error_body` turns any of them into the body vLLM and OpenAI send.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = (
    "ConfigError",
    "DisaggTransformError",
    "PluginLoadError",
    "RequestError",
    "TransformError",
    "UpstreamContractError",
    "openai_error_body",
)


class DisaggTransformError(Exception):
    """Root of every error this library raises; only its subclasses are raised.

    Attributes:
        param: The JSON path or config key of the offending field, or ``None``.
        status_hint: The HTTP status a router would answer with.
        error_type: The ``type`` string of the OpenAI-style error body.
    """

    status_hint: ClassVar[int] = 500
    error_type: ClassVar[str] = "InternalServerError"

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


class UpstreamContractError(DisaggTransformError):
    """A worker's answer breaks the contract (wrong ``output_mode`` echo, malformed body)."""

    status_hint: ClassVar[int] = 502
    error_type: ClassVar[str] = "BadGatewayError"


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


def openai_error_body(error: DisaggTransformError) -> dict[str, dict[str, Any]]:
    """Build the ``{"error": {...}}`` body a router sends for ``error``.

    The shape is the one vLLM answers with on every route: ``message``, ``type`` (vLLM's
    exception-class style, e.g. ``BadRequestError``), ``param`` and ``code`` (the HTTP status).
    """
    return {
        "error": {
            "message": error.message,
            "type": error.error_type,
            "param": error.param,
            "code": error.status_hint,
        }
    }

"""How the router wants every envelope built: one frozen parameter object, and the rules it feeds.

:class:`EnvelopeOptions` is taken by every wrap, single frame and stream converter.
:func:`envelope_model` and :func:`envelope_created` are the one ``model`` precedence and the one
``created`` rule of every envelope (see ``docs/envelopes.md``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import msgspec

from disagg_transforms._config import OutputMode, validate_vllm_version, vllm_honours
from disagg_transforms._wire import keys as w
from disagg_transforms._wire.limits import DEFAULT_LIMITS, Limits
from disagg_transforms._wire.sse import DEFAULT_MAX_EVENT_BYTES
from disagg_transforms.errors import UpstreamContractError

__all__ = ("DEFAULT_MAX_CHOICES", "EnvelopeOptions")

DEFAULT_MAX_CHOICES: Final = 4096
"""Default bound on the distinct choice indices one stream may carry (the converter's state)."""


class EnvelopeOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How the client's envelope is built; frozen, build one at startup and share it.

    Every wrap, single frame and stream converter takes one (``options=``); ``None`` means
    ``EnvelopeOptions()``.
    """

    model: str | None = None
    """The envelope's ``model``, over the worker's and the client's (see :func:`envelope_model`)."""
    clock: Callable[[], float] = time.time
    """Gives "now" (Unix seconds) when neither the caller nor the worker gives ``created``."""
    vllm_finish_reasons: bool = False
    """Chat: pass vLLM's ``finish_reason`` through as is (``abort`` and ``repetition`` then fail
    the openai SDK's validation) instead of mapping it to ``"stop"``."""
    reasoning_content: bool = False
    """Chat: also expose the message's ``reasoning`` as ``reasoning_content`` (LiteLLM-style)."""
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
    """Stream converters: bound on one buffered generate event."""
    max_choices: int = DEFAULT_MAX_CHOICES
    """Chat stream converter: bound on distinct choice indices."""
    limits: Limits = DEFAULT_LIMITS
    """Bytes paths: the bounds on a worker's body (``max_body_bytes``, ``max_depth``)."""
    vllm_version: str | None = None
    """The vLLM release the workers run (``"0.32.0"``), when known: where releases write a
    client API's envelope differently, it is written as that release's coupled route writes it
    (``docs/envelopes.md``, "vLLM releases"); ``None``: as vLLM 0.33 writes it."""

    def __post_init__(self) -> None:
        if self.vllm_version is not None:
            validate_vllm_version(self.vllm_version, "EnvelopeOptions.vllm_version")


DEFAULT_OPTIONS: Final = EnvelopeOptions()


def envelope_model(options: EnvelopeOptions, worker_model: object, client_body: object) -> str:
    """The envelope's ``model``: the router's option, else the worker's, else the client's.

    The router's option wins because it is the one place the router states what its clients
    see (an alias, a served name); the worker's comes before the client's because it names
    what answered.

    Raises:
        UpstreamContractError: none of the three names a model.
    """
    if options.model:
        return options.model
    if isinstance(worker_model, str) and worker_model:
        return worker_model  # the common case
    client_model = client_body.get(w.MODEL) if isinstance(client_body, Mapping) else None
    if isinstance(client_model, str) and client_model:
        return client_model
    msg = "$.model: neither the options, the worker nor the client body names a model"
    raise UpstreamContractError(msg, param="$.model")


def envelope_created(options: EnvelopeOptions, given: object) -> int:
    """``created``: the given value (the caller's, or the worker's), else ``options.clock()``."""
    if isinstance(given, int) and not isinstance(given, bool):
        return given
    return int(options.clock())


def writes_like_032(options: EnvelopeOptions) -> bool:
    """Whether the envelopes imitate vLLM 0.32 (a release before 0.33: no ``derender`` yet)."""
    version = options.vllm_version
    return version is not None and not vllm_honours(OutputMode.DERENDER, version)


def client_mapping(client_body: object) -> Mapping[str, Any]:
    """The client's body as a mapping; anything else reads as an empty body."""
    return client_body if isinstance(client_body, Mapping) else {}

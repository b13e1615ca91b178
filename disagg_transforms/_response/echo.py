"""The ``output_mode`` echo check (``docs/responses.md``).

Every vLLM generate response and stream chunk echoes the ``output_mode`` it was asked for. A
worker older than the field ignores it and answers token IDs only, which leaves a chat client
with no text; so a missing echo (read as ``"tokens"``) or a different one is a contract breach.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Final

from msgspec import UNSET

from disagg_transforms._config import MIN_VLLM_VERSION, OutputMode
from disagg_transforms._routes import Route
from disagg_transforms._wire import keys as w
from disagg_transforms._wire.describe import describe
from disagg_transforms._wire.limits import check_response_depth
from disagg_transforms.errors import ConfigError, UpstreamContractError

__all__ = ("check_output_mode_echo",)

_PARAM = f"$.{w.OUTPUT_MODE}"
# An enum member costs several times a global's lookup (Python 3.11): the per-call path reads this.
_AUTO: Final = OutputMode.AUTO


def as_output_mode(requested: object) -> OutputMode:
    """``requested`` as an :class:`OutputMode`; a router may pass the wire string instead."""
    if type(requested) is OutputMode and requested is not _AUTO:
        return requested  # the common case, two comparisons
    mode = requested
    if isinstance(requested, str) and not isinstance(requested, OutputMode):
        with contextlib.suppress(ValueError):
            mode = OutputMode(requested)
    if mode is OutputMode.AUTO:
        msg = (
            'requested output_mode: "auto" is a decode step\'s setting, not a mode a leg asks '
            "for; pass the leg's output_mode (the mode chosen for the request)"
        )
        raise ConfigError(msg, param=w.OUTPUT_MODE)
    if isinstance(mode, OutputMode):
        return mode
    msg = (
        f"requested output_mode: expected one of tokens, text, derender, got {describe(requested)}"
    )
    raise ConfigError(msg, param=w.OUTPUT_MODE)


def check_echoed_mode(
    echoed: object, requested: OutputMode, *, where: str = "response", generate: bool = True
) -> None:
    """Check one echoed ``output_mode`` (``UNSET``: the key was absent) against ``requested``.

    Shared by :func:`check_output_mode_echo` and the stream converters, which read the echo
    through their own narrow views. ``generate`` is false when the body does not even look
    like a generate answer (see :func:`looks_generate`). The message tells the three causes
    apart, each fixed elsewhere (see ``docs/responses.md``).
    """
    mode = as_output_mode(requested)
    # OutputMode is a str enum: the echoed string compares equal to the member itself.
    if (mode is OutputMode.TOKENS) if echoed is UNSET else (echoed == mode):
        return
    needs = _needs(mode)
    if echoed is UNSET and not generate:
        msg = (
            f'$: requested "{mode.value}", the worker\'s {where} is not a generate {where} at '
            "all (no choices, or another API's envelope): check that the leg is sent to "
            f"{Route.GENERATE.value}{needs}"
        )
        raise UpstreamContractError(msg, param="$")
    if echoed is UNSET:
        msg = (
            f'{_PARAM}: requested "{mode.value}", the worker\'s {where} carries no output_mode '
            '(read as "tokens"): the worker predates output_mode and answers token IDs only; '
            f"upgrade it{needs}"
        )
        raise UpstreamContractError(msg, param=_PARAM)
    msg = (
        f'{_PARAM}: requested "{mode.value}", the worker answered {describe(echoed)}: a '
        "configuration mismatch (the leg's body and the mode the router reads the answer with "
        f"disagree, or something between them rewrites output_mode){needs}"
    )
    raise UpstreamContractError(msg, param=_PARAM)


def _needs(mode: OutputMode) -> str:
    version = MIN_VLLM_VERSION.get(mode)
    return "" if version is None else f' ("{mode.value}" needs vLLM >= {version})'


def looks_generate(response: Mapping[str, Any]) -> bool:
    """A generate answer has choices and, unlike every client API's envelope, no ``object``."""
    return w.CHOICES in response and w.OBJECT not in response


def check_output_mode_echo(response: Mapping[str, Any], requested: OutputMode) -> None:
    """Check that a generate response or stream chunk echoes the requested ``output_mode``.

    Args:
        response: A decoded generate response or stream chunk.
        requested: The mode the leg asked for.

    Raises:
        UpstreamContractError: ``response`` is not an object, or its ``output_mode`` is missing
            (read as ``"tokens"``, what an older worker answers) or differs from ``requested``;
            the message tells apart a body that is no generate response at all, a worker that
            predates the field (with the vLLM version the mode needs) and a worker that
            answered another mode (a configuration mismatch); or it nests deeper
            than the default ``Limits.max_depth``.
        ConfigError: ``requested`` is not an output mode.
    """
    untyped: object = response  # a worker's answer may be any JSON value
    if not isinstance(untyped, Mapping):
        msg = f"$: a generate response must be a JSON object, got {describe(untyped)}"
        raise UpstreamContractError(msg, param="$")
    check_echoed_mode(
        untyped.get(w.OUTPUT_MODE, UNSET), requested, generate=looks_generate(untyped)
    )
    check_response_depth(untyped)

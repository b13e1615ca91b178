"""Pipeline checks that need the exchange's view of the flow (used by ``check-config``)."""

from __future__ import annotations

from collections.abc import Mapping

from disagg_transforms._config import DecodeParams, Step, StepParams

__all__ = ("pipeline_warnings",)

_UNWRAPPED = (
    "decode.use_openai_format: false with decode.wrap_chat_completion: false: a chat client "
    "gets the generate envelope, not a chat.completion; set decode.wrap_chat_completion: true"
)


def pipeline_warnings(config: Mapping[Step, StepParams]) -> list[str]:
    """One line per setting that works but answers some client oddly.

    A decode step on the generate route with ``wrap_chat_completion: false`` hands a chat
    client the generate envelope (less its internal keys) instead of a ``chat.completion``.
    """
    decode = config.get(Step.DECODE)
    if (
        isinstance(decode, DecodeParams)
        and not decode.use_openai_format
        and not decode.wrap_chat_completion
    ):
        return [_UNWRAPPED]
    return []

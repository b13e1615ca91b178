"""Pipeline checks that need the exchange's view of the flow (used by ``check-config``)."""

from __future__ import annotations

from collections.abc import Mapping

from disagg_transforms._config import DecodeParams, OutputMode, Step, StepParams

__all__ = ("pipeline_warnings",)

_UNWRAPPED = (
    "decode.use_openai_format: false with decode.wrap_chat_completion: false: a chat client "
    "gets the generate envelope, not a chat.completion; set decode.wrap_chat_completion: true"
)
_REFUSES_TOOLS = (
    "decode.output_mode: text: every client that asks for tools (chat, Responses, Messages) gets "
    "a 400, since a text answer carries no tool calls; set decode.output_mode: auto"
)


def pipeline_warnings(config: Mapping[Step, StepParams]) -> list[str]:
    """One line per setting that works but answers some client oddly.

    A decode step on the generate route with ``wrap_chat_completion: false`` hands a chat
    client the generate envelope (less its internal keys) instead of a ``chat.completion``; one
    with ``output_mode: text`` refuses every client that asks for tools
    (docs/routes-and-config.md, "Output mode auto, and tools").
    """
    decode = config.get(Step.DECODE)
    if not isinstance(decode, DecodeParams) or decode.use_openai_format:
        return []
    warnings = [] if decode.wrap_chat_completion else [_UNWRAPPED]
    if decode.output_mode is OutputMode.TEXT:
        warnings.append(_REFUSES_TOOLS)
    return warnings

"""Pipeline checks that need the exchange's view of the flow (used by ``check-config``)."""

from __future__ import annotations

from collections.abc import Mapping

from disagg_transforms._config import (
    MIN_VLLM_VERSION,
    DecodeParams,
    OutputMode,
    Step,
    StepParams,
    validate_vllm_version,
    vllm_honours,
)
from disagg_transforms.errors import ConfigError

__all__ = ("pipeline_warnings", "version_errors")

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


def version_errors(config: Mapping[Step, StepParams], vllm_version: str) -> list[ConfigError]:
    """The steps that ask the workers' vLLM for a mode it does not have, one error each.

    A decode step on the generate route whose ``output_mode`` needs a newer vLLM than
    ``vllm_version`` (``derender`` on 0.32) would be refused by the worker on every request
    with tools, after any prefill; ``auto`` serves every supported release
    (``docs/routes-and-config.md``, "vLLM versions").

    Raises:
        ConfigError: ``vllm_version`` is not a vLLM release.
    """
    version = validate_vllm_version(vllm_version)
    decode = config.get(Step.DECODE)
    if not isinstance(decode, DecodeParams) or decode.use_openai_format:
        return []
    mode = decode.output_mode
    if vllm_honours(mode, version):
        return []
    hint = (
        "; use output_mode: auto (a request with tools is then decoded on the client's own route)"
        if vllm_honours(OutputMode.AUTO, version)
        else ""
    )
    msg = (
        f'decode.output_mode: "{mode.value}" needs vLLM >= {MIN_VLLM_VERSION[mode]}, and the '
        f"workers run vLLM {version}{hint}"
    )
    return [ConfigError(msg, param="decode.output_mode")]

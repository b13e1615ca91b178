"""What an Anthropic Messages body contributes to a generate leg (``/v1/messages``).

vLLM 0.33 serves ``/v1/messages`` by converting the body to a chat request first
(``AnthropicServingMessages._convert_anthropic_to_openai_request``); this mapper applies the
same conversion to the fields that reach ``sampling_params`` and ``parse_context``. The full
table is in ``docs/request-legs.md``. The cap (``max_tokens``) is moved by
:func:`~disagg_transforms.apply_sampling_caps`; this mapper only insists that it is there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from disagg_transforms._request import fields as f
from disagg_transforms._request.caps import CAP_VIEW, MIN_TOKENS_VIEW, viewed_caps
from disagg_transforms._request.mapping import ClientMapping
from disagg_transforms._wire import keys as w
from disagg_transforms._wire.validate import (
    CONVERT_ERRORS,
    OBJECT,
    STRINGS,
    client_object,
    obj,
    refuse,
    typed,
)

_SAMPLING = (w.TEMPERATURE, w.TOP_P, w.TOP_K)
_CONTEXT_KEYS = (w.TOOLS, w.TOOL_CHOICE, w.CHAT_TEMPLATE_KWARGS)
_MAPPED = frozenset({*_SAMPLING, *_CONTEXT_KEYS, w.MAX_TOKENS, w.STOP_SEQUENCES, w.OUTPUT_CONFIG})
# vLLM turns output_config.format into a json_schema response_format: that is all it takes.
_FORMATS = f.OutputFormats((w.JSON_SCHEMA,))
_TOOL_CHOICE_PATH = f"$.{w.TOOL_CHOICE}"
# Anthropic tool_choice type -> chat tool_choice (vLLM's `_convert_tool_choice`).
_TOOL_CHOICES = {
    w.TOOL_CHOICE_AUTO: w.TOOL_CHOICE_AUTO,
    w.TOOL_CHOICE_ANY: w.TOOL_CHOICE_REQUIRED,
    w.TOOL_CHOICE_NONE: w.TOOL_CHOICE_NONE,
}


def map_messages_request(body: Mapping[str, Any], /, *, generate_leg: bool = True) -> ClientMapping:
    """Map an Anthropic Messages body's sampling and tool fields for a generate leg.

    Raises:
        RequestError: ``max_tokens`` is missing (the Messages API requires it), a field has the
            wrong type, or a tool is a server tool that only Anthropic can run.
    """
    body = client_object(body)
    if body.get(w.MAX_TOKENS) is None:
        why = "required by the Messages API (an integer)"
        raise refuse(body.get(w.MAX_TOKENS), why, at=f"$.{w.MAX_TOKENS}")
    sampling = f.copy_sampling(body, _SAMPLING)
    stop = typed(body, w.STOP_SEQUENCES, STRINGS)
    if stop is not None:
        sampling[w.STOP] = stop
    kwargs = dict(obj(body, w.CHAT_TEMPLATE_KWARGS) or {})
    config = obj(body, w.OUTPUT_CONFIG)
    if config is not None:
        # vLLM turns `format` into a json_schema response_format and `effort` into the chat
        # request's reasoning_effort, which reaches the template (and parsers) as a template kwarg.
        path = f"$.{w.OUTPUT_CONFIG}"
        fmt = obj(config, w.FORMAT, path)
        f.structured_outputs(
            sampling, given=None, fmt=fmt, path=f"{path}.{w.FORMAT}", formats=_FORMATS
        )
        effort = typed(config, w.EFFORT, str, path)
        if effort is not None:
            kwargs.setdefault(w.REASONING_EFFORT, effort)
    context = _parse_context(body, kwargs) if generate_leg else None
    return f.client_mapping(
        body, sampling, mapped=_MAPPED, context_keys=_CONTEXT_KEYS, parse_context=context
    )


_MessagesSampling = f.sampling_view("_MessagesSampling", _SAMPLING)
# What a Messages generate leg reads of the body before its tools besides its sampling fields,
# each typed as its reader checks it (`output_config` null only; the cap in range): a body that
# converts to both with a cap passes those checks and the caps' (docs/performance.md, "Typed
# views of the client's body").
_MessagesView = msgspec.defstruct(
    "_MessagesView",
    [
        (w.STOP_SEQUENCES, STRINGS | None, None),
        (w.CHAT_TEMPLATE_KWARGS, OBJECT | None, None),
        (w.OUTPUT_CONFIG, None, None),
        (w.VLLM_XARGS, OBJECT | None, None),
        (w.MAX_TOKENS, CAP_VIEW, None),
        (w.MIN_TOKENS, MIN_TOKENS_VIEW, None),
    ],
    kw_only=True,
)


def read_messages_view(body: Mapping[str, Any]) -> tuple[ClientMapping, dict[str, Any]] | None:
    """A Messages body's mapping and caps for a generate leg, read through its view.

    What :func:`map_messages_request` and the caps give the common body (a cap, no
    ``output_config``), its tools converted by the mapper's own rules; ``None`` for any other
    body, which the mapper and the caps read (and refuse where they do).
    """
    try:
        view: Any = msgspec.convert(body, _MessagesView)
    except CONVERT_ERRORS:
        return None
    caps = viewed_caps(view.max_tokens, view.min_tokens)
    sampling = f.viewed_sampling(body, _MessagesSampling)
    if sampling is None or view.max_tokens is None or caps is None:
        return None  # the mapper's or the caps' refusal
    if view.stop_sequences is not None:
        sampling[w.STOP] = view.stop_sequences
    context = _parse_context(body, dict(view.chat_template_kwargs or {}))
    mapping = f.client_mapping(
        body, sampling, mapped=_MAPPED, context_keys=_CONTEXT_KEYS, parse_context=context
    )
    return mapping, caps


def _parse_context(body: Mapping[str, Any], kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    tool_choice, parallel = _tool_choice(body)
    return f.parse_context(
        tools=f.chat_tools(body, _chat_tool),
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        chat_template_kwargs=kwargs,
    )


def _chat_tool(path: str, tool: Mapping[str, Any]) -> dict[str, Any]:
    kind = tool.get(w.TYPE)
    if kind not in (None, w.CUSTOM):
        why = "expected a custom tool: server tools run on Anthropic's side"
        raise refuse(kind, why, at=f"{path}.{w.TYPE}")
    schema = obj(tool, w.INPUT_SCHEMA, path)
    if schema is None:
        raise refuse(None, "expected a JSON schema object", at=f"{path}.{w.INPUT_SCHEMA}")
    if w.TYPE not in schema:
        # vLLM fills in the schema's type the same way.
        schema = {**schema, w.TYPE: "object"}
    return f.chat_function_tool(
        path,
        tool.get(w.NAME),
        tool.get(w.DESCRIPTION),
        schema,
        (w.DEFER_LOADING, tool.get(w.DEFER_LOADING)),
    )


def _tool_choice(body: Mapping[str, Any]) -> tuple[object, bool | None]:
    choice = obj(body, w.TOOL_CHOICE)
    if choice is None:
        return None, None
    disable = typed(choice, w.DISABLE_PARALLEL_TOOL_USE, bool, _TOOL_CHOICE_PATH)
    parallel = None if disable is None else not disable
    kind = choice.get(w.TYPE)
    if kind == w.TOOL_CHOICE_TOOL:
        return f.named_tool_choice(choice.get(w.NAME), _TOOL_CHOICE_PATH), parallel
    if isinstance(kind, str) and kind in _TOOL_CHOICES:
        return _TOOL_CHOICES[kind], parallel
    raise refuse(
        kind, 'expected "auto", "any", "tool" or "none"', at=f"{_TOOL_CHOICE_PATH}.{w.TYPE}"
    )

"""What an OpenAI Responses API body contributes to a generate leg (``/v1/responses``).

Follows vLLM 0.33's ``ResponsesRequest.to_sampling_params`` without its server defaults; the
full table is in ``docs/request-legs.md``. The cap (``max_output_tokens``) is
:func:`~disagg_transforms.apply_sampling_caps`' job; the keys of
:data:`disagg_transforms._request.fields.LEG_KEYS` are the leg builder's.
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

_SAMPLING = (
    w.TEMPERATURE,
    w.TOP_P,
    w.TOP_K,
    w.REPETITION_PENALTY,
    w.SEED,
    w.STOP,
    w.IGNORE_EOS,
    w.LOGIT_BIAS,
    w.SKIP_SPECIAL_TOKENS,
    w.INCLUDE_STOP_STR_IN_OUTPUT,
)
"""The ``SamplingParams`` fields vLLM's ``ResponsesRequest.to_sampling_params`` reads."""
_CONTEXT_KEYS = (w.TOOLS, w.TOOL_CHOICE, w.PARALLEL_TOOL_CALLS, w.REASONING)
# Refused when set to anything but null (or false): a stateless router cannot serve them.
_REFUSED_WHEN_SET = {
    w.PREVIOUS_RESPONSE_ID: "a stateless router keeps no stored responses; send the history "
    "in `input`",
    w.CONVERSATION: "a stateless router keeps no conversations; send the history in `input`",
    w.BACKGROUND: "background responses need a response store; send the request in the foreground",
    w.PROMPT: "prompt templates are not supported (vLLM refuses them too)",
    w.ENABLE_RESPONSE_MESSAGES: "the generate route does not return the raw messages",
}
_MAPPED = frozenset(
    {
        *_SAMPLING,
        *_CONTEXT_KEYS,
        *_REFUSED_WHEN_SET,
        w.MAX_OUTPUT_TOKENS,
        w.INCLUDE,
        w.TOP_LOGPROBS,
        w.TEXT,
        w.STRUCTURED_OUTPUTS,
    }
)
_FORMATS = f.OutputFormats((w.TEXT, w.JSON_OBJECT, w.JSON_SCHEMA))
_TOOL_CHOICE_PATH = f"$.{w.TOOL_CHOICE}"
_TOOL_CHOICE_OPTIONS = frozenset({w.TOOL_CHOICE_AUTO, w.TOOL_CHOICE_NONE, w.TOOL_CHOICE_REQUIRED})


def map_responses_request(
    body: Mapping[str, Any], /, *, generate_leg: bool = True
) -> ClientMapping:
    """Map a Responses API body's sampling and tool fields for a generate leg.

    Raises:
        RequestError: a field has the wrong type, or asks for what a stateless generate leg
            cannot serve (``previous_response_id``, ``conversation``, ``background: true``,
            ``prompt``, non-function tools, ...).
    """
    body = client_object(body)
    if generate_leg:
        f.refuse_when_set(body, _REFUSED_WHEN_SET)
    sampling = f.copy_sampling(body, _SAMPLING)
    include = typed(body, w.INCLUDE, STRINGS) or []
    # vLLM returns output logprobs only when `include` asks for them.
    f.logprobs(
        body,
        sampling,
        wanted=w.INCLUDE_OUTPUT_LOGPROBS in include,
        needs=f"`include` to contain {w.INCLUDE_OUTPUT_LOGPROBS}",
    )
    text = obj(body, w.TEXT)
    f.structured_outputs(
        sampling,
        given=obj(body, w.STRUCTURED_OUTPUTS),
        fmt=None if text is None else obj(text, w.FORMAT, f"$.{w.TEXT}"),
        path=f"$.{w.TEXT}.{w.FORMAT}",
        formats=_FORMATS,
    )
    reasoning = obj(body, w.REASONING)
    effort = None if reasoning is None else typed(reasoning, w.EFFORT, str, f"$.{w.REASONING}")
    context = (
        f.parse_context(
            tools=f.chat_tools(body, _chat_tool),
            tool_choice=_tool_choice(body),
            parallel_tool_calls=typed(body, w.PARALLEL_TOOL_CALLS, bool),
            chat_template_kwargs=None if effort is None else {w.REASONING_EFFORT: effort},
        )
        if generate_leg
        else None
    )
    return f.client_mapping(
        body, sampling, mapped=_MAPPED, context_keys=_CONTEXT_KEYS, parse_context=context
    )


_ResponsesSampling = f.sampling_view("_ResponsesSampling", _SAMPLING)
# What a Responses generate leg reads of the body besides its sampling fields, each field typed
# as its reader checks it (the refused keys and `structured_outputs` null only; the cap in
# range): a body that converts to both passes every check of map_responses_request before its
# tools, and of its caps (docs/performance.md, "Typed views of the client's body").
_ResponsesView = msgspec.defstruct(
    "_ResponsesView",
    [
        *((key, None, None) for key in _REFUSED_WHEN_SET),
        (w.STRUCTURED_OUTPUTS, None, None),
        (w.INCLUDE, STRINGS | None, None),
        (w.TOP_LOGPROBS, f.TOP_LOGPROBS_VIEW, None),
        (w.TEXT, OBJECT | None, None),
        (w.REASONING, OBJECT | None, None),
        (w.PARALLEL_TOOL_CALLS, bool | None, None),
        (w.VLLM_XARGS, OBJECT | None, None),
        (w.MAX_OUTPUT_TOKENS, CAP_VIEW, None),
        (w.MIN_TOKENS, MIN_TOKENS_VIEW, None),
    ],
    kw_only=True,
)


def read_responses_view(body: Mapping[str, Any]) -> tuple[ClientMapping, dict[str, Any]] | None:
    """A Responses body's mapping and caps for a generate leg, read through its view.

    What :func:`map_responses_request` and the caps give the common body (a text or no format,
    a string or no reasoning effort), its tools converted by the mapper's own rules; ``None``
    for any other body, which the mapper and the caps read (and refuse where they do).
    """
    try:
        view: Any = msgspec.convert(body, _ResponsesView)
    except CONVERT_ERRORS:
        return None
    top, text, reasoning = view.top_logprobs, view.text, view.reasoning
    wanted = w.INCLUDE_OUTPUT_LOGPROBS in (view.include or ())
    fmt = None if text is None else text.get(w.FORMAT)
    effort = None if reasoning is None else reasoning.get(w.EFFORT)
    caps = viewed_caps(view.max_output_tokens, view.min_tokens)
    sampling = f.viewed_sampling(body, _ResponsesSampling)
    if (
        sampling is None
        or caps is None
        or (top and not wanted)
        or (fmt is not None and (type(fmt) is not dict or fmt.get(w.TYPE) != w.TEXT))
        or (effort is not None and type(effort) is not str)
    ):
        return None  # the mapper's or the caps' rules (a format, a refusal) apply
    if wanted:
        sampling[w.LOGPROBS] = 0 if top is None else top
    context = f.parse_context(
        tools=f.chat_tools(body, _chat_tool),
        tool_choice=_tool_choice(body),
        parallel_tool_calls=view.parallel_tool_calls,
        chat_template_kwargs=None if effort is None else {w.REASONING_EFFORT: effort},
    )
    mapping = f.client_mapping(
        body, sampling, mapped=_MAPPED, context_keys=_CONTEXT_KEYS, parse_context=context
    )
    return mapping, caps


def _chat_tool(path: str, tool: Mapping[str, Any]) -> dict[str, Any]:
    if tool.get(w.TYPE) != w.FUNCTION:
        why = 'expected "function": built-in tools run on the provider, not on a generate leg'
        raise refuse(tool.get(w.TYPE), why, at=f"{path}.{w.TYPE}")
    return f.chat_function_tool(
        path,
        tool.get(w.NAME),
        tool.get(w.DESCRIPTION),
        tool.get(w.PARAMETERS),
        (w.STRICT, tool.get(w.STRICT)),
    )


def _tool_choice(body: Mapping[str, Any]) -> object:
    choice = body.get(w.TOOL_CHOICE)
    if choice is None or (isinstance(choice, str) and choice in _TOOL_CHOICE_OPTIONS):
        return choice
    if isinstance(choice, Mapping) and choice.get(w.TYPE) == w.FUNCTION:
        return f.named_tool_choice(choice.get(w.NAME), _TOOL_CHOICE_PATH)
    if isinstance(choice, Mapping):
        raise refuse(
            choice.get(w.TYPE),
            'expected "function" for a named choice',
            at=f"{_TOOL_CHOICE_PATH}.{w.TYPE}",
        )
    raise refuse(
        choice, 'expected "auto", "none", "required" or a function choice', at=_TOOL_CHOICE_PATH
    )

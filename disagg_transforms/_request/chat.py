"""What a chat-completions body contributes to a generate leg (``/v1/chat/completions``).

The rules are vLLM 0.33's own ``to_sampling_params`` minus the server defaults: a field the client
did not set (or set to null) is not written, so the worker applies its own defaults exactly as it
would have on the client's route. The output cap and ``min_tokens`` are not mapped here
(:func:`~disagg_transforms.apply_sampling_caps` moves them), nor are the keys the leg builder
carries itself (:data:`disagg_transforms._request.fields.LEG_KEYS`).
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
    STRING_OR_OBJECT,
    client_object,
    obj,
    typed,
)

_CONTEXT_KEYS = (
    w.TOOLS,
    w.TOOL_CHOICE,
    w.PARALLEL_TOOL_CALLS,
    w.CHAT_TEMPLATE_KWARGS,
    w.INCLUDE_REASONING,
)
"""Chat keys that become ``parse_context`` (a derender worker's parser inputs)."""

# Keys that only say something when set to a true value the generate route cannot honour: an
# explicit false / null is the default and is dropped quietly.
_REFUSED_WHEN_SET: Mapping[str, str] = {
    w.ECHO: "the generate route cannot echo the prompt back",
    w.USE_BEAM_SEARCH: "the generate route has no beam search",
    w.LENGTH_PENALTY: "the generate route has no beam search",
}
_FORMATS = f.OutputFormats(
    (w.TEXT, w.JSON_OBJECT, w.JSON_SCHEMA, w.STRUCTURAL_TAG), schema_in=w.JSON_SCHEMA
)

_CHAT_MAPPED = frozenset(
    {
        *f.SAMPLING_FIELDS,
        *_CONTEXT_KEYS,
        w.MAX_COMPLETION_TOKENS,
        w.MAX_TOKENS,
        w.LOGPROBS,
        w.TOP_LOGPROBS,
        w.RESPONSE_FORMAT,
        w.STRUCTURED_OUTPUTS,
    }
)


def chat_family_sampling(body: Mapping[str, Any], *, generate_leg: bool) -> dict[str, Any]:
    """The ``sampling_params`` fields chat and completions share (they differ in logprobs)."""
    if generate_leg:
        f.refuse_when_set(body, _REFUSED_WHEN_SET)
    sampling = f.copy_sampling(body, f.SAMPLING_KEYS)
    f.structured_outputs(
        sampling,
        given=obj(body, w.STRUCTURED_OUTPUTS),
        fmt=obj(body, w.RESPONSE_FORMAT),
        path=f"$.{w.RESPONSE_FORMAT}",
        formats=_FORMATS,
    )
    return sampling


def map_chat_request(body: Mapping[str, Any], /, *, generate_leg: bool = True) -> ClientMapping:
    """Map a chat-completions body's sampling fields and tools (see ``docs/request-legs.md``)."""
    body = client_object(body)
    sampling = chat_family_sampling(body, generate_leg=generate_leg)
    wanted = typed(body, w.LOGPROBS, bool) is True
    f.logprobs(body, sampling, wanted=wanted, needs="logprobs set to true")
    context = f.parse_context(
        tools=f.chat_tools(body),
        tool_choice=typed(body, w.TOOL_CHOICE, STRING_OR_OBJECT),
        parallel_tool_calls=typed(body, w.PARALLEL_TOOL_CALLS, bool),
        chat_template_kwargs=obj(body, w.CHAT_TEMPLATE_KWARGS),
        include_reasoning=typed(body, w.INCLUDE_REASONING, bool),
    )
    return f.client_mapping(
        body, sampling, mapped=_CHAT_MAPPED, context_keys=_CONTEXT_KEYS, parse_context=context
    )


_ChatSampling = f.sampling_view("_ChatSampling", f.SAMPLING_KEYS)
# What a chat generate leg reads of the body besides its sampling fields (_ChatSampling), each
# field typed as its reader checks it (the refused keys null only; both caps in range; absent
# and null both None, as the readers take them): a body that converts to both passes every check
# of map_chat_request and of its caps (docs/performance.md, "Typed views of the client's body").
_ChatView = msgspec.defstruct(
    "_ChatView",
    [
        *((key, None, None) for key in _REFUSED_WHEN_SET),
        (w.RESPONSE_FORMAT, OBJECT | None, None),
        (w.STRUCTURED_OUTPUTS, OBJECT | None, None),
        (w.LOGPROBS, bool | None, None),
        (w.TOP_LOGPROBS, f.TOP_LOGPROBS_VIEW, None),
        (w.TOOLS, list[dict[str, Any]] | None, None),
        (w.TOOL_CHOICE, STRING_OR_OBJECT | None, None),
        (w.PARALLEL_TOOL_CALLS, bool | None, None),
        (w.CHAT_TEMPLATE_KWARGS, OBJECT | None, None),
        (w.INCLUDE_REASONING, bool | None, None),
        (w.VLLM_XARGS, OBJECT | None, None),
        (w.MAX_COMPLETION_TOKENS, CAP_VIEW, None),
        (w.MAX_TOKENS, CAP_VIEW, None),
        (w.MIN_TOKENS, MIN_TOKENS_VIEW, None),
    ],
    kw_only=True,
)


def read_chat_view(body: Mapping[str, Any]) -> tuple[ClientMapping, dict[str, Any]] | None:
    """A chat body's mapping and caps for a generate leg, read through the chat view.

    What :func:`map_chat_request` and the caps give the common body (a text or no
    ``response_format``, no ``structured_outputs``), built from two converts; ``None`` for any
    other body, which the mapper and the caps read (and refuse where they do).
    """
    try:
        view: Any = msgspec.convert(body, _ChatView)
    except CONVERT_ERRORS:
        return None
    fmt, top, wanted = view.response_format, view.top_logprobs, view.logprobs is True
    caps = viewed_caps(view.max_completion_tokens or view.max_tokens, view.min_tokens)
    sampling = f.viewed_sampling(body, _ChatSampling)
    if (
        sampling is None
        or caps is None
        or view.structured_outputs is not None
        or (fmt is not None and fmt.get(w.TYPE) != w.TEXT)
        or (not wanted and (top or w.LOGPROB_TOKEN_IDS in sampling))
    ):
        return None  # the mapper's or the caps' rules (a format, a refusal) apply
    if wanted and w.LOGPROB_TOKEN_IDS not in sampling:
        sampling[w.LOGPROBS] = 0 if top is None else top
    tools = view.tools
    context = f.parse_context(
        tools=None if tools is None else list(body[w.TOOLS]),
        tool_choice=body.get(w.TOOL_CHOICE),
        parallel_tool_calls=view.parallel_tool_calls,
        chat_template_kwargs=view.chat_template_kwargs,
        include_reasoning=view.include_reasoning,
    )
    mapping = f.client_mapping(
        body, sampling, mapped=_CHAT_MAPPED, context_keys=_CONTEXT_KEYS, parse_context=context
    )
    return mapping, caps

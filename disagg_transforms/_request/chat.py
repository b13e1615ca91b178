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

from disagg_transforms._request import fields as f
from disagg_transforms._request.mapping import ClientMapping
from disagg_transforms._wire import keys as w
from disagg_transforms._wire.validate import STRING_OR_OBJECT, client_object, obj, typed

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

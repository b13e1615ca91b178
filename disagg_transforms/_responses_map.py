"""What an OpenAI Responses API body contributes to a generate leg (``/v1/responses``).

Follows vLLM 0.33's ``ResponsesRequest.to_sampling_params`` without its server defaults; the
full table is in ``docs/envelopes.md``. The cap (``max_output_tokens``) is
:func:`disagg_transforms.caps.apply_sampling_caps`' job; ``model``, ``stream``,
``stream_options``, ``request_id``, ``cache_salt``, ``priority`` and the transfer params are the
leg builder's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from disagg_transforms import _map_fields as f
from disagg_transforms import _wire as w
from disagg_transforms._client_map import ClientMapping

_LEG_KEYS = f.LEG_KEYS | {w.MAX_OUTPUT_TOKENS}  # the cap is apply_sampling_caps' to move
_MAPPED = frozenset(
    {
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
        w.INCLUDE,
        w.TOP_LOGPROBS,
        w.TEXT,
        w.STRUCTURED_OUTPUTS,
        w.VLLM_XARGS,
        w.TOOLS,
        w.TOOL_CHOICE,
        w.PARALLEL_TOOL_CALLS,
        w.REASONING,
    }
)
# Refused when set to anything but null (or false): a stateless router cannot serve them.
_REFUSED_UNLESS_EMPTY = {
    w.PREVIOUS_RESPONSE_ID: "a stateless router keeps no stored responses; send the history "
    "in `input`",
    w.CONVERSATION: "a stateless router keeps no conversations; send the history in `input`",
    w.BACKGROUND: "background responses need a response store; send the request in the foreground",
    w.PROMPT: "prompt templates are not supported (vLLM refuses them too)",
    w.ENABLE_RESPONSE_MESSAGES: "the generate route does not return the raw messages",
}
_CONSUMED = _LEG_KEYS | _MAPPED | frozenset(_REFUSED_UNLESS_EMPTY)
_TOOL_CHOICE_OPTIONS = frozenset({w.TOOL_CHOICE_AUTO, w.TOOL_CHOICE_NONE, w.TOOL_CHOICE_REQUIRED})


def map_responses_request(body: Mapping[str, Any]) -> ClientMapping:
    """Map a Responses API body's sampling and tool fields for a generate leg.

    Raises:
        RequestError: a field has the wrong type, or asks for what a stateless generate leg
            cannot serve (``previous_response_id``, ``conversation``, ``background: true``,
            ``prompt``, non-function tools, ...).
    """
    body = f.client_object(body)
    for key, why in _REFUSED_UNLESS_EMPTY.items():
        value = body.get(key)
        if value is not None and value is not False:
            raise f.refuse(value, why, at=f"$.{key}")
    sampling: dict[str, Any] = {}
    f.copy_scalars(
        body,
        sampling,
        numbers=(w.TEMPERATURE, w.TOP_P, w.REPETITION_PENALTY),
        integers=(w.TOP_K, w.SEED),
        booleans=(w.IGNORE_EOS, w.SKIP_SPECIAL_TOKENS, w.INCLUDE_STOP_STR_IN_OUTPUT),
    )
    if stop := f.string_list(body, w.STOP):
        sampling[w.STOP] = stop
    for key, target in ((w.LOGIT_BIAS, w.LOGIT_BIAS), (w.VLLM_XARGS, w.EXTRA_ARGS)):
        if (value := f.obj(body, key)) is not None:
            sampling[target] = dict(value)
    _map_logprobs(body, sampling)
    _map_structured_outputs(body, sampling)
    reasoning = f.obj(body, w.REASONING)
    effort = None if reasoning is None else f.string(reasoning, w.EFFORT, "$.reasoning.effort")
    return ClientMapping(
        sampling_params=sampling,
        parse_context=f.parse_context(
            tools=_tools(body),
            tool_choice=_tool_choice(body),
            parallel_tool_calls=f.boolean(body, w.PARALLEL_TOOL_CALLS),
            chat_template_kwargs=None if effort is None else {w.REASONING_EFFORT: effort},
        ),
        dropped=f.leftover_keys(body, _CONSUMED),
    )


def _map_logprobs(body: Mapping[str, Any], sampling: dict[str, Any]) -> None:
    # vLLM returns output logprobs only when `include` asks for them; `top_logprobs` sets k
    # (vLLM's default is 0: the sampled token alone).
    include = f.array(body, w.INCLUDE) or []
    for index, item in enumerate(include):
        if not isinstance(item, str):
            raise f.refuse(item, "expected a string", at=f"$.include[{index}]")
    top_logprobs = f.integer(body, w.TOP_LOGPROBS)
    if w.INCLUDE_OUTPUT_LOGPROBS in include:
        sampling[w.LOGPROBS] = top_logprobs or 0


def _map_structured_outputs(body: Mapping[str, Any], sampling: dict[str, Any]) -> None:
    structured = f.obj(body, w.STRUCTURED_OUTPUTS)
    text = f.obj(body, w.TEXT)
    fmt = None if text is None else f.obj(text, w.FORMAT, "$.text.format")
    if structured is not None:
        if fmt is not None:
            raise f.refuse(
                fmt, "cannot be set together with `structured_outputs`", at="$.text.format"
            )
        sampling[w.STRUCTURED_OUTPUTS] = dict(structured)
        return
    if fmt is None:
        return
    kind = fmt.get(w.TYPE)
    if kind == w.JSON_SCHEMA:
        sampling[w.STRUCTURED_OUTPUTS] = f.json_schema_output(fmt, "$.text.format")
    elif kind == w.JSON_OBJECT:
        sampling[w.STRUCTURED_OUTPUTS] = {w.JSON_OBJECT: True}
    elif kind != w.TEXT:
        raise f.refuse(
            kind, 'expected "text", "json_schema" or "json_object"', at="$.text.format.type"
        )


def _tools(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    tools = f.tool_objects(body)
    if tools is None:
        return None
    converted = []
    for path, tool in tools:
        if tool.get(w.TYPE) != w.FUNCTION:
            raise f.refuse(
                tool.get(w.TYPE),
                'expected "function": built-in tools run on the provider, not on a generate leg',
                at=f"{path}.type",
            )
        converted.append(
            f.chat_function_tool(
                tool.get(w.NAME),
                path,
                description=tool.get(w.DESCRIPTION),
                parameters=tool.get(w.PARAMETERS),
                extra={w.STRICT: tool.get(w.STRICT)},
            )
        )
    return converted


def _tool_choice(body: Mapping[str, Any]) -> object:
    choice = body.get(w.TOOL_CHOICE)
    if choice is None or (isinstance(choice, str) and choice in _TOOL_CHOICE_OPTIONS):
        return choice
    if isinstance(choice, Mapping) and choice.get(w.TYPE) == w.FUNCTION:
        return f.named_tool_choice(choice.get(w.NAME), "$.tool_choice")
    if isinstance(choice, Mapping):
        raise f.refuse(
            choice.get(w.TYPE), 'expected "function" for a named choice', at="$.tool_choice.type"
        )
    raise f.refuse(
        choice, 'expected "auto", "none", "required" or a function choice', at="$.tool_choice"
    )

"""What an Anthropic Messages body contributes to a generate leg (``/v1/messages``).

vLLM 0.33 serves ``/v1/messages`` by converting the body to a chat request first
(``AnthropicServingMessages._convert_anthropic_to_openai_request``); this mapper applies the
same conversion to the fields that reach ``sampling_params`` and ``parse_context``. The full
table is in ``docs/envelopes.md``. The cap (``max_tokens``) is moved by
:func:`disagg_transforms.caps.apply_sampling_caps`; this mapper only insists that it is there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from disagg_transforms import _map_fields as f
from disagg_transforms import _wire as w
from disagg_transforms._client_map import ClientMapping

_LEG_KEYS = f.LEG_KEYS | {w.MAX_TOKENS}  # the cap is apply_sampling_caps' to move
_MAPPED = frozenset(
    {
        w.TEMPERATURE,
        w.TOP_P,
        w.TOP_K,
        w.STOP_SEQUENCES,
        w.TOOLS,
        w.TOOL_CHOICE,
        w.OUTPUT_CONFIG,
        w.CHAT_TEMPLATE_KWARGS,
    }
)
_CONSUMED = _LEG_KEYS | _MAPPED
# Anthropic tool_choice type -> chat tool_choice (vLLM's `_convert_tool_choice`).
_TOOL_CHOICES = {
    w.TOOL_CHOICE_AUTO: w.TOOL_CHOICE_AUTO,
    w.TOOL_CHOICE_ANY: w.TOOL_CHOICE_REQUIRED,
    w.TOOL_CHOICE_NONE: w.TOOL_CHOICE_NONE,
}


def map_messages_request(body: Mapping[str, Any]) -> ClientMapping:
    """Map an Anthropic Messages body's sampling and tool fields for a generate leg.

    Raises:
        RequestError: ``max_tokens`` is missing (the Messages API requires it), a field has the
            wrong type, or a tool is a server tool that only Anthropic can run.
    """
    body = f.client_object(body)
    if body.get(w.MAX_TOKENS) is None:
        raise f.refuse(
            body.get(w.MAX_TOKENS), "required by the Messages API (an integer)", at="$.max_tokens"
        )
    sampling: dict[str, Any] = {}
    f.copy_scalars(body, sampling, numbers=(w.TEMPERATURE, w.TOP_P), integers=(w.TOP_K,))
    if stop := f.string_list(body, w.STOP_SEQUENCES):
        sampling[w.STOP] = stop
    kwargs = dict(f.obj(body, w.CHAT_TEMPLATE_KWARGS) or {})
    output_config = f.obj(body, w.OUTPUT_CONFIG)
    if output_config is not None:
        _map_output_config(output_config, sampling, kwargs)
    tool_choice, parallel = _tool_choice(body)
    return ClientMapping(
        sampling_params=sampling,
        parse_context=f.parse_context(
            tools=_tools(body),
            tool_choice=tool_choice,
            parallel_tool_calls=parallel,
            chat_template_kwargs=kwargs,
        ),
        dropped=f.leftover_keys(body, _CONSUMED),
    )


def _map_output_config(
    config: Mapping[str, Any], sampling: dict[str, Any], kwargs: dict[str, Any]
) -> None:
    # vLLM turns `format` into a json_schema response_format and `effort` into the chat
    # request's reasoning_effort, which reaches the template (and parsers) as a template kwarg.
    fmt = f.obj(config, w.FORMAT, "$.output_config.format")
    if fmt is not None:
        if fmt.get(w.TYPE) != w.JSON_SCHEMA:
            raise f.refuse(
                fmt.get(w.TYPE), 'expected "json_schema"', at="$.output_config.format.type"
            )
        sampling[w.STRUCTURED_OUTPUTS] = f.json_schema_output(fmt, "$.output_config.format")
    effort = f.string(config, w.EFFORT, "$.output_config.effort")
    if effort is not None:
        kwargs.setdefault(w.REASONING_EFFORT, effort)


def _tools(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    tools = f.tool_objects(body)
    if tools is None:
        return None
    converted = []
    for path, tool in tools:
        kind = tool.get(w.TYPE)
        if kind not in (None, w.CUSTOM):
            raise f.refuse(
                kind,
                "expected a custom tool: server tools run on Anthropic's side",
                at=f"{path}.type",
            )
        schema = f.obj(tool, w.INPUT_SCHEMA, f"{path}.input_schema")
        if schema is None:
            raise f.refuse(None, "expected a JSON schema object", at=f"{path}.input_schema")
        if w.TYPE not in schema:
            # vLLM fills in the schema's type the same way.
            schema = {**schema, w.TYPE: "object"}
        converted.append(
            f.chat_function_tool(
                tool.get(w.NAME),
                path,
                description=tool.get(w.DESCRIPTION),
                parameters=schema,
                extra={w.DEFER_LOADING: tool.get(w.DEFER_LOADING)},
            )
        )
    return converted


def _tool_choice(body: Mapping[str, Any]) -> tuple[object, bool | None]:
    choice = f.obj(body, w.TOOL_CHOICE)
    if choice is None:
        return None, None
    disable = f.boolean(choice, w.DISABLE_PARALLEL_TOOL_USE)
    parallel = None if disable is None else not disable
    kind = choice.get(w.TYPE)
    if kind == w.TOOL_CHOICE_TOOL:
        return f.named_tool_choice(choice.get(w.NAME), "$.tool_choice"), parallel
    if isinstance(kind, str) and kind in _TOOL_CHOICES:
        return _TOOL_CHOICES[kind], parallel
    raise f.refuse(kind, 'expected "auto", "any", "tool" or "none"', at="$.tool_choice.type")

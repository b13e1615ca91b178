"""What every client mapper shares: one implementation of each mapping concept.

The sampling fields, structured outputs, logprobs, tools, the derender ``parse_context`` and the
``dropped`` list.

Each concept has one implementation here; a route's mapper (``map_chat_request``,
``map_completions_request``, ``map_responses_request``, ``map_messages_request``) only says which
of its client keys feed which concept. Values are read through the typed readers of
:mod:`disagg_transforms._wire.validate`, so every refusal is a
:class:`~disagg_transforms.errors.RequestError` naming the JSON path and the bad value.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping
from itertools import filterfalse
from typing import Annotated, Any, Final, NamedTuple, TypeAlias

import msgspec

from disagg_transforms._request.mapping import ClientMapping
from disagg_transforms._wire import keys as w
from disagg_transforms._wire.validate import (
    ARRAY,
    CONVERT_ERRORS,
    MAPPINGS,
    OBJECT,
    STRING_OR_STRINGS,
    STRINGS,
    integer,
    obj,
    refuse,
    typed,
)

TRANSFER_KEYS = (w.KV_TRANSFER_PARAMS, w.EC_TRANSFER_PARAMS)
"""The transfer params: the leg builder strips the client's copies or keeps them (trusted)."""
CARRIED_AS_IS = (w.MODEL, w.CACHE_SALT, w.PRIORITY, w.RETURN_TOKEN_IDS)
"""Client keys the leg builder carries onto a generate leg as sent, when set (not null)."""
LEG_KEYS = frozenset(
    {
        *CARRIED_AS_IS,
        *TRANSFER_KEYS,
        w.STREAM,
        w.STREAM_OPTIONS,
        w.REQUEST_ID,
        w.MIN_TOKENS,
    }
)
"""Client keys the leg builder carries itself (on every route): neither mapped nor dropped by a
mapper. The route's own cap is the mapper's to name (``apply_sampling_caps`` moves it); another
route's cap key is dropped."""

SAMPLING_FIELDS: Mapping[str, Any] = {
    w.N: int,
    w.PRESENCE_PENALTY: float,
    w.FREQUENCY_PENALTY: float,
    w.REPETITION_PENALTY: float,
    w.TEMPERATURE: float,
    w.TOP_P: float,
    w.TOP_K: int,
    w.MIN_P: float,
    w.SEED: int,
    w.STOP: STRING_OR_STRINGS,
    w.STOP_TOKEN_IDS: list[int],
    w.IGNORE_EOS: bool,
    w.SKIP_SPECIAL_TOKENS: bool,
    w.SPACES_BETWEEN_SPECIAL_TOKENS: bool,
    w.INCLUDE_STOP_STR_IN_OUTPUT: bool,
    w.LOGIT_BIAS: dict[str, float],
    w.BAD_WORDS: STRINGS,
    w.ALLOWED_TOKEN_IDS: list[int],
    w.THINKING_TOKEN_BUDGET: int,
    w.REPETITION_DETECTION: OBJECT,
    w.STREAM_INTERVAL: int,
    w.ROUTED_EXPERTS_PROMPT_START: int,
    w.WATERMARKING: bool,
    w.PROMPT_LOGPROBS: int,
    w.LOGPROB_TOKEN_IDS: list[int],
}
"""vLLM ``SamplingParams`` fields a client sends under the same name, with the type vLLM gives
them (checked, so a wrong type is refused at the client's own path)."""


SAMPLING_KEYS = tuple(SAMPLING_FIELDS)
"""The keys of :data:`SAMPLING_FIELDS`, in its order (chat and completions map them all)."""


@functools.cache
def _positions(keys: tuple[str, ...]) -> Mapping[str, int]:
    # One table per mapper's key tuple, built once: where each key comes in the result.
    return {key: index for index, key in enumerate(keys)}


def copy_sampling(body: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The set (non-null) ``SAMPLING_FIELDS`` among ``keys``, type-checked and as sent.

    The result (and the first refusal) follows the order of ``keys``.
    """
    # Most keys are absent: the present ones are found by one C-level set intersection, then
    # put in the order of `keys`, instead of a lookup per key (docs/performance.md).
    positions = _positions(keys)
    present = sorted(body.keys() & positions.keys(), key=positions.__getitem__)
    return {
        key: value
        for key in present
        if (value := typed(body, key, SAMPLING_FIELDS[key])) is not None
    }


TOP_LOGPROBS_VIEW: Any = Annotated[int, msgspec.Meta(ge=-1)] | None
"""A client view's type for a ``top_logprobs`` its reader takes as sent (-1 is all)."""

# A float field's reader returns an int as sent: its view keeps an int an int.
_AS_SENT: Mapping[Any, Any] = {float: int | float, dict[str, float]: dict[str, int | float]}


def sampling_view(name: str, keys: tuple[str, ...]) -> type[msgspec.Struct]:
    """A view of the ``SAMPLING_FIELDS`` of ``keys``, typed as their readers check them.

    A value converts when :func:`typed` takes it unchanged (an int of an ``int`` field, not a
    whole float, which the reader rewrites); null or absent is ``None``, left out of
    :func:`viewed_sampling`'s result.
    """
    fields = [
        (key, _AS_SENT.get(SAMPLING_FIELDS[key], SAMPLING_FIELDS[key]) | None, None) for key in keys
    ]
    return msgspec.defstruct(name, fields, kw_only=True, omit_defaults=True)


def viewed_sampling(body: Mapping[str, Any], view: type[msgspec.Struct]) -> dict[str, Any] | None:
    """What :func:`copy_sampling` gives a body whose fields convert to ``view``, else ``None``.

    One convert and one C-speed write-out of the set fields, in the view's (the keys') order.
    """
    try:
        sampling: dict[str, Any] = msgspec.to_builtins(msgspec.convert(body, view))
    except CONVERT_ERRORS:
        return None
    return sampling


def refuse_when_set(body: Mapping[str, Any], reasons: Mapping[str, str]) -> None:
    """Refuse each key of ``reasons`` set to anything but null or false (the harmless values)."""
    for key, why in reasons.items():
        value = body.get(key)
        if value is not None and value is not False:
            raise refuse(value, f"is refused: {why}", at=f"$.{key}")


def logprobs(
    body: Mapping[str, Any], sampling: dict[str, Any], *, wanted: bool, needs: str
) -> None:
    """``sampling_params.logprobs`` from the client's switch (``wanted``) and ``top_logprobs``.

    vLLM's rule: when the switch is on, ``logprobs`` = ``top_logprobs`` (0 when unset) unless
    ``logprob_token_ids`` asks for specific tokens. A ``top_logprobs`` above 0 or
    ``logprob_token_ids`` with the switch off would be ignored, so it is refused (``needs`` says
    what the switch is).
    """
    top = integer(body, w.TOP_LOGPROBS, minimum=-1)
    if top is not None and top != 0 and not wanted:
        raise refuse(top, f"needs {needs}", at=f"$.{w.TOP_LOGPROBS}")
    if w.LOGPROB_TOKEN_IDS in sampling:
        if not wanted:
            raise refuse(
                sampling[w.LOGPROB_TOKEN_IDS], f"needs {needs}", at=f"$.{w.LOGPROB_TOKEN_IDS}"
            )
        return
    if wanted:
        sampling[w.LOGPROBS] = 0 if top is None else top


class OutputFormats(NamedTuple):
    """The output formats one client API accepts, and where its ``json_schema`` keeps the schema."""

    kinds: tuple[str, ...]
    """The format types the API accepts, of ``text`` (no constraint), ``json_object``,
    ``json_schema`` and ``structural_tag``."""
    schema_in: str | None = None
    """The key of the object holding ``schema`` in a ``json_schema`` format (chat:
    ``json_schema``); ``None`` when ``schema`` is in the format itself."""


def _format_outputs(fmt: Mapping[str, Any], path: str, formats: OutputFormats) -> dict[str, Any]:
    kinds, schema_in = formats
    kind = fmt.get(w.TYPE)
    if kind not in kinds:
        expected = ", ".join(f'"{k}"' for k in kinds)
        raise refuse(kind, f"expected one of {expected}", at=f"{path}.{w.TYPE}")
    if kind == w.JSON_OBJECT:
        return {w.JSON_OBJECT: True}
    if kind == w.STRUCTURAL_TAG:
        # vLLM hands the structural tag to the grammar backend as the format's JSON text.
        try:
            return {w.STRUCTURAL_TAG: json.dumps(fmt)}
        except (ValueError, TypeError, RecursionError):
            raise refuse(fmt, "expected a JSON structural tag", at=path) from None
    if kind != w.JSON_SCHEMA:
        return {}  # "text": no constraint
    holder, holder_path = fmt, path
    if schema_in is not None:
        holder_path = f"{path}.{schema_in}"
        holder = obj(fmt, schema_in, path) or {}
        if not holder:
            raise refuse(fmt.get(schema_in), "a json_schema format needs it", at=holder_path)
    schema = obj(holder, w.SCHEMA, holder_path)
    if schema is None:
        raise refuse(None, "a json_schema format needs a schema", at=f"{holder_path}.{w.SCHEMA}")
    return {w.JSON_KEY: schema}


def structured_outputs(
    sampling: dict[str, Any],
    *,
    given: Mapping[str, Any] | None,
    fmt: Mapping[str, Any] | None,
    path: str,
    formats: OutputFormats,
) -> None:
    """``sampling_params.structured_outputs`` from the client's output format or its own.

    Args:
        sampling: the ``sampling_params`` being built.
        given: the client's own ``structured_outputs`` (a vLLM extension), if the route has it.
        fmt: the client's format object (chat ``response_format``, Responses ``text.format``,
            Messages ``output_config.format``), ``None`` when unset.
        path: the JSON path of ``fmt``.
        formats: the formats the client's API accepts (:class:`OutputFormats`).

    Raises:
        RequestError: an unknown format type, a ``json_schema`` format without a schema, or
            both a format and ``structured_outputs`` (vLLM would refuse the pair).
    """
    if given is not None and fmt is not None:
        raise refuse(fmt, "cannot be set together with `structured_outputs`", at=path)
    outputs = dict(given) if given is not None else None
    if fmt is not None:
        outputs = _format_outputs(fmt, path, formats)
    if outputs:
        sampling[w.STRUCTURED_OUTPUTS] = outputs


def chat_function_tool(
    path: str, name: object, description: object, parameters: object, option: tuple[str, object], /
) -> dict[str, Any]:
    """A chat ``{type: "function", function: {...}}`` tool, with nulls left out.

    ``option`` is the API's one other function key (``strict``, ``defer_loading``) and its
    value, written last unless the value is null. Positional only: a call that names its
    arguments costs a keyword match each, on every tool of every request (docs/performance.md,
    "Calls that parse their arguments").
    """
    if not isinstance(name, str) or not name:
        raise refuse(name, "expected a non-empty function name", at=f"{path}.{w.NAME}")
    # Written key by key: no dict built to be filtered (0.3 us less a tool).
    function: dict[str, Any] = {w.NAME: name}
    if description is not None:
        function[w.DESCRIPTION] = description
    if parameters is not None:
        function[w.PARAMETERS] = parameters
    key, value = option
    if value is not None:
        function[key] = value
    return {w.TYPE: w.FUNCTION, w.FUNCTION: function}


def named_tool_choice(name: object, path: str) -> dict[str, Any]:
    """The chat form of a tool choice that names one function."""
    if not isinstance(name, str) or not name:
        raise refuse(name, "expected the name of a function", at=f"{path}.{w.NAME}")
    return {w.TYPE: w.FUNCTION, w.FUNCTION: {w.NAME: name}}


ToolConverter: TypeAlias = Callable[[str, Mapping[str, Any]], dict[str, Any]]
"""Turns one client tool (its JSON path, the tool object) into a chat tool, or refuses it."""


def _tool_paths(count: int) -> tuple[str, ...]:
    return tuple(f"$.{w.TOOLS}[{index}]" for index in range(count))


# The JSON paths of an agent's tools, formatted once rather than per tool of every request.
_TOOL_PATHS: Final = _tool_paths(128)


def chat_tools(body: Mapping[str, Any], convert: ToolConverter | None = None) -> list[Any] | None:
    """The client's ``tools`` in the chat shape ``parse_context`` carries.

    Each tool is checked to be an object, then converted by ``convert(path, tool)`` (``path`` is
    ``$.tools[i]``); without ``convert`` the tools are passed on as sent (a chat client's are
    already in the chat shape).
    """
    tools = typed(body, w.TOOLS, ARRAY)
    if tools is None:
        return None
    paths = _TOOL_PATHS if len(tools) <= len(_TOOL_PATHS) else _tool_paths(len(tools))
    converted = []
    # Indexed, not zipped: zip(strict=...) parses its keyword as a slow call does.
    for index, tool in enumerate(tools):
        if not isinstance(tool, MAPPINGS):
            raise refuse(tool, "expected a tool object", at=paths[index])
        converted.append(tool if convert is None else convert(paths[index], tool))
    return converted


def parse_context(
    *,
    tools: list[Any] | None,
    tool_choice: object,
    parallel_tool_calls: bool | None,
    chat_template_kwargs: Mapping[str, Any] | None,
    include_reasoning: bool | None = None,
) -> dict[str, Any] | None:
    """A ``parse_context`` in the chat shape with vLLM's chat defaults, or ``None`` when empty.

    ``tool_choice`` becomes ``"auto"`` when tools are present and it is unset (vLLM's chat
    default); without tools (``tools: []`` included) it is left out, as vLLM refuses an empty
    tool list and a choice among no tools. Nulls and empty template kwargs are left out too.
    """
    context: dict[str, Any] = {}
    if tools:
        context[w.TOOLS] = tools
        context[w.TOOL_CHOICE] = w.TOOL_CHOICE_AUTO if tool_choice is None else tool_choice
    if parallel_tool_calls is not None:
        context[w.PARALLEL_TOOL_CALLS] = parallel_tool_calls
    if chat_template_kwargs:
        context[w.CHAT_TEMPLATE_KWARGS] = dict(chat_template_kwargs)
    if include_reasoning is not None:
        context[w.INCLUDE_REASONING] = include_reasoning
    return context or None


def asks_for_tools(context: Mapping[str, Any] | None) -> bool:
    """Whether a ``parse_context`` asks for tools: some tools, and a choice other than none."""
    if not context or not context.get(w.TOOLS):
        return False
    return bool(context.get(w.TOOL_CHOICE) != w.TOOL_CHOICE_NONE)


@functools.cache
def _kept(mapped: frozenset[str]) -> frozenset[str]:
    # One set per route's mapped keys, built once: a union of 40 keys costs a microsecond.
    return mapped | LEG_KEYS | {w.VLLM_XARGS}


def client_mapping(
    body: Mapping[str, Any],
    sampling: dict[str, Any],
    *,
    mapped: frozenset[str],
    parse_context: dict[str, Any] | None = None,
    context_keys: Iterable[str] = (),
) -> ClientMapping:
    """What ``body`` contributes to a leg, its dropped keys derived one way for every route.

    Every route's ``vllm_xargs`` becomes ``sampling_params.extra_args`` here (vLLM hands it to
    the engine so). ``dropped`` is the body's keys, in body order, neither ``mapped`` nor the
    leg builder's (:data:`LEG_KEYS`), then ``tools`` and ``tool_choice`` when the client's tool
    list is empty or absent (nothing for ``parse_context`` to carry); ``context_keys`` is those
    of ``context_keys`` present (they only feed ``parse_context``, so text mode drops them).
    """
    xargs = obj(body, w.VLLM_XARGS)
    if xargs is not None:
        sampling[w.EXTRA_ARGS] = dict(xargs)
    kept = _kept(mapped)
    toolless = parse_context is None or w.TOOLS not in parse_context
    unused = (w.TOOLS, w.TOOL_CHOICE) if toolless else ()
    return ClientMapping(
        sampling_params=sampling,
        parse_context=parse_context,
        # C-level filters, not a generator's Python step per key of the body.
        dropped=(*filterfalse(kept.__contains__, body), *filter(body.__contains__, unused)),
        context_keys=tuple(filter(body.__contains__, context_keys)),
    )

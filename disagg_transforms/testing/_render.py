"""The ``/v1/.../render`` routes: a client body turned into vLLM 0.33 ``GenerateRequest`` bodies.

The prompt goes through a Qwen3-like ChatML template and the toy byte tokenizer; everything else
(key order, nulls, omitted defaults, ids) is what vLLM's render routes write.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import uuid
from collections.abc import Mapping
from typing import Any, Final

from disagg_transforms.testing import _tokenizer as tok
from disagg_transforms.testing._common import (
    BadRequestError,
    Issue,
    RequestInvalidError,
    WorkerSettings,
)

ENGINE_DEFAULT_MAX_TOKENS: Final = 16
"""``SamplingParams.max_tokens``'s default: a dump leaves this value out."""
_GREEDY: Final = 1e-5
_MIN_TEMPERATURE: Final = 0.01


EMPTY_CONVERSATION: Final = (
    "Cannot apply chat template to an empty conversation. Provide at least one message."
)
"""What vLLM 0.32 answers (a 400 ``BadRequestError``) when the template gets no message."""
_CHAT_CONTENT_MEMBERS: Final = ("Developer", "System", "User")
"""The chat message classes with a string-or-parts ``content``, in vLLM's union order."""

_IMAGE: Final = f"<|vision_start|>{'<|image_pad|>' * tok.IMAGE_TOKENS}<|vision_end|>"


def _image_url(part: object) -> str | None:
    if not (isinstance(part, dict) and part.get("type") == "image_url"):
        return None
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    return url if isinstance(url, str) else None


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part["text"]) if isinstance(part.get("text"), str) else _IMAGE
            for part in content
            if isinstance(part, dict) and (isinstance(part.get("text"), str) or _image_url(part))
        )
    return ""


def _features(messages: list[dict[str, Any]], token_ids: list[int]) -> dict[str, Any] | None:
    """The image parts as vLLM's ``MultiModalFeatures``: one placeholder per image's pads.

    The hash is the URL's (the simulated processor never fetches it); ``kwargs_data`` is a
    stand-in for the processed pixels, so an encode leg has something to encode.
    """
    urls = [
        url
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if (url := _image_url(part)) is not None
    ]
    if not urls:
        return None
    starts = [i + 1 for i, token in enumerate(token_ids) if token == tok.VISION_START]
    hashes = [hashlib.sha256(url.encode()).hexdigest() for url in urls]
    return {
        "mm_hashes": {"image": hashes},
        "mm_placeholders": {
            "image": [{"offset": start, "length": tok.IMAGE_TOKENS} for start in starts]
        },
        "kwargs_data": {
            "image": [base64.b64encode(f"pixels:{h}".encode()).decode() for h in hashes]
        },
    }


def _tool_call_text(call: Mapping[str, Any]) -> str:
    function = call.get("function") if isinstance(call.get("function"), dict) else call
    assert isinstance(function, dict)  # noqa: S101 - narrowed by the line above
    arguments: object = function.get("arguments", {})
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    payload = {"name": function.get("name"), "arguments": arguments}
    return f"<tool_call>\n{json.dumps(payload, ensure_ascii=False)}\n</tool_call>"


def chat_prompt(  # noqa: C901 - one branch per role, as the template has
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    kwargs: Mapping[str, Any],
) -> str:
    """The prompt text of a chat, in the Qwen3-like template.

    Args:
        messages: OpenAI chat messages.
        tools: OpenAI chat tools, or ``None``.
        kwargs: The effective chat template kwargs.

    Returns:
        The prompt, special strings included.

    Raises:
        BadRequestError: no message at all (after the route's conversion), as vLLM's template.
    """
    if not messages:
        raise BadRequestError(EMPTY_CONVERSATION)
    parts: list[str] = []
    rest = messages
    system = (
        messages[0] if messages and messages[0].get("role") in {"system", "developer"} else None
    )
    if system is not None:
        rest = messages[1:]
    if tools:
        header = f"{_text_of(system.get('content'))}\n\n" if system is not None else ""
        lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
        parts.append(
            f"<|im_start|>system\n{header}# Tools\n\n<tools>\n{lines}\n</tools><|im_end|>\n"
        )
    elif system is not None:
        parts.append(f"<|im_start|>system\n{_text_of(system.get('content'))}<|im_end|>\n")
    for index, message in enumerate(rest):
        role = message.get("role")
        content = _text_of(message.get("content"))
        if role == "tool":
            opening = index == 0 or rest[index - 1].get("role") != "tool"
            closing = index == len(rest) - 1 or rest[index + 1].get("role") != "tool"
            parts.append(
                ("<|im_start|>user" if opening else "")
                + f"\n<tool_response>\n{content}\n</tool_response>"
                + ("<|im_end|>\n" if closing else "")
            )
            continue
        if role == "assistant":
            calls = message.get("tool_calls") or []
            for number, call in enumerate(calls):
                if isinstance(call, dict):
                    separator = "\n" if content or number else ""
                    content += separator + _tool_call_text(call)
        parts.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
    if kwargs.get("continue_final_message") and parts:
        parts[-1] = parts[-1].removesuffix("<|im_end|>\n")
    elif kwargs.get("add_generation_prompt", True):
        thinking_off = kwargs.get("enable_thinking") is False
        parts.append(
            "<|im_start|>assistant\n" + ("<think>\n\n</think>\n\n" if thinking_off else "")
        )
    return "".join(parts)


def _number(value: object, default: float) -> float:
    return (
        float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default
    )


def _room(prompt_len: int, settings: WorkerSettings) -> int:
    room = settings.max_model_len - prompt_len
    if room <= 0:
        msg = (
            f"This model's maximum context length is {settings.max_model_len} tokens. However,"
            f" your request has {prompt_len} input tokens. Please reduce the length of the input"
            " messages."
        )
        raise BadRequestError(msg, "input_tokens")
    return room


def _max_tokens(cap: object, prompt_len: int, settings: WorkerSettings) -> int:
    room = _room(prompt_len, settings)
    if not isinstance(cap, int) or isinstance(cap, bool):
        return room
    if cap > room:
        msg = (
            f"'max_tokens' or 'max_completion_tokens' is too large: {cap}. This model's maximum"
            f" context length is {settings.max_model_len} tokens and your request has"
            f" {prompt_len} input tokens ({cap} > {settings.max_model_len} - {prompt_len})."
        )
        raise BadRequestError(msg, "max_tokens")
    return cap


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sampling:
    """What a render route decided for ``sampling_params``, besides the client's own fields."""

    max_tokens: int
    """The resolved cap."""
    skip_special_tokens: bool = False
    """The value after the parsers adjusted the request."""
    logprobs: int | None = None
    """Top logprobs per token, or ``None``."""
    stop: object = None
    """The client's stop string(s)."""
    extra_args: dict[str, Any] | None = None
    """``extra_args`` to write, or ``None``."""


def sampling_params(  # noqa: C901, PLR0912, PLR0915 - a branch per optional field, vLLM's order
    request: Mapping[str, Any], decided: Sampling
) -> dict[str, Any]:
    """``sampling_params`` as a render route dumps them (defaults left out, vLLM's order).

    Args:
        request: The client's body (penalties, temperature, seed, ``stream``, ...).
        decided: What the route decided (:class:`Sampling`).

    Returns:
        The dict.
    """
    temperature = _number(request.get("temperature"), 1.0)
    if 0 < temperature < _MIN_TEMPERATURE:
        temperature = _MIN_TEMPERATURE
    greedy = temperature < _GREEDY
    params: dict[str, Any] = {}
    n = request.get("n")
    if isinstance(n, int) and n != 1:
        params["n"] = n
    params["presence_penalty"] = _number(request.get("presence_penalty"), 0.0)
    params["frequency_penalty"] = _number(request.get("frequency_penalty"), 0.0)
    params["repetition_penalty"] = _number(request.get("repetition_penalty"), 1.0)
    params["temperature"] = temperature
    if not greedy:
        params["top_p"] = _number(request.get("top_p"), 1.0)
        top_k = request.get("top_k")
        if isinstance(top_k, int) and top_k not in {0, -1}:
            params["top_k"] = top_k
        params["min_p"] = _number(request.get("min_p"), 0.0)
    if isinstance(request.get("seed"), int) and request["seed"] != -1:
        params["seed"] = request["seed"]
    stops = [decided.stop] if isinstance(decided.stop, str) else []
    if isinstance(decided.stop, list):
        stops = [item for item in decided.stop if isinstance(item, str)]
    params["stop"] = stops
    stop_ids = request.get("stop_token_ids")
    params["stop_token_ids"] = list(dict.fromkeys(stop_ids)) if isinstance(stop_ids, list) else []
    if request.get("ignore_eos") is True:
        params["ignore_eos"] = True
    if decided.max_tokens != ENGINE_DEFAULT_MAX_TOKENS:
        params["max_tokens"] = decided.max_tokens
    min_tokens = request.get("min_tokens")
    if isinstance(min_tokens, int) and min_tokens > 0:
        params["min_tokens"] = min_tokens
    if decided.logprobs is not None:
        params["logprobs"] = decided.logprobs
    if not decided.skip_special_tokens:
        params["skip_special_tokens"] = False
    if request.get("include_stop_str_in_output") is True:
        params["include_stop_str_in_output"] = True
    params["output_kind"] = 1 if request.get("stream") is True else 2
    params["skip_clone"] = True
    if stops and not request.get("include_stop_str_in_output"):
        # Text that could start a stop string is held back this many characters.
        params["output_text_buffer_length"] = max(len(s) for s in stops) - 1
    outputs = _structured_outputs(request)
    if outputs is not None:
        params["structured_outputs"] = outputs
    if isinstance(request.get("logit_bias"), dict):
        params["logit_bias"] = {int(k): float(v) for k, v in request["logit_bias"].items()}
    if decided.extra_args is not None:
        params["extra_args"] = decided.extra_args
    params["bad_words"] = []
    params["skip_reading_prefix_cache"] = False
    return params


def _structured_outputs(request: Mapping[str, Any]) -> dict[str, Any] | None:
    """``structured_outputs`` from the client's output format, in each client API's place.

    Chat's ``response_format``, Responses' ``text.format``, Messages' ``output_config.format``,
    or vLLM's own ``structured_outputs`` as sent.
    """
    given = request.get("structured_outputs")
    if isinstance(given, dict):
        return dict(given)
    text, config = request.get("text"), request.get("output_config")
    fmt = request.get("response_format")
    if isinstance(text, dict):
        fmt = text.get("format")
    elif isinstance(config, dict):
        fmt = config.get("format")
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_object":
        return {"json_object": True}
    if fmt.get("type") != "json_schema":
        return None
    # Chat nests the schema under json_schema; Responses and Messages put it on the format.
    holder = fmt.get("json_schema", fmt)
    schema = holder.get("schema") if isinstance(holder, dict) else None
    return {"json": schema} if isinstance(schema, dict) else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Dump:
    """The fields of a ``GenerateRequest`` dump a render route decided.

    The client's body and the worker's settings give the rest (``model``, ``stream``,
    ``cache_salt``, ``priority``).
    """

    request_id: str
    token_ids: list[int]
    sampling: dict[str, Any]
    reasoning_ended: bool | None = None
    template_kwargs: dict[str, Any] | None = None
    parse_context: dict[str, Any] | None = None
    stream_options: dict[str, Any] | None = None
    kv: object = None
    ec: object = None
    features: dict[str, Any] | None = None


def _generate_request(
    body: Mapping[str, Any], settings: WorkerSettings, dump: _Dump
) -> dict[str, Any]:
    template_kwargs = dump.template_kwargs
    return {
        "request_id": dump.request_id,
        "token_ids": dump.token_ids,
        "token_offsets": None,
        "features": dump.features,
        "content_parts": None,
        "sampling_params": dump.sampling,
        "model": body.get("model") or settings.default_model,
        "reasoning_ended": dump.reasoning_ended,
        "reasoning_parser_kwargs": (
            None if template_kwargs is None else {"chat_template_kwargs": template_kwargs}
        ),
        "return_token_ids": None,
        "output_mode": "tokens",
        "parse_context": dump.parse_context,
        "stream": body.get("stream") is True,
        "stream_options": dump.stream_options,
        "cache_salt": body.get("cache_salt") if isinstance(body.get("cache_salt"), str) else None,
        "priority": body.get("priority") if isinstance(body.get("priority"), int) else 0,
        "kv_transfer_params": dump.kv if isinstance(dump.kv, dict) else None,
        "ec_transfer_params": dump.ec if isinstance(dump.ec, dict) else None,
    }


def _template_kwargs(body: Mapping[str, Any]) -> dict[str, Any]:
    client = body.get("chat_template_kwargs")
    client = client if isinstance(client, dict) else {}
    kwargs: dict[str, Any] = {
        "add_generation_prompt": client.get(
            "add_generation_prompt", body.get("add_generation_prompt", True)
        ),
        "continue_final_message": client.get(
            "continue_final_message", body.get("continue_final_message", False)
        ),
    }
    kwargs.update((k, v) for k, v in client.items() if k not in kwargs)
    return kwargs


def _require_object(body: object, *required: str) -> Mapping[str, Any]:
    """The body as an object holding every ``required`` key (pydantic's errors otherwise)."""
    if not isinstance(body, dict):
        msg = "Input should be a valid dictionary"
        raise RequestInvalidError([Issue("model_attributes_type", "body", msg, body)])
    for key in required:
        _require_key(body, key)
    return body


def _require_key(body: Mapping[str, Any], key: str) -> None:
    if key not in body:
        raise RequestInvalidError([Issue("missing", f"body.{key}", "Field required", dict(body))])


def _require_list(body: Mapping[str, Any], key: str) -> list[Any]:
    _require_key(body, key)
    value = body[key]
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        msg = "Input should be a valid list"
        raise RequestInvalidError([Issue("list_type", f"body.{key}", msg, value)])
    return value


def _content_issues(loc: str, value: object) -> list[Issue]:
    """A ``content`` that is neither a string nor a list, as pydantic reports it."""
    return [
        Issue("string_type", loc, "Input should be a valid string", value),
        Issue("list_type", loc, "Input should be a valid list", value),
    ]


def _has_bad_content(message: Mapping[str, Any]) -> bool:
    return "content" in message and not isinstance(message["content"], (str, list))


def _check_chat_contents(messages: list[dict[str, Any]]) -> None:
    """Refuse a chat message whose ``content`` is neither a string nor parts (null: assistant).

    vLLM's validation tries each message class of its union; the classes with such a content
    come first, and their issues are the ones reported here (the count of the rest is not).
    """
    for index, message in enumerate(messages):
        content = message.get("content")
        if not _has_bad_content(message) or (
            content is None and message.get("role") == "assistant"
        ):
            continue
        issues: list[Issue] = []
        for member in _CHAT_CONTENT_MEMBERS:
            loc = f"body.messages.{index}.ChatCompletion{member}MessageParam"
            issues += [
                Issue("string_type", f"{loc}.content", "Input should be a valid string", content),
                Issue("iterable_type", f"{loc}.content", "Input should be iterable", content),
            ]
            role = member.lower()
            if message.get("role") != role:
                issues.append(
                    Issue(
                        "literal_error",
                        f"{loc}.role",
                        f"Input should be '{role}'",
                        message.get("role"),
                        {"expected": f"'{role}'"},
                    )
                )
        raise RequestInvalidError(issues)


def _base_id(header_id: str | None, body: Mapping[str, Any]) -> str:
    # vLLM: the X-Request-Id header wins, else the body's request_id, else a random id.
    if header_id is not None:
        return header_id
    given = body.get("request_id")
    return given if isinstance(given, str) else uuid.uuid4().hex


def _history_tool_calls(messages: list[dict[str, Any]]) -> int:
    return sum(
        len(message.get("tool_calls") or [])
        for message in messages
        if message.get("role") == "assistant"
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Chat:
    """A request as chat messages, after each API's conversion, and what its route decided."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    request_id: str
    cap: object
    stream_options: dict[str, Any] | None = None
    kv: object = None
    ec: object = None
    extra_args: dict[str, Any] | None = None
    logprobs: int | None = None
    tool_choice: object = None
    stop: object = None


def _chat_render(body: Mapping[str, Any], chat: _Chat, settings: WorkerSettings) -> dict[str, Any]:
    messages, tools, tool_choice = chat.messages, chat.tools, chat.tool_choice
    kwargs = _template_kwargs(body)
    token_ids = tok.encode(chat_prompt(messages, tools, kwargs))
    sampling = sampling_params(
        body,
        Sampling(
            max_tokens=_max_tokens(chat.cap, len(token_ids), settings),
            logprobs=chat.logprobs,
            stop=chat.stop,
            extra_args=chat.extra_args,
        ),
    )
    if tool_choice is None:
        tool_choice = "auto" if tools else "none"
    parallel = body.get("parallel_tool_calls", True)
    parse_context = {
        "tools": tools or None,
        "tool_choice": tool_choice,
        "parallel_tool_calls": parallel if isinstance(parallel, bool) else True,
        "include_reasoning": body.get("include_reasoning", True) is not False,
        "chat_template_kwargs": kwargs,
        "history_tool_call_cnt": _history_tool_calls(messages),
    }
    dump = _Dump(
        request_id=chat.request_id,
        token_ids=token_ids,
        sampling=sampling,
        reasoning_ended=False,
        template_kwargs=kwargs,
        parse_context=parse_context,
        stream_options=chat.stream_options,
        kv=chat.kv,
        ec=chat.ec,
        features=_features(messages, token_ids),
    )
    return _generate_request(body, settings, dump)


def render_chat(body: object, header_id: str | None, settings: WorkerSettings) -> dict[str, Any]:
    """``POST /v1/chat/completions/render``.

    Args:
        body: The client's chat body.
        header_id: The ``x-request-id`` header, if sent.
        settings: The worker's settings.

    Returns:
        One ``GenerateRequest`` body.

    Raises:
        BadRequestError: ``tools: []``, ``stream_options`` without ``stream``, too long a prompt.
    """
    request = _require_object(body)
    messages = _require_list(request, "messages")
    _check_chat_contents(messages)
    tools = request.get("tools")
    if tools == []:
        msg = (
            "`tools` must not be an empty array. Either provide at least one tool or omit the"
            " field entirely. (parameter=tools)"
        )
        raise BadRequestError(msg, "tools")
    options = request.get("stream_options")
    if options is not None and request.get("stream") is not True:
        msg = "Stream options can only be defined when `stream=True`."
        raise BadRequestError(msg, "stream_options")
    stream_options = None
    if isinstance(options, dict):
        stream_options = {
            "include_usage": options.get("include_usage", True),
            "continuous_usage_stats": options.get("continuous_usage_stats", False),
        }
    cap = request.get("max_completion_tokens")
    if cap is None:
        cap = request.get("max_tokens")
    top = request.get("top_logprobs")
    logprobs = (top if isinstance(top, int) else 0) if request.get("logprobs") is True else None
    xargs = request.get("vllm_xargs")
    chat = _Chat(
        messages=messages,
        tools=tools if isinstance(tools, list) else None,
        request_id=f"chatcmpl-{_base_id(header_id, request)}",
        cap=cap,
        stream_options=stream_options,
        kv=request.get("kv_transfer_params"),
        ec=request.get("ec_transfer_params"),
        extra_args=dict(xargs) if isinstance(xargs, dict) else None,
        logprobs=logprobs,
        tool_choice=request.get("tool_choice"),
        stop=request.get("stop"),
    )
    return _chat_render(request, chat, settings)


def _anthropic_messages(request: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    system = request.get("system")
    if system is not None:
        messages.append({"role": "system", "content": _text_of(system)})
    for index, message in enumerate(_require_list(request, "messages")):
        content = message.get("content")
        if _has_bad_content(message):
            raise RequestInvalidError(_content_issues(f"body.messages.{index}.content", content))
        if isinstance(content, str):
            messages.append({"role": message.get("role"), "content": content})
            continue
        blocks = [block for block in content or [] if isinstance(block, dict)]
        texts = [block for block in blocks if block.get("type") == "text"]
        calls = [
            {
                "id": block.get("id"),
                "type": "function",
                "function": {
                    "name": block.get("name"),
                    "arguments": json.dumps(block.get("input", {}), ensure_ascii=False),
                },
            }
            for block in blocks
            if block.get("type") == "tool_use"
        ]
        messages.extend(
            {
                "role": "tool",
                "tool_call_id": block.get("tool_use_id"),
                "content": _text_of(block.get("content")),
            }
            for block in blocks
            if block.get("type") == "tool_result"
        )
        if texts or calls:
            converted: dict[str, Any] = {"role": message.get("role"), "content": _text_of(texts)}
            if calls:
                converted["tool_calls"] = calls
            messages.append(converted)
    return messages


def _anthropic_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.get("name")}
    if "description" in tool:
        function["description"] = tool["description"]
    function["parameters"] = tool.get("input_schema")
    return {"type": "function", "function": function}


def _anthropic_tool_choice(choice: object) -> object:
    if not isinstance(choice, dict):
        return None
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"auto": "auto", "any": "required", "none": "none"}.get(str(kind))


def render_messages(
    body: object, header_id: str | None, settings: WorkerSettings
) -> dict[str, Any]:
    """``POST /v1/messages/render``: an Anthropic Messages body, converted to chat first.

    Arguments (``body``: the client's Messages body) and result as :func:`render_chat`.
    """
    request = _require_object(body, "max_tokens")
    messages = _anthropic_messages(request)
    raw_tools = request.get("tools")
    tools = [_anthropic_tool(t) for t in raw_tools if isinstance(t, dict)] if raw_tools else None
    stream = request.get("stream") is True
    usage = {"include_usage": True, "continuous_usage_stats": True} if stream else None
    chat = _Chat(
        messages=messages,
        tools=tools,
        request_id=f"chatcmpl-{_base_id(header_id, request)}",
        cap=request.get("max_tokens"),
        stream_options=usage,
        tool_choice=_anthropic_tool_choice(request.get("tool_choice")),
        stop=request.get("stop_sequences"),
    )
    return _chat_render(request, chat, settings)


def _responses_messages(request: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    instructions = request.get("instructions")
    if isinstance(instructions, str):
        messages.append({"role": "system", "content": instructions})
    given = request.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
        return messages
    for item in given if isinstance(given, list) else []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            role = "system" if item.get("role") == "developer" else item.get("role")
            messages.append({"role": role, "content": _text_of(item.get("content"))})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")},
            }
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = _text_of(item.get("output"))
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": output}
            )
    return messages


def _check_responses_input(given: object) -> None:
    """Refuse an ``input`` that is neither a string nor items, or an item's bad ``content``.

    vLLM's validation reports the input first (not a string), then each item class it tried:
    the message classes come first (``param`` is ``body.input`` either way).
    """
    if isinstance(given, str):
        return
    if not isinstance(given, list):
        raise RequestInvalidError(_content_issues("body.input", given))
    for index, item in enumerate(given):
        # A reasoning item (no role) may say null; a message may not.
        if isinstance(item, dict) and "role" in item and _has_bad_content(item):
            loc = f"body.input.{index}.EasyInputMessageParam.content"
            raise RequestInvalidError(
                [
                    Issue("string_type", "body.input", "Input should be a valid string", given),
                    *_content_issues(loc, item["content"]),
                ]
            )


def responses_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses function tool in chat's shape, as vLLM's Responses serving converts it."""
    # vLLM keeps ``strict`` (openai-agents sends ``true``): it is in the prompt's tool lines.
    keys = ("name", "description", "parameters", "strict")
    function = {key: tool[key] for key in keys if key in tool}
    return {"type": "function", "function": function}


def render_responses(body: object, settings: WorkerSettings) -> dict[str, Any]:
    """``POST /v1/responses/render``: no ``parse_context``, and ``X-Request-Id`` is ignored.

    Args:
        body: The client's Responses body.
        settings: The worker's settings.

    Returns:
        One ``GenerateRequest`` body.
    """
    request = _require_object(body, "input")
    _check_responses_input(request["input"])
    messages = _responses_messages(request)
    raw_tools = request.get("tools") or []
    tools = [
        responses_tool(tool)
        for tool in raw_tools
        if isinstance(tool, dict) and tool.get("type") == "function"
    ]
    kwargs = _template_kwargs(request)
    token_ids = tok.encode(chat_prompt(messages, tools or None, kwargs))
    given = request.get("request_id")
    request_id = given if isinstance(given, str) else f"resp_{uuid.uuid4().hex[:16]}"
    top = request.get("top_logprobs")
    sampling = sampling_params(
        request,
        Sampling(
            max_tokens=_max_tokens(request.get("max_output_tokens"), len(token_ids), settings),
            logprobs=top if isinstance(top, int) and top > 0 else None,
            extra_args={},
        ),
    )
    dump = _Dump(
        request_id=request_id, token_ids=token_ids, sampling=sampling, template_kwargs=kwargs
    )
    return _generate_request(request, settings, dump)


def _prompts(request: Mapping[str, Any]) -> list[list[int]]:
    prompt = request.get("prompt")
    if isinstance(prompt, str):
        return [tok.encode(prompt)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(item, str) for item in prompt):
            return [tok.encode(item) for item in prompt]
        if all(isinstance(item, int) and not isinstance(item, bool) for item in prompt):
            return [list(prompt)]
        if all(isinstance(item, list) and all(isinstance(t, int) for t in item) for item in prompt):
            return [list(item) for item in prompt]
    _require_key(request, "prompt")
    msg = "Input should be a valid string or a list of strings or token IDs"
    raise RequestInvalidError([Issue("string_type", "body.prompt", msg, prompt)])


def render_completions(
    body: object, header_id: str | None, settings: WorkerSettings
) -> list[dict[str, Any]]:
    """``POST /v1/completions/render``: one ``GenerateRequest`` per prompt, no template.

    Args:
        body: The client's completions body.
        header_id: The ``x-request-id`` header, if sent.
        settings: The worker's settings.

    Returns:
        The list of bodies; the request ids are ``cmpl-<id>-<index>``.
    """
    request = _require_object(body)
    base = _base_id(header_id, request)
    options = request.get("stream_options")
    stream_options = None
    if isinstance(options, dict):
        stream_options = {
            "include_usage": options.get("include_usage", True),
            "continuous_usage_stats": options.get("continuous_usage_stats", False),
        }
    # A completions client's cap defaults to 16, the OpenAI default.
    cap = request.get("max_tokens", ENGINE_DEFAULT_MAX_TOKENS)
    logprobs = request.get("logprobs")
    xargs = request.get("vllm_xargs")
    answers: list[dict[str, Any]] = []
    for index, token_ids in enumerate(_prompts(request)):
        sampling = sampling_params(
            request,
            Sampling(
                max_tokens=_max_tokens(cap, len(token_ids), settings),
                skip_special_tokens=request.get("skip_special_tokens", True) is not False,
                logprobs=logprobs if isinstance(logprobs, int) else None,
                stop=request.get("stop"),
                extra_args=dict(xargs) if isinstance(xargs, dict) else None,
            ),
        )
        dump = _Dump(
            request_id=f"cmpl-{base}-{index}",
            token_ids=token_ids,
            sampling=sampling,
            stream_options=stream_options,
            kv=request.get("kv_transfer_params"),
            ec=request.get("ec_transfer_params"),
        )
        answers.append(_generate_request(request, settings, dump))
    return answers


def tokenize(body: object, settings: WorkerSettings) -> dict[str, Any]:
    """``POST /tokenize``: a ``prompt``, or a chat's ``messages`` through the template.

    Args:
        body: vLLM's tokenize request, completion form (``prompt``) or chat form (``messages``,
            ``tools``, ``add_generation_prompt``, ``chat_template_kwargs``, ...).
        settings: The worker's settings.

    Returns:
        ``{"count", "max_model_len", "tokens", "token_strs"}`` (``token_strs`` when asked for
        with ``return_token_strs``, else null).
    """
    request = _require_object(body)
    if "messages" in request:
        tools = request.get("tools")
        prompt = chat_prompt(
            _require_list(request, "messages"),
            tools if isinstance(tools, list) and tools else None,
            _template_kwargs(request),
        )
    else:
        _require_key(request, "prompt")
        prompt = request["prompt"]
        if not isinstance(prompt, str):
            msg = "Input should be a valid string"
            raise RequestInvalidError([Issue("string_type", "body.prompt", msg, prompt)])
    tokens = tok.encode(prompt)
    strs = None
    if request.get("return_token_strs") is True:
        strs = [tok.token_bytes(token).decode(errors="replace") for token in tokens]
    return {
        "count": len(tokens),
        "max_model_len": settings.max_model_len,
        "tokens": tokens,
        "token_strs": strs,
    }


def detokenize(body: object) -> dict[str, Any]:
    """``POST /detokenize``: the text of ``tokens``, special strings included.

    Args:
        body: ``{"model"?, "tokens": [int, ...]}``.

    Returns:
        ``{"prompt": text}``.
    """
    request = _require_object(body, "tokens")
    tokens = request["tokens"]
    if not isinstance(tokens, list) or not all(
        isinstance(token, int) and not isinstance(token, bool) for token in tokens
    ):
        msg = "Input should be a valid list of integers"
        raise RequestInvalidError([Issue("list_type", "body.tokens", msg, tokens)])
    return {"prompt": tok.decode(tokens)}

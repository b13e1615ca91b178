"""``POST /inference/v1/generate``: vLLM 0.33's validation, refusals, answers and streams."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import orjson

from disagg_transforms.testing import _tokenizer as tok
from disagg_transforms.testing._common import (
    BadRequestError,
    Issue,
    RequestInvalidError,
    WorkerSettings,
)
from disagg_transforms.testing._schema import instance

OUTPUT_MODES: Final = ("tokens", "text", "derender")
TOOL_CHOICES: Final = ("none", "auto", "required")
BLOCK_SIZE: Final = 16
"""Tokens per KV block: a prefill of 21 tokens names blocks ``[[1, 2]]``."""
MAX_CACHE_SALT: Final = 128
GREEDY_TEMPERATURE: Final = 1e-5
ALL_LOGPROBS: Final = 3
"""How many alternatives ``logprobs: -1`` ("all of them") gives."""
_ALTERNATIVES: Final = tuple(tok.BYTE_OFFSET + byte for byte in b" eaot")

_INT64: Final = 2**63
# Type of every sampling_params field vLLM 0.33 declares (unknown keys are dropped, like vLLM).
_SAMPLING_KINDS: Final[dict[str, str]] = {
    "n": "int",
    "presence_penalty": "num",
    "frequency_penalty": "num",
    "repetition_penalty": "num",
    "temperature": "num",
    "watermarking": "bool?",
    "top_p": "num",
    "top_k": "int",
    "min_p": "num",
    "seed": "int?",
    "stop": "stop",
    "stop_token_ids": "ints?",
    "ignore_eos": "bool",
    "max_tokens": "int?",
    "min_tokens": "int",
    "logprobs": "int?",
    "prompt_logprobs": "int?",
    "prompt_logprob_token_ids": "intss?",
    "prompt_logprob_start": "int?",
    "logprob_token_ids": "ints?",
    "flat_logprobs": "bool",
    "detokenize": "bool",
    "skip_special_tokens": "bool",
    "spaces_between_special_tokens": "bool",
    "include_stop_str_in_output": "bool",
    "output_kind": "kind",
    "stream_interval": "int?",
    "skip_clone": "bool",
    "output_text_buffer_length": "int",
    "structured_outputs": "obj?",
    "logit_bias": "bias?",
    "allowed_token_ids": "ints?",
    "extra_args": "obj?",
    "bad_words": "strs?",
    "skip_reading_prefix_cache": "bool?",
    "thinking_token_budget": "int?",
    "repetition_detection": "obj?",
    "routed_experts_prompt_start": "int",
    "trace_decode_token_ids": "ints?",
}
_TOP_KINDS: Final[dict[str, str]] = {
    "request_id": "str",
    "token_offsets": "offsets?",
    "model": "str?",
    "reasoning_ended": "bool?",
    "return_token_ids": "bool?",
    "stream": "bool?",
    "cache_salt": "str?",
    "priority": "int",
    "kv_transfer_params": "obj?",
    "ec_transfer_params": "obj?",
}
_TYPE_ERRORS: Final[dict[str, tuple[str, str]]] = {
    "int": ("int_type", "Input should be a valid integer"),
    "num": ("float_type", "Input should be a valid number"),
    "bool": ("bool_type", "Input should be a valid boolean"),
    "str": ("string_type", "Input should be a valid string"),
    "list": ("list_type", "Input should be a valid list"),
    "obj": ("dict_type", "Input should be a valid dictionary"),
}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -_INT64 <= value < _INT64


def _is_int_list(value: object) -> bool:
    return isinstance(value, list) and all(_is_int(item) for item in value)


def _kind_matches(kind: str, value: object) -> bool:  # noqa: C901, PLR0911 - one answer per kind
    if kind.endswith("?"):
        return value is None or _kind_matches(kind[:-1], value)
    if kind == "int":
        return _is_int(value)
    if kind == "num":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "obj":
        return isinstance(value, dict)
    if kind == "ints":
        return _is_int_list(value)
    if kind == "intss":
        return isinstance(value, list) and all(_is_int_list(item) for item in value)
    if kind == "strs":
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    if kind == "stop":
        return isinstance(value, str) or _kind_matches("strs", value)
    if kind == "kind":
        return _is_int(value) and value in {0, 1, 2}
    if kind == "bias":
        return isinstance(value, dict) and all(
            _kind_matches("num", item) for item in value.values()
        )
    # "offsets": [[start, end], ...]
    return isinstance(value, list) and all(
        isinstance(item, list) and len(item) == 2 and _is_int_list(item) for item in value
    )


def _type_issue(kind: str, loc: str, value: object) -> Issue:
    base = kind.rstrip("?")
    key = base if base in _TYPE_ERRORS else ("obj" if base == "bias" else "list")
    error_kind, msg = _TYPE_ERRORS[key]
    return Issue(error_kind, loc, msg, value)


def _check_token_ids(body: Mapping[str, Any], issues: list[Issue]) -> None:
    if "token_ids" not in body:
        issues.append(Issue("missing", "body.token_ids", "Field required", dict(body)))
        return
    token_ids = body["token_ids"]
    if not isinstance(token_ids, list):
        issues.append(_type_issue("list", "body.token_ids", token_ids))
        return
    if not token_ids:
        msg = "List should have at least 1 item after validation, not 0"
        issues.append(Issue("too_short", "body.token_ids", msg, token_ids))
    for index, token in enumerate(token_ids):
        loc = f"body.token_ids.{index}"
        if not _is_int(token):
            issues.append(_type_issue("int", loc, token))
        elif token < 0:
            msg = "Input should be greater than or equal to 0"
            issues.append(Issue("greater_than_equal", loc, msg, token))


def _check_parse_context(value: object, issues: list[Issue]) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        issues.append(_type_issue("obj", "body.parse_context", value))
        return
    tools = value.get("tools")
    if tools is not None and not (
        isinstance(tools, list)
        and all(
            isinstance(tool, dict)
            and tool.get("type", "function") == "function"
            and isinstance(tool.get("function"), dict)
            and isinstance(tool["function"].get("name"), str)
            for tool in tools
        )
    ):
        issues.append(Issue("model_type", "body.parse_context.tools", "Invalid tools", tools))
    choice = value.get("tool_choice", "none")
    named = (
        isinstance(choice, dict)
        and choice.get("type", "function") == "function"
        and isinstance(choice.get("function"), dict)
        and isinstance(choice["function"].get("name"), str)
    )
    if not (choice is None or (isinstance(choice, str) and choice in TOOL_CHOICES) or named):
        msg = "Input should be 'none', 'auto' or 'required'"
        issues.append(Issue("literal_error", "body.parse_context.tool_choice", msg, choice))
    for key, kind in (
        ("parallel_tool_calls", "bool?"),
        ("include_reasoning", "bool"),
        ("chat_template_kwargs", "obj"),
        ("history_tool_call_cnt", "int"),
    ):
        if key in value and not _kind_matches(kind, value[key]):
            issues.append(_type_issue(kind, f"body.parse_context.{key}", value[key]))
    count = value.get("history_tool_call_cnt", 0)
    if _is_int(count) and count < 0:
        msg = "Input should be greater than or equal to 0"
        loc = "body.parse_context.history_tool_call_cnt"
        issues.append(Issue("greater_than_equal", loc, msg, count))


def _check_features(features: object, token_ids: object, issues: list[Issue]) -> None:
    """``MultiModalFeatures``: parallel lists per modality, placeholders inside the prompt."""
    loc = "body.features"
    if not isinstance(features, dict):
        issues.append(_type_issue("obj", loc, features))
        return
    hashes = features.get("mm_hashes")
    places = features.get("mm_placeholders")
    data = features.get("kwargs_data")
    if not (isinstance(hashes, dict) and isinstance(places, dict)):
        msg = "mm_hashes and mm_placeholders are required objects"
        issues.append(Issue("value_error", loc, msg, features))
        return
    length = len(token_ids) if isinstance(token_ids, list) else 0
    for modality, items in places.items():
        hashed = hashes.get(modality)
        given = data.get(modality) if isinstance(data, dict) else None
        if not (isinstance(items, list) and isinstance(hashed, list)) or len(items) != len(hashed):
            msg = f"{modality}: mm_hashes and mm_placeholders must be parallel lists"
            issues.append(Issue("value_error", f"{loc}.mm_placeholders.{modality}", msg, items))
            continue
        if given is not None and not (isinstance(given, list) and len(given) == len(items)):
            msg = f"{modality}: kwargs_data must be parallel to mm_hashes"
            issues.append(Issue("value_error", f"{loc}.kwargs_data.{modality}", msg, given))
        for index, item in enumerate(items):
            offset: Any = item.get("offset") if isinstance(item, dict) else None
            size: Any = item.get("length") if isinstance(item, dict) else None
            if not (_is_int(offset) and _is_int(size) and offset >= 0 and size > 0):
                msg = "offset >= 0 and length > 0 are required"
                issues.append(
                    Issue("value_error", f"{loc}.mm_placeholders.{modality}.{index}", msg, item)
                )
            elif offset + size > length:
                msg = "Value error, mm_placeholders must lie inside token_ids"
                issues.append(Issue("value_error", loc, msg, features))


def _encoder_inputs(body: Mapping[str, Any]) -> list[str]:
    """The hashes of the items this call must encode itself (their data is in the body)."""
    features = body.get("features")
    if not isinstance(features, dict):
        return []
    data = features.get("kwargs_data") or {}
    return [
        digest
        for modality, hashes in features["mm_hashes"].items()
        for digest, item in zip(hashes, data.get(modality) or [None] * len(hashes), strict=True)
        if item is not None
    ]


def _metadata_only(body: Mapping[str, Any]) -> bool:
    features = body.get("features")
    if not isinstance(features, dict):
        return False
    data = features.get("kwargs_data") or {}
    return any(
        item is None
        for modality, hashes in features["mm_hashes"].items()
        for item in data.get(modality) or [None] * len(hashes)
    )


def _check_other_fields(body: Mapping[str, Any], issues: list[Issue]) -> None:
    for key, kind in _TOP_KINDS.items():
        if key in body and not _kind_matches(kind, body[key]):
            issues.append(_type_issue(kind, f"body.{key}", body[key]))
    if body.get("content_parts") is not None:
        # Raw media would need a processor; the toy worker takes rendered features only.
        msg = "content_parts is not supported by the simulated worker"
        issues.append(Issue("value_error", "body.content_parts", msg, body["content_parts"]))
    if body.get("features") is not None:
        _check_features(body["features"], body.get("token_ids"), issues)
        if not issues and _metadata_only(body) and body.get("ec_transfer_params") is None:
            msg = "Value error, multimodal items without kwargs_data need ec_transfer_params"
            issues.append(Issue("value_error", "body.features", msg, body["features"]))
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            issues.append(_type_issue("obj", "body.stream_options", options))
        else:
            issues.extend(
                _type_issue("bool", f"body.stream_options.{key}", options[key])
                for key in ("include_usage", "continuous_usage_stats")
                if key in options and not _kind_matches("bool?", options[key])
            )
    kwargs = body.get("reasoning_parser_kwargs")
    if kwargs is not None and not (
        isinstance(kwargs, dict)
        and set(kwargs) <= {"chat_template_kwargs"}
        and isinstance(kwargs.get("chat_template_kwargs", {}), dict)
    ):
        msg = "Invalid reasoning_parser_kwargs"
        issues.append(Issue("model_type", "body.reasoning_parser_kwargs", msg, kwargs))
    salt = body.get("cache_salt")
    if isinstance(salt, str) and not 1 <= len(salt) <= 1024:
        msg = "String should have between 1 and 1024 characters"
        issues.append(Issue("string_too_long", "body.cache_salt", msg, salt))


def validate(
    body: object, *, legacy: bool, modes: tuple[str, ...] = OUTPUT_MODES
) -> dict[str, Any]:
    """Check a generate body the way vLLM's request model does.

    Args:
        body: The parsed JSON body.
        legacy: Act like a vLLM that predates ``output_mode`` (the key is ignored).
        modes: The ``output_mode`` values the release takes (0.32: no ``derender``).

    Returns:
        The body, known to be well formed.

    Raises:
        RequestInvalidError: A field has the wrong type or value (vLLM's 400 ``Bad Request``).
    """
    if not isinstance(body, dict):
        msg = "Input should be a valid dictionary"
        raise RequestInvalidError([Issue("model_attributes_type", "body", msg, body)])
    issues: list[Issue] = []
    _check_token_ids(body, issues)
    sampling = body.get("sampling_params")
    if "sampling_params" not in body:
        issues.append(Issue("missing", "body.sampling_params", "Field required", body))
    elif not isinstance(sampling, dict):
        issues.append(_type_issue("obj", "body.sampling_params", sampling))
    else:
        for key, kind in _SAMPLING_KINDS.items():
            if key in sampling and not _kind_matches(kind, sampling[key]):
                issues.append(_type_issue(kind, f"body.sampling_params.{key}", sampling[key]))
    mode = body.get("output_mode", "tokens")
    if not legacy and mode not in modes:
        # pydantic's literal_error, as vLLM's handler prints it (captured from vLLM 0.32).
        quoted = [f"'{m}'" for m in modes]
        expected = f"{', '.join(quoted[:-1])} or {quoted[-1]}"
        ctx: dict[str, object] = {"expected": expected}
        msg = f"Input should be {expected}"
        issues.append(Issue("literal_error", "body.output_mode", msg, mode, ctx))
    if not legacy:
        # A vLLM older than output_mode has no parse_context either: it drops the key unread.
        _check_parse_context(body.get("parse_context"), issues)
    _check_other_fields(body, issues)
    if issues:
        raise RequestInvalidError(issues)
    sampling = body["sampling_params"]
    if not legacy and mode != "tokens" and sampling.get("detokenize", True) is False:
        # The model validator's failure, printed with its ValueError as vLLM's handler does.
        msg = f"output_mode={mode!r} requires sampling_params.detokenize to be true"
        error: dict[str, object] = {"error": ValueError(msg)}
        raise RequestInvalidError(
            [Issue("value_error", "body", f"Value error, {msg}", body, error)]
        )
    return body


_RANGES: Final[tuple[tuple[str, Callable[[Any], bool], str], ...]] = (
    ("n", lambda v: v >= 1, "n must be at least 1, got {v}."),
    ("presence_penalty", lambda v: -2 <= v <= 2, "presence_penalty must be in [-2, 2], got {v}."),
    ("frequency_penalty", lambda v: -2 <= v <= 2, "frequency_penalty must be in [-2, 2], got {v}."),
    ("repetition_penalty", lambda v: v > 0, "repetition_penalty must be positive, got {v}."),
    ("temperature", lambda v: 0 <= v <= 2, "temperature must be in [0, 2], got {v}."),
    ("top_p", lambda v: 0 < v <= 1, "top_p must be in (0, 1], got {v}."),
    ("top_k", lambda v: v >= -1, "top_k must be 0 (disable), or at least 1, got {v}."),
    ("min_p", lambda v: 0 <= v <= 1, "min_p must be in [0, 1], got {v}."),
    ("max_tokens", lambda v: v >= 1, "max_tokens must be at least 1, got {v}."),
    ("min_tokens", lambda v: v >= 0, "min_tokens must be greater than or equal to 0, got {v}."),
    ("logprobs", lambda v: v >= -1, "logprobs must be non-negative or -1, got {v}."),
)


def check_request(body: Mapping[str, Any], settings: WorkerSettings) -> None:
    """The refusals after validation, in the order vLLM 0.33 runs them.

    Args:
        body: A validated body.
        settings: The worker's settings.

    Raises:
        BadRequestError: vLLM's 400 ``BadRequestError``.
    """
    sampling: Mapping[str, Any] = body["sampling_params"]
    for key, ok, template in _RANGES:
        value = sampling.get(key)
        if value is not None and not ok(value):
            raise BadRequestError(template.format(v=value), key)
    temperature = sampling.get("temperature", 1.0)
    if temperature < GREEDY_TEMPERATURE and sampling.get("n", 1) > 1:
        msg = f"n must be 1 when using greedy sampling, got {sampling['n']}."
        raise BadRequestError(msg, "n")
    salt = body.get("cache_salt")
    if isinstance(salt, str) and (len(salt) > MAX_CACHE_SALT or any(c in salt for c in "@/\\\0")):
        msg = "cache_salt must be at most 128 characters without '@', '/', '\\' or NUL."
        raise BadRequestError(msg, "cache_salt")
    stream = body.get("stream") is True
    if stream and sampling.get("prompt_logprob_token_ids") is not None:
        msg = "prompt_logprob_token_ids is not supported with stream=true."
        raise BadRequestError(msg, "prompt_logprob_token_ids")
    mode = body.get("output_mode", "tokens")
    if mode == "derender" and stream:
        msg = "output_mode='derender' does not support stream=true."
        raise BadRequestError(msg)
    if mode == "derender" and body.get("parse_context") is None:
        # The simulated server has a tool and a reasoning parser (hermes, qwen3), as vLLM's would.
        msg = (
            "output_mode='derender' requires parse_context on a server with a tool or reasoning"
            " parser. Use the one returned by /render."
        )
        raise BadRequestError(msg)
    if mode == "derender":
        _chosen_tool(body["parse_context"])
    prompt_len = len(body["token_ids"])
    if prompt_len >= settings.max_model_len:
        msg = (
            f"The decoder prompt (length {prompt_len}) is longer than the maximum model length"
            f" of {settings.max_model_len}. Make sure that `max_model_len` is no smaller than the"
            " number of text tokens."
        )
        raise BadRequestError(msg)


def _chosen_tool(context: Mapping[str, Any]) -> Mapping[str, Any] | None:
    tools = context.get("tools") or []
    choice = context.get("tool_choice", "none")
    if not tools or choice is None or choice == "none":
        return None
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        for tool in tools:
            if tool["function"]["name"] == name:
                return dict(tool["function"])
        msg = f"tool_choice names the function {name!r}, which is not in tools."
        raise BadRequestError(msg, "tool_choice")
    return dict(tools[0]["function"])


_SAMPLE_VALUES: Final[dict[str, object]] = {
    "string": "Paris",
    "integer": 1,
    "number": 1.0,
    "boolean": True,
    "array": [],
    "object": {},
}


def _tool_arguments(function: Mapping[str, Any]) -> dict[str, object]:
    parameters = function.get("parameters")
    if not isinstance(parameters, dict):
        return {}
    properties = parameters.get("properties")
    if not isinstance(properties, dict):
        return {}
    required = parameters.get("required")
    names = required if isinstance(required, list) and required else list(properties)
    arguments: dict[str, object] = {}
    for name in names:
        schema = properties.get(name)
        kind = schema.get("type") if isinstance(schema, dict) else None
        arguments[str(name)] = _SAMPLE_VALUES.get(kind) if isinstance(kind, str) else None
    return arguments


def _structured_answer(sampling: Mapping[str, Any]) -> str | None:
    """The JSON text a request for structured output gets (``None``: it asked for none)."""
    outputs = sampling.get("structured_outputs")
    if not isinstance(outputs, dict):
        return None
    if isinstance(outputs.get("json"), dict):
        return json.dumps(instance(outputs["json"]))
    if outputs.get("json_object") is True:
        return "{}"
    return None


_TOOL_RESULTS_TURN: Final = tok.encode("</tool_response><|im_end|>\n<|im_start|>assistant\n")
"""How a prompt ends whose last turn is tool results (the template's generation prompt after it)."""
_THINKING_OFF: Final = tok.encode("<think>\n\n</think>\n\n")


def _answers_tool_results(prompt: list[int]) -> bool:
    """Whether the prompt's last turn is tool results.

    Chat ``tool`` messages, Messages ``tool_result`` blocks and Responses
    ``function_call_output`` items all render as one.
    """
    if prompt[-len(_THINKING_OFF) :] == _THINKING_OFF:
        prompt = prompt[: -len(_THINKING_OFF)]
    return prompt[-len(_TOOL_RESULTS_TURN) :] == _TOOL_RESULTS_TURN


def _called_tool(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The tool the model calls, if any.

    None after tool results unless ``tool_choice`` forces one, so an agent loop ends.
    """
    context: Mapping[str, Any] = body["parse_context"]
    if context.get("tool_choice") == "auto" and _answers_tool_results(body["token_ids"]):
        return None
    return _chosen_tool(context)


def _script(body: Mapping[str, Any], settings: WorkerSettings, mode: str) -> list[int]:
    """The tokens this deterministic model generates when nothing stops it."""
    structured = _structured_answer(body.get("sampling_params") or {})
    if mode != "derender":
        return [*tok.encode(structured or settings.answer), tok.IM_END]
    function = _called_tool(body)
    if structured is not None:
        answer = structured
    elif function is None:
        answer = settings.answer
    else:
        call = {"name": function["name"], "arguments": _tool_arguments(function)}
        answer = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    return [*tok.encode(f"<think>\n{settings.reasoning}\n</think>\n\n{answer}"), tok.IM_END]


@dataclasses.dataclass(frozen=True)
class _Choice:
    index: int
    tokens: list[int]
    finish_reason: str
    stop_reason: str | None = None
    """The stop string that ended the answer."""
    text_end: int | None = None
    """Where the stop string cuts the whole text (``None``: not cut)."""

    def visible(self) -> list[int]:
        # The EOS that stopped generation is never detokenized.
        if self.finish_reason == "stop" and self.tokens and self.tokens[-1] == tok.IM_END:
            return self.tokens[:-1]
        return self.tokens


def _stop_strings(sampling: Mapping[str, Any]) -> list[str]:
    stop = sampling.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    return [item for item in stops if isinstance(item, str) and item]


def _held_back(sampling: Mapping[str, Any]) -> int:
    """Characters a stream holds back while they could begin a stop string.

    vLLM's ``output_text_buffer_length``: the longest stop string's length less one.
    """
    stops = _stop_strings(sampling)
    if not stops or sampling.get("include_stop_str_in_output") is True:
        return 0
    return max(len(stop) for stop in stops) - 1


def _stopped(
    script: list[int], count: int, sampling: Mapping[str, Any], mode: str
) -> _Choice | None:
    """The answer a stop string ends within its first ``count`` tokens, else ``None``.

    As vLLM's detokenizer: after each token the new text is searched for each stop string in
    turn (the first found wins); the match ends generation with that token counted, and the text
    is cut before the string (after it with ``include_stop_str_in_output``). Text and tokens
    modes (derender parses the whole answer; stop strings are not played there).
    """
    stops = _stop_strings(sampling)
    if not stops or mode == "derender":
        return None
    skip = sampling.get("skip_special_tokens", True)
    include = sampling.get("include_stop_str_in_output") is True
    text = ""
    for length in range(1, count + 1):
        if script[length - 1] == tok.IM_END:
            return None  # the end of turn stops first
        before, text = len(text), tok.decode(script[:length], skip_special_tokens=skip)
        for stop in stops:
            found = text.find(stop, max(before - len(stop) + 1, 0))
            if found != -1:
                end = found + len(stop) if include else found
                return _Choice(0, script[:length], "stop", stop, end)
    return None


def _text(choice: _Choice, count: int, sampling: Mapping[str, Any]) -> str:
    visible = choice.visible()[:count]
    text = tok.decode(visible, skip_special_tokens=sampling.get("skip_special_tokens", True))
    if choice.text_end is None or count < len(choice.tokens):
        return text
    return text[: choice.text_end]  # cut once the stop string is found, on the whole text


def _shown(choice: _Choice, count: int, sampling: Mapping[str, Any]) -> str:
    """The text a stream has sent once ``count`` tokens are out: all of it at the end."""
    text = _text(choice, count, sampling)
    held = 0 if count == len(choice.tokens) else _held_back(sampling)
    return text[: len(text) - held] if held else text


def _message(
    choice: _Choice, context: Mapping[str, Any], request_id: str
) -> tuple[dict[str, Any], bool]:
    """The parsed assistant message (qwen3 reasoning + hermes tools), and whether it calls."""
    tokens = choice.visible()
    reasoning: str | None = None
    if tok.THINK_START in tokens[:1]:
        if tok.THINK_END in tokens:
            end = tokens.index(tok.THINK_END)
            reasoning, tokens = tok.decode(tokens[1:end]).strip("\n"), tokens[end + 1 :]
        else:
            reasoning, tokens = tok.decode(tokens[1:]).strip("\n"), []
    text = tok.decode(tokens).lstrip("\n")
    tool_calls: list[dict[str, Any]] = []
    start, end = text.find("<tool_call>"), text.find("</tool_call>")
    if 0 <= start < end:
        try:
            call = json.loads(text[start + len("<tool_call>") : end])
        except ValueError:
            call = None
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            digest = hashlib.sha256(f"{request_id}:{choice.index}".encode()).hexdigest()[:32]
            arguments = json.dumps(call.get("arguments", {}))
            tool_calls.append(
                {
                    "id": f"chatcmpl-tool-{digest}",
                    "type": "function",
                    "function": {"name": call["name"], "arguments": arguments},
                }
            )
            text = text[:start].strip()
    forced = context.get("tool_choice") == "required" or isinstance(
        context.get("tool_choice"), dict
    )
    content: str | None = text or ("" if forced else None)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if tool_calls:
        message["tool_calls"] = tool_calls
    message["reasoning"] = reasoning if context.get("include_reasoning", True) else None
    return message, bool(tool_calls)


def parsed_prefixes(
    tokens: list[int], finish_reason: str, context: Mapping[str, Any], request_id: str, index: int
) -> list[dict[str, Any]]:
    """The message the parser makes of each prefix of a choice's tokens, the whole one last.

    What a streaming parser has seen after each token: the derender mode's own parse
    (:func:`_message`), run on every prefix; a tool call not closed yet is held back, not
    shown as content (hermes' streaming parser sends nothing after ``<tool_call>``).

    Args:
        tokens: The choice's tokens.
        finish_reason: Why the choice ended (its last token's).
        context: The request's ``parse_context``.
        request_id: The answer's ``request_id`` (tool-call ids derive from it).
        index: The choice's index.

    Returns:
        One message per token.
    """
    messages = []
    for count in range(1, len(tokens) + 1):
        finish = finish_reason if count == len(tokens) else "length"
        message, _ = _message(_Choice(index, tokens[:count], finish), context, request_id)
        content = message["content"]
        if count < len(tokens) and isinstance(content, str) and "<tool_call>" in content:
            message["content"] = content[: content.index("<tool_call>")].strip()
        messages.append(message)
    return messages


def _alternatives(token: int, count: int) -> list[int]:
    return [alt for alt in _ALTERNATIVES if alt != token][:count]


def _logprob_entries(tokens: list[int], sampling: Mapping[str, Any]) -> list[tuple[int, list[int]]]:
    wanted = sampling["logprobs"]
    count = ALL_LOGPROBS if wanted == -1 else wanted
    # The engine's top list: the sampled token (rank 1) first, not cut to the request's count.
    return [(token, [token, *_alternatives(token, max(count - 1, 0))]) for token in tokens]


def _alt_logprob(rank: int) -> float:
    return -0.1 if rank == 1 else -2.0 - 0.5 * (rank - 1)


def _chat_logprob(token: int, logprob: float) -> dict[str, Any]:
    raw = tok.token_bytes(token)
    return {"token": raw.decode(errors="replace"), "logprob": logprob, "bytes": list(raw)}


def _logprobs(tokens: list[int], sampling: Mapping[str, Any], mode: str) -> dict[str, Any] | None:
    if sampling.get("logprobs") is None:
        return None
    content: list[dict[str, Any]] = []
    for token, top in _logprob_entries(tokens, sampling):
        if mode == "tokens":
            tops = [
                {"token_id": alt, "logprob": _alt_logprob(rank), "rank": rank}
                for rank, alt in enumerate(top, 1)
            ]
            content.append({"token_id": token, "logprob": -0.1, "rank": 1, "top_logprobs": tops})
            continue
        chat_tops = [_chat_logprob(alt, _alt_logprob(rank)) for rank, alt in enumerate(top, 1)]
        if mode == "derender":
            # Derender cuts the chat way: the request's count, everything for -1.
            wanted = sampling["logprobs"]
            chat_tops = chat_tops if wanted == -1 else chat_tops[:wanted]
        content.append({**_chat_logprob(token, -0.1), "top_logprobs": chat_tops})
    return {"content": content}


def _kv_answer(
    body: Mapping[str, Any], request_id: str, sequence: int, settings: WorkerSettings
) -> Any:  # noqa: ANN401 - JSON
    params = body.get("kv_transfer_params")
    if not (isinstance(params, dict) and params.get("do_remote_decode") is True):
        return None
    prompt_len = len(body["token_ids"])
    blocks = list(range(1, -(-prompt_len // BLOCK_SIZE) + 1))
    suffix = hashlib.sha256(f"{request_id}:{sequence}".encode()).hexdigest()[:8]
    # The key set and order of vLLM's NIXL pull connector (request_finished).
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [blocks],
        "remote_engine_id": settings.engine_id,
        "remote_request_id": f"{request_id}-{suffix}",
        "remote_host": "localhost",
        "remote_port": 5600,
        "tp_size": 1,
        "dcp_size": 1,
        "pp_size": 1,
        "remote_num_tokens": prompt_len,
        "remote_blocks_expiry_time": None,
        "remote_registration_generation": 0,
        "transfer_mode": "pull",
    }


def cached_prefix(prompt: list[int], earlier: Iterable[object]) -> int:
    """The tokens of ``prompt`` a prefix cache holding the ``earlier`` prompts would reuse.

    Whole blocks of the longest prefix shared with an earlier prompt, never the whole prompt
    (its last token is always computed), as vLLM's prefix cache reports them.
    """
    longest = 0
    for other in earlier:
        if not isinstance(other, list):
            continue
        shared = 0
        for mine, theirs in zip(prompt, other, strict=False):
            if mine != theirs:
                break
            shared += 1
        longest = max(longest, shared)
    return min(longest, len(prompt) - 1) // BLOCK_SIZE * BLOCK_SIZE


class PrefixCache:
    """The prompts a worker computed, which its prefix cache holds: one for every route."""

    def __init__(self) -> None:
        self._prompts: list[list[int]] = []

    def computed(self, prompt: list[int]) -> int:
        """The tokens of ``prompt`` the cache held (:func:`cached_prefix`); it holds it now.

        Args:
            prompt: The prompt a generation computes.

        Returns:
            The cached tokens.
        """
        cached = cached_prefix(prompt, self._prompts)
        self._prompts.append(list(prompt))
        return cached


@dataclasses.dataclass(frozen=True)
class Call:
    """Where a coupled route's generation runs: the call, and the worker's prefix cache."""

    header_id: str | None
    """The ``x-request-id`` header, if sent."""
    sequence: int
    """The call's position in the worker's log (makes ids unique yet repeatable)."""
    cache: PrefixCache
    """The worker's prefix cache."""


def _prompt_details(body: Mapping[str, Any], cached_tokens: int) -> dict[str, Any]:
    """``usage.prompt_tokens_details`` as vLLM with prompt token details reports it.

    The prefix cache's tokens, but none for a decode that pulls the prompt's KV from prefill
    (``do_remote_prefill``). vLLM 0.33's generate route writes no ``created_cache_tokens`` (its
    chat route does).
    """
    params = body.get("kv_transfer_params")
    pulled = isinstance(params, dict) and params.get("do_remote_prefill") is True
    cached = 0 if pulled else cached_tokens
    return {"cached_tokens": cached, "created_cache_tokens": None, "multimodal_tokens": None}


def _ec_answer(body: Mapping[str, Any], settings: WorkerSettings) -> Any:  # noqa: ANN401 - JSON
    """Where the encoder cache of the items this call encoded can be pulled from.

    A call that ran the encoder (features with data, no ``ec_transfer_params``) answers the
    simulated EC connector's params; a call that was handed them answers none.
    """
    encoded = _encoder_inputs(body)
    if not encoded or body.get("ec_transfer_params") is not None:
        return None
    return {
        "do_remote_encode": False,
        "mm_hashes": encoded,
        "remote_engine_id": settings.engine_id,
        "remote_host": "localhost",
        "remote_port": 5700,
    }


@dataclasses.dataclass(frozen=True)
class GenerateAnswer:
    """What the route answers: one JSON body, or the SSE events of a stream."""

    body: dict[str, Any] | None
    events: list[bytes] | None


def response_request_id(body: Mapping[str, Any], header_id: str | None) -> str:
    """The generate answer's ``request_id``: vLLM prefixes the header's id, else the body's.

    Args:
        body: The request body.
        header_id: The ``x-request-id`` header, if sent.

    Returns:
        ``generate-tokens-<id>``.
    """
    base = header_id if header_id is not None else body.get("request_id")
    return f"generate-tokens-{base if base is not None else uuid.uuid4().hex[:16]}"


def generate(  # noqa: PLR0913 - the body, then what the worker knows, by keyword
    body: Mapping[str, Any],
    settings: WorkerSettings,
    *,
    header_id: str | None,
    legacy: bool,
    sequence: int,
    cached_tokens: int = 0,
) -> GenerateAnswer:
    """Answer a validated, accepted generate body.

    Args:
        body: The request body (validated, refusals checked).
        settings: The worker's settings.
        header_id: The ``x-request-id`` header, if sent.
        legacy: Answer like a vLLM that predates ``output_mode``.
        sequence: The call's position in the worker's log (makes ids unique yet repeatable).
        cached_tokens: The prompt's tokens in the worker's prefix cache (:func:`cached_prefix`).

    Returns:
        The answer.
    """
    sampling: Mapping[str, Any] = body["sampling_params"]
    mode = "tokens" if legacy else body.get("output_mode", "tokens")
    request_id = response_request_id(body, header_id)
    prompt: list[int] = body["token_ids"]
    room = settings.max_model_len - len(prompt)
    cap = sampling.get("max_tokens")
    cap = room if cap is None else min(cap, room)
    script = _script(body, settings, mode)
    count = min(cap, len(script))
    finish = "stop" if count == len(script) else "length"
    ended = _stopped(script, count, sampling, mode) or _Choice(0, script[:count], finish)
    choices = [dataclasses.replace(ended, index=index) for index in range(sampling.get("n", 1))]
    details = _prompt_details(body, cached_tokens) if settings.prompt_tokens_details else None
    if body.get("stream") is True:
        # vLLM dumps its last usage chunk without its nulls (exclude_none): no
        # created_cache_tokens or multimodal_tokens in the details.
        written = None if details is None else {k: v for k, v in details.items() if v is not None}
        events = _stream(body, choices, request_id, mode, legacy=legacy, details=written)
        return GenerateAnswer(None, events)
    answer_choices = [_answer_choice(choice, body, mode, request_id) for choice in choices]
    completion = sum(len(choice.tokens) for choice in choices)
    answer: dict[str, Any] = {
        "request_id": request_id,
        "model": body.get("model") or settings.default_model,
        "created": settings.created if settings.created is not None else int(time.time()),
        "usage": {
            "prompt_tokens": len(prompt),
            "total_tokens": len(prompt) + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": details,
            "completion_tokens_details": None,
        },
        "prompt_logprobs": None,
        "prompt_token_id_logprobs": None,
        "prompt_token_ids": list(prompt) if body.get("return_token_ids") is True else None,
        "mm_placeholders": None,
        "metrics": None,
        "kv_transfer_params": _kv_answer(body, request_id, sequence, settings),
        "ec_transfer_params": _ec_answer(body, settings),
        "output_mode": mode,
        "choices": answer_choices,
    }
    if legacy:
        del answer["output_mode"]
    return GenerateAnswer(answer, None)


def _answer_choice(
    choice: _Choice, body: Mapping[str, Any], mode: str, request_id: str
) -> dict[str, Any]:
    sampling: Mapping[str, Any] = body["sampling_params"]
    finish = choice.finish_reason
    answer: dict[str, Any] = {
        "index": choice.index,
        "finish_reason": finish,
        "stop_reason": choice.stop_reason,
        "token_ids": list(choice.tokens),
        "routed_experts": None,
        "sampling_mask": None,
        "weight_versions": None,
    }
    logprobs = _logprobs(choice.tokens, sampling, mode)
    if mode == "text":
        answer["text"] = _text(choice, len(choice.tokens), sampling)
    elif mode == "derender":
        context: Mapping[str, Any] = body["parse_context"]
        message, calls = _message(choice, context, request_id)
        if calls and finish == "stop" and not isinstance(context.get("tool_choice"), dict):
            answer["finish_reason"] = "tool_calls"
        if not context.get("include_reasoning", True):
            # Hidden reasoning hides everything that would show it.
            answer["token_ids"] = None
            logprobs = None
        answer["message"] = message
    answer["logprobs"] = logprobs
    return answer


def _event(chunk: Mapping[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _stream(  # noqa: PLR0913 - the answer's parts, by keyword
    body: Mapping[str, Any],
    choices: list[_Choice],
    request_id: str,
    mode: str,
    *,
    legacy: bool,
    details: dict[str, Any] | None,
) -> list[bytes]:
    sampling: Mapping[str, Any] = body["sampling_params"]
    options = body.get("stream_options") or {}
    include_usage = options.get("include_usage") is True
    continuous = include_usage and options.get("continuous_usage_stats") is True
    prompt_len = len(body["token_ids"])
    events: list[bytes] = []
    first = True
    for step in range(max(len(choice.tokens) for choice in choices)):
        for choice in choices:
            if step >= len(choice.tokens):
                continue
            token = choice.tokens[step]
            last = step == len(choice.tokens) - 1
            delta: dict[str, Any] = {
                "index": choice.index,
                "finish_reason": choice.finish_reason if last else None,
                "stop_reason": choice.stop_reason if last else None,
                "token_ids": [token],
                "routed_experts": None,
                "sampling_mask": None,
                "weight_versions": None,
            }
            if mode == "text":
                before = _shown(choice, step, sampling)
                delta["text"] = _shown(choice, step + 1, sampling)[len(before) :]
            delta["logprobs"] = _logprobs([token], sampling, mode)
            usage = None
            if continuous:
                usage = {
                    "prompt_tokens": prompt_len,
                    "total_tokens": prompt_len + step + 1,
                    "completion_tokens": step + 1,
                    "prompt_tokens_details": None,  # the details come with the last usage
                    "completion_tokens_details": None,
                }
            chunk: dict[str, Any] = {"request_id": request_id, "usage": usage}
            if first and body.get("return_token_ids") is True:
                chunk["prompt_token_ids"] = list(body["token_ids"])
            first = False
            if not legacy:
                chunk["output_mode"] = mode
            chunk["choices"] = [delta]
            events.append(_event(chunk))
    if include_usage:
        completion = sum(len(choice.tokens) for choice in choices)
        counts: dict[str, Any] = {
            "prompt_tokens": prompt_len,
            "total_tokens": prompt_len + completion,
            "completion_tokens": completion,
        }
        # vLLM's last usage chunk names only the counts when it has no details.
        final: dict[str, Any] = {
            "request_id": request_id,
            "usage": counts if details is None else {**counts, "prompt_tokens_details": details},
        }
        if not legacy:
            final["output_mode"] = mode
        final["choices"] = []
        events.append(_event(final))
    events.append(b"data: [DONE]\n\n")
    return events

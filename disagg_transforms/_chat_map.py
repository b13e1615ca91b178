"""Client mappers: chat and completions fields into a generate leg's ``sampling_params``.

They also build the derender ``parse_context`` from a chat client's tools; a Responses or
Messages body only has its cap honoured for now (its mapper comes with its own issue).

The rules are vLLM 0.33's own ``to_sampling_params`` minus the server defaults: a field the client
did not set (or set to null) is not written, so the worker applies its own defaults exactly as it
would have on the client's route. The output cap and ``min_tokens`` are not mapped here
(:func:`disagg_transforms.caps.apply_sampling_caps` moves them), nor are the keys the leg builder
carries itself (:data:`CARRIED`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from disagg_transforms import _validate
from disagg_transforms import _wire as w
from disagg_transforms._client_map import ClientMapping
from disagg_transforms._describe import describe
from disagg_transforms.caps import TOP_LEVEL_CAPS
from disagg_transforms.envelopes import JSON
from disagg_transforms.errors import RequestError

CARRIED: frozenset[str] = frozenset(
    {
        w.MODEL,
        w.REQUEST_ID,
        w.STREAM,
        w.STREAM_OPTIONS,
        w.RETURN_TOKEN_IDS,
        w.CACHE_SALT,
        w.PRIORITY,
        w.KV_TRANSFER_PARAMS,
        w.EC_TRANSFER_PARAMS,
        w.MIN_TOKENS,
        *TOP_LEVEL_CAPS,
    }
)
"""Client keys the leg builder handles itself; a mapper neither maps nor reports them."""

# Fields copied under the same name into `sampling_params`, with the type vLLM's
# `SamplingParams` gives them (checked so a wrong type is refused at the client's own path).
_COPIED: Mapping[str, Any] = {
    "n": int,
    "presence_penalty": float,
    "frequency_penalty": float,
    "repetition_penalty": float,
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "seed": int,
    "stop": str | list[str],
    "stop_token_ids": list[int],
    "ignore_eos": bool,
    "skip_special_tokens": bool,
    "spaces_between_special_tokens": bool,
    "include_stop_str_in_output": bool,
    "logit_bias": dict[str, float],
    "bad_words": list[str],
    "allowed_token_ids": list[int],
    "thinking_token_budget": int,
    "repetition_detection": dict[str, JSON],
    "stream_interval": int,
    "routed_experts_prompt_start": int,
    "watermarking": bool,
    "prompt_logprobs": int,
    "logprob_token_ids": list[int],
}

_PARSE_CONTEXT_TYPES: Mapping[str, Any] = {
    w.TOOLS: list[dict[str, JSON]],
    w.TOOL_CHOICE: str | dict[str, JSON],
    w.PARALLEL_TOOL_CALLS: bool,
    w.CHAT_TEMPLATE_KWARGS: dict[str, JSON],
    w.INCLUDE_REASONING: bool,
}
"""Chat keys that become ``parse_context`` (a derender worker's parser inputs)."""

# Keys that only say something when set to a true value the generate route cannot honour: an
# explicit false / null is the default and is dropped quietly.
_REFUSED_WHEN_SET: Mapping[str, str] = {
    w.ECHO: "the generate route cannot echo the prompt back",
    w.USE_BEAM_SEARCH: "the generate route has no beam search",
    w.LENGTH_PENALTY: "the generate route has no beam search",
}


def _checked(body: Mapping[str, Any], key: str, view: Any) -> Any:  # noqa: ANN401 - JSON value
    value = body[key]
    _validate.convert(value, view, f"$.{key}")
    return value


def _copied_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    return {
        key: _checked(body, key, view) for key, view in _COPIED.items() if body.get(key) is not None
    }


def _refuse_unhonoured(body: Mapping[str, Any]) -> None:
    for key, reason in _REFUSED_WHEN_SET.items():
        value = body.get(key)
        if value is not None and value is not False:
            msg = f"$.{key}: {describe(value)} is refused: {reason}"
            raise RequestError(msg, param=f"$.{key}")


def _chat_logprobs(body: Mapping[str, Any], sampling: dict[str, Any]) -> None:
    # vLLM: `logprobs: true` + `top_logprobs: k` -> `logprobs = k` (0 when k is unset), unless
    # `logprob_token_ids` asks for specific tokens; `logprobs: false` -> no logprobs.
    wanted = _validate.optional_bool(body, w.LOGPROBS)
    top = body.get(w.TOP_LOGPROBS)
    if top is not None:
        top = _validate.whole_number(top, f"$.{w.TOP_LOGPROBS}", minimum=-1)
        if not wanted and top != 0:
            msg = f"$.{w.TOP_LOGPROBS}: {describe(top)} needs logprobs set to true"
            raise RequestError(msg, param=f"$.{w.TOP_LOGPROBS}")
    if w.LOGPROB_TOKEN_IDS in sampling:
        if not wanted:
            msg = f"$.{w.LOGPROB_TOKEN_IDS}: needs logprobs set to true"
            raise RequestError(msg, param=f"$.{w.LOGPROB_TOKEN_IDS}")
        return
    if wanted:
        sampling[w.LOGPROBS] = 0 if top is None else top


def _completions_logprobs(body: Mapping[str, Any], sampling: dict[str, Any]) -> None:
    # Completions already send the number of alternatives as `logprobs`.
    value = body.get(w.LOGPROBS)
    if value is not None:
        sampling[w.LOGPROBS] = _validate.whole_number(value, f"$.{w.LOGPROBS}", minimum=-1)


def _from_response_format(value: object) -> dict[str, Any]:
    path = f"$.{w.RESPONSE_FORMAT}"
    response_format = _validate.mapping(value, path)
    kind = response_format.get(w.TYPE)
    if kind == "text":
        return {}
    if kind == w.JSON_OBJECT:
        return {w.JSON_OBJECT: True}
    if kind == w.JSON_SCHEMA:
        spec = _validate.mapping(response_format.get(w.JSON_SCHEMA), f"{path}.{w.JSON_SCHEMA}")
        schema_path = f"{path}.{w.JSON_SCHEMA}.{w.SCHEMA}"
        return {w.JSON_KEY: _validate.mapping(spec.get(w.SCHEMA), schema_path)}
    if kind == w.STRUCTURAL_TAG:
        # vLLM hands the structural tag to the grammar backend as the request's JSON text.
        return {w.STRUCTURAL_TAG: json.dumps(response_format)}
    msg = (
        f"{path}.{w.TYPE}: expected text, json_object, json_schema or structural_tag, "
        f"got {describe(kind)}"
    )
    raise RequestError(msg, param=f"{path}.{w.TYPE}")


def _structured_outputs(body: Mapping[str, Any], sampling: dict[str, Any]) -> None:
    given = _validate.optional_mapping(body, w.STRUCTURED_OUTPUTS, "$")
    merged = dict(given or {})
    if body.get(w.RESPONSE_FORMAT) is not None:
        merged.update(_from_response_format(body[w.RESPONSE_FORMAT]))
    if merged:
        sampling[w.STRUCTURED_OUTPUTS] = merged


def _extra_args(body: Mapping[str, Any], sampling: dict[str, Any]) -> None:
    # vLLM passes `vllm_xargs` to the engine as `sampling_params.extra_args`.
    xargs = _validate.optional_mapping(body, w.VLLM_XARGS, "$")
    if xargs is not None:
        sampling[w.EXTRA_ARGS] = dict(xargs)


def _parse_context(body: Mapping[str, Any]) -> dict[str, Any]:
    context = {
        key: _checked(body, key, view)
        for key, view in _PARSE_CONTEXT_TYPES.items()
        if body.get(key) is not None
    }
    # vLLM's chat default: tools without a tool_choice means the model may call them.
    if context.get(w.TOOLS) and w.TOOL_CHOICE not in context:
        context[w.TOOL_CHOICE] = w.TOOL_CHOICE_AUTO
    return context


def _dropped(body: Mapping[str, Any], used: frozenset[str]) -> tuple[str, ...]:
    return tuple(key for key in body if key not in used and key not in CARRIED)


_CHAT_USED = frozenset(
    {
        *_COPIED,
        *_PARSE_CONTEXT_TYPES,
        w.LOGPROBS,
        w.TOP_LOGPROBS,
        w.RESPONSE_FORMAT,
        w.STRUCTURED_OUTPUTS,
        w.VLLM_XARGS,
    }
)
_COMPLETIONS_USED = frozenset(
    {*_COPIED, w.LOGPROBS, w.RESPONSE_FORMAT, w.STRUCTURED_OUTPUTS, w.VLLM_XARGS}
)


def _sampling(
    body: Mapping[str, Any], logprobs: Callable[[Mapping[str, Any], dict[str, Any]], None]
) -> dict[str, Any]:
    """The ``sampling_params`` fields of a chat or completions body (they differ in logprobs)."""
    _refuse_unhonoured(body)
    sampling = _copied_fields(body)
    logprobs(body, sampling)
    _structured_outputs(body, sampling)
    _extra_args(body, sampling)
    return sampling


def map_chat_request(body: Mapping[str, Any]) -> ClientMapping:
    """Map a chat-completions body's sampling fields and tools (see ``docs/request-legs.md``)."""
    body = _validate.mapping(body, "$")
    return ClientMapping(
        sampling_params=_sampling(body, _chat_logprobs),
        parse_context=_parse_context(body),
        dropped=_dropped(body, _CHAT_USED),
    )


def map_completions_request(body: Mapping[str, Any]) -> ClientMapping:
    """Map a completions body's sampling fields (``logprobs`` is already a count there)."""
    body = _validate.mapping(body, "$")
    return ClientMapping(
        sampling_params=_sampling(body, _completions_logprobs),
        dropped=_dropped(body, _COMPLETIONS_USED),
    )


def map_caps_only(body: Mapping[str, Any]) -> ClientMapping:
    """Interim mapper for Responses and Messages: only the cap is honoured (by the builder).

    Every other field is reported as dropped until the route's own mapper replaces this one.
    """
    body = _validate.mapping(body, "$")
    return ClientMapping(sampling_params={}, dropped=_dropped(body, frozenset()))

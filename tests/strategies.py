"""Testing strategies for Hypothesis-based tests: the one home of every strategy."""

from __future__ import annotations

import ipaddress
import json
from operator import add, itemgetter
from typing import Any

import msgspec
from hypothesis import strategies as st

from disagg_transforms import LegInputs

# JSON scalars as a client could send them (no NaN: JSON has none; the hostile strategies
# below add those literals on purpose).
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)

json_values: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)

# Anything a config loader could hand over: JSON values plus tuples and non-string keys.
config_values: st.SearchStrategy[Any] = json_values | st.tuples(json_scalars) | st.floats()

config_mappings: st.SearchStrategy[dict[Any, Any]] = st.dictionaries(
    st.sampled_from(
        [
            "use_openai_format",
            "output_mode",
            "wrap_chat_completion",
            "kv_transfer_placement",
            "trust_client_transfer_params",
        ]
    )
    | st.text(max_size=12)
    | st.integers(),
    config_values
    | st.sampled_from(["text", "derender", "tokens", "both", "top_level", "extra_args"]),
    max_size=5,
)

step_names = st.sampled_from(["encode", "prefill", "decode", "conditional-decode"]) | st.text(
    max_size=20
)

paths = st.text() | st.sampled_from(
    [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/inference/v1/generate",
        "/v1/chat/completions/render",
        "/prefix/v1/messages?beta=true",
        "",
    ]
)

# --------------------------------------------------------------------------------------------
# Response side: generate responses (text / derender) and generate SSE streams

GENERATE_ONLY_TOP_KEYS = (
    "request_id",
    "output_mode",
    "kv_transfer_params",
    "ec_transfer_params",
    "prompt_token_ids",
    "prompt_token_id_logprobs",
    "mm_placeholders",
    "metrics",
)
GENERATE_ONLY_CHOICE_KEYS = ("token_ids", "weight_versions", "routed_experts", "sampling_mask")
VLLM_FINISH_REASONS = ("stop", "length", "tool_calls", "abort", "repetition")

_tokens = st.text(max_size=6)
_logprob = st.floats(min_value=-50, max_value=0)


@st.composite
def chat_logprobs(draw: st.DrawFn) -> dict[str, Any]:
    """Chat-shaped logprobs, top lists longer than a client usually asks (as vLLM sends)."""
    entries = []
    for _ in range(draw(st.integers(0, 3))):
        tops = [
            {"token": draw(_tokens), "logprob": draw(_logprob), "bytes": None}
            for _ in range(draw(st.integers(0, 4)))
        ]
        entries.append(
            {"token": draw(_tokens), "logprob": draw(_logprob), "bytes": [1], "top_logprobs": tops}
        )
    return {"content": entries}


_tool_calls = st.lists(
    st.fixed_dictionaries(
        {
            "id": st.text(min_size=1, max_size=8),
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {"name": st.text(min_size=1, max_size=8), "arguments": st.text(max_size=12)}
            ),
        }
    ),
    min_size=1,
    max_size=3,
    unique_by=itemgetter("id"),
)

# Unknown keys a newer vLLM could add; the names never collide with a chat field.
_extra_fields = st.dictionaries(st.sampled_from(["x_new", "y_future", "z_more"]), json_values)


@st.composite
def generate_messages(draw: st.DrawFn) -> dict[str, Any]:
    """A derendered assistant message: content, reasoning, tool calls, unknown keys."""
    message: dict[str, Any] = {"role": "assistant", "content": draw(st.none() | st.text())}
    if draw(st.booleans()):
        message["reasoning"] = draw(st.none() | st.text())
    if draw(st.booleans()):
        message["tool_calls"] = draw(_tool_calls)
    if draw(st.booleans()):
        message["x_parser_note"] = draw(json_values)
    return message


@st.composite
def generate_responses(draw: st.DrawFn, mode: str) -> dict[str, Any]:
    """A valid non-streaming generate response in ``mode`` ("text" or "derender")."""
    n = draw(st.integers(1, 4))
    indices = draw(st.permutations(list(range(n))))
    choices = []
    for index in indices:
        choice: dict[str, Any] = {
            "index": index,
            "finish_reason": draw(st.sampled_from(VLLM_FINISH_REASONS)),
            "stop_reason": draw(st.none() | st.integers(0, 10) | st.text(max_size=3)),
            "token_ids": draw(st.lists(st.integers(0, 2**31), max_size=4)),
            "routed_experts": None,
            "sampling_mask": None,
            "weight_versions": [{"version": "v1", "start": 0, "end": 1}],
            "logprobs": draw(st.none() | chat_logprobs()),
        }
        if mode == "text":
            choice["text"] = draw(st.text())
        else:
            choice["message"] = draw(generate_messages())
        choice.update(draw(_extra_fields))
        choices.append(choice)
    response: dict[str, Any] = {
        "request_id": draw(st.sampled_from(["generate-tokens-chatcmpl-", "chatcmpl-", ""]))
        + draw(st.text(max_size=8)),
        "model": draw(st.none() | st.text(min_size=1, max_size=10)),
        "created": draw(st.none() | st.integers(0, 2**40)),
        "usage": {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2},
        "prompt_logprobs": None,
        "prompt_token_id_logprobs": None,
        "prompt_token_ids": draw(st.none() | st.lists(st.integers(0, 99), max_size=3)),
        "mm_placeholders": None,
        "metrics": draw(st.none() | st.just({"queue_time_ms": 1.0})),
        "kv_transfer_params": draw(st.none() | st.just({"remote_host": "10.0.0.1"})),
        "ec_transfer_params": None,
        "output_mode": mode,
        "choices": choices,
    }
    response.update(draw(_extra_fields))
    return response


@st.composite
def generate_text_streams(draw: st.DrawFn) -> bytes:
    """A valid text-mode generate SSE stream: interleaved choices, usage chunk, ``[DONE]``."""
    n = draw(st.integers(1, 3))
    pending = {
        index: draw(st.lists(st.text(max_size=5), min_size=1, max_size=3)) for index in range(n)
    }
    events: list[dict[str, Any]] = []
    while pending:
        index = draw(st.sampled_from(sorted(pending)))
        text = pending[index].pop(0)
        last = not pending[index]
        if last:
            del pending[index]
        choice = {
            "index": index,
            "finish_reason": draw(st.sampled_from(VLLM_FINISH_REASONS)) if last else None,
            "stop_reason": None,
            "token_ids": [7],
            "text": text,
            "logprobs": draw(st.none() | chat_logprobs()),
        }
        events.append(
            {"request_id": "generate-tokens-r", "output_mode": "text", "choices": [choice]}
        )
    if draw(st.booleans()):
        events.append(
            {
                "request_id": "generate-tokens-r",
                "usage": {"prompt_tokens": 1, "total_tokens": 2, "completion_tokens": 1},
                "output_mode": "text",
                "choices": [],
            }
        )
    separator = draw(st.sampled_from([b"\n\n", b"\r\n\r\n", b"\r\r"]))
    body = b"".join(
        b"data: " + json.dumps(event, ensure_ascii=False).encode() + separator for event in events
    )
    return body + b"data: [DONE]" + separator


# Generate responses for the Responses / Anthropic envelopes, and their client bodies.

FINISH_REASONS = ["stop", "length", "tool_calls", "abort", "repetition"]

_ids = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=16)
_counts = st.integers(min_value=0, max_value=2**31)

_generate_usage = st.fixed_dictionaries(
    {"prompt_tokens": _counts, "completion_tokens": _counts, "total_tokens": _counts},
    optional={
        "prompt_tokens_details": st.none() | st.fixed_dictionaries({"cached_tokens": _counts}),
        "completion_tokens_details": st.none()
        | st.fixed_dictionaries({"reasoning_tokens": _counts}),
    },
)

# Fields a generate response carries that no client envelope may show.
_generate_only_extras = st.fixed_dictionaries(
    {},
    optional={
        "prompt_token_ids": st.none() | st.lists(st.integers(0, 2**20), max_size=4),
        "metrics": st.none() | st.fixed_dictionaries({"ttft": st.floats(0, 10)}),
        "kv_transfer_params": st.none() | st.fixed_dictionaries({"remote_engine_id": _ids}),
        "ec_transfer_params": st.none(),
        "mm_placeholders": st.none(),
        "prompt_logprobs": st.none(),
        "prompt_token_id_logprobs": st.none(),
        "vllm_future_field": json_values,
    },
)

_choice_extras = st.fixed_dictionaries(
    {"token_ids": st.lists(st.integers(0, 2**20), max_size=4)},
    optional={
        "weight_versions": st.none(),
        "routed_experts": st.none(),
        "sampling_mask": st.none(),
        "vllm_future_choice_field": json_values,
    },
)

json_object_args = st.dictionaries(st.text(max_size=8), json_values, max_size=4).map(json.dumps)

_tool_call = st.fixed_dictionaries(
    {
        "id": _ids,
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": st.text(min_size=1, max_size=12), "arguments": json_object_args}
        ),
    }
)


def _response(mode: str, choice: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[Any]:
    def build(parts: tuple[Any, ...]) -> dict[str, Any]:
        request_id, model, created, usage, extras, one_choice, choice_extras = parts
        return {
            "request_id": "generate-tokens-" + request_id,
            "model": model,
            "created": created,
            "usage": usage,
            **extras,
            "output_mode": mode,
            "choices": [{**choice_extras, **one_choice}],
        }

    return st.tuples(
        _ids,
        st.text(min_size=1, max_size=20),
        st.integers(0, 2**33),
        _generate_usage,
        _generate_only_extras,
        choice,
        _choice_extras,
    ).map(build)


_finish = st.fixed_dictionaries(
    {
        "index": st.just(0),
        "finish_reason": st.sampled_from(FINISH_REASONS),
        "stop_reason": st.none() | st.integers(0, 2**20) | st.text(max_size=4),
    }
)

generate_text_responses = _response(
    "text",
    st.tuples(_finish, st.text()).map(lambda parts: {**parts[0], "text": parts[1]}),
)

_derender_optional: dict[str, st.SearchStrategy[Any]] = {
    "reasoning": st.none() | st.text(),
    # vLLM's tool-call ids are unique (uuids); the SDKs' stream accumulators rely on it.
    "tool_calls": st.lists(_tool_call, min_size=1, max_size=3, unique_by=itemgetter("id")),
    "refusal": st.none(),
    "annotations": st.none(),
    "audio": st.none(),
    "function_call": st.none(),
}
_derender_message = st.fixed_dictionaries(
    {"role": st.just("assistant"), "content": st.none() | st.text()},
    optional=_derender_optional,
)

generate_derender_responses = _response(
    "derender",
    st.tuples(_finish, _derender_message).map(lambda parts: {**parts[0], "message": parts[1]}),
)

# (response, output_mode value)
generate_envelope_responses = generate_text_responses.map(lambda r: (r, "text")) | (
    generate_derender_responses.map(lambda r: (r, "derender"))
)

_responses_keys = [
    "model", "input", "instructions", "temperature", "top_p", "top_k", "seed", "stop",
    "tools", "tool_choice", "parallel_tool_calls", "reasoning", "text", "include",
    "top_logprobs", "previous_response_id", "conversation", "background", "store",
    "structured_outputs", "vllm_xargs", "logit_bias", "metadata", "max_output_tokens",
]  # fmt: skip
_messages_keys = [
    "model", "messages", "system", "max_tokens", "temperature", "top_p", "top_k",
    "stop_sequences", "tools", "tool_choice", "thinking", "output_config", "metadata",
    "chat_template_kwargs", "stream",
]  # fmt: skip


def _client_bodies(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(keys) | st.text(max_size=8), json_values, max_size=8)


responses_client_bodies = _client_bodies(_responses_keys)
messages_client_bodies = _client_bodies(_messages_keys)


# Hooks: bodies a pipeline runs over (JSON objects, possibly with tuples and shared subtrees).
json_objects: st.SearchStrategy[dict[str, Any]] = st.dictionaries(
    st.text(max_size=8), json_values | st.tuples(json_values, json_values), max_size=6
)


# ---- request legs: client bodies, caps, token IDs ----

cap_values = (
    st.none()
    | st.integers(min_value=-3, max_value=300)
    | st.floats(allow_nan=False, max_value=300)
    | st.booleans()
    | st.text(max_size=3)
)

cap_bodies: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {},
    optional={
        "max_tokens": cap_values,
        "max_completion_tokens": cap_values,
        "max_output_tokens": cap_values,
        "min_tokens": cap_values,
        "sampling_params": st.none()
        | st.fixed_dictionaries({}, optional={"max_tokens": cap_values, "min_tokens": cap_values})
        | json_values,
        "model": st.text(max_size=5),
    },
)

token_id_lists = st.lists(st.integers(min_value=0, max_value=2**63 - 1), min_size=1, max_size=8)

# A token_ids array as JSON text, the way a client may spell it: IDs of any size, negatives,
# fractions, exponents, the other JSON values, nesting, and JSON whitespace anywhere it may go.
_json_whitespace = st.text(alphabet=" \t\n\r", max_size=2)
_token_id_literals = (
    st.integers(min_value=0, max_value=2**63 - 1).map(str)
    | st.integers().map(str)
    | st.integers(min_value=2**63 - 2, max_value=2**80).map(str)
    | st.floats(allow_nan=False, allow_infinity=False).map(json.dumps)
    | st.sampled_from(
        ["5.0", "-0", "1e2", "1E2", "1e+2", "2E-1", "0e0", "true", "false", "null", '"3"', "[]"]
    )
    | st.sampled_from(["[1]", "[ 2 , 3 ]", "{}", '{"a": 1}', "-1", "9223372036854775808"])
)


@st.composite
def _token_id_array(draw: st.DrawFn) -> bytes:
    items = draw(st.lists(st.tuples(_json_whitespace, _token_id_literals, _json_whitespace)))
    inner = ",".join(before + item + after for before, item, after in items)
    return f"[{draw(_json_whitespace)}{inner}{draw(_json_whitespace)}]".encode()


token_id_arrays: st.SearchStrategy[bytes] = _token_id_array() | st.sampled_from(
    [b"7", b'"[1]"', b"null", b"{}", b"[]", b"[ \n]"]
)

_transfer_values = st.dictionaries(st.sampled_from(["remote_host", "remote_port"]), json_scalars)

router_leg_inputs = st.builds(
    LegInputs,
    token_ids=st.none() | token_id_lists,
    kv_transfer_params=st.none() | st.just({"remote_host": "router", "remote_port": 2}),
    request_id=st.none() | st.just("r-1"),
)
"""What a router hands a leg builder besides the client's body: each input given or not."""

client_request_bodies: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {},
    optional={
        "model": st.text(max_size=5) | json_scalars,
        "messages": st.just([{"role": "user", "content": "hi"}]),
        "prompt": st.text(max_size=5),
        "token_ids": token_id_lists | json_values,
        "sampling_params": st.fixed_dictionaries(
            {},
            optional={
                "max_tokens": cap_values,
                "temperature": st.floats(0, 2),
                "detokenize": st.booleans(),
                "extra_args": st.fixed_dictionaries(
                    {}, optional={"kv_transfer_params": _transfer_values}
                ),
            },
        )
        | json_values,
        "max_tokens": cap_values,
        "max_completion_tokens": cap_values,
        "max_output_tokens": cap_values,
        "min_tokens": cap_values,
        "temperature": st.floats(0, 2) | json_scalars,
        "top_p": st.floats(0.1, 1) | json_scalars,
        "seed": st.integers(0, 99) | json_scalars,
        "stop": st.text(min_size=1, max_size=3) | json_values,
        "logprobs": st.booleans() | json_scalars,
        "top_logprobs": st.integers(0, 5) | json_scalars,
        "response_format": st.sampled_from(
            [{"type": "json_object"}, {"type": "text"}, {"type": "bogus"}]
        )
        | json_values,
        "tools": st.sampled_from([[{"type": "function", "function": {"name": "f"}}], []])
        | json_values,
        "tool_choice": st.sampled_from(["auto", "none"]),
        "stream": st.booleans() | json_scalars,
        "stream_options": st.just({"include_usage": True}) | json_values,
        "kv_transfer_params": _transfer_values | json_values,
        "ec_transfer_params": _transfer_values,
        "vllm_xargs": st.fixed_dictionaries(
            {}, optional={"kv_transfer_params": _transfer_values, "lora": st.text(max_size=3)}
        ),
        "cache_salt": st.text(min_size=1, max_size=4),
        "priority": st.integers(-2, 2),
        "request_id": st.text(max_size=4),
    },
).flatmap(
    lambda body: st.dictionaries(st.text(max_size=6), json_values, max_size=3).map(
        lambda extra: {**extra, **body}
    )
)

# A generate client's body as vLLM serialises a GenerateRequest (the members in its order, most
# null), each member also drawn off that common shape: set where a rule rewrites it, a wrong
# type, a cap elsewhere, transfer params, tools, streaming; the keys then shuffled and unknown
# keys added.
_generate_sampling = st.fixed_dictionaries(
    {},
    optional={
        "presence_penalty": st.just(0.0),
        "repetition_penalty": st.just(1.0),
        "temperature": st.floats(0, 2) | json_scalars,
        "top_p": st.just(0.9),
        "seed": st.none() | st.integers(0, 9),
        "stop": st.just([]) | st.lists(st.text(max_size=2), max_size=2),
        "stop_token_ids": st.just([]),
        "output_kind": st.just(2),
        "skip_clone": st.booleans(),
        "bad_words": st.just([]),
        "skip_reading_prefix_cache": st.booleans(),
        "n": st.integers(1, 3) | json_scalars,
        "logprobs": st.none() | st.integers(0, 2),
        "max_tokens": cap_values,
        "min_tokens": cap_values,
        "detokenize": st.booleans(),
        "extra_args": st.none()
        | st.fixed_dictionaries({}, optional={"kv_transfer_params": _transfer_values}),
    },
)
_generate_members = {
    "request_id": st.none() | st.text(max_size=4),
    "token_offsets": st.none() | st.just([[0, 1]]),
    "features": st.none() | json_values,
    "content_parts": st.none(),
    "sampling_params": _generate_sampling | json_values,
    "model": st.none() | st.just("Qwen/Qwen3-0.6B") | json_scalars,
    "max_tokens": cap_values,
    "max_completion_tokens": cap_values,
    "min_tokens": cap_values,
    "reasoning_ended": st.none() | st.booleans(),
    "reasoning_parser_kwargs": st.none() | st.just({}),
    "return_token_ids": st.none() | st.booleans() | json_scalars,
    "output_mode": st.none() | st.sampled_from(["text", "tokens", "derender", "auto", "x"]),
    "parse_context": st.none()
    | st.just({"tools": [{"type": "function", "function": {"name": "f"}}]})
    | json_values,
    "stream": st.none() | st.booleans() | json_scalars,
    "stream_options": st.none() | st.just({"include_usage": True}) | json_values,
    "cache_salt": st.none() | st.text(min_size=1, max_size=4),
    "priority": st.integers(-2, 2) | json_scalars,
    "kv_transfer_params": st.none() | _transfer_values | json_values,
    "ec_transfer_params": st.none() | _transfer_values,
    "vllm_xargs": st.none()
    | st.fixed_dictionaries({}, optional={"kv_transfer_params": _transfer_values}),
}

generate_request_bodies: st.SearchStrategy[dict[str, Any]] = (
    st.fixed_dictionaries(
        {"token_ids": token_id_lists | st.sampled_from([[], None, "1", [1.0]])},
        optional=_generate_members,
    )
    .flatmap(lambda body: st.sampled_from([body, dict(reversed(body.items()))]))
    .flatmap(
        lambda body: st.dictionaries(st.text(max_size=6), json_values, max_size=2).map(
            lambda extra: {**body, **extra}
        )
    )
)
"""A generate client's body, of the common shape vLLM serialises or off it anywhere."""

_common_render_answers = st.fixed_dictionaries(
    {
        "token_ids": token_id_lists,
        "sampling_params": st.fixed_dictionaries(
            {},
            optional={
                "temperature": st.floats(0, 2),
                "stop": st.just([]),
                "max_tokens": st.none() | st.integers(1, 300),
                "skip_special_tokens": st.booleans(),
                "extra_args": st.none() | st.just({}),
            },
        ),
    },
    optional={
        "request_id": st.text(max_size=4),
        **dict.fromkeys(["token_offsets", "features", "content_parts"], st.none()),
        "model": st.none() | st.just("Qwen/Qwen3-0.6B"),
        "reasoning_ended": st.none() | st.booleans(),
        "return_token_ids": st.none() | st.booleans(),
        "output_mode": st.just("tokens"),
        "parse_context": st.none()
        | st.just({"tools": [{"type": "function", "function": {"name": "f"}}]}),
        "stream": st.just(False),  # noqa: FBT003 - a JSON value
        "stream_options": st.none() | st.just({"include_usage": True}),
        "cache_salt": st.none() | st.text(min_size=1, max_size=4),
        "priority": st.just(0),
        **dict.fromkeys(["kv_transfer_params", "ec_transfer_params"], st.none()),
    },
)
render_answers: st.SearchStrategy[dict[str, Any]] = (
    _common_render_answers
    | st.tuples(_common_render_answers, st.sampled_from(sorted(_generate_members))).flatmap(
        lambda pair: _generate_members[pair[1]].map(lambda value: {**pair[0], pair[1]: value})
    )
    | generate_request_bodies
)
"""What vLLM's ``/render`` answers: its common shape, that shape with one member drawn off it,
or any generate body."""

_TOOLS_CONTEXT = {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"}
_vllm_sampling = st.fixed_dictionaries(
    {"temperature": st.floats(0, 2) | st.integers(0, 2)},
    optional={
        "stop": st.just([]) | st.lists(st.text(max_size=2), max_size=2),
        # The view's types bound the cap: at and past the largest token ID.
        "max_tokens": st.none()
        | st.integers(1, 300)
        | cap_values
        | st.sampled_from([2**63 - 1, 2**63]),
        "skip_special_tokens": st.booleans(),
        "output_kind": st.just(2),
        "extra_args": st.none()
        | st.just({})
        | st.just({"kv_transfer_params": {}})
        | st.just({"other": 1}),
        "detokenize": st.booleans(),
        "min_tokens": cap_values,
        "logit_bias": st.just({"1": 0.5}),
        "not_a_field": json_values,
    },
)
_common_vllm_answers = st.fixed_dictionaries(
    {
        "request_id": st.text(max_size=4),
        "token_ids": token_id_lists,
        **dict.fromkeys(["token_offsets", "features", "content_parts"], st.none()),
        "sampling_params": _vllm_sampling,
        "model": st.none() | st.just("Qwen/Qwen3-0.6B"),
        "reasoning_ended": st.none() | st.booleans(),
        "reasoning_parser_kwargs": st.none() | st.just({"chat_template_kwargs": {"a": True}}),
        "return_token_ids": st.none() | st.booleans(),
        "output_mode": st.just("tokens"),
        "parse_context": st.none() | st.just(_TOOLS_CONTEXT),
        "stream": st.booleans(),
        "stream_options": st.none()
        | st.just({"include_usage": True, "continuous_usage_stats": True}),
        "cache_salt": st.none() | st.text(min_size=1, max_size=4),
        "priority": st.just(0) | st.integers(-2, 2),
        **dict.fromkeys(["kv_transfer_params", "ec_transfer_params"], st.none()),
    }
)
_vllm_answers = (
    _common_vllm_answers
    # vLLM 0.32 has no parse_context.
    | _common_vllm_answers.map(lambda body: {k: v for k, v in body.items() if k != "parse_context"})
    # One member drawn off the common shape (or one more), in vLLM's order or reversed.
    | st.tuples(_common_vllm_answers, st.sampled_from(sorted(_generate_members))).flatmap(
        lambda pair: _generate_members[pair[1]].map(lambda value: {**pair[0], pair[1]: value})
    )
    | _common_vllm_answers.map(lambda body: dict(reversed(body.items())))
)
vllm_render_answers: st.SearchStrategy[tuple[bytes, bool]] = st.tuples(
    _vllm_answers, st.booleans()
).map(
    lambda pair: (
        (msgspec.json.encode(pair[0]), True)
        if pair[1]
        else (json.dumps(pair[0], indent=1).encode(), False)
    )
)
"""A render answer as vLLM writes one (its ``GenerateRequest``'s members, in order; 0.32's
without ``parse_context``), of the common shape or off it, as bytes: compact as msgspec writes
JSON (``True``) or spelt otherwise (indented, non-ASCII escaped: ``False``)."""

router_decode_inputs = st.builds(
    LegInputs,
    token_ids=st.none() | token_id_lists,
    kv_transfer_params=st.none() | st.just({"remote_host": "router"}) | json_values,
    ec_transfer_params=st.none() | st.just({"hash": "h"}),
    features=st.none() | st.just({}),
    parse_context=st.none() | st.just({}),
    request_id=st.none() | st.just("r-1"),
)
"""What a router hands a decode leg builder, every input given or not (some of them wrong)."""

client_paths = st.sampled_from(
    [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/inference/v1/generate",
    ]
)
# --------------------------------------------------------------------------------------------
# Text-mode generate streams of one choice (Responses / Anthropic streaming clients).


@st.composite
def single_choice_text_streams(draw: st.DrawFn) -> bytes:
    """A valid one-choice text-mode generate SSE stream: deltas, maybe an error, ``[DONE]``."""
    texts = draw(st.lists(st.text(max_size=5), min_size=1, max_size=4))
    usage = {"prompt_tokens": 3, "total_tokens": 3 + len(texts), "completion_tokens": len(texts)}
    events: list[dict[str, Any]] = []
    for position, text in enumerate(texts):
        last = position == len(texts) - 1
        choice = {
            "index": 0,
            "finish_reason": draw(st.sampled_from(VLLM_FINISH_REASONS)) if last else None,
            "stop_reason": draw(st.none() | st.text(max_size=3)) if last else None,
            "token_ids": [7],
            "text": text,
            "logprobs": draw(st.none() | chat_logprobs()),
        }
        event: dict[str, Any] = {
            "request_id": "generate-tokens-r",
            "output_mode": "text",
            "choices": [choice],
        }
        if draw(st.booleans()):
            event["usage"] = usage  # continuous usage stats
        events.append(event)
    if draw(st.booleans()):
        events.append({"error": {"message": draw(st.text(max_size=8)), "type": "E", "code": 500}})
    elif draw(st.booleans()):
        events.append({"request_id": "r", "usage": usage, "output_mode": "text", "choices": []})
    separator = draw(st.sampled_from([b"\n\n", b"\r\n\r\n", b"\r\r"]))
    body = b"".join(
        b"data: " + json.dumps(event, ensure_ascii=False).encode() + separator for event in events
    )
    return body + b"data: [DONE]" + separator


# ---- request legs for every client route (Responses / Messages mappers wired in) ----

_client_transfer = st.fixed_dictionaries(
    {},
    optional={
        "kv_transfer_params": _transfer_values | json_values,
        "ec_transfer_params": _transfer_values,
        "vllm_xargs": st.fixed_dictionaries({}, optional={"kv_transfer_params": _transfer_values}),
    },
)

_responses_valid = st.fixed_dictionaries(
    {},
    optional={
        "max_output_tokens": cap_values,
        "temperature": st.floats(0, 2),
        "tools": st.just([{"type": "function", "name": "f", "parameters": {"type": "object"}}]),
        "tool_choice": st.sampled_from(["auto", "none", {"type": "function", "name": "f"}]),
        "text": st.sampled_from(
            [{"format": {"type": "json_schema", "name": "x", "schema": {}}}, {"format": None}]
        ),
        "include": st.just(["message.output_text.logprobs"]),
        "top_logprobs": st.integers(0, 5),
        "stream": st.booleans(),
    },
)

_messages_valid = st.fixed_dictionaries(
    {"max_tokens": st.integers(1, 300) | cap_values},
    optional={
        "top_k": st.integers(1, 50),
        "stop_sequences": st.lists(st.text(min_size=1, max_size=3), max_size=2),
        "tools": st.just([{"name": "f", "input_schema": {}}]),
        "tool_choice": st.sampled_from([{"type": "any"}, {"type": "tool", "name": "f"}]),
        "system": st.text(max_size=4),
        "stream": st.booleans(),
    },
)


def _merged(*parts: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.tuples(*parts).map(lambda dicts: {k: v for d in dicts for k, v in d.items()})


# (client path, body): each non-generate client route with a body shaped for it (valid fields,
# random values for its own keys, unknown keys and client-supplied transfer params).
client_route_bodies: st.SearchStrategy[tuple[str, dict[str, Any]]] = (
    st.tuples(st.sampled_from(["/v1/chat/completions", "/v1/completions"]), client_request_bodies)
    | st.tuples(
        st.just("/v1/responses"),
        _merged(responses_client_bodies, _responses_valid, _client_transfer),
    )
    | st.tuples(
        st.just("/v1/messages"),
        _merged(messages_client_bodies, _messages_valid, _client_transfer),
    )
)


render_client_bodies: st.SearchStrategy[tuple[str, dict[str, Any]]] = client_route_bodies | (
    st.sampled_from(
        [
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
            ("/v1/responses", {"input": "hi", "max_output_tokens": 9}),
            ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}),
        ]
    )
)
"""(client path, body) of a client whose decode leg is built on a render answer: the common
bodies of chat, Responses and Messages, and any body of :data:`client_route_bodies`."""

# --------------------------------------------------------------------------------------------
# Hostile inputs: any subtree replaced by any value, huge numbers, NaN / Infinity,
# deep nesting, lone surrogates, and raw bytes that are truncated, invalid UTF-8 or duplicate
# keys. Dict strategies feed the dict entry points; byte strategies feed the byte parsers.

HUGE_NUMBERS = (2**63, 2**63 - 1, 2**64, 2**64 + 1, -1, -(2**63), -(2**63) - 1, 10**400)
# Deep enough to overflow any recursive walk (the interpreter's default limit is 1000).
DEEP = 5000

hostile_scalars: st.SearchStrategy[Any] = (
    json_scalars
    | st.sampled_from(HUGE_NUMBERS)
    | st.integers()
    | st.floats()  # NaN and the infinities, as a Python dict can carry them
    | st.text(st.characters(codec=None, categories=None), max_size=6)  # lone surrogates too
    | st.sampled_from(["\ud800", "a\udfffb", "\x00", "\u202e", "@/\\"])
)

hostile_keys = st.text(max_size=6) | st.sampled_from(["\ud800", "", "\x00", "$", "[0]", "a.b"])


def nested(depth: int, leaf: object = 0, *, kind: str = "list") -> object:
    """A value nested ``depth`` levels deep, built without recursion."""
    value = leaf
    for _ in range(depth):
        value = [value] if kind == "list" else {"a": value}
    return value


deep_values: st.SearchStrategy[Any] = st.builds(
    nested,
    st.sampled_from([DEEP, 1100, 300]),
    st.just(0),
    kind=st.sampled_from(["list", "dict"]),
)

hostile_values: st.SearchStrategy[Any] = (
    st.recursive(
        hostile_scalars,
        lambda children: (
            st.lists(children, max_size=3) | st.dictionaries(hostile_keys, children, max_size=3)
        ),
        max_leaves=8,
    )
    | deep_values
)


def _subtree_paths(value: object) -> list[tuple[object, ...]]:
    """Every path to a subtree of ``value`` (dict keys and list indices), root first."""
    paths: list[tuple[object, ...]] = [()]
    pending: list[tuple[tuple[object, ...], object]] = [((), value)]
    while pending and len(paths) < 200:
        path, node = pending.pop()
        items: list[tuple[object, object]] = []
        if isinstance(node, dict):
            items = list(node.items())
        elif isinstance(node, list):
            items = list(enumerate(node))
        for key, child in items:
            paths.append((*path, key))
            pending.append(((*path, key), child))
    return paths


def _replaced(value: object, path: tuple[object, ...], new: object) -> object:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replaced(value[head], rest, new)}
    assert isinstance(value, list)
    assert isinstance(head, int)
    return [_replaced(v, rest, new) if i == head else v for i, v in enumerate(value)]


def hostile(base: st.SearchStrategy[Any], *, max_edits: int = 3) -> st.SearchStrategy[Any]:
    """``base`` values with up to ``max_edits`` subtrees (the root too) replaced by any value."""

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        value = draw(base)
        for _ in range(draw(st.integers(0, max_edits))):
            path = draw(st.sampled_from(_subtree_paths(value)))
            value = _replaced(value, path, draw(hostile_values))
        return value

    return build()


generate_client_bodies: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {"token_ids": token_id_lists},
    optional={
        "sampling_params": st.fixed_dictionaries(
            {},
            optional={
                "max_tokens": cap_values,
                "n": st.integers(-1, 3),
                "extra_args": st.fixed_dictionaries(
                    {}, optional={"kv_transfer_params": _transfer_values}
                ),
            },
        ),
        "model": st.text(max_size=5),
        "stream": st.booleans(),
        "cache_salt": st.text(min_size=1, max_size=4),
        "kv_transfer_params": _transfer_values,
        "ec_transfer_params": _transfer_values,
        "features": st.just(
            {
                "mm_hashes": {"image": ["h"]},
                "mm_placeholders": {"image": [{"offset": 0, "length": 1}]},
            }
        ),
    },
)

# (client path, body) for all five client routes, valid-shaped.
all_route_bodies: st.SearchStrategy[tuple[str, dict[str, Any]]] = client_route_bodies | st.tuples(
    st.just("/inference/v1/generate"), generate_client_bodies
)
# The same with hostile edits anywhere in the body (the path stays a client route).
hostile_route_bodies: st.SearchStrategy[tuple[str, Any]] = all_route_bodies.flatmap(
    lambda pair: st.tuples(st.just(pair[0]), hostile(st.just(pair[1])))
)

# A generate response in the requested mode, with hostile edits: (response, mode value).
hostile_generate_responses: st.SearchStrategy[tuple[Any, str]] = (
    st.tuples(generate_responses("text"), st.just("text"))
    | st.tuples(generate_responses("derender"), st.just("derender"))
    | generate_envelope_responses
).flatmap(lambda pair: st.tuples(hostile(st.just(pair[0])), st.just(pair[1])))


def _raw_json(value: object) -> bytes:
    try:
        return json.dumps(value, allow_nan=True).encode()
    except (RecursionError, ValueError):  # too deep for json; spell it out iteratively
        return b"[" * DEEP + b"0" + b"]" * DEEP


@st.composite
def hostile_json_bytes(draw: st.DrawFn, base: st.SearchStrategy[Any] = hostile_values) -> bytes:
    """JSON bytes of a ``base`` value, then maybe broken: truncated, invalid UTF-8, a lone
    surrogate escape, a duplicate key, a NaN literal, or replaced by deep brackets."""
    raw = _raw_json(draw(base))
    edit = draw(
        st.sampled_from(
            ["none", "truncate", "utf8", "surrogate", "duplicate", "nan", "deep", "empty"]
        )
    )
    if edit == "truncate":
        raw = raw[: draw(st.integers(0, max(len(raw) - 1, 0)))]
    elif edit == "utf8":
        at = draw(st.integers(0, len(raw)))
        raw = (
            raw[:at]
            + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80"]))
            + raw[at:]
        )
    elif edit == "surrogate":
        raw = raw.replace(b'"', b'"\\ud800', 1)
    elif edit == "duplicate" and raw.startswith(b"{") and len(raw) > 2:
        raw = b'{"output_mode": 1, "choices": 2, ' + raw[1:]
    elif edit == "nan":
        raw = (
            raw.replace(b"0", b"NaN", 1)
            .replace(b"1", b"-Infinity", 1)
            .replace(b"2", b"Infinity", 1)
        )
    elif edit == "deep":
        depth = draw(st.sampled_from([300, 1100, DEEP]))
        raw = b'{"a":' * depth + b"1" + b"}" * depth
    elif edit == "empty":
        raw = b""
    return raw


def _sse(events: list[bytes], separator: bytes) -> bytes:
    return b"".join(b"data: " + event + separator for event in events)


# One event of an SSE stream: mostly as vLLM frames it (``data: <payload>\n\n``), else in one
# of the forms only the general reader takes: other line ends, comments, other fields,
# multi-line data, no space after the colon, a field-less or data-less event, a line end in
# what a regular event carries.
_sse_payloads = st.sampled_from([b'{"a":1}', b"[DONE]", b""]) | st.lists(
    st.sampled_from([b"a", b" ", b":", b"\r", b"\n", "é😀".encode()]), max_size=6
).map(b"".join)
_sse_line_ends = st.sampled_from([b"\n", b"\r\n", b"\r"])


@st.composite
def _sse_event(draw: st.DrawFn) -> bytes:
    payload = draw(_sse_payloads)
    if draw(st.integers(0, 2)):  # two in three as vLLM writes them
        return b"data: " + payload + b"\n\n"
    end = draw(_sse_line_ends)
    fields = [b"data: " + payload, b"data:" + payload, b": a comment", b"event: x", b"id: 1"]
    lines = draw(st.lists(st.sampled_from(fields), max_size=4))
    return b"".join(line + end for line in lines) + draw(_sse_line_ends)


sse_streams = st.lists(_sse_event(), max_size=6).map(b"".join) | st.builds(
    add, st.lists(_sse_event(), max_size=4).map(b"".join), st.binary(max_size=12)
)
"""An SSE stream of regular and unusual events, possibly ending mid-event or in garbage."""


@st.composite
def hostile_sse_streams(draw: st.DrawFn) -> bytes:
    """A generate SSE stream, valid or with hostile events, framing and truncation."""
    valid = draw(generate_text_streams() | single_choice_text_streams())
    kind = draw(st.sampled_from(["valid", "events", "truncated", "garbage"]))
    if kind == "valid":
        return valid
    if kind == "truncated":
        return valid[: draw(st.integers(0, len(valid)))]
    if kind == "garbage":
        return draw(st.binary(max_size=64))
    events = draw(st.lists(hostile_json_bytes(), min_size=1, max_size=3))
    separator = draw(st.sampled_from([b"\n\n", b"\r\n\r\n", b"\r\r"]))
    stream = valid.split(b"data: [DONE]")[0] + _sse(events, separator)
    return stream + draw(st.sampled_from([b"data: [DONE]\n\n", b"", b"data: [DONE]"]))


# Generate request bodies for the simulated worker: every field of vLLM 0.33's GenerateRequest,
# each drawn well formed or not, so that both its acceptances and its 400s are exercised.
_loose_values: st.SearchStrategy[Any] = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-3, max_value=5000)
    | st.floats(min_value=-3, max_value=3, allow_nan=False)
    | st.text(max_size=3)
    | st.lists(st.integers(min_value=-1, max_value=3), max_size=3)
    | st.lists(st.text(max_size=2), max_size=2)
    | st.dictionaries(st.sampled_from(["a", "1"]), st.integers(0, 2) | st.none(), max_size=2)
)
_SAMPLING_KEYS = (
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "max_tokens",
    "min_tokens",
    "logprobs",
    "detokenize",
    "skip_special_tokens",
    "output_kind",
    "extra_args",
    "logit_bias",
    "bad_words",
    "skip_reading_prefix_cache",
    "vllm_future_key",
)
_tools = st.lists(
    st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": st.text(max_size=4)}),
        }
    ),
    max_size=2,
)
_parse_contexts = (
    st.none()
    | _loose_values
    | st.fixed_dictionaries(
        {},
        optional={
            "tools": st.none() | _tools | _loose_values,
            "tool_choice": st.sampled_from(["none", "auto", "required", "any"]) | _loose_values,
            "parallel_tool_calls": _loose_values,
            "include_reasoning": _loose_values,
            "chat_template_kwargs": _loose_values,
            "history_tool_call_cnt": _loose_values,
        },
    )
)
_GENERATE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "request_id": st.text(max_size=6) | _loose_values,
    "token_ids": st.lists(st.integers(min_value=-1, max_value=200_000), max_size=6) | _loose_values,
    "token_offsets": _loose_values,
    "sampling_params": st.dictionaries(st.sampled_from(_SAMPLING_KEYS), _loose_values, max_size=6)
    | _loose_values,
    "model": _loose_values,
    "reasoning_ended": _loose_values,
    "reasoning_parser_kwargs": _loose_values
    | st.fixed_dictionaries({"chat_template_kwargs": _loose_values}),
    "return_token_ids": _loose_values,
    "output_mode": st.sampled_from(["tokens", "text", "derender", "Text"]) | _loose_values,
    "parse_context": _parse_contexts,
    "stream": _loose_values,
    "stream_options": _loose_values
    | st.fixed_dictionaries(
        {}, optional={"include_usage": _loose_values, "continuous_usage_stats": _loose_values}
    ),
    "cache_salt": _loose_values,
    "priority": _loose_values,
    "kv_transfer_params": _loose_values,
    "ec_transfer_params": _loose_values,
    "vllm_future_field": _loose_values,
}


@st.composite
def simulated_generate_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A generate body with a random subset of fields, each well formed or not."""
    keys = draw(st.sets(st.sampled_from(sorted(_GENERATE_FIELDS))))
    # Most bodies carry the two required fields, so that the later checks are reached.
    if draw(st.integers(0, 3)):
        keys |= {"token_ids", "sampling_params"}
    return {key: draw(_GENERATE_FIELDS[key]) for key in sorted(keys)}


# Response side: what the one-start stream converters and the dispatchers are checked over.
request_ids = st.text(min_size=1, max_size=24) | st.sampled_from(
    ["generate-tokens-r1", "generate-tokens-chatcmpl-r1", "chatcmpl-r1", "generate-tokens-"]
)
"""A generate ``request_id``: any text, and the prefixes the id rules strip or keep."""

envelope_options = st.builds(
    lambda model, passthrough, reasoning: {
        "model": model,
        "vllm_finish_reasons": passthrough,
        "reasoning_content": reasoning,
    },
    st.none() | st.text("abcxyz", min_size=1, max_size=4),
    st.booleans(),
    st.booleans(),
)
"""Keyword arguments of an ``EnvelopeOptions`` (the fields every envelope reads)."""

rebuilt_routes = st.sampled_from(["/v1/chat/completions", "/v1/responses", "/v1/messages"])
"""The client routes whose envelope is rebuilt from a generate answer."""
# HTTP error statuses a worker or a router may answer with, and the messages beside them.
error_statuses = st.integers(min_value=400, max_value=599)
error_messages = st.text(max_size=40)
# -- the reference proxy: pipelines and the worker URLs given with them -----------------------

proxy_steps = st.fixed_dictionaries(
    {},
    optional={
        "encode": st.fixed_dictionaries({}, optional={"use_openai_format": st.booleans()}),
        "prefill": st.fixed_dictionaries({}, optional={"use_openai_format": st.booleans()}),
        "decode": st.fixed_dictionaries({}, optional={"use_openai_format": st.booleans()}),
        "conditional-decode": st.just({}),
    },
)
"""A pipeline's steps as a router's config gives them (any subset, either wire format)."""

proxy_urls = st.fixed_dictionaries(
    {
        f"{step}_url": st.none() | st.just(f"http://{step}:8000")
        for step in ("render", "encode", "prefill", "decode")
    }
)
"""The ``--<step>-url`` flags, each given or not."""


# ---- llm-d's sidecar seat: worker hosts as its headers and allow-lists write them -------------

# A DNS label (RFC 1123): letters, digits and inner hyphens, 1 to 63 characters.
host_labels = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
host_names = (
    st.lists(host_labels, min_size=1, max_size=4)
    .map(".".join)
    .filter(
        lambda name: not name.replace(".", "").isdigit()  # all digits reads as an address
    )
)
ipv4_networks = st.builds(
    lambda address, bits: ipaddress.ip_network(f"{address}/{bits}", strict=False),
    st.ip_addresses(v=4),
    st.integers(8, 32),
)
worker_ports = st.integers(1, 65535)


# ---- SGLang's cumulative /generate streams ----------------------------------------------------

# Text with what JSON escapes (quotes, backslashes, controls), multi-byte UTF-8 and emoji (a
# surrogate pair once escaped as ASCII).
_sglang_chars = st.sampled_from('a "\\\n\t\x00\x1f/é€😀') | st.characters(exclude_categories=["Cs"])
# The JSON spellings of an event: SGLang's own (orjson: compact, UTF-8), then ASCII escapes and
# spaces, which a reader takes whole.
_SGLANG_SPELLINGS = (
    lambda event: json.dumps(event, ensure_ascii=False, separators=(",", ":")),
    lambda event: json.dumps(event, separators=(",", ":")),
    json.dumps,
)


@st.composite
def sglang_cumulative_streams(draw: st.DrawFn, *, broken: bool = False) -> tuple[list[str], bytes]:
    """SGLang's cumulative ``/generate`` stream of random deltas, and the deltas.

    Each event repeats the text and the token IDs so far, in a spelling drawn for it. ``broken``:
    one event after the first does not extend the text before it (shorter, or a character of
    that text's last 16 changed), and the deltas are those of the events before it.
    """
    deltas = draw(st.lists(st.text(_sglang_chars, max_size=6), min_size=2, max_size=8))
    texts = [deltas[0]]
    for delta in deltas[1:]:
        texts.append(texts[-1] + delta)
    if broken:
        at = draw(st.integers(1, len(texts) - 1))
        if not texts[at - 1]:  # then every text before it is empty too
            texts[at - 1] = deltas[at - 1] = "a"
        before = texts[at - 1]
        if draw(st.booleans()):
            texts[at] = before[: draw(st.integers(0, len(before) - 1))]
        else:
            changed = draw(st.integers(max(0, len(before) - 16), len(before) - 1))
            char = draw(_sglang_chars.filter(lambda c: c != before[changed]))
            texts[at] = before[:changed] + char + before[changed + 1 :] + deltas[at]
        texts, deltas = texts[: at + 1], deltas[:at]
    events = []
    for count, text in enumerate(texts, 1):
        finish = {"type": "stop", "matched": 2} if count == len(texts) else None
        meta = {"id": "r", "finish_reason": finish, "completion_tokens": count}
        event = {"text": text, "output_ids": list(range(count)), "meta_info": meta}
        spelling = draw(st.sampled_from(_SGLANG_SPELLINGS))
        events.append(b"data: " + spelling(event).encode() + b"\n\n")
    return deltas, b"".join([*events, b"data: [DONE]\n\n"])


sglang_logprob_triples = st.tuples(
    st.one_of(st.none(), st.floats(-20, 0)),
    st.integers(0, 1000),
    st.one_of(st.none(), st.text(max_size=3)),
)
"""One output position's ``[logprob, token id, token text]`` as SGLang's meta_info writes it."""

# A chat client's body with every field the chat mapper and caps read, each of the type the
# reader wants or of another (ints and floats for each other, nulls, false for the refused keys,
# formats, logprobs without the switch), plus any body of client_request_bodies, hostile or not.
_chat_view_values = {
    "n": st.integers(-1, 3) | st.just(2.0),
    "temperature": st.floats(0, 2) | st.integers(0, 2) | st.booleans(),
    "top_k": st.integers(-1, 50) | st.just(40.0),
    "seed": st.integers(0, 2**70),
    "stop": st.text(max_size=2) | st.lists(st.text(max_size=2), max_size=2) | st.just([1]),
    "stop_token_ids": st.lists(st.integers(0, 9), max_size=2) | st.just([1.0]),
    "ignore_eos": st.booleans() | st.just(1),
    "logit_bias": st.dictionaries(
        st.sampled_from(["5", "7"]), st.integers(-9, 9) | st.floats(-1, 1)
    ),
    "bad_words": st.lists(st.text(max_size=2), max_size=2),
    "repetition_detection": st.just({"window": 3}) | st.just([]),
    "logprob_token_ids": st.lists(st.integers(0, 9), max_size=2),
    "echo": st.booleans(),
    "use_beam_search": st.booleans(),
    "length_penalty": st.just(1.0) | st.booleans(),
    "response_format": st.sampled_from(
        [{"type": "text"}, {"type": "json_object"}, {"type": "json_schema"}, {}]
    ),
    "structured_outputs": st.just({"regex": "a+"}),
    "logprobs": st.booleans() | st.just(1),
    "top_logprobs": st.integers(-2, 5) | st.just(2.0),
    "tools": st.just([{"type": "function", "function": {"name": "f"}}])
    | st.just([])
    | st.just([1]),
    "tool_choice": st.sampled_from(["auto", "none", {"type": "function"}, 3]),
    "parallel_tool_calls": st.booleans() | st.just("yes"),
    "chat_template_kwargs": st.just({"enable_thinking": False}) | st.just({}) | st.just([]),
    "include_reasoning": st.booleans(),
    "vllm_xargs": st.just({"lora": "a"}) | st.just([]),
    "max_completion_tokens": cap_values | st.just(2**64),
    "max_tokens": cap_values,
    "min_tokens": cap_values,
}
_responses_view_values = {
    "temperature": st.floats(0, 2) | st.integers(0, 2),
    "top_k": st.integers(-1, 50) | st.just(40.0),
    "seed": st.integers(0, 9),
    "stop": st.lists(st.text(max_size=2), max_size=2) | st.just(3),
    "logit_bias": st.dictionaries(st.sampled_from(["5"]), st.integers(-9, 9) | st.floats(-1, 1)),
    "background": st.booleans(),
    "prompt": st.just({"id": "p"}),
    "include": st.just(["message.output_text.logprobs"]) | st.just([]) | st.just("x"),
    "top_logprobs": st.integers(-2, 5) | st.just(2.0),
    "text": st.sampled_from(
        [{"format": {"type": "text"}}, {"format": {"type": "json_object"}}, {"format": 3}, {}]
    ),
    "structured_outputs": st.just({"regex": "a+"}),
    "reasoning": st.sampled_from([{"effort": "low"}, {"effort": 3}, {}]),
    "tools": st.just([{"type": "function", "name": "f"}]) | st.just([{"type": "web_search"}]),
    "tool_choice": st.sampled_from(
        ["auto", "required", "bogus", {"type": "function", "name": "f"}]
    ),
    "parallel_tool_calls": st.booleans() | st.just(1),
    "vllm_xargs": st.just({"lora": "a"}) | st.just([]),
    "max_output_tokens": cap_values | st.just(2**64),
    "min_tokens": cap_values,
}
_messages_view_values = {
    "temperature": st.floats(0, 1) | st.integers(0, 1) | st.just("hot"),
    "top_p": st.floats(0, 1),
    "top_k": st.integers(1, 50) | st.just(5.0),
    "stop_sequences": st.lists(st.text(max_size=2), max_size=2) | st.just("x"),
    "chat_template_kwargs": st.just({"enable_thinking": True}) | st.just([]),
    "output_config": st.just({"effort": "low"}),
    "tools": st.just([{"name": "f", "input_schema": {}}]) | st.just([{"type": "bash"}]),
    "tool_choice": st.sampled_from([{"type": "any"}, {"type": "auto"}, {"type": "x"}, "auto"]),
    "vllm_xargs": st.just({"lora": "a"}),
    "max_tokens": cap_values | st.just(2**64),
    "min_tokens": cap_values,
}


def _view_bodies(values: dict[str, Any], base: dict[str, Any]) -> st.SearchStrategy[Any]:
    return st.fixed_dictionaries(
        {key: st.just(value) for key, value in base.items()},
        optional={key: st.none() | strategy for key, strategy in values.items()},
    )


client_view_bodies: st.SearchStrategy[tuple[str, Any]] = (
    st.tuples(
        st.just("/v1/chat/completions"),
        _view_bodies(_chat_view_values, {"messages": [{"role": "user", "content": "hi"}]})
        | client_request_bodies
        | hostile(client_request_bodies),
    )
    | st.tuples(st.just("/v1/responses"), _view_bodies(_responses_view_values, {"input": "hi"}))
    | st.tuples(st.just("/v1/messages"), _view_bodies(_messages_view_values, {"messages": []}))
    | client_route_bodies
    | client_route_bodies.flatmap(
        lambda pair: st.tuples(st.just(pair[0]), hostile(st.just(pair[1])))
    )
)
"""(client path, body) of a chat, Responses or Messages client: every field its view reads, of
the type the mapper wants or off it, and any body of client_route_bodies, hostile or not."""


# What feeds a parse_context, of the type each mapper wants or off it.
def _maybe(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    # Mostly of its type, so that most bodies are read; one time in eight any JSON value.
    return st.integers(0, 7).flatmap(lambda pick: json_values if pick == 0 else valid)


_tool_names = _maybe(st.sampled_from(["f", "get_weather"]))
_schemas = _maybe(st.just({"type": "object", "properties": {"city": {"type": "string"}}}))
_chat_function_tools = st.fixed_dictionaries(
    {"type": _maybe(st.just("function"))},
    optional={
        "function": _maybe(
            st.fixed_dictionaries(
                {"name": _tool_names}, optional={"parameters": _schemas, "strict": json_values}
            )
        )
    },
)
_responses_tools = st.fixed_dictionaries(
    {"type": _maybe(st.just("function")), "name": _tool_names},
    optional={"description": json_values, "parameters": _schemas, "strict": json_values},
)
_messages_tools = st.fixed_dictionaries(
    {"name": _tool_names, "input_schema": _schemas},
    optional={
        "type": _maybe(st.just("custom")),
        "description": json_values,
        "defer_loading": json_values,
    },
)
_choices = st.sampled_from(["auto", "none", "required", "any", "tool", "function", "x"])


def _context_bodies(
    path: str, base: dict[str, Any], fields: dict[str, st.SearchStrategy[Any]]
) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    return st.tuples(st.just(path), st.fixed_dictionaries(base, optional=fields))


parse_context_bodies: st.SearchStrategy[tuple[str, dict[str, Any]]] = (
    _context_bodies(
        "/v1/chat/completions",
        {
            "messages": st.just([{"role": "user", "content": "hi"}]),
            "tools": _maybe(st.lists(_maybe(_chat_function_tools), min_size=1, max_size=2)),
        },
        {
            "tool_choice": _maybe(
                _choices | st.fixed_dictionaries({"type": _choices, "function": json_values})
            ),
            "parallel_tool_calls": _maybe(st.booleans()),
            "chat_template_kwargs": _maybe(st.just({"enable_thinking": True})),
            "include_reasoning": _maybe(st.booleans()),
        },
    )
    | _context_bodies(
        "/v1/responses",
        {
            "input": st.just("hi"),
            "tools": _maybe(st.lists(_maybe(_responses_tools), min_size=1, max_size=2)),
        },
        {
            "tool_choice": _maybe(
                _choices | st.fixed_dictionaries({"type": _choices, "name": _tool_names})
            ),
            "parallel_tool_calls": _maybe(st.booleans()),
            "reasoning": _maybe(st.fixed_dictionaries({"effort": _maybe(st.just("low"))})),
        },
    )
    | _context_bodies(
        "/v1/messages",
        {
            "messages": st.just([{"role": "user", "content": "hi"}]),
            "max_tokens": st.just(9),
            "tools": _maybe(st.lists(_maybe(_messages_tools), min_size=1, max_size=2)),
        },
        {
            "tool_choice": _maybe(
                st.fixed_dictionaries(
                    {"type": _choices},
                    optional={
                        "name": _tool_names,
                        "disable_parallel_tool_use": _maybe(st.booleans()),
                    },
                )
            ),
            "chat_template_kwargs": _maybe(st.just({"enable_thinking": True})),
            "output_config": _maybe(st.fixed_dictionaries({"effort": _maybe(st.just("low"))})),
        },
    )
)
"""(client path, body) of a chat, Responses or Messages client whose fields feed the decode leg's
parse_context (tools, the choice, the template kwargs...), each of its type or any JSON value."""

"""Testing strategies for Hypothesis-based tests: the one home of every strategy."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

# JSON scalars as a client could send them (no NaN: JSON has none; the hostile strategies
# below add those literals on purpose).
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()

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

# ---- request legs (issue 3): client bodies, caps, token IDs ----

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

_transfer_values = st.dictionaries(st.sampled_from(["remote_host", "remote_port"]), json_scalars)

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
        "tools": st.just([{"type": "function", "function": {"name": "f"}}]) | json_values,
        "stream": st.booleans() | json_scalars,
        "stream_options": st.just({"include_usage": True}) | json_values,
        "kv_transfer_params": _transfer_values | json_values,
        "ec_transfer_params": _transfer_values,
        "vllm_xargs": st.fixed_dictionaries({}, optional={"kv_transfer_params": _transfer_values}),
        "cache_salt": st.text(min_size=1, max_size=4),
        "priority": st.integers(-2, 2),
        "request_id": st.text(max_size=4),
    },
).flatmap(
    lambda body: st.dictionaries(st.text(max_size=6), json_values, max_size=3).map(
        lambda extra: {**extra, **body}
    )
)

client_paths = st.sampled_from(
    [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/inference/v1/generate",
    ]
)

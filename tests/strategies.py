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

# Hooks: bodies a pipeline runs over (JSON objects, possibly with tuples and shared subtrees).
json_objects: st.SearchStrategy[dict[str, Any]] = st.dictionaries(
    st.text(max_size=8), json_values | st.tuples(json_values, json_values), max_size=6
)

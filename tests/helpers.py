"""Helpers shared by test modules (the strategies live in ``strategies.py``)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from strategies import GENERATE_ONLY_CHOICE_KEYS, GENERATE_ONLY_TOP_KEYS

from disagg_transforms import (
    DisaggTransformError,
    EnvelopeOptions,
    OutputMode,
    Route,
    StreamConverter,
    stream_converter,
)

ENVELOPE_GENERATE_ONLY = frozenset(
    {
        *GENERATE_ONLY_TOP_KEYS,
        *GENERATE_ONLY_CHOICE_KEYS,
        "prompt_logprobs",
        "choices",
        "finish_reason",
        "vllm_future_field",
        "vllm_future_choice_field",
    }
)
"""Generate-response keys no non-chat envelope may carry (its own names differ)."""

# A tool_use block's `input` is the model's own arguments: any key may appear there.
_MODEL_DATA = frozenset({"input"})


def keys_of(value: Any) -> set[str]:
    """Every key of the envelope, not descending into the model's tool arguments."""
    if isinstance(value, dict):
        return set(value) | {
            k for key, v in value.items() if key not in _MODEL_DATA for k in keys_of(v)
        }
    if isinstance(value, list):
        return {k for v in value for k in keys_of(v)}
    return set()


def wrap_checked(wrap: Any, sdk_model: Any, response: Any, mode: OutputMode) -> tuple[Any, Any]:
    """Wrap, parse with the SDK; the input stays untouched and nothing generate-only leaks."""
    before = copy.deepcopy(response)
    result = wrap(response, requested=mode)
    parsed = sdk_model.model_validate(result)
    assert response == before
    assert not keys_of(result) & ENVELOPE_GENERATE_ONLY
    return result, parsed


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """``("ok", result)``, or the name of the library error ``call`` raised and its ``param``."""
    try:
        return "ok", call()
    except DisaggTransformError as error:
        return type(error).__name__, error.param


def text_stream_converter(
    route: Route, *, client_body: Any = None, **options: Any
) -> StreamConverter:
    """``route``'s converter over a text-mode leg: model ``m``, created 5, ``options`` as given."""
    return stream_converter(
        route,
        requested=OutputMode.TEXT,
        client_body=client_body,
        options=EnvelopeOptions(model="m", **options),
        created=5,
    )


T = TypeVar("T")
TIMEOUT = 30.0
"""Seconds: every call the LiteLLM tests make is bounded by it."""

WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
"""One chat tool, ``get_weather(city)``, as a client sends it."""

LITELLM_WARNINGS = [
    pytest.mark.filterwarnings("ignore::UserWarning:pydantic.*"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20"),
]
"""The ``pytestmark`` of a LiteLLM test module: LiteLLM's own import- and call-time warnings
(pydantic schema notes, deprecations) are not ours."""


def run_bounded(awaitable: Awaitable[T]) -> T:
    """Run ``awaitable`` in a new event loop; fail after ``TIMEOUT`` seconds."""

    async def bounded() -> T:
        return await asyncio.wait_for(awaitable, TIMEOUT)

    return asyncio.run(bounded())

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from golden import load_fixture, load_stream
from hypothesis import given
from hypothesis import strategies as st
from strategies import json_values

from disagg_transforms.envelopes import (
    ChatCompletion,
    ChatCompletionChunk,
    GenerateDerenderResponse,
    GenerateRequest,
    GenerateStreamChunk,
    GenerateTextResponse,
    GenerateTokensResponse,
    SamplingParams,
)

GOLDEN = [
    ("request-decode-derender.json", GenerateRequest),
    ("response-tokens.json", GenerateTokensResponse),
    ("response-text.json", GenerateTextResponse),
    ("response-text-logprobs.json", GenerateTextResponse),
    ("response-text-finish-abort.json", GenerateTextResponse),
    ("response-text-finish-repetition.json", GenerateTextResponse),
    ("response-derender-text.json", GenerateDerenderResponse),
    ("response-derender-tool-call.json", GenerateDerenderResponse),
    ("chat-completion-coupled.json", ChatCompletion),
    ("chat-completion-chunk-coupled.json", ChatCompletionChunk),
]


@pytest.mark.parametrize(("name", "view"), GOLDEN)
def test_golden_bodies_round_trip_without_losing_a_field(name: str, view: type) -> None:
    body = load_fixture(name)
    decoded: object = msgspec.convert(body, view)
    assert msgspec.to_builtins(decoded) == body
    # Bytes in, bytes out: the same, key for key.
    raw = msgspec.json.encode(body)
    assert msgspec.json.decode(msgspec.json.encode(msgspec.json.decode(raw, type=view))) == body


@pytest.mark.parametrize("name", ["stream-text.sse", "stream-text-error.sse"])
def test_golden_stream_chunks_round_trip(name: str) -> None:
    events = [
        line.removeprefix(b"data: ")
        for line in load_stream(name).splitlines()
        if line.startswith(b"data: {")
    ]
    chunks = [e for e in events if not e.startswith(b'{"error"')]
    assert chunks
    for event in chunks:
        decoded = msgspec.json.decode(event, type=GenerateStreamChunk)
        assert msgspec.json.decode(msgspec.json.encode(decoded)) == msgspec.json.decode(event)


def test_usage_chunk_has_no_choices() -> None:
    last = load_stream("stream-text.sse").split(b"\n\n")[-3].removeprefix(b"data: ")
    chunk = msgspec.json.decode(last, type=GenerateStreamChunk)
    assert chunk.choices == []
    assert chunk.usage is not None
    assert chunk.usage.completion_tokens == 4  # type: ignore[union-attr]


def test_absent_and_null_stay_apart() -> None:
    absent = msgspec.convert({}, SamplingParams)
    null = msgspec.convert({"max_tokens": None}, SamplingParams)
    assert absent.max_tokens is msgspec.UNSET
    assert null.max_tokens is None
    assert msgspec.to_builtins(absent) == {}
    assert msgspec.to_builtins(null) == {"max_tokens": None}


def test_missing_output_mode_reads_as_tokens_shape() -> None:
    body = load_fixture("response-tokens.json")
    del body["output_mode"]
    decoded = msgspec.convert(body, GenerateTokensResponse)
    assert decoded.output_mode is msgspec.UNSET


def test_text_response_requires_text_and_mode() -> None:
    body = load_fixture("response-text.json")
    del body["choices"][0]["text"]
    with pytest.raises(msgspec.ValidationError, match=r"\$\.choices\[0\]"):
        msgspec.convert(body, GenerateTextResponse)


@pytest.mark.parametrize(("name", "view"), GOLDEN)
@given(extra=st.dictionaries(st.text(min_size=1).map(lambda s: "x-" + s), json_values))
def test_unknown_fields_are_tolerated(name: str, view: type, extra: dict[str, Any]) -> None:
    body = {**load_fixture(name), **extra}
    decoded: object = msgspec.convert(body, view)
    assert msgspec.to_builtins(decoded) == load_fixture(name)

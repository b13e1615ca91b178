"""A plain chunk's fast path writes what the general path writes (docs/performance.md, "Streams").

Fed one event a call, a converter in its steady state writes a plain chunk (one choice, index 0,
a text delta, nothing else) from bytes cut once per stream; fed the whole stream at once, every
event takes the general path. Both must give the same bytes, or both an error, for any stream.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from helpers import text_stream_converter
from hypothesis import given
from hypothesis import strategies as st
from strategies import VLLM_FINISH_REASONS, chat_logprobs

from disagg_transforms import Route, StreamConverter, UpstreamContractError
from disagg_transforms._response.generate_stream import GenerateStreamReader, StreamEvent

_USAGE = {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2}
# Texts whose JSON needs escapes: quotes, backslashes, controls, non-ASCII, the slot's own NUL.
_texts = st.text(max_size=6) | st.sampled_from(['"', "\\", "\n\t", "\x00plain\x00", "é😀", "</"])


@st.composite
def _events(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Chunks most of which are plain, the rest off it by one member each, maybe an error."""
    events: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 8))):
        text = draw(_texts)
        choice: dict[str, Any] = {"index": 0, "finish_reason": None, "text": text, "logprobs": None}
        event: dict[str, Any] = {"request_id": "generate-tokens-r", "output_mode": "text"}
        change = draw(st.sampled_from(["plain"] * 4 + ["finish", "logprobs", "usage", "more"]))
        if change == "finish":
            choice["finish_reason"] = draw(st.sampled_from(VLLM_FINISH_REASONS))
            choice["stop_reason"] = draw(st.none() | st.integers(0, 9))
        elif change == "logprobs":
            choice["logprobs"] = draw(chat_logprobs())
        elif change == "usage":
            event["usage"] = _USAGE
        elif change == "more":
            choice = draw(
                st.sampled_from(
                    [
                        {**choice, "index": 1},
                        {**choice, "token_ids": [7, 8]},
                        {key: value for key, value in choice.items() if key != "finish_reason"},
                        {key: value for key, value in choice.items() if key != "logprobs"},
                        {key: value for key, value in choice.items() if key != "text"},
                    ]
                )
            )
        event["choices"] = [choice]
        events.append(event)
    ending = draw(st.sampled_from(["done", "usage", "error"]))
    if ending == "usage":
        events.append({"request_id": "r", "usage": _USAGE, "output_mode": "text", "choices": []})
    elif ending == "error":
        events.append({"error": {"message": "m", "type": "E", "code": 500}})
    return events


def _sse(events: list[dict[str, Any]], *, ascii_only: bool) -> list[bytes]:
    framed = [
        b"data: " + json.dumps(event, ensure_ascii=ascii_only).encode() + b"\n\n"
        for event in events
    ]
    return [*framed, b"data: [DONE]\n\n"]


def _run(converter: StreamConverter, feeds: list[bytes]) -> bytes | tuple[str | None, str]:
    out: list[bytes] = []
    try:
        out.extend(converter.feed(data) for data in feeds)
        out.append(converter.close())
    except UpstreamContractError as error:
        return error.param, str(error)
    return b"".join(out)


_CLIENTS = [
    None,
    {"n": 2, "return_token_ids": True},
    {"top_logprobs": 1, "stream_options": {"include_usage": True}},
]


@pytest.mark.parametrize("route", [Route.CHAT_COMPLETIONS, Route.RESPONSES, Route.MESSAGES])
@given(events=_events(), client=st.sampled_from(_CLIENTS), ascii_only=st.booleans())
def test_one_event_a_feed_writes_what_the_whole_stream_writes(
    route: Route, events: list[dict[str, Any]], client: dict[str, Any] | None, ascii_only: bool
) -> None:
    feeds = _sse(events, ascii_only=ascii_only)
    one_by_one = _run(text_stream_converter(route, client_body=client), feeds)
    whole = _run(text_stream_converter(route, client_body=client), [b"".join(feeds)])
    if isinstance(whole, tuple):
        # Fed at once, every event is read (and checked) before any is converted: a later
        # event's breach may be the one reported.
        assert isinstance(one_by_one, tuple)
    else:
        assert one_by_one == whole


_HI = {"index": 0, "text": "hi", "logprobs": None}
_PLAIN = {"request_id": "r", "output_mode": "text", "choices": [_HI]}


@pytest.mark.parametrize(
    ("event", "plain"),
    [
        (_PLAIN, True),
        ({**_PLAIN, "usage": None}, True),
        ({**_PLAIN, "choices": [{**_HI, "finish_reason": None, "stop_reason": None}]}, True),
        ({**_PLAIN, "choices": [{**_HI, "token_ids": [1]}]}, True),
        ({**_PLAIN, "choices": [{**_HI, "text": ""}]}, False),
        ({**_PLAIN, "choices": [{**_HI, "index": 1}]}, False),
        ({**_PLAIN, "choices": [{**_HI, "finish_reason": "stop"}]}, False),
        ({**_PLAIN, "choices": [{**_HI, "logprobs": {"content": []}}]}, False),
        ({**_PLAIN, "choices": [{"index": 0, "text": "hi"}]}, False),  # logprobs left out
        ({**_PLAIN, "choices": [_HI, _HI]}, False),
        ({**_PLAIN, "usage": _USAGE}, False),
    ],
)
def test_the_reader_tells_a_plain_chunk_apart(event: dict[str, Any], plain: bool) -> None:
    reader = GenerateStreamReader(max_event_bytes=1 << 16)
    data = b"data: " + json.dumps(event).encode() + b"\n\n"
    read = reader.feed_text(data)
    if plain:
        assert read == "hi"
    else:
        assert read == [(data[6:-2], msgspec.json.decode(data[6:-2], type=StreamEvent))]
    assert reader.feed_text(data + data) == GenerateStreamReader(max_event_bytes=99).feed(data * 2)

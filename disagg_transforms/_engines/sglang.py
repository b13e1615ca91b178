"""SGLang: one ``/generate`` body to both workers at once, met by a bootstrap room.

Its leg is built by :mod:`disagg_transforms._request.sglang`; its answers and cumulative streams
are read by :mod:`disagg_transforms._response.sglang` into the generate answer the envelopes
read (``docs/sglang.md``).
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

from disagg_transforms._engines.description import Engine, EngineDescription, Meeting
from disagg_transforms._response.sglang import SglangFailure, SglangStreamReader, generate_answer
from disagg_transforms._wire import keys as w


def _read(
    answer: Mapping[str, Any], stop_token_ids: Container[int]
) -> dict[str, Any] | SglangFailure:
    return generate_answer(answer, stop_token_ids=stop_token_ids)


def _stream(max_event_bytes: int, stop_token_ids: Container[int]) -> SglangStreamReader:
    return SglangStreamReader(max_event_bytes=max_event_bytes, stop_token_ids=stop_token_ids)


DESCRIPTION = EngineDescription(
    engine=Engine.SGLANG,
    token_path=w.SGLANG_GENERATE_PATH,
    meeting=Meeting.RENDEZVOUS,
    abort_path=w.SGLANG_ABORT_PATH,
    read_answer=_read,
    stream_reader=_stream,
)

"""The shape of an engine description: what the rest of the library asks of an engine."""

from __future__ import annotations

import enum
from collections.abc import Callable, Container, Iterator, Mapping
from typing import Any, Protocol, TypeAlias

import msgspec

from disagg_transforms._response.sglang import SglangFailure

__all__ = (
    "AnswerReader",
    "Engine",
    "EngineDescription",
    "Meeting",
    "StreamReader",
    "StreamReaderFactory",
)


class Engine(str, enum.Enum):
    """A worker engine; the value is its name in configuration (``engine: sglang``)."""

    VLLM = "vllm"
    SGLANG = "sglang"


class Meeting(enum.Enum):
    """How a request's prefill and decode meet."""

    HANDOFF = "handoff"
    """The prefill answers first; its answer's transfer params go into the decode leg."""
    RENDEZVOUS = "rendezvous"
    """Both legs are sent at once with the same body and room; each waits for the other."""


AnswerReader: TypeAlias = Callable[
    [Mapping[str, Any], Container[int]], "dict[str, Any] | SglangFailure"
]
"""A decode worker's whole answer (and the stop token ids the request named) read as the
generate answer the envelopes read, or the worker failure it is."""


class StreamReader(Protocol):
    """A decode worker's SSE in, the generate SSE the stream converters read out."""

    def feed(self, data: bytes) -> bytes:
        """The generate SSE of the events ``data`` completes."""
        ...

    def feed_each(self, data: bytes) -> Iterator[bytes | str]:
        """:meth:`feed`, event by event; a broken event raises after the ones before it.

        A ``str`` is a plain chunk's text delta, for a converter's ``plain_chunk``.
        """
        ...

    def plain_event(self, text: str) -> bytes:
        """The generate SSE of a plain chunk :meth:`feed_each` gave as its text delta."""
        ...

    def close(self) -> bytes:
        """The end of the worker's stream."""
        ...


class StreamReaderFactory(Protocol):
    """Makes a decode stream's reader."""

    def __call__(
        self, max_event_bytes: int, stop_token_ids: Container[int], *, incremental: bool
    ) -> StreamReader:
        """A reader given the largest event, the stop token ids the request named, and more.

        ``incremental``: the worker streams deltas (else every event repeats the text so far).
        """
        ...


class EngineDescription(msgspec.Struct, frozen=True, kw_only=True):
    """What depends on one engine."""

    engine: Engine
    token_path: str
    """The path of the token route a generate leg is sent to."""
    meeting: Meeting
    abort_path: str | None
    """Where a running request is stopped by its id (``None``: by closing the connection)."""
    read_answer: AnswerReader
    """How a whole decode answer reads as the generate answer."""
    stream_reader: StreamReaderFactory | None
    """Makes the reader of the decode's stream; ``None``: the stream already is the generate
    SSE."""
    prompt_logprobs: Callable[[bytes, int], list[dict[str, Any] | None]] | None
    """vLLM's ``prompt_logprobs`` (the client's count of them) from the answer of the worker
    that computed them, SGLang's prefill; ``None``: the decode's answer already carries them."""
    peer_failure: Callable[[bytes], SglangFailure | None] | None
    """The failure a 2xx answer of a call sent together with decode reports (an abort), else
    ``None``; ``None`` for an engine whose legs are never sent together."""

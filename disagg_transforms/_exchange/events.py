"""What the exchange asks of the router: call a worker, answer the client, or keep feeding.

The router's side of the conversation, apart from the state machine (``flow``) that emits it, as
h11 keeps its events apart from its connection. See ``docs/exchange.md``.
"""

from __future__ import annotations

from typing import TypeAlias

import msgspec

__all__ = ("NEED_DATA", "ClientReply", "ClientStream", "Event", "Headers", "NeedData", "WorkerCall")

Headers: TypeAlias = tuple[tuple[str, str], ...]


class WorkerCall(msgspec.Struct, frozen=True, kw_only=True):
    """Send this request to the worker of ``step``; feed its answer back."""

    step: str
    """``"render"``, ``"encode"``, ``"prefill"`` or ``"decode"``: which worker to call."""
    method: str
    path: str
    headers: Headers
    body: bytes
    stream: bool
    """Read the answer as a stream (``receive_stream_head``, ``feed``, ``end_of_stream``)."""


class ClientReply(msgspec.Struct, frozen=True, kw_only=True):
    """Answer the client with this status, headers and whole body; the exchange is over."""

    status: int
    headers: Headers
    body: bytes


class ClientStream(msgspec.Struct, frozen=True, kw_only=True):
    """Start the client's streamed reply: this status and headers, then ``first``.

    Then send what each later ``feed`` and ``end_of_stream`` returns.
    """

    status: int
    headers: Headers
    first: bytes


class NeedData(msgspec.Struct, frozen=True):
    """Keep feeding the worker's stream: the client's reply is not known yet."""


NEED_DATA = NeedData()

Event: TypeAlias = WorkerCall | ClientReply | ClientStream | NeedData

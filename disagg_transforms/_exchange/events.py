"""What the exchange asks of the router: call a worker, answer the client, or keep feeding.

The router's side of the conversation, apart from the state machine (``flow``) that emits it, as
h11 keeps its events apart from its connection. See ``docs/exchange.md``.
"""

from __future__ import annotations

import enum
from typing import TypeAlias

import msgspec

__all__ = (
    "NEED_DATA",
    "ClientReply",
    "ClientStream",
    "Event",
    "Headers",
    "NeedData",
    "Phase",
    "WorkerCall",
)

Headers: TypeAlias = tuple[tuple[str, str], ...]


class Phase(str, enum.Enum):
    """Where an exchange is: one of its worker calls, the client's stream, or replied.

    The one name of a step in worker calls, errors, hooks (``Step(phase)`` for a leg) and logs.
    A ``str`` that compares, prints and formats as its name (``"render"``), so a router's
    ``call.step == "render"`` or ``urls[call.step]`` reads it as the name it is.
    """

    RENDER = "render"
    CONDITIONAL_DECODE = "conditional-decode"
    ENCODE = "encode"
    PREFILL = "prefill"
    DECODE = "decode"
    STREAMING = "streaming"
    """The client's stream has started; the decode worker's is relayed."""
    REPLIED = "replied"
    """The client's reply is complete (or, a stream, has ended)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __repr__(self) -> str:
        return repr(self.value)


class WorkerCall(msgspec.Struct, frozen=True, kw_only=True):
    """Send this request to the worker of ``step``; feed its answer back."""

    step: Phase
    """Which worker to call: :attr:`Phase.RENDER`, ``CONDITIONAL_DECODE`` (a decode worker),
    ``ENCODE``, ``PREFILL`` or ``DECODE``."""
    method: str
    path: str
    headers: Headers
    body: bytes
    stream: bool
    """Read the answer as a stream (``receive_stream_head``, ``feed``, ``end_of_stream``)."""
    together: tuple[WorkerCall, ...] = ()
    """Calls sent at the same time as this one, each to its own ``step``'s worker: the workers
    wait for each other (SGLang's rendezvous, ``docs/exchange.md``, "Calls that go together").
    Each is read to its end (a stream too, whole) and fed with ``receive_together`` or
    ``together_failed``; this call's answer is read as usual and makes the client's reply."""
    abort: WorkerCall | None = None
    """How to cancel this call once sent, beside closing its connection: send this call to the
    same worker (``None``: closing is enough). A call is cancelled when the client leaves, or
    when the exchange replied with an error while the call's answer was still being read."""


class ClientReply(msgspec.Struct, frozen=True, kw_only=True):
    """Answer the client with this status, headers and whole body; the exchange is over."""

    status: int
    headers: Headers
    body: bytes


class ClientStream(msgspec.Struct, frozen=True, kw_only=True):
    """Start the client's streamed reply: this status and headers, then ``first``.

    ``first`` holds every byte the client is owed so far: the ``feed`` (or ``end_of_stream``)
    call that started the stream returned ``b""``. Then send what each later ``feed``,
    ``end_of_stream`` and ``worker_failed`` returns.
    """

    status: int
    headers: Headers
    first: bytes


class NeedData(msgspec.Struct, frozen=True):
    """Keep feeding the worker's stream: the client's reply is not known yet."""


NEED_DATA = NeedData()

Event: TypeAlias = WorkerCall | ClientReply | ClientStream | NeedData

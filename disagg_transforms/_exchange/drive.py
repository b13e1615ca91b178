"""The I/O-free half of driving an exchange: the loop every router writes, without its I/O.

A router makes each worker call with its own HTTP client and hands the answer to a
:class:`Driver`, which feeds the exchange and says whether to read on; see ``docs/router.md``.
"""

from __future__ import annotations

from collections.abc import Iterable

from disagg_transforms._exchange.events import (
    NEED_DATA,
    ClientReply,
    ClientStream,
    Phase,
    WorkerCall,
)
from disagg_transforms._exchange.flow import Exchange, ExchangeStateError

__all__ = ("Driver",)


class Driver:
    """Drives one :class:`Exchange` to its end; the router does only the I/O around it.

    The loop, with the router's calls in angle brackets::

        drive = Driver(exchange)
        while (call := drive.next_call()) is not None:
            <start each of call.together at once; when one's answer is in, whole:
             drive.together_answered(it, <status>, <headers>, <body>), or on a failure
             drive.together_failed(it, <reason>); once drive.cancelling, cancel the call>
            try:
                answer = <send call>
                if not call.stream:
                    drive.answered(<status>, <headers>, <body>)
                    continue
                drive.stream_opened(<status>, <headers>)
                while drive.opening:
                    drive.chunk(<the next chunk, None at the end>)
            except <transport failure or timeout>:
                drive.failed(<reason>, timed_out=<whether it was a timeout>)
        if drive.awaiting:
            <wait for the together calls' answers, fed as above>
        reply = drive.reply()  # ClientReply, or ClientStream: send reply.first
        while drive.relaying:  # on a failure here: send drive.failed(<reason>)
            <send> drive.chunk(<the next chunk, None at the end>)
        <close the worker's stream>
        <if drive.cancelling, or the client left: cancel every call still in flight;
         else read the together calls to their end>

    To cancel a call is to close its connection and send its ``abort`` call, when it has one,
    to the same worker (``docs/router.md``, "Calls that go together").

    Nothing reaches the client before :meth:`reply`: its :class:`ClientStream` carries every
    byte owed so far, and :meth:`chunk` returns only what follows it.

    Args:
        exchange: the exchange to drive, as built.
    """

    __slots__ = ("_open", "_step", "exchange")

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self._step: Phase | None = None  # the step of the call made last
        self._open = False  # its stream is being read

    def next_call(self) -> WorkerCall | None:
        """The worker call to make now; ``None`` once the client's reply is known."""
        event = self.exchange.next_event()
        if not isinstance(event, WorkerCall):
            return None
        self._step = event.step
        return event

    def answered(self, status: int, headers: object, body: bytes) -> None:
        """The whole answer to the call made (not streamed)."""
        self.exchange.receive(status, headers, body)

    def stream_opened(self, status: int, headers: object) -> None:
        """The status and headers of the streamed call's answer; then feed its chunks."""
        self.exchange.receive_stream_head(status, headers)
        self._open = True

    @property
    def opening(self) -> bool:
        """The worker's stream is read on until the client's reply is known."""
        return self._open and self.exchange.next_event() is NEED_DATA

    @property
    def relaying(self) -> bool:
        """The client's stream takes the worker's next chunk (false once either has ended)."""
        return self._open and self.exchange.phase is Phase.STREAMING

    def chunk(self, data: bytes | None) -> bytes:
        """Feed the worker stream's next chunk (``None``: its end); the client's next bytes."""
        if data is None:
            self._open = False
            return self.exchange.end_of_stream()
        return self.exchange.feed(data)

    def failed(self, reason: str, *, timed_out: bool = False) -> bytes:
        """The call made last got no answer, or its stream broke off (connection, timeout).

        Before the client's reply is known it becomes an error reply (``b""``: 502, or 504
        when ``timed_out``); after, the returned bytes end the client's stream.
        """
        self._open = False
        if self._step is None:
            msg = "failed: no worker call was made"
            raise ExchangeStateError(msg)
        return self.exchange.worker_failed(self._step, reason, timed_out=timed_out)

    def together_answered(
        self, call: WorkerCall, status: int, headers: object, body: bytes
    ) -> None:
        """The whole answer of ``call``, one of the ``together`` calls of the call made."""
        self.exchange.receive_together(call.step, status, headers, body)

    def together_failed(self, call: WorkerCall, reason: str, *, timed_out: bool = False) -> None:
        """``call``, one of the ``together`` calls of the call made, got no answer."""
        self.exchange.together_failed(call.step, reason, timed_out=timed_out)

    @property
    def awaiting(self) -> bool:
        """The client's reply waits for the answer of a call sent together with the call made.

        The call made has answered, and the reply needs the answer of one of its ``together``
        calls too (SGLang's prompt logprobs come in the prefill's): wait for those answers and
        feed them before :meth:`reply` (``docs/router.md``, "Calls that go together").
        """
        return self.exchange.awaits_together

    @property
    def cancelling(self) -> bool:
        """The calls still in flight are to be cancelled: the client's reply is an error.

        A call sent together that failed, or the call made that failed, ended the exchange:
        what the other workers still do is for nobody.
        """
        return self.exchange.reply_over and self.exchange.error_kind is not None

    def relay_all(self, chunks: Iterable[bytes]) -> bytes:
        """Feed a worker stream held whole (its chunks, then its end) while it is read.

        For routers and tests that have the answer in hand; returns the client's bytes after
        its stream's head.
        """
        sent = bytearray()
        for data in (*chunks, None):
            if not (self.opening or self.relaying):
                break
            sent += self.chunk(data)
        return bytes(sent)

    def reply(self) -> ClientReply | ClientStream:
        """The client's reply or its stream's head, once :meth:`next_call` returned ``None``."""
        event = self.exchange.next_event()
        if not isinstance(event, (ClientReply, ClientStream)):
            msg = f"reply: the exchange still waits for {type(event).__name__}"
            raise ExchangeStateError(msg)
        return event

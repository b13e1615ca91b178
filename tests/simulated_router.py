"""A router in process: the exchange's worker calls served by the simulated vLLM worker.

Each client request runs one :class:`~disagg_transforms.Exchange`; every worker call goes to a
:class:`~disagg_transforms.testing.SimulatedWorker` through ``httpx.ASGITransport`` (or, given
``urls``, over HTTP to each step's worker: a real vLLM), a streamed one fed chunk by chunk
(``receive_stream_head`` / ``feed`` / ``end_of_stream``). The router is a transport handler for
the official SDKs (``httpx.MockTransport``, or ``httpx2``'s for the anthropic SDK).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import httpx
import httpx2

from disagg_transforms import (
    ClientReply,
    ClientStream,
    Driver,
    Exchange,
    ExchangeSettings,
    Step,
    StepParams,
    WorkerCall,
)
from disagg_transforms.testing import SimulatedWorker, WorkerSettings


class SimulatedRouter:
    """A transport handler: one exchange per client request, the worker in process."""

    def __init__(
        self,
        config: Mapping[Step, StepParams],
        worker: SimulatedWorker | None = None,
        *,
        fault: str | None = None,
        fault_step: str = "decode",
        urls: Mapping[str, str] | None = None,
        settings: ExchangeSettings | None = None,
    ) -> None:
        self.config = config
        self.urls = urls
        self.settings = settings
        self.worker = worker or SimulatedWorker(
            WorkerSettings(created=1796000000), first_byte_delay=0.05
        )
        self.fault = fault
        self.fault_step = fault_step
        self.requests = 0
        self.calls: list[WorkerCall] = []

    def __call__(self, request: Any) -> Any:
        self.requests += 1
        status, headers, body = asyncio.run(
            self.serve(request.url.path, request.headers.raw, request.content)
        )
        http = httpx2 if isinstance(request, httpx2.Request) else httpx
        return http.Response(status, headers=headers, content=body)

    async def serve(
        self,
        path: str,
        headers: Any,
        body: bytes,
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """The exchange loop (docs/router.md), the client's reply collected whole."""
        drive = Driver(Exchange(self.config, path, headers, body, settings=self.settings))
        transport = None if self.urls else httpx.ASGITransport(app=self.worker)
        sent = bytearray()
        async with httpx.AsyncClient(transport=transport, timeout=120) as http:
            while (call := drive.next_call()) is not None:
                self.calls.append(call)
                extra = {}
                if self.fault is not None and call.step == self.fault_step:
                    extra["x-simulate-fault"] = self.fault
                base = self.urls[call.step] if self.urls else "http://worker"
                request = http.build_request(
                    call.method,
                    base + call.path,
                    headers=[*call.headers, *extra.items()],
                    content=call.body,
                )
                answer = await http.send(request, stream=call.stream)
                try:
                    if not call.stream:
                        drive.answered(answer.status_code, answer.headers.raw, await answer.aread())
                        continue
                    drive.stream_opened(answer.status_code, answer.headers.raw)
                    chunks = answer.aiter_raw()
                    while drive.opening or drive.relaying:
                        sent += drive.chunk(await anext(chunks, None))
                finally:
                    await answer.aclose()
        reply = drive.reply()
        if isinstance(reply, ClientReply):
            return reply.status, list(reply.headers), reply.body
        assert isinstance(reply, ClientStream)
        return reply.status, list(reply.headers), reply.first + bytes(sent)

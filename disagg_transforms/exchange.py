"""The exchange: one client request through render, encode, prefill and decode, and back.

No I/O: the router asks :meth:`Exchange.next_event` what to do (call a worker, answer the
client), does it with its own HTTP client, and feeds the worker's status, headers and bytes
back. See ``docs/exchange.md`` and ``docs/router.md``.
"""

from __future__ import annotations

from disagg_transforms._engines import Engine, SglangSettings
from disagg_transforms._exchange.check import pipeline_warnings, version_errors
from disagg_transforms._exchange.drive import Driver
from disagg_transforms._exchange.events import (
    NEED_DATA,
    ClientReply,
    ClientStream,
    Event,
    NeedData,
    Phase,
    WorkerCall,
)
from disagg_transforms._exchange.flow import (
    ErrorKind,
    Exchange,
    ExchangeSettings,
    ExchangeStateError,
    StreamEnd,
    pipeline_phases,
)

__all__ = (
    "ClientReply",
    "ClientStream",
    "Driver",
    "Engine",
    "ErrorKind",
    "Event",
    "Exchange",
    "ExchangeSettings",
    "ExchangeStateError",
    "NEED_DATA",
    "NeedData",
    "Phase",
    "SglangSettings",
    "StreamEnd",
    "WorkerCall",
    "pipeline_phases",
    "pipeline_warnings",
    "version_errors",
)

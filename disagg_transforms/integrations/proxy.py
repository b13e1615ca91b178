"""The reference proxy: the exchange served over HTTP with Starlette and one pooled aiohttp client.

``pip install 'disagg_transforms[proxy]'``; ``disagg-transforms serve`` runs it (see
``docs/proxy.md``). :func:`create_app` builds the ASGI app: every client request is one
:class:`~disagg_transforms.Exchange` whose worker calls go to the URL of their step, streamed
answers relayed to the client as they come. The library's core never imports this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import operator
import os
import random
import signal
import sys
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from types import FrameType
from typing import TypeAlias

import aiohttp
import msgspec
import orjson
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    values,
)
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route as HttpRoute
from starlette.types import Message, Receive, Scope, Send

from disagg_transforms import (
    DEFAULT_LIMITS,
    EcConnector,
    KvConnector,
    Limits,
    Route,
    Step,
    StepParams,
    detect_route,
    parse_pipeline_params,
    validate_vllm_version,
    version_errors,
)
from disagg_transforms.errors import (
    ConfigError,
    RequestError,
    WorkerNotAllowedError,
    error_body,
)
from disagg_transforms.exchange import (
    ClientReply,
    ClientStream,
    Driver,
    Engine,
    ErrorKind,
    Exchange,
    ExchangeSettings,
    Phase,
    SglangSettings,
    WorkerCall,
    pipeline_phases,
)
from disagg_transforms.hooks import Pipeline
from disagg_transforms.integrations.sidecar import (
    ENCODE_HEADER,
    PREFILL_HEADER,
    WorkerHosts,
    WorkerTarget,
    worker_targets,
)

if sys.version_info >= (3, 11):
    from asyncio import timeout as _deadline
else:  # aiohttp's own dependency there
    from async_timeout import timeout as _deadline

__all__ = (
    "SidecarSeat",
    "Timeouts",
    "create_app",
    "sidecar_errors",
    "url_errors",
    "worker_vllm_version",
)

ACCESS_LOG = logging.getLogger("disagg_transforms.proxy")
"""One line per client request: its id, route, status, and each worker call's status and time."""

_CLIENT_ROUTES = tuple(Route)  # every client API is served, each through the exchange


# vLLM's routes the render worker answers, relayed as they are (docs/proxy.md).
_RENDER_WORKER_ROUTES = (("/tokenize", "POST"), ("/detokenize", "POST"), ("/version", "GET"))
_COUNT_TOKENS = "/v1/messages/count_tokens"
_SGLANG_GENERATE = "/generate"
# Gateway mode: the header naming a leg's pool, as llm-d's coordinator sends it (docs/llm-d.md).
_PROFILE_HEADER = "epp-profile"
_PROFILES: Mapping[str, str] = {
    "encode": "encode",
    "prefill": "prefill",
    "decode": "decode",
    "conditional-decode": "decode",
}
# What a relayed call passes on of the client's headers.
_RELAYED_HEADERS = frozenset({"authorization", "content-type", "x-request-id"})
# What aiohttp would add to a call: a worker gets the headers the exchange gives, and Host and
# Content-Length (no Accept-Encoding: the answers are read undecoded).
_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


@dataclass(frozen=True)
class Timeouts:
    """How long the proxy waits on a worker, in seconds; a timeout is a failed worker call.

    Before the client's reply has started it answers a retryable 504; after, it ends the
    client's stream with the API's error event (``docs/proxy.md``).
    """

    connect: float = 5.0
    """To open a connection to a worker (or take one from the pool)."""
    first_byte: float = 300.0
    """From sending a call to its whole answer, or to a stream's first chunk."""
    idle: float = 60.0
    """Between two chunks of a worker's stream."""


@dataclass(frozen=True)
class SidecarSeat:
    """llm-d's sidecar seat (``serve --prefill-from-header``; docs/llm-d.md, "The sidecar seat").

    Each request's prefill worker is the first that ``x-prefiller-host-port`` names, its encode
    worker the first of ``x-encoder-hosts-ports``; without the prefill header the request is
    decode only. Decode (and render) go to the decode URL.
    """

    allowed_worker_hosts: WorkerHosts | None = None
    """The hosts a request may name; any other is refused with 403 before any worker call.
    ``None``: any host."""
    prefiller_sampling: bool = False
    """A random entry of the prefill header's list gets the prefill, not the first (llm-d's
    ``--enable-prefiller-sampling``)."""


# What url_errors is given for a step whose worker each request names in the sidecar seat.
_FROM_HEADER = "http://x-prefiller-host-port"


def sidecar_errors(config: Mapping[Step, StepParams], **urls: str | None) -> list[ConfigError]:
    """Every problem of the sidecar seat's pipeline and URLs, one each (as :func:`url_errors`).

    ``urls`` are :func:`url_errors`' keywords (``decode_url``, ``render_url``, ...; ``None``:
    not given). Prefill and encode workers come from each request's headers, so their URLs and
    gateway mode are refused, and the pipeline needs a prefill step.
    """
    errors = [
        ConfigError(
            f"--prefill-from-header: give no --{name}-url with it (each request's headers "
            "name its prefill and encode workers; decode is --decode-url)",
            param=name,
        )
        for name in ("prefill", "encode", "gateway")
        if urls.get(f"{name}_url") is not None
    ]
    workers = set(pipeline_phases(config).values())
    if "prefill" not in workers:
        msg = "--prefill-from-header: the pipeline has no prefill step for the header to name"
        errors.append(ConfigError(msg, param="prefill"))
    stand_ins = {f"{w}_url": _FROM_HEADER for w in ("prefill", "encode") if w in workers}
    given = {"decode_url": urls.get("decode_url"), "render_url": urls.get("render_url")}
    return errors + url_errors(config, **given, **stand_ins)


def url_errors(  # noqa: PLR0913 - one URL per step, all by keyword
    config: Mapping[Step, StepParams],
    *,
    decode_url: str | None = None,
    prefill_url: str | None = None,
    encode_url: str | None = None,
    render_url: str | None = None,
    gateway_url: str | None = None,
) -> list[ConfigError]:
    """Every worker URL the proxy cannot call and every mismatch of steps and URLs, one each.

    A configured step needs its URL and a URL needs its step; render is needed when a leg
    speaks the generate route (its URL defaults to the decode URL). The calls a pipeline makes
    are the exchange's to say (:func:`~disagg_transforms.pipeline_phases`). In gateway mode
    (``gateway_url``) every leg goes to the gateway: no worker URL is given, and render needs
    ``render_url``.
    """
    given = {
        "decode": decode_url,
        "prefill": prefill_url,
        "encode": encode_url,
        "render": render_url,
        "gateway": gateway_url,
    }
    errors = [
        ConfigError(f"--{step}-url: {url!r} {why}", param=step)
        for step, url in given.items()
        if url is not None and (why := _url_problem(url))
    ]
    workers = set(pipeline_phases(config).values())
    urls = {"encode": encode_url, "prefill": prefill_url, "decode": decode_url}
    if gateway_url is not None:
        return errors + _gateway_errors(workers, urls, render_url)
    for worker, url in urls.items():
        if worker in workers and url is None:
            article = "an" if worker[0] in "aeiou" else "a"
            msg = f"{worker}: the pipeline has {article} {worker} step but no --{worker}-url"
            errors.append(ConfigError(msg, param=worker))
    if Step.DECODE not in config:
        errors.append(ConfigError("decode: the pipeline has no decode step", param="decode"))
    for worker, url in urls.items():
        if url is not None and worker != "decode" and worker not in workers:
            msg = f"--{worker}-url: the pipeline has no {worker} step to send there"
            errors.append(ConfigError(msg, param=worker))
    if render_url is not None and "render" not in workers:
        msg = "--render-url: no leg speaks the generate route, so nothing is rendered"
        errors.append(ConfigError(msg, param="render"))
    return errors


def _gateway_errors(
    workers: set[str], urls: Mapping[str, str | None], render_url: str | None
) -> list[ConfigError]:
    errors = [
        ConfigError(
            f"--gateway-url: give no --{worker}-url with it (the gateway picks every "
            f"{worker} worker)",
            param="gateway",
        )
        for worker, url in urls.items()
        if url is not None
    ]
    if "render" in workers and render_url is None:
        msg = (
            "--render-url: a leg speaks the generate route, and render is not a gateway leg: "
            "pass --render-url URL (a vLLM server with the render routes, such as `vllm launch "
            "render`), or run every leg on the client's route (use_openai_format: true)"
        )
        errors.append(ConfigError(msg, param="render"))
    return errors


def _url_problem(url: str) -> str:
    """Why ``url`` cannot be a worker's base URL, or ``""``: the checks a call would fail on."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in {"http", "https"}:
        return "has no scheme the proxy calls (expected http:// or https://, e.g. http://host:8000)"
    if not parts.hostname:
        return "has no host (expected http://host:port)"
    try:
        parts.port  # noqa: B018 - reading it checks it
    except ValueError as error:
        return f"has a bad port ({error})"
    return ""


# Seconds: from a millisecond render call to a long generation.
_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class _Metrics:
    """The coordinator's metrics (docs/proxy.md), as this process counts them.

    Under ``--workers N`` prometheus_client runs in its multiprocess mode (``serve`` names its
    directory before the processes start): each process writes its values to files there, and
    ``/metrics`` sums every process's. Otherwise this app's own registry holds them.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        into: CollectorRegistry | None = self.registry
        if values.ValueClass is not values.MutexValue:  # the mode prometheus_client chose
            MultiProcessCollector(self.registry)  # type: ignore[no-untyped-call]
            into = None
        model = ("model_name",)
        prefix = "llm_d_coordinator_"

        def counter(name: str, summary: str, labels: tuple[str, ...]) -> Counter:
            return Counter(name, summary, labels, registry=into)

        def histogram(name: str, summary: str, labels: tuple[str, ...]) -> Histogram:
            return Histogram(name, summary, labels, buckets=_DURATION_BUCKETS, registry=into)

        self.requests = counter(
            prefix + "request_total", "Client requests, refused ones included.", model
        )
        self.errors = counter(
            prefix + "request_error_total",
            "Client requests answered with an error.",
            (*model, "error_code"),
        )
        self.duration = histogram(
            prefix + "request_duration_seconds", "Client requests, to the reply's last byte.", model
        )
        self.running = Gauge(
            prefix + "request_running",
            "Client requests in flight.",
            model,
            multiprocess_mode="livesum",
            registry=into,
        )
        self.decisions = counter(
            prefix + "disagg_decision_total",
            "Client requests by the legs chosen for them.",
            (*model, "decision_type"),
        )
        self.calls = counter(
            prefix + "upstream_request_total", "Worker calls made, retries included.", ("phase",)
        )
        self.steps = histogram(
            prefix + "pipeline_step_duration_seconds",
            "Worker calls, to their answer's last byte.",
            ("step",),
        )
        self.cache_lookups = counter(
            prefix + "decode_cache_lookups_total",
            "Conditional decode calls: hit (2xx) or miss (412).",
            ("result",),
        )
        self.first_token = histogram(
            "disagg_transforms_time_to_first_token_seconds",
            "Client streams, from the request to their first bytes.",
            model,
        )


class _Log:
    """One client request's access log line and metrics; no line is kept when the log is off."""

    __slots__ = (
        "_cache_hit",
        "_legs",
        "_metrics",
        "_model",
        "_on",
        "_open",
        "_request",
        "_started",
        "_steps",
        "_written",
    )

    def __init__(self, request: Request, metrics: _Metrics) -> None:
        self._on = ACCESS_LOG.isEnabledFor(logging.INFO)
        self._request = request
        self._metrics = metrics
        self._started = time.monotonic()
        self._legs: list[str] = []
        self._model: str | None = None  # known once the request is counted
        self._steps: set[str] = set()  # the calls made
        self._cache_hit = False
        self._open: tuple[str, object, float, float] | None = None  # a stream read on
        self._written = False

    def begin(self, model: str | None) -> None:
        """The request is counted, under its body's ``model``."""
        self._model = model or "unknown"
        self._metrics.requests.labels(self._model).inc()
        self._metrics.running.labels(self._model).inc()

    def calling(self, step: str) -> float:
        """A worker call is made: it is counted; its start."""
        self._metrics.calls.labels(step).inc()
        self._steps.add(step)
        return time.monotonic()

    def leg(self, step: str, outcome: object, since: float, first: float | None = None) -> None:
        """A call is over: its status (``failed``: no answer) and when its answer's head came."""
        self._open = None  # a stream that failed before the client's reply began ends here
        self._over(step, outcome, since, first, time.monotonic())

    def streaming(self, step: str, status: int, since: float) -> None:
        """A streamed call's first events are read; it is over when the reply is."""
        self._open = (step, status, since, time.monotonic())

    def _over(
        self, step: str, outcome: object, since: float, first: float | None, end: float
    ) -> None:
        metrics = self._metrics
        metrics.steps.labels(step).observe(end - since)
        if step == Phase.CONDITIONAL_DECODE and isinstance(outcome, int):
            if outcome == 412:  # the decode worker does not hold the prompt's KV
                metrics.cache_lookups.labels("miss").inc()
            elif 200 <= outcome < 300:
                metrics.cache_lookups.labels("hit").inc()
                self._cache_hit = True
        if self._on:
            shown = "-" if first is None else f"{_ms(since, first)}ms"
            self._legs.append(f"{step}={outcome}/{shown}/{_ms(since, end)}ms")

    def first_bytes(self) -> None:
        """The client's stream sends its first bytes (its first token)."""
        model = self._model or "unknown"
        self._metrics.first_token.labels(model).observe(time.monotonic() - self._started)

    def _decision(self) -> str | None:
        steps = self._steps
        if Phase.ENCODE in steps:
            return "encode-prefill-decode"
        if Phase.PREFILL in steps:
            return "prefill-decode"
        if Phase.DECODE in steps or self._cache_hit:
            return "decode-only"
        return None  # refused, or answered before any leg was chosen

    def write(
        self,
        request_id: str,
        status: int,
        stream: str | None = None,
        why: str = "",
        error: ErrorKind | None = None,
    ) -> None:
        """The reply is over: count it, and write the line (a stream's says how it ended)."""
        if self._written:
            return
        self._written = True
        if self._open is not None:
            self._over(*self._open, time.monotonic())
        if self._model is None:
            self.begin(None)
        model = self._model
        assert model is not None  # noqa: S101 - begin sets it
        metrics = self._metrics
        metrics.running.labels(model).dec()
        metrics.duration.labels(model).observe(time.monotonic() - self._started)
        if error is not None:
            metrics.errors.labels(model, error).inc()
        if (decision := self._decision()) is not None:
            metrics.decisions.labels(model, decision).inc()
        if not self._on:
            return
        end = "" if stream is None else f" stream={stream}{why and f' ({why})'}"
        ACCESS_LOG.info(
            "%s %s %s %d %s total=%dms%s",
            request_id,
            self._request.method,
            self._request.scope["path"],
            status,
            " ".join(self._legs) or "-",
            _ms(self._started),
            end,
        )


def _ms(since: float, until: float | None = None) -> int:
    return round(((time.monotonic() if until is None else until) - since) * 1000)


class _Stream:
    """A worker's streamed answer, read under one deadline per phase (docs/proxy.md).

    The first read waits until the call's first-byte deadline, each later one at most the idle
    timeout. One timer checks the read in progress when it fires and re-arms itself (never more
    than an idle period ahead), so a read costs no timer of its own; a read past its deadline
    fails with ``TimeoutError``.
    """

    def __init__(self, answer: aiohttp.ClientResponse, first_byte_due: float, idle: float) -> None:
        self.answer = answer
        self._content = answer.content
        # What the answer holds unread, one piece per HTTP chunk (none for an answer with no
        # body: aiohttp's empty reader).
        self._pieces: deque[bytes] | None = getattr(self._content, "_buffer", None)
        self._loop = asyncio.get_running_loop()
        self._idle = idle
        self._due = first_byte_due  # the deadline of the read in progress
        self._first = True
        self._reading = False
        self._timer: asyncio.TimerHandle | None = None

    async def read(self) -> bytes:
        """All the bytes the worker's stream holds now, at least one; ``b""`` at its end."""
        now = self._loop.time()
        if self._first:
            self._first = False
        else:
            self._due = now + self._idle
        if self._timer is None:
            self._timer = self._loop.call_at(min(self._due, now + self._idle), self._check)
        self._reading = True
        try:
            if (pieces := self._pieces) is not None:
                await self._gather(pieces)
            return await self._content.readany()
        finally:
            self._reading = False

    async def _gather(self, pieces: deque[bytes]) -> None:
        """Wait for bytes, then make what came one piece, so ``readany`` takes it at once.

        ``readany`` takes the pieces one by one, each time resuming the connection's reading
        and so running its parser again: about 0.35 us a piece, and an SGLang event is one
        (docs/performance.md, "What the stream figures compare"). Only ``readany`` reads this
        answer, so no piece was partly read.
        """
        content = self._content
        if not pieces and not content.is_eof() and content.exception() is None:
            await content._wait("readany")  # noqa: SLF001 - readany's own wait
        if len(pieces) > 1:
            whole = b"".join(pieces)
            pieces.clear()
            pieces.append(whole)

    def _check(self) -> None:
        self._timer = None
        if not self._reading:
            return  # the next read arms it again
        now = self._loop.time()
        if now >= self._due:
            self._content.set_exception(TimeoutError())
            return
        # At most an idle period ahead: a read started before it fires has a later deadline.
        self._timer = self._loop.call_at(min(self._due, now + self._idle), self._check)

    def close(self) -> None:
        """Stop the deadline; close the worker's answer (its connection stays pooled if read)."""
        if self._timer is not None:
            self._timer.cancel()
        self.answer.close()


# asyncio's TimeoutError is the builtin one from Python 3.11 on (another class on 3.10).
_TIMEOUTS = (TimeoutError, asyncio.TimeoutError)
_FAILURES = (aiohttp.ClientError, *_TIMEOUTS)


_SignalHandler: TypeAlias = Callable[[int, FrameType | None], object]
# What a closed pooled connection looks like before any byte of the answer came.
_IDLE_CLOSE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
# A prefill answer worth another try (--prefill-max-retries): the worker or its gateway was
# unavailable; any other status is the answer.
_RETRIED_STATUSES = frozenset({502, 503, 504})
# What a worker's answer may hold unread before its socket is paused (aiohttp pauses at twice
# this): about one socket read of uvloop's (250 KB). At aiohttp's 64 KB, a stream of large events
# (SGLang's cumulative ones) came in reads of a few events, each one write to the client
# (docs/performance.md, "What the stream figures compare").
_READ_BUFSIZE = 1 << 18
# glibc's malloc (mallopt's parameters): blocks from the mmap threshold up are mapped on their
# own; free space past the trim threshold at the heap's top goes back to the system. glibc moves
# both with the largest block freed so far, so where they end depends on the process's history:
# in about one serving process in six, the ~1 MB a streamed request's reads swing the heap's top
# by went back and came again each request (900 page faults a 1k-token SGLang stream, 15% more
# CPU a chunk). Fixed above what a read holds (twice _READ_BUFSIZE), a process runs the same way
# each time (docs/performance.md, "What the stream figures compare").
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD = 1 << 20
_TRIM_THRESHOLD = 8 << 20


def _is_glibc() -> bool:
    """Whether this process's C library is glibc (whose malloc ``mallopt`` tunes)."""
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (AttributeError, ValueError, OSError):  # no confstr, or not that name
        return False


def _steady_heap() -> bool:
    """Fix glibc malloc's mmap and trim thresholds in this process; False with another libc."""
    if not _is_glibc():
        return False  # another allocator, its own rules
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    )


_WorkerHeaders: TypeAlias = Mapping[str, str] | Sequence[tuple[str, str]]
"""A worker call's headers: an exchange's (pairs) or a relayed request's."""


class _Reuse:
    """Whether a call went out on a pooled connection (aiohttp's trace of that call says)."""

    __slots__ = ("pooled",)

    def __init__(self) -> None:
        self.pooled = False


async def _on_reuse(
    _session: aiohttp.ClientSession,
    context: object,
    _params: aiohttp.TraceConnectionReuseconnParams,
) -> None:
    reuse = getattr(context, "trace_request_ctx", None)
    if isinstance(reuse, _Reuse):
        reuse.pooled = True


def _timed_out(error: BaseException) -> bool:
    # aiohttp's own timeouts (a connection not opened or taken from the pool in time) are
    # asyncio's TimeoutError too.
    return isinstance(error, _TIMEOUTS)


def _reason(error: BaseException, timeouts: Timeouts) -> str:
    """The kind of a failed call, as the client is told it.

    Never the worker's address nor the transport's own text: they name internal hosts
    (docs/proxy.md, "Errors and timeouts"); ``_logged_failure`` writes them to the log.
    """
    if isinstance(error, _TIMEOUTS):
        if isinstance(error, aiohttp.ClientError):  # aiohttp's own: the connect timeout
            return f"no connection within the timeout ({timeouts.connect:g}s connect)"
        return (
            f"no answer within the timeout ({timeouts.first_byte:g}s first byte,"
            f" {timeouts.idle:g}s idle)"
        )
    return next(
        (kind for classes, kind in _FAILURE_KINDS if isinstance(error, classes)),
        "the connection failed",
    )


# The kinds of a failed call a client is told, the most precise first.
_FAILURE_KINDS: tuple[tuple[type[aiohttp.ClientError], str], ...] = (
    (aiohttp.ClientConnectorError, "could not connect to the worker"),
    (aiohttp.ServerDisconnectedError, "the worker closed the connection"),
    (aiohttp.ClientPayloadError, "the worker's answer was cut off"),
    (aiohttp.ClientOSError, "connection reset"),
)


def _log_failure(step: str, url: str, error: BaseException) -> None:
    """What a client is never told of a failed call: the worker's address, the exception."""
    ACCESS_LOG.warning("%s call to %s failed: %s: %s", step, url, type(error).__name__, error)


def _logged_failure(step: str, url: str, error: BaseException, timeouts: Timeouts) -> str:
    """:func:`_reason` for the client; the worker's address and the exception to the log."""
    _log_failure(step, url, error)
    return _reason(error, timeouts)


class _Version(msgspec.Struct):
    """What a worker's ``GET /version`` is read for."""

    version: object = None


async def _asked_version(http: aiohttp.ClientSession, url: str, timeout: float) -> str | None:
    """The vLLM release the worker at ``url`` names in its ``GET /version``.

    ``None`` when it answers but names none (not a vLLM worker, an error status).

    Raises:
        aiohttp.ClientError, TimeoutError: no answer (the worker is not up, or not there).
    """
    async with _deadline(timeout):
        answer = await http.get(url + "/version")
        try:
            body = await answer.read()
        finally:
            answer.release()
    try:
        version = msgspec.json.decode(body, type=_Version).version
        return validate_vllm_version(version) if answer.status == HTTPStatus.OK else None
    except (msgspec.DecodeError, RecursionError, ConfigError):
        return None


def worker_vllm_version(url: str, *, timeout: float = 5.0) -> str | None:
    """The vLLM release of the worker at ``url``, from its ``GET /version`` (blocking).

    What ``serve`` asks the render worker at startup (docs/proxy.md, "vLLM versions"). ``None``
    when it cannot be reached in ``timeout`` seconds or names no release; why goes to the log.
    """

    async def ask() -> str | None:
        async with aiohttp.ClientSession(trust_env=False) as http:
            return await _asked_version(http, url.rstrip("/"), timeout)

    try:
        return asyncio.run(ask())
    except _FAILURES as error:
        _log_failure("version", url, error)
        return None


def _client_error(
    request: Request,
    status: int,
    message: str,
    param: str | None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """An error in the client API's shape, answered before any exchange reads the request."""
    body = error_body(detect_route(request.url.path), status=status, message=message, param=param)
    return Response(
        orjson.dumps(body), status_code=status, headers=headers, media_type="application/json"
    )


def _too_large(request: Request, limit: int) -> Response:
    # Named as the operator sets it: serve's flag (create_app's limits= is its programmatic twin).
    message = f"$: the body is over the limit of {limit} bytes (--max-body-bytes)"
    # The rest of the body is never read, so the connection cannot carry another request.
    return _client_error(request, 413, message, "$", {"connection": "close"})


class _Seat:
    """The sidecar seat's choice per request: the pipeline and worker URLs its headers give."""

    __slots__ = ("allowed", "decode_only", "pick_prefill", "pipelines", "urls")

    def __init__(
        self, seat: SidecarSeat, config: Mapping[Step, StepParams], urls: Mapping[str, str]
    ) -> None:
        self.allowed = seat.allowed_worker_hosts
        self.urls = urls
        # Spreading load, not a secret: this app's own generator, seeded by the OS.
        sample = random.Random().choice  # noqa: S311
        self.pick_prefill: Callable[[Sequence[WorkerTarget]], WorkerTarget] = (
            sample if seat.prefiller_sampling else operator.itemgetter(0)
        )
        # By whether the request names encode workers: without, encode is not run.
        self.pipelines: Mapping[bool, Mapping[Step, StepParams]] = {
            True: config,
            False: {step: params for step, params in config.items() if step is not Step.ENCODE},
        }
        leg_steps = (Step.ENCODE, Step.PREFILL)
        self.decode_only = {k: v for k, v in config.items() if k not in leg_steps}

    def choose(self, request: Request) -> tuple[Mapping[Step, StepParams], Mapping[str, str]]:
        """The pipeline and worker URLs of ``request``.

        Raises:
            RequestError: a header is not a list of ``host:port`` (400).
            WorkerNotAllowedError: a header names a host off the allow-list (403).
        """
        prefill = worker_targets(_header(request, PREFILL_HEADER), PREFILL_HEADER)
        encode = worker_targets(_header(request, ENCODE_HEADER), ENCODE_HEADER)
        if self.allowed is not None:
            self.allowed.check(prefill, PREFILL_HEADER)
            self.allowed.check(encode, ENCODE_HEADER)
        if not prefill:  # as llm-d's sidecar: no prefill worker named, decode only
            return self.decode_only, self.urls
        # One encode call per request carries every image: it goes to the first encoder
        # named (docs/llm-d.md, "The sidecar seat").
        urls = {**self.urls, "prefill": self.pick_prefill(prefill).url}
        if encode:
            urls["encode"] = encode[0].url
        return self.pipelines[bool(encode)], urls


class _Flight:
    """A request's calls that a cancel must reach: those sent together, and the one with an abort.

    Cancelled (the client left, or the reply is an error), a call's connection is closed and
    its ``abort`` sent; otherwise a call sent together is read to its end (docs/proxy.md,
    "Calls that go together").
    """

    __slots__ = ("aborted", "failed", "main", "peers")

    def __init__(self) -> None:
        self.peers: dict[asyncio.Future[None], WorkerCall] = {}
        self.main: WorkerCall | None = None
        """The last call made that has an ``abort``."""
        self.failed = asyncio.Event()
        """A call sent together ended the exchange with its failure."""
        self.aborted = False


def _host(url: str | None) -> str | None:
    """The host of a worker's base URL, as SGLang's decode reaches its prefill by it."""
    return None if url is None else urllib.parse.urlsplit(url).hostname


def _header(request: Request, name: str) -> str | None:
    """Every value of header ``name``, joined as one comma list; ``None`` when absent."""
    values = request.headers.getlist(name)
    return ",".join(values) if values else None


class _Proxy:
    def __init__(  # noqa: PLR0913 - what create_app was given, read once
        self,
        config: Mapping[Step, StepParams],
        urls: Mapping[str, str],
        timeouts: Timeouts,
        settings: ExchangeSettings,
        *,
        worker_keep_alive: float,
        profiles: Mapping[str, str],
        prefill_max_retries: int,
        seat: _Seat | None,
        probe_version: bool,
    ) -> None:
        self.config = config
        self.seat = seat  # the sidecar seat: each request's headers name its workers
        self.prefill_max_retries = prefill_max_retries
        self.urls = urls
        self.profiles = profiles  # gateway mode: each leg's EPP-Profile
        self.timeouts = timeouts
        self.worker_keep_alive = worker_keep_alive
        self.settings = settings  # one settings object for every exchange this proxy runs
        self.version_unknown = probe_version and settings.vllm_version is None
        """The workers' release is asked before the next client request (serve could not)."""
        self.probing = asyncio.Lock()
        # A count_tokens request is rendered whatever the pipeline: its exchange's first call.
        # Its decode never runs; auto, so a count request with tools is counted, not refused,
        # and rendered whatever the workers' release (its decode is never sent).
        self.rendered = parse_pipeline_params(
            {"decode": {"output_mode": "auto"}}, use_openai_format=False
        )
        self.count_settings = msgspec.structs.replace(settings, vllm_version=None)
        self.http: aiohttp.ClientSession | None = None
        self.metrics = _Metrics()
        self.draining = False
        """A stop signal has come: ``/readyz`` answers 503 from now on."""
        self.background: set[asyncio.Future[None]] = set()
        """Aborts sent and calls read to their end after the client's reply (kept referenced)."""

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        _steady_heap()  # each serving process
        with self._draining_on_stop_signals():
            async with self._pooled_client():
                yield

    @contextlib.contextmanager
    def _draining_on_stop_signals(self) -> Iterator[None]:
        """Chain a handler before the server's own for SIGTERM and SIGINT, until the app stops.

        The server (uvicorn) stops on them: this process closes its listener and drains. Only
        a signal the server handles itself is chained, so the app never takes one over; a
        server that does not handle signals in the main thread leaves ``/readyz`` at 200.
        """
        chained: list[tuple[signal.Signals, _SignalHandler, _SignalHandler]] = []
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                server = signal.getsignal(sig)
                if callable(server):
                    handler = self._draining_then(server)
                    signal.signal(sig, handler)
                    chained.append((sig, handler, server))
        try:
            yield
        finally:
            for sig, handler, server in chained:
                if signal.getsignal(sig) is handler:  # else another handler came after ours
                    signal.signal(sig, server)

    def _draining_then(self, server: _SignalHandler) -> _SignalHandler:
        def handler(signum: int, frame: FrameType | None) -> object:
            self.draining = True
            return server(signum, frame)

        return handler

    @contextlib.asynccontextmanager
    async def _pooled_client(self) -> AsyncIterator[None]:
        # One pooled session per process, with no limit on connections; its connect timeout
        # also bounds taking a connection from the pool. Nothing is added to the exchange's
        # calls (no cookies, no default headers, no proxy from the environment), and the
        # worker's bytes reach the exchange as they came.
        connector = aiohttp.TCPConnector(
            limit=0,
            keepalive_timeout=self.worker_keep_alive or None,
            force_close=not self.worker_keep_alive,
        )
        reuse = aiohttp.TraceConfig()
        reuse.on_connection_reuseconn.append(_on_reuse)
        async with aiohttp.ClientSession(
            trace_configs=[reuse],
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, connect=self.timeouts.connect),
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=_AUTO_HEADERS,
            auto_decompress=False,
            trust_env=False,
            read_bufsize=_READ_BUFSIZE,
        ) as http:
            self.http = http
            yield
        self.http = None

    def _client(self) -> aiohttp.ClientSession:
        assert self.http is not None  # noqa: S101 - requests are served only inside the lifespan
        return self.http

    async def health(self, _request: Request) -> Response:
        return Response(b"", status_code=200)

    async def alive(self, _request: Request) -> Response:
        return Response(b"ok", media_type="text/plain")

    async def ready(self, _request: Request) -> Response:
        if self.draining:
            return Response(b"draining", status_code=503, media_type="text/plain")
        return Response(b"ok", media_type="text/plain")

    async def metrics_text(self, _request: Request) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def _logged(
        self, request: Request, handler: Callable[[Request, _Log], Awaitable[Response]]
    ) -> Response:
        """``handler``'s reply to a client request, which it logs and counts (``_Log``)."""
        log = _Log(request, self.metrics)
        try:
            return await handler(request, log)
        except BaseException as error:
            # A bug (Starlette answers 500), or the task cancelled: still counted, and logged.
            log.write("-", 500, error="internal" if isinstance(error, Exception) else None)
            raise

    async def models(self, request: Request) -> Response:
        return await self._relayed(request, "decode")

    async def render_worker(self, request: Request) -> Response:
        return await self._relayed(request, "render")

    async def _relayed(self, request: Request, step: str) -> Response:
        """The answer of ``step``'s worker to the same method, path and body, as it came."""
        url = self.urls[step] + request.url.path
        headers = {k: v for k, v in request.headers.items() if k in _RELAYED_HEADERS}
        try:
            async with _deadline(self.timeouts.first_byte):
                sent = await request.body() or None
                answer = await self._request(request.method, url, headers, sent)
                try:
                    body = await answer.read()
                finally:
                    answer.release()
        except _FAILURES as error:
            message = f"{step} failed: {_logged_failure(step, url, error, self.timeouts)}"
            return _openai_error(502, message)
        kind = answer.headers.get("content-type", "application/json")
        return Response(body, status_code=answer.status, media_type=kind)

    async def _client_body(self, request: Request) -> bytes | Response:
        """The client's body, or the 413 that refuses it as soon as it is over the limit.

        A declared length is judged before any byte is read, a chunked body as it comes: one
        body costs at most the limit (twice, briefly, as it becomes bytes; docs/proxy.md).
        """
        limit = self.settings.limits.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            return _too_large(request, limit)
        # Chunks joined once at the end: a growing buffer would copy itself as it grows.
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return _too_large(request, limit)
            chunks.append(chunk)
        return b"".join(chunks)  # one chunk, the usual body, is returned as it is

    async def count_tokens(self, request: Request) -> Response:
        return await self._logged(request, self._count_tokens)

    async def _count_tokens(self, request: Request, log: _Log) -> Response:
        """``POST /v1/messages/count_tokens``, as vLLM: the token IDs of the request's render.

        The body runs through an exchange as a Messages request (with a ``max_tokens``, which
        the render requires and a count request lacks): its render call is the exchange's own
        (headers, request id, transfer params), and the leg after it carries the render's
        ``token_ids``. A refusal or a failed render is the exchange's Anthropic error.
        """
        read = await self._client_body(request)
        if isinstance(read, Response):
            log.write("-", read.status_code, error="bad_request")
            return read
        body = _with_max_tokens(read)
        ex = Exchange(
            self.rendered,
            Route.MESSAGES.value,
            request.headers.raw,
            body,
            settings=self.count_settings,
        )
        log.begin(ex.client_model)
        drive = Driver(ex)
        if (call := drive.next_call()) is not None:
            await self._call(drive, call, log, self.urls)
        if (call := drive.next_call()) is not None:  # the leg after render: not sent
            count = len(msgspec.json.decode(call.body, type=_TokenIds).token_ids)
            log.write(ex.request_id, 200)
            answer = {"input_tokens": count, "context_management": {"original_input_tokens": count}}
            headers = {"x-request-id": ex.request_id}
            return Response(orjson.dumps(answer), media_type="application/json", headers=headers)
        reply = drive.reply()
        assert isinstance(reply, ClientReply)  # noqa: S101 - no stream was asked for
        log.write(ex.request_id, reply.status, error=ex.error_kind)
        return Response(reply.body, status_code=reply.status, headers=dict(reply.headers))

    async def serve(self, request: Request) -> Response:
        return await self._logged(request, self._serve)

    async def _serve(self, request: Request, log: _Log) -> Response:
        client_body = await self._client_body(request)
        if isinstance(client_body, Response):
            log.write("-", client_body.status_code, error="bad_request")
            return client_body
        config, urls = self.config, self.urls
        if self.seat is not None:
            try:
                config, urls = self.seat.choose(request)
            except (RequestError, WorkerNotAllowedError) as error:
                log.begin(_body_model(client_body))
                log.write("-", error.status_hint, error="bad_request")
                return _client_error(request, error.status_hint, error.message, error.param)
        if self.version_unknown:
            await self._ask_version()
        sglang = self.settings.engine is Engine.SGLANG
        ex = Exchange(
            config,
            request.scope["path"],
            request.headers.raw,
            client_body,
            settings=self.settings,
            bootstrap_host=_host(urls.get("prefill")) if sglang else None,
        )
        log.begin(ex.client_model)
        drive = Driver(ex)
        flight = _Flight()
        watch = _Watch(request)
        try:
            stream = await self._calls(drive, log, urls, flight)
        except BaseException as error:
            if not (isinstance(error, asyncio.CancelledError) and watch.caught()):
                watch.stop()  # a bug, or the server stops
                raise
            # The client went away: the call in flight is cancelled, which closes its
            # connection, so the worker aborts it and frees its KV blocks (docs/proxy.md).
            self._settle(drive, flight, urls, gone=True)
            log.write(ex.request_id, 499, "client-disconnected")
            return Response(b"", status_code=499)  # nobody reads it
        reply = drive.reply()
        if isinstance(reply, ClientReply):
            watch.stop()
            if stream is not None:
                stream.close()
            self._settle(drive, flight, urls, gone=False)
            log.write(ex.request_id, reply.status, error=ex.error_kind)
            return Response(reply.body, status_code=reply.status, headers=dict(reply.headers))
        assert stream is not None  # noqa: S101 - a client stream relays a worker stream

        async def relay(send: Send, start: Message) -> None:
            await self._relay(
                send, start, reply, log, drive=drive, stream=stream, flight=flight, urls=urls
            )

        return _Streamed(reply.status, reply.headers, relay, watch)

    def _settle(
        self, drive: Driver, flight: _Flight, urls: Mapping[str, str], *, gone: bool
    ) -> None:
        """After the client's reply: cancel what is still in flight, or read it to its end.

        In the background: nothing here holds the client's reply, and a cancelled relay must
        not wait (docs/proxy.md, "Calls that go together").
        """
        if flight.aborted:
            return
        if not (gone or drive.cancelling):
            for task in flight.peers:  # read to their end, their outcome logged
                self._keep(task)
            return
        flight.aborted = True
        for task, call in flight.peers.items():
            if not task.done():
                task.cancel()
                self._keep(asyncio.ensure_future(self._abort(call, urls)))
        if flight.main is not None:
            self._keep(asyncio.ensure_future(self._abort(flight.main, urls)))

    def _keep(self, task: asyncio.Future[None]) -> None:
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def _abort(self, call: WorkerCall, urls: Mapping[str, str]) -> None:
        """Send ``call``'s abort to its worker; a failure is only logged (nothing waits on it)."""
        abort = call.abort
        assert abort is not None  # noqa: S101 - only calls with an abort are cancelled so
        try:
            async with _deadline(self.timeouts.connect):
                answer = await self._send(abort, urls)
                answer.release()
        except _FAILURES as error:
            _log_failure(f"{call.step} abort", urls[call.step], error)

    async def _ask_version(self) -> None:
        """Ask the render worker's release once it answers (``serve`` could not at startup).

        A worker that cannot be reached is asked again before the next request; one that
        answers without a release is taken to honour every mode (docs/proxy.md, "vLLM
        versions").
        """
        async with self.probing:
            if not self.version_unknown:
                return  # another request asked meanwhile
            url = self.urls["render"]  # a vLLM worker of the fleet, never the gateway's picker
            try:
                version = await _asked_version(self._client(), url, self.timeouts.connect)
            except _FAILURES as error:
                _log_failure("version", url, error)
                return
            self.version_unknown = False
            if version is None:
                ACCESS_LOG.warning("%s/version names no vLLM release: every mode is assumed", url)
                return
            ACCESS_LOG.info("the workers run vLLM %s", version)
            self.settings = msgspec.structs.replace(self.settings, vllm_version=version)
            for refused in version_errors(self.config, version):
                ACCESS_LOG.error("%s", refused.message)

    async def _send(self, call: WorkerCall, urls: Mapping[str, str]) -> aiohttp.ClientResponse:
        """Send ``call`` to its step's worker in ``urls``; its answer once its head came."""
        headers = call.headers
        if (profile := self.profiles.get(call.step)) is not None:
            headers = (*headers, (_PROFILE_HEADER, profile))
        return await self._request(call.method, urls[call.step] + call.path, headers, call.body)

    async def _request(
        self, method: str, url: str, headers: _WorkerHeaders, body: bytes | None
    ) -> aiohttp.ClientResponse:
        """One call to a worker; its answer once its head came.

        A call that fails on a pooled connection before any byte of its answer came is sent
        again: the worker closed that idle connection as the call went out, and never read it
        (docs/proxy.md, "Keep-alive"). Each such failure closes that connection, so this ends
        on a fresh one, whose failure is the call's.
        """
        while True:
            reuse = _Reuse()
            try:
                return await self._client().request(
                    method, url, headers=headers, data=body, trace_request_ctx=reuse
                )
            except _IDLE_CLOSE:
                if not reuse.pooled:
                    raise

    async def _calls(
        self, drive: Driver, log: _Log, urls: Mapping[str, str], flight: _Flight
    ) -> _Stream | None:
        """Make the exchange's worker calls; the decode worker's stream when it is relayed."""
        stream: _Stream | None = None
        while (call := drive.next_call()) is not None:
            if call.abort is not None:
                flight.main = call
            if call.together:
                stream = await self._together(drive, call, log, urls, flight)
            else:
                stream = await self._call(drive, call, log, urls)
        return stream

    async def _together(
        self, drive: Driver, call: WorkerCall, log: _Log, urls: Mapping[str, str], flight: _Flight
    ) -> _Stream | None:
        """Make ``call`` and the calls that go with it at once (SGLang's prefill and decode).

        A call sent together that fails before the client's reply is known ends the exchange:
        ``call`` is cancelled then (docs/proxy.md, "Calls that go together").
        """
        for peer in call.together:
            task = asyncio.ensure_future(self._peer(drive, peer, log, urls, flight))
            flight.peers[task] = peer
        main = asyncio.ensure_future(self._call(drive, call, log, urls))
        failed = asyncio.ensure_future(flight.failed.wait())
        try:
            await asyncio.wait((main, failed), return_when=asyncio.FIRST_COMPLETED)
        finally:
            failed.cancel()
            if not main.done():  # a call sent together failed, or the client left
                main.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await main
        if main.cancelled():
            return None
        if drive.awaiting:  # the reply needs a peer's answer too (SGLang's prompt logprobs)
            await asyncio.wait(flight.peers)
        return main.result()

    async def _peer(
        self, drive: Driver, call: WorkerCall, log: _Log, urls: Mapping[str, str], flight: _Flight
    ) -> None:
        """Make a call sent together with another; read its answer to its end and feed it."""
        since = log.calling(call.step)
        try:
            answer = await self._send(call, urls)
            try:
                body = await answer.read()
            finally:
                answer.release()
        except _FAILURES as error:
            log.leg(call.step, "failed", since)
            why = _logged_failure(call.step, urls[call.step], error, self.timeouts)
            drive.together_failed(call, why, timed_out=_timed_out(error))
        else:
            log.leg(call.step, answer.status, since)
            drive.together_answered(call, answer.status, answer.raw_headers, body)
        if drive.cancelling:
            flight.failed.set()

    async def _call(
        self, drive: Driver, call: WorkerCall, log: _Log, urls: Mapping[str, str]
    ) -> _Stream | None:
        """Make one worker call and feed its answer (a stream until the client's reply is known)."""
        if not call.stream:
            await self._call_whole(drive, call, log, urls)
            return None
        since = log.calling(call.step)
        stream: _Stream | None = None
        first_byte_due = asyncio.get_running_loop().time() + self.timeouts.first_byte
        try:
            async with _deadline(self.timeouts.first_byte):
                answer = await self._send(call, urls)
            stream = _Stream(answer, first_byte_due, self.timeouts.idle)
            drive.stream_opened(answer.status, answer.raw_headers)
            while drive.opening:
                drive.chunk(await stream.read() or None)  # b"": the stream's end
        except _FAILURES as error:
            why = _logged_failure(call.step, urls[call.step], error, self.timeouts)
            drive.failed(why, timed_out=_timed_out(error))
            log.leg(call.step, "failed", since)
            if stream is not None:
                stream.close()
            return None
        except BaseException:  # cancelled (the server stops): the worker's stream goes too
            if stream is not None:
                stream.close()
            raise
        if isinstance(drive.exchange.next_event(), WorkerCall):
            stream.close()  # read whole and the plan goes on (a conditional decode's 412)
            log.leg(call.step, answer.status, since)
            return None
        log.streaming(call.step, answer.status, since)
        return stream

    async def _call_whole(
        self, drive: Driver, call: WorkerCall, log: _Log, urls: Mapping[str, str]
    ) -> None:
        """Make a call whose answer is read whole, and feed it.

        A prefill that failed with 502, 503, 504 or in transport is sent again, up to
        ``--prefill-max-retries`` times; only the last try's outcome reaches the exchange, so
        a failed prefill is the client's error and no decode call follows it.
        """
        retries = self.prefill_max_retries if call.step is Phase.PREFILL else 0
        for retries_left in range(retries, -1, -1):
            since = log.calling(call.step)  # every try is a call made
            try:
                async with _deadline(self.timeouts.first_byte):
                    answer = await self._send(call, urls)
                    head = time.monotonic()
                    try:
                        body = await answer.read()
                    finally:
                        answer.release()
            except _FAILURES as error:
                log.leg(call.step, "failed", since)
                why = _logged_failure(call.step, urls[call.step], error, self.timeouts)
                if not retries_left:
                    drive.failed(why, timed_out=_timed_out(error))
                continue
            log.leg(call.step, answer.status, since, head)
            if retries_left and answer.status in _RETRIED_STATUSES:
                continue
            drive.answered(answer.status, answer.raw_headers, body)
            return

    async def _relay(  # noqa: PLR0913 - the reply's parts and what settles the request
        self,
        send: Send,
        start: Message,
        reply: ClientStream,
        log: _Log,
        *,
        drive: Driver,
        stream: _Stream,
        flight: _Flight,
        urls: Mapping[str, str],
    ) -> None:
        """Send the client's stream as the worker's comes; close the worker's at the end.

        Everything one read of the worker's stream brings is fed at once, and what the exchange
        gives back is one write to the client (none when it gives nothing); the last one also
        ends the reply's body (no write of its own).
        """
        ended: str | None = None  # how it ended when the exchange cannot know (the client left)
        why = ""
        try:
            await send(start)
            log.first_bytes()
            out = reply.first
            try:
                while drive.relaying:
                    if out:
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                    # b"" is the stream's end; the client's stream may end first (a broken
                    # contract: its error event went out, and the worker's is closed below).
                    out = drive.chunk(await stream.read() or None)
            except _FAILURES as error:
                why = _logged_failure("streamed", str(stream.answer.url), error, self.timeouts)
                out = drive.failed(why, timed_out=_timed_out(error))
            await send({"type": "http.response.body", "body": out, "more_body": False})
        except BaseException:
            # Cancelled when the client goes away (_Watch): the worker's stream is closed
            # below, so the worker stops generating for nobody.
            ended = "client-disconnected"
            raise
        finally:
            stream.close()
            self._settle(drive, flight, urls, gone=ended is not None)
            ex = drive.exchange
            log.write(ex.request_id, reply.status, str(ended or ex.stream_end), why, ex.error_kind)


class _Watch:
    """Watches one request's client while the request is served: its leaving cancels the task.

    One task reads the client's side (its body was read whole before) from the first worker
    call to the reply's end; the request's own task makes the calls and sends the reply, and
    takes the cancel back when it was the client's (:meth:`caught`).
    """

    __slots__ = ("_task", "_watcher", "left")

    def __init__(self, request: Request) -> None:
        task = asyncio.current_task()
        assert task is not None  # noqa: S101 - a request is served in a task
        self._task = task
        self.left = False
        self._watcher = asyncio.ensure_future(self._watch(request.receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.left = True
        self._task.cancel()

    def caught(self) -> bool:
        """Whether the cancel being raised is the client's leaving, then taken back."""
        if not self.left:
            return False  # the server's (it stops): raised on
        if sys.version_info >= (3, 11):
            self._task.uncancel()
        return True

    def stop(self) -> None:
        """The reply is over: the client is no longer watched."""
        self._watcher.cancel()


class _Streamed(Response):
    """A streamed reply that ``relay`` sends, in the request's own task (:class:`_Watch`).

    Not Starlette's ``StreamingResponse``: under uvicorn's ASGI 2.3 that runs a task group and
    a second task per reply to see the client leave, which the request's watcher already does.
    """

    def __init__(
        self,
        status: int,
        headers: Sequence[tuple[str, str]],
        relay: Callable[[Send, Message], Awaitable[None]],
        watch: _Watch,
    ) -> None:
        self.status_code = status
        self.background = None
        self.init_headers(dict(headers))
        self._relay = relay
        self._watch = watch

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        del scope, receive
        start = {"type": "http.response.start", "status": self.status_code}
        try:
            await self._relay(send, {**start, "headers": self.raw_headers})
        except asyncio.CancelledError:
            if not self._watch.caught():
                raise
        finally:
            self._watch.stop()


class _Model(msgspec.Struct):
    """The member of a client's body its metrics are labelled with."""

    model: object = None


def _body_model(body: bytes) -> str | None:
    """The body's ``model``, for a request refused before an exchange reads it (its metrics)."""
    try:
        model = msgspec.json.decode(body, type=_Model).model
    except (msgspec.DecodeError, RecursionError):
        return None
    return model if isinstance(model, str) else None


class _TokenIds(msgspec.Struct):
    """The one member of a generate leg the count of its prompt reads."""

    token_ids: list[int]


def _with_max_tokens(body: bytes) -> bytes:
    """A count_tokens body as a Messages render takes it: with a ``max_tokens`` of 1.

    Anything but a JSON object without ``max_tokens`` is left as it is, for the exchange to
    answer (a refusal in Anthropic's error shape, or the render's own answer).
    """
    try:
        members = msgspec.json.decode(body, type=dict[str, msgspec.Raw])
    except (msgspec.DecodeError, RecursionError):
        return body
    if "max_tokens" in members:
        return body
    rest = body.lstrip()[1:]
    return b'{"max_tokens":1' + (b"," + rest if members else rest.lstrip())


def _openai_error(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    body = orjson.dumps(error_body(Route.CHAT_COMPLETIONS, status=status, message=message))
    return Response(body, status_code=status, media_type="application/json", headers=headers)


async def _no_route(request: Request, exc: Exception) -> Response:
    """A path the proxy does not serve (404) or a method it does not take there (405, ``Allow``).

    In the OpenAI error shape every other answer of the proxy has, not Starlette's plain text.
    """
    assert isinstance(exc, HTTPException)  # noqa: S101 - registered for 404 and 405 only
    message = f"{exc.detail}: {request.method} {request.url.path}"
    return _openai_error(exc.status_code, message, exc.headers)


def create_app(  # noqa: PLR0913 - one URL per step and the settings, all by keyword
    config: Mapping[Step, StepParams],
    *,
    decode_url: str | None = None,
    prefill_url: str | None = None,
    encode_url: str | None = None,
    render_url: str | None = None,
    gateway_url: str | None = None,
    timeouts: Timeouts = Timeouts(),
    hooks: Pipeline | None = None,
    limits: Limits = DEFAULT_LIMITS,
    worker_keep_alive: float = 2.0,
    kv_connector: KvConnector = KvConnector.NIXL,
    ec_connector: EcConnector = EcConnector.NIXL,
    prefill_max_retries: int = 0,
    sidecar: SidecarSeat | None = None,
    render_first: bool = False,
    vllm_version: str | None = None,
    probe_vllm_version: bool = False,
    engine: Engine = Engine.VLLM,
    sglang: SglangSettings | None = None,
) -> Starlette:
    """The proxy as a Starlette app: the client routes and vLLM's others (``docs/proxy.md``).

    The five client routes (and SGLang's ``/generate`` with ``Engine.SGLANG``), ``/health``,
    ``/v1/models``, ``/v1/messages/count_tokens``, and the render worker's ``/tokenize``,
    ``/detokenize`` and ``/version``; any other path or method is answered in the OpenAI error
    shape.

    Args:
        config: the pipeline (:func:`~disagg_transforms.parse_pipeline_params`); a decode step is
            required.
        decode_url: the decode worker's base URL (``http://host:port``); it also answers
            ``GET /v1/models``.
        prefill_url: the prefill worker's, required exactly when the pipeline has a prefill step.
        encode_url: the encode worker's, required exactly when it has an encode step.
        render_url: where render calls go (default: the decode URL, or the gateway URL).
        gateway_url: gateway mode (llm-d's coordinator seat): every encode, prefill, decode
            and conditional-decode call goes to this URL with the header ``EPP-Profile``
            naming its pool; no worker URL is given with it, and render needs ``render_url``
            when a leg speaks the generate route.
        timeouts: how long to wait on a worker.
        hooks: the host's :class:`~disagg_transforms.Pipeline`, run by each exchange.
        limits: the bounds on a client's body; a body over ``max_body_bytes`` is a 413, refused
            while it is read.
        worker_keep_alive: seconds a pooled worker connection may stay idle before it is
            closed; well under a uvicorn-served vLLM worker's 5 s, so the proxy never sends on
            a connection the worker is closing (docs/proxy.md).
        kv_connector: how prefill hands the prompt's KV to decode
            (:attr:`~disagg_transforms.ExchangeSettings.kv_connector`).
        ec_connector: how encode hands its encoder cache to prefill
            (:attr:`~disagg_transforms.ExchangeSettings.ec_connector`).
        prefill_max_retries: how many more times a prefill that failed with 502, 503, 504 or
            in transport is sent; never a decode-only fallback.
        sidecar: llm-d's sidecar seat (:class:`SidecarSeat`): each request's headers name its
            prefill and encode workers, so no ``prefill_url``, ``encode_url`` or
            ``gateway_url`` is given with it.
        render_first: render before a conditional decode
            (:attr:`~disagg_transforms.ExchangeSettings.render_first`).
        vllm_version: the workers' vLLM release
            (:attr:`~disagg_transforms.ExchangeSettings.vllm_version`); ``None``: one that
            honours every mode, unless ``probe_vllm_version``.
        probe_vllm_version: without ``vllm_version``, ask the render worker's ``GET /version``
            (the decode URL's by default) before the first client request (again before the
            next while it cannot be reached), as ``serve`` does when it could not at startup.
        engine: the workers' engine (:attr:`~disagg_transforms.ExchangeSettings.engine`):
            with ``Engine.SGLANG`` prefill and decode are sent together, met at the prefill
            URL's host (docs/sglang.md); render stays a vLLM worker's.
        sglang: with ``Engine.SGLANG``, the bootstrap port and the workers' stream output
            (``None``: SGLang's defaults).

    Raises:
        ConfigError: the first of :func:`url_errors` (:func:`sidecar_errors` in the sidecar
            seat), a ``vllm_version`` that is not a release, or the first of
            :func:`~disagg_transforms.version_errors`.
    """
    errors = (url_errors if sidecar is None else sidecar_errors)(
        config,
        decode_url=decode_url,
        prefill_url=prefill_url,
        encode_url=encode_url,
        render_url=render_url,
        gateway_url=gateway_url,
    )
    if errors:
        raise errors[0]
    if engine is Engine.SGLANG and gateway_url is not None:
        msg = (
            "gateway_url: SGLang's rendezvous needs each prefill worker's host, which the "
            "gateway picks: not carried out yet (docs/sglang.md)"
        )
        raise ConfigError(msg, param="gateway_url")
    if gateway_url is not None:
        urls = dict.fromkeys(_PROFILES, gateway_url)
        urls["render"] = render_url or gateway_url
        profiles = _PROFILES
    else:
        assert decode_url is not None  # noqa: S101 - url_errors requires it
        # A conditional decode asks the decode worker (pipeline_phases names the worker).
        urls = {"decode": decode_url, "conditional-decode": decode_url}
        urls["render"] = render_url or decode_url
        urls.update({k: v for k, v in (("prefill", prefill_url), ("encode", encode_url)) if v})
        profiles = {}
    stripped = {k: v.rstrip("/") for k, v in urls.items()}
    settings = ExchangeSettings(
        hooks=hooks,
        limits=limits,
        kv_connector=kv_connector,
        ec_connector=ec_connector,
        render_first=render_first,
        vllm_version=vllm_version,
        engine=engine,
        sglang=sglang or SglangSettings(),
    )
    if vllm_version is not None and (refused := version_errors(config, vllm_version)):
        raise refused[0]
    if prefill_max_retries < 0:
        msg = f"prefill_max_retries: expected 0 or more, got {prefill_max_retries}"
        raise ConfigError(msg, param="prefill_max_retries")
    proxy = _Proxy(
        config,
        stripped,
        timeouts,
        settings,
        worker_keep_alive=worker_keep_alive,
        profiles=profiles,
        prefill_max_retries=prefill_max_retries,
        seat=None if sidecar is None else _Seat(sidecar, config, stripped),
        probe_version=probe_vllm_version,
    )
    routes = [HttpRoute(route.value, proxy.serve, methods=["POST"]) for route in _CLIENT_ROUTES]
    if engine is Engine.SGLANG:  # SGLang's own clients: their answer relayed as SGLang writes it
        routes.append(HttpRoute(_SGLANG_GENERATE, proxy.serve, methods=["POST"]))
    routes += [
        HttpRoute("/health", proxy.health, methods=["GET"]),
        HttpRoute("/healthz", proxy.alive, methods=["GET"]),
        HttpRoute("/readyz", proxy.ready, methods=["GET"]),
        HttpRoute("/metrics", proxy.metrics_text, methods=["GET"]),
        HttpRoute("/v1/models", proxy.models, methods=["GET"]),
        HttpRoute(_COUNT_TOKENS, proxy.count_tokens, methods=["POST"]),
    ]
    routes += [
        HttpRoute(path, proxy.render_worker, methods=[method])
        for path, method in _RENDER_WORKER_ROUTES
    ]
    handlers = dict.fromkeys((404, 405), _no_route)
    return Starlette(routes=routes, lifespan=proxy.lifespan, exception_handlers=handlers)

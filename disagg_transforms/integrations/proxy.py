"""The reference proxy: the exchange served over HTTP with Starlette and one pooled aiohttp client.

``pip install 'disagg_transforms[proxy]'``; ``disagg-transforms serve`` runs it (see
``docs/proxy.md``). :func:`create_app` builds the ASGI app: every client request is one
:class:`~disagg_transforms.Exchange` whose worker calls go to the URL of their step, streamed
answers relayed to the client as they come. The library's core never imports this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import aiohttp
import msgspec
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route as HttpRoute

from disagg_transforms import (
    DEFAULT_LIMITS,
    Limits,
    Route,
    Step,
    StepParams,
    detect_route,
    parse_pipeline_params,
)
from disagg_transforms.errors import ConfigError, error_body
from disagg_transforms.exchange import (
    ClientReply,
    Driver,
    Exchange,
    ExchangeSettings,
    Phase,
    WorkerCall,
    pipeline_phases,
)
from disagg_transforms.hooks import Pipeline

if sys.version_info >= (3, 11):
    from asyncio import timeout as _deadline
else:  # aiohttp's own dependency there
    from async_timeout import timeout as _deadline

__all__ = ("Timeouts", "create_app", "url_errors")

ACCESS_LOG = logging.getLogger("disagg_transforms.proxy")
"""One line per client request: its id, route, status, and each worker call's status and time."""

_CLIENT_ROUTES = tuple(Route)  # every client API is served, each through the exchange


# vLLM's routes the render worker answers, relayed as they are (docs/proxy.md).
_RENDER_WORKER_ROUTES = (("/tokenize", "POST"), ("/detokenize", "POST"), ("/version", "GET"))
_COUNT_TOKENS = "/v1/messages/count_tokens"
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


def url_errors(
    config: Mapping[Step, StepParams],
    *,
    decode_url: str | None,
    prefill_url: str | None = None,
    encode_url: str | None = None,
    render_url: str | None = None,
) -> list[ConfigError]:
    """Every worker URL the proxy cannot call and every mismatch of steps and URLs, one each.

    A configured step needs its URL and a URL needs its step; render is needed when a leg
    speaks the generate route (its URL defaults to the decode URL). The calls a pipeline makes
    are the exchange's to say (:func:`~disagg_transforms.pipeline_phases`).
    """
    given = {
        "decode": decode_url,
        "prefill": prefill_url,
        "encode": encode_url,
        "render": render_url,
    }
    errors = [
        ConfigError(f"--{step}-url: {url!r} {why}", param=step)
        for step, url in given.items()
        if url is not None and (why := _url_problem(url))
    ]
    if Step.CONDITIONAL_DECODE in config:
        msg = "conditional-decode: the proxy does not run it; leave it out of the pipeline"
        errors.append(ConfigError(msg, param="conditional-decode"))
    workers = set(pipeline_phases(config).values())
    urls = {"encode": encode_url, "prefill": prefill_url, "decode": decode_url}
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


class _Log:
    """What the access log line of one client request says; nothing is kept when it is off."""

    __slots__ = ("_legs", "_on", "_request", "_started")

    def __init__(self, request: Request) -> None:
        self._on = ACCESS_LOG.isEnabledFor(logging.INFO)
        self._request = request
        self._started = time.monotonic()
        self._legs: list[str] = []

    def leg(self, step: str, outcome: object, since: float) -> None:
        if self._on:
            self._legs.append(f"{step}={outcome}/{_ms(since)}ms")

    def write(self, request_id: str, status: int, stream: str | None = None, why: str = "") -> None:
        """Write the line; a stream's says how it ended (``why`` it failed, if it did)."""
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


def _ms(since: float) -> int:
    return round((time.monotonic() - since) * 1000)


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
            return await self._content.readany()
        finally:
            self._reading = False

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


# What a closed pooled connection looks like before any byte of the answer came.
_IDLE_CLOSE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
# A prefill answer worth another try (--prefill-max-retries): the worker or its gateway was
# unavailable; any other status is the answer.
_RETRIED_STATUSES = frozenset({502, 503, 504})


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
    if isinstance(error, _TIMEOUTS) and not isinstance(error, aiohttp.ClientError):
        return (
            f"no answer within the timeout ({timeouts.first_byte:g}s first byte,"
            f" {timeouts.idle:g}s idle)"
        )
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _too_large(request: Request, limit: int) -> Response:
    message = f"$: the body is over the limit of {limit} bytes (Limits.max_body_bytes)"
    route = detect_route(request.url.path)
    body = orjson.dumps(error_body(route, status=413, message=message, param="$"))
    # The rest of the body is never read, so the connection cannot carry another request.
    headers = {"connection": "close"}
    return Response(body, status_code=413, media_type="application/json", headers=headers)


class _Proxy:
    def __init__(  # noqa: PLR0913 - what create_app was given, set once
        self,
        config: Mapping[Step, StepParams],
        urls: Mapping[str, str],
        timeouts: Timeouts,
        settings: ExchangeSettings,
        *,
        worker_keep_alive: float,
        prefill_max_retries: int,
    ) -> None:
        self.config = config
        self.prefill_max_retries = prefill_max_retries
        self.urls = urls
        self.timeouts = timeouts
        self.worker_keep_alive = worker_keep_alive
        self.settings = settings  # one settings object for every exchange this proxy runs
        # A count_tokens request is rendered whatever the pipeline: its exchange's first call.
        # Its decode never runs; auto, so a count request with tools is counted, not refused.
        self.rendered = parse_pipeline_params(
            {"decode": {"output_mode": "auto"}}, use_openai_format=False
        )
        self.http: aiohttp.ClientSession | None = None

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
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
        ) as http:
            self.http = http
            yield
        self.http = None

    def _client(self) -> aiohttp.ClientSession:
        assert self.http is not None  # noqa: S101 - requests are served only inside the lifespan
        return self.http

    async def health(self, _request: Request) -> Response:
        return Response(b"", status_code=200)

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
                answer = await self._client().request(
                    request.method, url, headers=headers, data=await request.body() or None
                )
                try:
                    body = await answer.read()
                finally:
                    answer.release()
        except _FAILURES as error:
            message = f"{step} failed: {_reason(error, self.timeouts)}"
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
        """``POST /v1/messages/count_tokens``, as vLLM: the token IDs of the request's render.

        The body runs through an exchange as a Messages request (with a ``max_tokens``, which
        the render requires and a count request lacks): its render call is the exchange's own
        (headers, request id, transfer params), and the leg after it carries the render's
        ``token_ids``. A refusal or a failed render is the exchange's Anthropic error.
        """
        log = _Log(request)
        read = await self._client_body(request)
        if isinstance(read, Response):
            log.write("-", read.status_code)
            return read
        body = _with_max_tokens(read)
        ex = Exchange(
            self.rendered, Route.MESSAGES.value, request.headers.raw, body, settings=self.settings
        )
        drive = Driver(ex)
        if (call := drive.next_call()) is not None:
            await self._call(drive, call, log)
        if (call := drive.next_call()) is not None:  # the leg after render: not sent
            count = len(msgspec.json.decode(call.body, type=_TokenIds).token_ids)
            log.write(ex.request_id, 200)
            answer = {"input_tokens": count, "context_management": {"original_input_tokens": count}}
            headers = {"x-request-id": ex.request_id}
            return Response(orjson.dumps(answer), media_type="application/json", headers=headers)
        reply = drive.reply()
        assert isinstance(reply, ClientReply)  # noqa: S101 - no stream was asked for
        log.write(ex.request_id, reply.status)
        return Response(reply.body, status_code=reply.status, headers=dict(reply.headers))

    async def serve(self, request: Request) -> Response:
        log = _Log(request)
        client_body = await self._client_body(request)
        if isinstance(client_body, Response):
            log.write("-", client_body.status_code)
            return client_body
        ex = Exchange(
            self.config,
            request.scope["path"],
            request.headers.raw,
            client_body,
            settings=self.settings,
        )
        drive = Driver(ex)
        calls = asyncio.ensure_future(self._calls(drive, log))
        gone = asyncio.ensure_future(_disconnected(request))
        await asyncio.wait((calls, gone), return_when=asyncio.FIRST_COMPLETED)
        if not calls.done():
            # The client went away: the call in flight is cancelled, which closes its
            # connection, so the worker aborts it and frees its KV blocks (docs/proxy.md).
            calls.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await calls
            log.write(ex.request_id, 499, "client-disconnected")
            return Response(b"", status_code=499)  # nobody reads it
        gone.cancel()
        stream = calls.result()
        reply = drive.reply()
        if isinstance(reply, ClientReply):
            if stream is not None:
                stream.close()
            log.write(ex.request_id, reply.status)
            return Response(reply.body, status_code=reply.status, headers=dict(reply.headers))
        assert stream is not None  # noqa: S101 - a client stream relays a worker stream
        body_stream = self._relay(drive, stream, reply.first, log, reply.status)
        return StreamingResponse(body_stream, status_code=reply.status, headers=dict(reply.headers))

    async def _send(self, call: WorkerCall) -> aiohttp.ClientResponse:
        """Send ``call``; its answer once its status and headers came.

        A call that fails on a pooled connection before any byte of its answer came is sent
        again: the worker closed that idle connection as the call went out, and never read it
        (docs/proxy.md, "Keep-alive"). Each such failure closes that connection, so this ends
        on a fresh one, whose failure is the call's.
        """
        url = self.urls[call.step] + call.path
        while True:
            reuse = _Reuse()
            try:
                return await self._client().request(
                    call.method, url, headers=call.headers, data=call.body, trace_request_ctx=reuse
                )
            except _IDLE_CLOSE:
                if not reuse.pooled:
                    raise

    async def _calls(self, drive: Driver, log: _Log) -> _Stream | None:
        """Make the exchange's worker calls; the decode worker's stream when it is relayed."""
        stream: _Stream | None = None
        while (call := drive.next_call()) is not None:
            stream = await self._call(drive, call, log)
        return stream

    async def _call(self, drive: Driver, call: WorkerCall, log: _Log) -> _Stream | None:
        """Make one worker call and feed its answer (a stream until the client's reply is known)."""
        if not call.stream:
            await self._call_whole(drive, call, log)
            return None
        since = time.monotonic()
        stream: _Stream | None = None
        first_byte_due = asyncio.get_running_loop().time() + self.timeouts.first_byte
        try:
            async with _deadline(self.timeouts.first_byte):
                answer = await self._send(call)
            stream = _Stream(answer, first_byte_due, self.timeouts.idle)
            drive.stream_opened(answer.status, answer.raw_headers)
            while drive.opening:
                drive.chunk(await stream.read() or None)  # b"": the stream's end
        except _FAILURES as error:
            drive.failed(_reason(error, self.timeouts), timed_out=_timed_out(error))
            log.leg(call.step, "failed", since)
            if stream is not None:
                stream.close()
            return None
        except BaseException:  # cancelled (the server stops): the worker's stream goes too
            if stream is not None:
                stream.close()
            raise
        log.leg(call.step, answer.status, since)
        return stream

    async def _call_whole(self, drive: Driver, call: WorkerCall, log: _Log) -> None:
        """Make a call whose answer is read whole, and feed it.

        A prefill that failed with 502, 503, 504 or in transport is sent again, up to
        ``--prefill-max-retries`` times; only the last try's outcome reaches the exchange, so
        a failed prefill is the client's error and no decode call follows it.
        """
        retries = self.prefill_max_retries if call.step is Phase.PREFILL else 0
        for retries_left in range(retries, -1, -1):
            since = time.monotonic()
            try:
                async with _deadline(self.timeouts.first_byte):
                    answer = await self._send(call)
                    try:
                        body = await answer.read()
                    finally:
                        answer.release()
            except _FAILURES as error:
                log.leg(call.step, "failed", since)
                if not retries_left:
                    drive.failed(_reason(error, self.timeouts), timed_out=_timed_out(error))
                continue
            log.leg(call.step, answer.status, since)
            if retries_left and answer.status in _RETRIED_STATUSES:
                continue
            drive.answered(answer.status, answer.raw_headers, body)
            return

    async def _relay(
        self, drive: Driver, stream: _Stream, first: bytes, log: _Log, status: int
    ) -> AsyncIterator[bytes]:
        """The client's stream, relayed as the worker's comes; closes the worker's at the end.

        Everything one read of the worker's stream brings is fed at once, and what the exchange
        gives back is one write to the client (none when it gives nothing).
        """
        ended: str | None = None  # how it ended when the exchange cannot know (the client left)
        why = ""
        try:
            yield first
            while drive.relaying:
                # b"" is the stream's end; the client's stream may end first (a broken
                # contract: its error event went out, and the worker's is closed below, unread).
                if out := drive.chunk(await stream.read() or None):
                    yield out
        except _FAILURES as error:
            why = _reason(error, self.timeouts)
            yield drive.failed(why, timed_out=_timed_out(error))
        except BaseException:
            # Starlette cancels the relay when the client goes away: the worker's stream is
            # closed below, so the worker stops generating for nobody.
            ended = "client-disconnected"
            raise
        finally:
            stream.close()
            ex = drive.exchange
            log.write(ex.request_id, status, str(ended or ex.stream_end), why)


async def _disconnected(request: Request) -> None:
    """Return once the client closed its connection (its body was read whole before)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


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
    decode_url: str,
    prefill_url: str | None = None,
    encode_url: str | None = None,
    render_url: str | None = None,
    timeouts: Timeouts = Timeouts(),
    hooks: Pipeline | None = None,
    limits: Limits = DEFAULT_LIMITS,
    worker_keep_alive: float = 2.0,
    prefill_max_retries: int = 0,
) -> Starlette:
    """The proxy as a Starlette app: the client routes and vLLM's others (``docs/proxy.md``).

    The five client routes, ``/health``, ``/v1/models``, ``/v1/messages/count_tokens``, and the
    render worker's ``/tokenize``, ``/detokenize`` and ``/version``; any other path or method
    is answered in the OpenAI error shape.

    Args:
        config: the pipeline (:func:`~disagg_transforms.parse_pipeline_params`); a decode step is
            required, conditional-decode is refused.
        decode_url: the decode worker's base URL (``http://host:port``); it also answers
            ``GET /v1/models``.
        prefill_url: the prefill worker's, required exactly when the pipeline has a prefill step.
        encode_url: the encode worker's, required exactly when it has an encode step.
        render_url: where render calls go (default: the decode URL).
        timeouts: how long to wait on a worker.
        hooks: the host's :class:`~disagg_transforms.Pipeline`, run by each exchange.
        limits: the bounds on a client's body; a body over ``max_body_bytes`` is a 413, refused
            while it is read.
        worker_keep_alive: seconds a pooled worker connection may stay idle before it is
            closed; well under a uvicorn-served vLLM worker's 5 s, so the proxy never sends on
            a connection the worker is closing (docs/proxy.md).
        prefill_max_retries: how many more times a prefill that failed with 502, 503, 504 or
            in transport is sent; never a decode-only fallback.

    Raises:
        ConfigError: the first of :func:`url_errors`.
    """
    errors = url_errors(
        config,
        decode_url=decode_url,
        prefill_url=prefill_url,
        encode_url=encode_url,
        render_url=render_url,
    )
    if errors:
        raise errors[0]
    urls = {"decode": decode_url, "render": render_url or decode_url}
    urls.update({k: v for k, v in (("prefill", prefill_url), ("encode", encode_url)) if v})
    stripped = {k: v.rstrip("/") for k, v in urls.items()}
    settings = ExchangeSettings(hooks=hooks, limits=limits)
    if prefill_max_retries < 0:
        msg = f"prefill_max_retries: expected 0 or more, got {prefill_max_retries}"
        raise ConfigError(msg, param="prefill_max_retries")
    proxy = _Proxy(
        config,
        stripped,
        timeouts,
        settings,
        worker_keep_alive=worker_keep_alive,
        prefill_max_retries=prefill_max_retries,
    )
    routes = [HttpRoute(route.value, proxy.serve, methods=["POST"]) for route in _CLIENT_ROUTES]
    routes += [
        HttpRoute("/health", proxy.health, methods=["GET"]),
        HttpRoute("/v1/models", proxy.models, methods=["GET"]),
        HttpRoute(_COUNT_TOKENS, proxy.count_tokens, methods=["POST"]),
    ]
    routes += [
        HttpRoute(path, proxy.render_worker, methods=[method])
        for path, method in _RENDER_WORKER_ROUTES
    ]
    handlers = dict.fromkeys((404, 405), _no_route)
    return Starlette(routes=routes, lifespan=proxy.lifespan, exception_handlers=handlers)

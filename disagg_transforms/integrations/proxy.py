"""The reference proxy: the exchange served over HTTP with Starlette and one pooled httpx client.

``pip install 'disagg_transforms[proxy]'``; ``disagg-transforms serve`` runs it (see
``docs/proxy.md``). :func:`create_app` builds the ASGI app: every client request is one
:class:`~disagg_transforms.Exchange` whose worker calls go to the URL of their step, streamed
answers relayed to the client as they come. The library's core never imports this module.
"""

from __future__ import annotations

import contextlib
import logging
import time
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import anyio
import httpx
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
    WorkerCall,
    pipeline_phases,
)
from disagg_transforms.hooks import Pipeline

__all__ = ("Timeouts", "create_app", "url_errors")

ACCESS_LOG = logging.getLogger("disagg_transforms.proxy")
"""One line per client request: its id, route, status, and each worker call's status and time."""

_CLIENT_ROUTES = tuple(Route)  # every client API is served, each through the exchange


# vLLM's routes the render worker answers, relayed as they are (docs/proxy.md).
_RENDER_WORKER_ROUTES = (("/tokenize", "POST"), ("/detokenize", "POST"), ("/version", "GET"))
_COUNT_TOKENS = "/v1/messages/count_tokens"
# What a relayed call passes on of the client's headers.
_RELAYED_HEADERS = frozenset({"authorization", "content-type", "x-request-id"})


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


@dataclass
class _Log:
    """What the access log line of one client request says."""

    request: Request
    started: float = field(default_factory=time.monotonic)
    legs: list[str] = field(default_factory=list)

    def leg(self, step: str, outcome: object, since: float) -> None:
        self.legs.append(f"{step}={outcome}/{_ms(since)}ms")

    def write(self, request_id: str, status: int, end: str = "") -> None:
        ACCESS_LOG.info(
            "%s %s %s %d %s total=%dms%s",
            request_id,
            self.request.method,
            self.request.url.path,
            status,
            " ".join(self.legs) or "-",
            _ms(self.started),
            end,
        )


def _ms(since: float) -> int:
    return round((time.monotonic() - since) * 1000)


class _Worker:
    """The worker stream being read: its chunks, each awaited under the right timeout."""

    def __init__(self, answer: httpx.Response, timeouts: Timeouts) -> None:
        self.answer = answer
        self._chunks = answer.aiter_bytes()
        self._timeouts = timeouts
        self._first = True

    async def chunk(self) -> bytes | None:
        """The next chunk, or ``None`` at the end; raises ``TimeoutError`` when none comes."""
        limit = self._timeouts.first_byte if self._first else self._timeouts.idle
        self._first = False
        try:
            with anyio.fail_after(limit):
                return await self._chunks.__anext__()
        except StopAsyncIteration:
            return None


# anyio.fail_after raises the builtin TimeoutError (asyncio's own on Python 3.10 is another).
_FAILURES = (httpx.TransportError, httpx.InvalidURL, TimeoutError)


def _timed_out(error: BaseException) -> bool:
    # httpx's own timeouts: a connect or pool timeout under the client's connect limit.
    return isinstance(error, (TimeoutError, httpx.TimeoutException))


def _reason(error: BaseException, timeouts: Timeouts) -> str:
    if isinstance(error, TimeoutError):
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
    def __init__(
        self,
        config: Mapping[Step, StepParams],
        urls: Mapping[str, str],
        timeouts: Timeouts,
        settings: ExchangeSettings,
        worker_keep_alive: float,
    ) -> None:
        self.config = config
        self.urls = urls
        self.timeouts = timeouts
        self.worker_keep_alive = worker_keep_alive
        self.settings = settings  # one settings object for every exchange this proxy runs
        # A count_tokens request is rendered whatever the pipeline: its exchange's first call.
        # Its decode never runs; auto, so a count request with tools is counted, not refused.
        self.rendered = parse_pipeline_params(
            {"decode": {"output_mode": "auto"}}, use_openai_format=False
        )
        self.http: httpx.AsyncClient | None = None

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        # One pooled client per process; its connect timeout also bounds waiting for the pool.
        timeout = httpx.Timeout(None, connect=self.timeouts.connect, pool=self.timeouts.connect)
        limits = httpx.Limits(
            max_connections=None,
            max_keepalive_connections=256,
            keepalive_expiry=self.worker_keep_alive,
        )
        async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as http:
            self.http = http
            yield
        self.http = None

    def _client(self) -> httpx.AsyncClient:
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
            with anyio.fail_after(self.timeouts.first_byte):
                answer = await self._client().request(
                    request.method, url, headers=headers, content=await request.body()
                )
        except _FAILURES as error:
            message = f"{step} failed: {_reason(error, self.timeouts)}"
            return _openai_error(502, message)
        kind = answer.headers.get("content-type", "application/json")
        return Response(answer.content, status_code=answer.status_code, media_type=kind)

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
        return b"".join(chunks)

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
            request.url.path,
            request.headers.raw,
            client_body,
            settings=self.settings,
        )
        drive = Driver(ex)
        stream: _Worker | None = None
        while (call := drive.next_call()) is not None:
            stream = await self._call(drive, call, log)
        reply = drive.reply()
        if isinstance(reply, ClientReply):
            if stream is not None:
                await stream.answer.aclose()
            log.write(ex.request_id, reply.status)
            return Response(reply.body, status_code=reply.status, headers=dict(reply.headers))
        assert stream is not None  # noqa: S101 - a client stream relays a worker stream
        body_stream = self._relay(drive, stream, reply.first, log, reply.status)
        return StreamingResponse(body_stream, status_code=reply.status, headers=dict(reply.headers))

    async def _call(self, drive: Driver, call: WorkerCall, log: _Log) -> _Worker | None:
        """Make one worker call and feed its answer (a stream until the client's reply is known)."""
        url = self.urls[call.step] + call.path
        since = time.monotonic()
        request = self._client().build_request(
            call.method, url, headers=call.headers, content=call.body
        )
        stream: _Worker | None = None
        try:
            with anyio.fail_after(self.timeouts.first_byte):
                answer = await self._client().send(request, stream=call.stream)
            if not call.stream:
                drive.answered(answer.status_code, answer.headers.raw, answer.content)
                log.leg(call.step, answer.status_code, since)
                return None
            stream = _Worker(answer, self.timeouts)
            drive.stream_opened(answer.status_code, answer.headers.raw)
            while drive.opening:
                drive.chunk(await stream.chunk())
        except _FAILURES as error:
            drive.failed(_reason(error, self.timeouts), timed_out=_timed_out(error))
            log.leg(call.step, "failed", since)
            if stream is not None:
                await stream.answer.aclose()
            return None
        log.leg(call.step, answer.status_code, since)
        return stream

    async def _relay(
        self, drive: Driver, stream: _Worker, first: bytes, log: _Log, status: int
    ) -> AsyncIterator[bytes]:
        """The client's stream, relayed as the worker's comes; closes the worker's at the end."""
        ended: str | None = None  # how it ended when the exchange cannot know (the client left)
        detail = ""
        try:
            yield first
            while drive.relaying:
                if out := drive.chunk(await stream.chunk()):  # an empty one still costs a send
                    yield out
        except _FAILURES as error:
            reason = _reason(error, self.timeouts)
            detail = f" ({reason})"
            yield drive.failed(reason, timed_out=_timed_out(error))
        except BaseException:
            # Starlette cancels the relay when the client goes away: the worker's stream is
            # closed below, so the worker stops generating for nobody.
            ended = "client-disconnected"
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await stream.answer.aclose()
            end = drive.exchange.stream_end
            log.write(drive.exchange.request_id, status, f" stream={ended or end}{detail}")


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
    proxy = _Proxy(config, stripped, timeouts, settings, worker_keep_alive)
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

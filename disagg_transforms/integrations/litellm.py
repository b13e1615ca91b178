"""LiteLLM integration: a custom provider that drives the exchange, and request callbacks.

Install with ``pip install 'disagg_transforms[litellm]'``; the core never imports this module.

- :class:`VllmGenerateLLM` is a LiteLLM ``CustomLLM`` that serves chat completions from vLLM
  workers' ``/inference/v1/generate`` by driving an :class:`~disagg_transforms.Exchange` per
  call: render once, an optional prefill leg on its own worker, the decode leg, and the chat
  envelope the exchange builds, parsed once into LiteLLM's own types (text, ``tool_calls``,
  reasoning as ``reasoning_content``), streaming included. LiteLLM turns its Responses and
  Anthropic Messages calls into chat completions before calling a custom provider, so they are
  served through the same path.
- :class:`SamplingCapsCallback` and :class:`StripTransferParamsCallback` are LiteLLM callbacks
  that relocate the client's output cap and remove client-supplied transfer params from a
  request dict, without mutating it.

**Compose, don't subclass.** LiteLLM calls some hooks only when they are defined in the
registered object's own class body (a subclass that adds nothing silently turns them off), so
these classes are concrete and final: register an instance, or hold one in your own class and
call it. The callbacks refuse to be subclassed. ``docs/litellm.md`` shows the registration.

Unlike the core, this module does I/O: HTTP to the workers, through one pooled ``httpx`` client
per provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import reprlib
import threading
import urllib.parse
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final, NamedTuple, NoReturn, TypeAlias, final

import httpx
import msgspec
import orjson
from litellm.integrations.custom_logger import CustomLogger
from litellm.llms.custom_llm import CustomLLM, CustomLLMError
from litellm.types.utils import GenericStreamingChunk, ModelResponse
from typing_extensions import override

from disagg_transforms import (
    DecodeParams,
    OutputMode,
    PrefillParams,
    Route,
    SseParser,
    Step,
    StepParams,
    apply_sampling_caps,
    strip_transfer_params,
)
from disagg_transforms.errors import ConfigError, DisaggTransformError
from disagg_transforms.exchange import (
    ClientReply,
    ClientStream,
    Driver,
    Engine,
    Exchange,
    ExchangeSettings,
    SglangSettings,
    WorkerCall,
)

_LOG: Final = logging.getLogger("disagg_transforms.litellm")

__all__ = (
    "PREFILL_API_BASE",
    "SamplingCapsCallback",
    "StripTransferParamsCallback",
    "VllmGenerateLLM",
    "auto_provider",
    "derender_provider",
    "sampling_caps_callback",
    "strip_transfer_params_callback",
    "text_provider",
)

PREFILL_API_BASE: Final = "prefill_api_base"
"""The deployment's ``model_info`` key naming the prefill worker's URL."""

_DEFAULT_TIMEOUT: Final = 600.0
_LITELLM_ONLY: Final = ("extra_body",)  # merged into the body, as the openai SDK does
_Timeout: TypeAlias = "float | httpx.Timeout"

# LiteLLM call types → the client route whose cap keys the request dict carries.
_CALL_ROUTES: Final[Mapping[str, Route]] = {
    "completion": Route.CHAT_COMPLETIONS,
    "acompletion": Route.CHAT_COMPLETIONS,
    "text_completion": Route.COMPLETIONS,
    "atext_completion": Route.COMPLETIONS,
    "responses": Route.RESPONSES,
    "aresponses": Route.RESPONSES,
    "anthropic_messages": Route.MESSAGES,
}


def _llm_error(status: int, message: str) -> CustomLLMError:
    # LiteLLM maps CustomLLMError's status_code onto its own exception classes.
    return CustomLLMError(status_code=status, message=message)  # type: ignore[no-untyped-call]  # LiteLLM leaves it unannotated


def _json_default(value: object) -> object:
    # LiteLLM users pass earlier answers back (pydantic Message objects) in `messages`.
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(exclude_none=True)
    msg = f"not JSON: {reprlib.repr(value)}"
    raise TypeError(msg)


def _chat_body(
    model: str, messages: list[Any], optional_params: Mapping[str, Any], *, stream: bool
) -> bytes:
    """The chat request LiteLLM was asked for, as the JSON bytes a client would have sent."""
    if PREFILL_API_BASE in optional_params:
        # Request kwargs win over a deployment's litellm_params, and a proxy client can send
        # any of them: a URL taken from there would let a client pick the worker that hands
        # decode its KV source (docs/litellm.md, "Prefill").
        msg = (
            f"{PREFILL_API_BASE}: not taken from the request (a client could point the prefill "
            "leg at any host); set it in the deployment's model_info or the provider's "
            "constructor"
        )
        raise _llm_error(400, msg)
    body: dict[str, Any] = {"model": model, "messages": messages}
    body.update((k, v) for k, v in optional_params.items() if k not in _LITELLM_ONLY)
    extra = optional_params.get("extra_body")
    if isinstance(extra, Mapping):
        body.update(extra)
    if stream:
        body["stream"] = True
    else:
        body.pop("stream", None)
    try:
        return orjson.dumps(body, default=_json_default)
    except TypeError as error:
        raise _llm_error(400, f"the chat request: {error}") from None


def _base_url(api_base: object, what: str) -> str:
    if not isinstance(api_base, str) or not api_base.strip():
        msg = f"{what}: the vLLM worker's URL is required, got {reprlib.repr(api_base)}"
        raise _llm_error(400, msg)
    return api_base.strip().rstrip("/")


def _prefill_base(litellm_params: object, default: str | None) -> str | None:
    """The prefill worker's URL: the deployment's ``model_info``, else the constructor's."""
    info = litellm_params.get("model_info") if isinstance(litellm_params, Mapping) else None
    given = info.get(PREFILL_API_BASE) if isinstance(info, Mapping) else None
    if given is None:
        return default
    return _base_url(given, f"model_info.{PREFILL_API_BASE}")


def _client_headers(headers: Mapping[str, str] | None, api_key: object) -> dict[str, str]:
    sent = {k.lower(): v for k, v in (headers or {}).items()}
    if isinstance(api_key, str) and api_key:
        sent.setdefault("authorization", f"Bearer {api_key}")
    return sent


# What a client is told of a failed call: its kind, never the worker's address nor the
# transport's own text (docs/litellm.md, "Errors"); the most precise kind first.
_FAILURE_KINDS: tuple[tuple[type[httpx.TransportError], str], ...] = (
    (httpx.ConnectTimeout, "no connection within the timeout"),
    (httpx.TimeoutException, "no answer within the timeout"),
    (httpx.ConnectError, "could not connect to the worker"),
    (httpx.RemoteProtocolError, "the worker closed the connection"),
    (httpx.ReadError, "connection reset"),
)


def _reason(error: httpx.TransportError) -> str:
    # The address and the exception go to the log only: in llm-d an address is a pod's IP.
    _LOG.warning("worker call failed: %s: %s", type(error).__name__, error)
    return next(
        (kind for classes, kind in _FAILURE_KINDS if isinstance(error, classes)),
        "the connection failed",
    )


def _timed_out(error: httpx.TransportError) -> bool:
    return isinstance(error, httpx.TimeoutException)


def _reply_error(reply: ClientReply) -> CustomLLMError:
    """The exchange's error reply (OpenAI's shape: the client is a chat client) for LiteLLM."""
    try:
        error = orjson.loads(reply.body).get("error")
        message = str(error["message"])
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError):
        message = reply.body.decode("utf-8", "replace")
    return _llm_error(reply.status, message)


def _reply_bytes(reply: ClientReply | ClientStream) -> bytes:
    if reply.status >= httpx.codes.BAD_REQUEST:
        assert isinstance(reply, ClientReply)  # noqa: S101 - a stream head is always a 200
        raise _reply_error(reply)
    return reply.first if isinstance(reply, ClientStream) else reply.body


def _with_reasoning_content(message: Mapping[str, Any]) -> dict[str, Any]:
    # The exchange writes vLLM's `reasoning`; LiteLLM's clients read `reasoning_content`.
    reasoning = message.get("reasoning")
    if reasoning is None or "reasoning_content" in message:
        return dict(message)
    return {**message, "reasoning_content": reasoning}


def _model_response(body: bytes) -> ModelResponse:
    """The exchange's ``chat.completion`` bytes as LiteLLM's ``ModelResponse`` (one parse)."""
    completion = orjson.loads(body)
    completion["choices"] = [
        {**choice, "message": _with_reasoning_content(choice.get("message") or {})}
        for choice in completion.get("choices") or []
    ]
    return ModelResponse(**completion)


def _generic_chunks(chunk: Mapping[str, Any]) -> list[GenericStreamingChunk]:
    """One ``chat.completion.chunk`` as LiteLLM's streaming chunks (one per choice, tool call)."""
    usage = chunk.get("usage")
    choices: list[Mapping[str, Any]] = chunk.get("choices") or []
    if not choices:  # the usage-only chunk
        return [GenericStreamingChunk(text="", is_finished=False, finish_reason="", usage=usage)]
    out: list[GenericStreamingChunk] = []
    for choice in choices:
        delta: Mapping[str, Any] = choice.get("delta") or {}
        finish = choice.get("finish_reason")
        calls: list[Any] = delta.get("tool_calls") or [None]
        for position, call in enumerate(calls):
            last = position == len(calls) - 1
            item = GenericStreamingChunk(
                text=(delta.get("content") or "") if position == 0 else "",
                tool_use=call,
                is_finished=last and finish is not None,
                finish_reason=(finish or "") if last else "",
                usage=usage if last else None,
                index=choice.get("index", 0),
            )
            reasoning = delta.get("reasoning")
            if position == 0 and reasoning:
                item["provider_specific_fields"] = {"reasoning_content": reasoning}
            out.append(item)
    return out


@final
class _ChatChunks:
    """The exchange's chat SSE bytes in, LiteLLM streaming chunks out."""

    def __init__(self) -> None:
        self._parser = SseParser()

    def feed(self, data: bytes) -> list[GenericStreamingChunk]:
        try:
            return self._chunks(self._parser.feed(data))
        except DisaggTransformError as error:
            raise _llm_error(error.status_hint, str(error)) from error

    def close(self) -> list[GenericStreamingChunk]:
        return self._chunks(self._parser.close())

    @staticmethod
    def _chunks(payloads: list[bytes]) -> list[GenericStreamingChunk]:
        out: list[GenericStreamingChunk] = []
        for payload in payloads:
            if payload == b"[DONE]":
                continue
            chunk = orjson.loads(payload)
            error = chunk.get("error")
            if error is not None:  # the in-stream error event that ends the client's stream
                code = error.get("code")
                status = code if isinstance(code, int) and code >= httpx.codes.BAD_REQUEST else 502
                raise _llm_error(status, str(error.get("message")))
            out.extend(_generic_chunks(chunk))
        return out


class _Call(NamedTuple):
    """One call of LiteLLM's, bound to ``CustomLLM``'s signature (the exchange uses a few fields).

    The four entry points take ``*args, **kwargs`` and bind them here, so LiteLLM's sixteen
    parameters are written once: LiteLLM passes them by keyword, a positional call binds as
    it would to ``CustomLLM``, and a missing or unknown argument is a ``TypeError``.
    """

    model: str
    messages: list[Any]
    api_base: object  # not trusted to be a str: _base_url checks it
    custom_prompt_dict: dict[str, Any]
    model_response: ModelResponse
    print_verbose: Callable[..., Any]
    encoding: object
    api_key: object
    logging_obj: object
    optional_params: Mapping[str, Any]
    acompletion: object = None
    litellm_params: object = None
    logger_fn: object = None
    headers: Mapping[str, str] | None = None
    timeout: float | httpx.Timeout | None = None
    client: object = None  # ignored: the provider's own pooled clients serve every call


@final
class _Plan:
    """One call's exchange, the worker URL of each of its steps, and the request timeout."""

    __slots__ = ("exchange", "timeout", "urls")

    def __init__(self, exchange: Exchange, urls: Mapping[str, str], timeout: _Timeout) -> None:
        self.exchange = exchange
        self.urls = urls
        self.timeout = timeout

    def request(self, http: httpx.Client | httpx.AsyncClient, call: WorkerCall) -> httpx.Request:
        return http.build_request(
            call.method,
            self.urls[call.step] + call.path,
            headers=call.headers,
            content=call.body,
            timeout=self.timeout,
        )


def _exchange_bytes(http: httpx.Client, plan: _Plan) -> Iterator[bytes]:
    """Drive the plan's exchange to its end over ``http``: the client's reply bytes, as they come.

    Raises ``CustomLLMError`` (before any byte) when the reply is an error status.
    """
    drive = Driver(plan.exchange)
    answer: httpx.Response | None = None
    chunks: Iterator[bytes] = iter(())  # the decode stream, once it is open
    peers = _Peers(http, plan)
    try:
        while (call := drive.next_call()) is not None:
            peers.start(call)
            try:
                try:
                    answer = http.send(plan.request(http, call), stream=call.stream)
                finally:
                    peers.main_answered()
                peers.feed_done(drive)  # a failure sent together is the reply, not this answer
                if not call.stream:  # httpx read the whole body in send()
                    drive.answered(answer.status_code, answer.headers.raw, answer.content)
                    continue
                drive.stream_opened(answer.status_code, answer.headers.raw)
                chunks = answer.iter_bytes()
                while drive.opening:
                    drive.chunk(next(chunks, None))
            except httpx.TransportError as error:
                peers.feed_done(drive)
                drive.failed(_reason(error), timed_out=_timed_out(error))
        if drive.awaiting:  # the reply needs a peer's answer too (SGLang's prompt logprobs)
            peers.feed_all(drive)
        yield _reply_bytes(drive.reply())
        try:
            while drive.relaying:
                yield drive.chunk(next(chunks, None))
        except httpx.TransportError as error:
            yield drive.failed(_reason(error), timed_out=_timed_out(error))
        peers.settle(drive, gone=False)
    finally:
        peers.settle(drive, gone=True)
        if answer is not None:
            answer.close()


# How often a failed peer's abort of the main call is sent again while the main call waits.
_ABORT_AGAIN_SECONDS: Final = 0.25


class _Peers:
    """The calls sent together with a synchronous call, each in a thread (docs/litellm.md).

    The thread only sends; the exchange is fed in the caller's thread. A call sent together
    that fails sends the main call's ``abort`` at once, and again every
    :data:`_ABORT_AGAIN_SECONDS` until the main call has answered: an abort that reaches the
    worker before the main call does finds nothing to abort (SGLang's abort matches the calls it
    holds), and the main call would then wait for its own timeout. The main call's answer is fed
    after that failure, which is the reply.
    """

    __slots__ = ("_answered", "_http", "_main", "_plan", "_running")

    def __init__(self, http: httpx.Client, plan: _Plan) -> None:
        self._http = http
        self._plan = plan
        self._running: list[tuple[WorkerCall, Future[httpx.Response]]] = []
        self._main: WorkerCall | None = None
        self._answered = threading.Event()

    def start(self, call: WorkerCall) -> None:
        if call.abort is not None:
            self._main = call
        if not call.together:
            return
        self._answered.clear()
        pool = ThreadPoolExecutor(max_workers=len(call.together))
        for peer in call.together:
            future = pool.submit(self._send, peer)
            future.add_done_callback(self._abort_main_if_failed)
            self._running.append((peer, future))
        pool.shutdown(wait=False)

    def _send(self, call: WorkerCall) -> httpx.Response:
        return self._http.send(self._plan.request(self._http, call))

    def main_answered(self) -> None:
        """The main call has its answer (or failed): no abort of it is needed any more."""
        self._answered.set()

    def _abort_main_if_failed(self, future: Future[httpx.Response]) -> None:
        error = future.exception()
        main = self._main
        if (error is not None or not future.result().is_success) and main is not None:
            # Its own thread: this callback may run in the caller's, before the main call is sent.
            threading.Thread(target=self._abort_until_answered, args=(main,), daemon=True).start()

    def _abort_until_answered(self, call: WorkerCall) -> None:
        self._abort(call)
        while not self._answered.wait(_ABORT_AGAIN_SECONDS):
            self._abort(call)

    def _abort(self, call: WorkerCall) -> None:
        assert call.abort is not None  # noqa: S101 - only calls with an abort are aborted
        try:
            self._http.send(self._plan.request(self._http, call.abort)).close()
        except httpx.TransportError as error:
            _LOG.warning("%s abort failed: %s", call.step, _reason(error))

    def feed_done(self, drive: Driver) -> None:
        """Feed the answers already in, before the main call's."""
        for call, future in [(c, f) for c, f in self._running if f.done()]:
            self._running.remove((call, future))
            _feed(drive, call, future)

    def feed_all(self, drive: Driver) -> None:
        """Wait for every answer still to come and feed it."""
        for call, future in self._running:
            _feed(drive, call, future)  # waits for its answer
        self._running.clear()

    def settle(self, drive: Driver, *, gone: bool) -> None:
        """Read the rest to their end, or, cancelled, abort them and the main call."""
        self._answered.set()  # whatever happened, a failed peer's aborts stop here
        if not (gone or drive.cancelling):
            self.feed_all(drive)
            self._main = None
            return
        for call, future in self._running:
            if not future.done():
                self._abort(call)
        self._running.clear()
        if self._main is not None:
            self._abort(self._main)
            self._main = None


def _feed(drive: Driver, call: WorkerCall, future: Future[httpx.Response]) -> None:
    error = future.exception()
    if isinstance(error, httpx.TransportError):
        drive.together_failed(call, _reason(error), timed_out=_timed_out(error))
    elif error is None:
        answer = future.result()
        drive.together_answered(call, answer.status_code, answer.headers.raw, answer.content)


async def _aexchange_bytes(http: httpx.AsyncClient, plan: _Plan) -> AsyncIterator[bytes]:
    """:func:`_exchange_bytes` over an ``httpx.AsyncClient``."""
    drive = Driver(plan.exchange)
    answer: httpx.Response | None = None
    chunks: AsyncIterator[bytes] | None = None  # the decode stream, once it is open
    peers = _AsyncPeers(http, plan, drive)
    try:
        while (call := drive.next_call()) is not None:
            try:
                answer = await peers.send(call)
                if answer is None:  # a call sent together failed first: the reply is its error
                    continue
                if not call.stream:
                    drive.answered(answer.status_code, answer.headers.raw, answer.content)
                    continue
                drive.stream_opened(answer.status_code, answer.headers.raw)
                chunks = answer.aiter_bytes()
                while drive.opening:
                    drive.chunk(await anext(chunks, None))
            except httpx.TransportError as error:
                drive.failed(_reason(error), timed_out=_timed_out(error))
        if drive.awaiting:  # the reply needs a peer's answer too (SGLang's prompt logprobs)
            await peers.answered()
        yield _reply_bytes(drive.reply())
        try:
            while drive.relaying and chunks is not None:
                yield drive.chunk(await anext(chunks, None))
        except httpx.TransportError as error:
            yield drive.failed(_reason(error), timed_out=_timed_out(error))
        await peers.settle(gone=False)
    finally:
        if answer is not None:
            await answer.aclose()
        await peers.settle(gone=True)


class _AsyncPeers:
    """The calls sent together with an async call, as tasks feeding the exchange."""

    __slots__ = ("_drive", "_failed", "_http", "_main", "_plan", "_running")

    def __init__(self, http: httpx.AsyncClient, plan: _Plan, drive: Driver) -> None:
        self._http = http
        self._plan = plan
        self._drive = drive
        self._running: dict[asyncio.Task[None], WorkerCall] = {}
        self._main: WorkerCall | None = None
        self._failed = asyncio.Event()

    async def send(self, call: WorkerCall) -> httpx.Response | None:
        """``call``'s answer (its head, when it streams); ``None`` when it was cancelled."""
        if call.abort is not None:
            self._main = call
        if not call.together:
            return await self._http.send(self._plan.request(self._http, call), stream=call.stream)
        for peer in call.together:
            self._running[asyncio.ensure_future(self._peer(peer))] = peer
        main = asyncio.ensure_future(
            self._http.send(self._plan.request(self._http, call), stream=call.stream)
        )
        failed = asyncio.ensure_future(self._failed.wait())
        try:
            await asyncio.wait((main, failed), return_when=asyncio.FIRST_COMPLETED)
        finally:
            failed.cancel()
            if not main.done():  # cancelled: its connection is closed, its abort sent later
                main.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await main
        return None if main.cancelled() else main.result()

    async def _peer(self, call: WorkerCall) -> None:
        drive = self._drive
        try:
            answer = await self._http.send(self._plan.request(self._http, call))
        except httpx.TransportError as error:
            drive.together_failed(call, _reason(error), timed_out=_timed_out(error))
        else:
            drive.together_answered(call, answer.status_code, answer.headers.raw, answer.content)
        if drive.cancelling:
            self._failed.set()

    async def _abort(self, call: WorkerCall) -> None:
        assert call.abort is not None  # noqa: S101 - only calls with an abort are aborted
        try:
            answer = await self._http.send(self._plan.request(self._http, call.abort))
            await answer.aclose()
        except httpx.TransportError as error:
            _LOG.warning("%s abort failed: %s", call.step, _reason(error))

    async def answered(self) -> None:
        """Wait for the answers of the calls sent together (each task feeds its own)."""
        if self._running:
            await asyncio.wait(self._running)

    async def settle(self, *, gone: bool) -> None:
        """Read the rest to their end, or, cancelled, abort them and the main call."""
        running, self._running = self._running, {}
        main, self._main = self._main, None
        if not (gone or self._drive.cancelling):
            await asyncio.gather(*running)
            return
        for task, call in running.items():
            if not task.done():
                task.cancel()
                await self._abort(call)
        if main is not None:
            await self._abort(main)


def _checked_url(value: object, param: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        msg = f"VllmGenerateLLM: {param} must be a worker URL or None, got {reprlib.repr(value)}"
        raise ConfigError(msg, param=param)
    return value.strip().rstrip("/")


@final
class VllmGenerateLLM(CustomLLM):
    """A LiteLLM provider serving chat completions from vLLM workers' generate route.

    Each call drives an :class:`~disagg_transforms.Exchange`: the chat body is rendered once by
    ``{api_base}/v1/chat/completions/render``; when a prefill worker is configured, the
    one-token prefill leg goes to ``{prefill_api_base}/inference/v1/generate`` and its
    ``kv_transfer_params`` are handed to decode; the decode leg (the client's cap, the
    ``output_mode`` of ``params``) goes to ``{api_base}/inference/v1/generate``. The exchange's
    reply, the client's ``chat.completion`` (or its chunk stream), is parsed once into LiteLLM's
    ``ModelResponse`` or ``GenericStreamingChunk``s, with the reasoning as
    ``reasoning_content``.

    The prefill worker's URL comes from the deployment's ``model_info.prefill_api_base``, else
    from ``prefill_api_base`` here; never from the request (a ``prefill_api_base`` call
    argument is refused with 400: a proxy client could send it). An error reply of the exchange
    reaches LiteLLM as a ``CustomLLMError`` with its status and message (a worker's 4xx keeps
    its status, a 5xx or a transport failure is a 502, a contract break such as a missing
    ``output_mode`` echo a 502).

    One pooled ``httpx.Client`` (sync calls) and ``httpx.AsyncClient`` (async calls) serve all
    calls, created on first use; :meth:`close` / :meth:`aclose` close them. LiteLLM's
    ``client`` argument is ignored. Register an instance (``litellm.custom_provider_map``); do
    not subclass it (see the module docstring).

    Args:
        params: the decode step's params; ``use_openai_format`` must be false (this provider
            exists to use the generate route); ``wrap_chat_completion`` is always on (LiteLLM
            reads the chat envelope). Defaults to ``output_mode`` auto: a request with tools gets
            its tool calls (a derender leg), any other text streamed as it comes.
        prefill_params: the prefill step's params, when a prefill worker is used. Defaults to
            the generate route.
        prefill_api_base: the prefill worker's URL for deployments whose ``model_info`` names
            none; ``None``: no prefill leg.
        timeout: seconds per HTTP request when LiteLLM passes none.
        http_client: the ``httpx.Client`` for sync calls (its owner closes it).
        async_http_client: the ``httpx.AsyncClient`` for async calls (its owner closes it).
        engine: the prefill and decode workers' engine. With ``Engine.SGLANG`` they are SGLang
            workers (``api_base`` the decode's): both get one ``/generate`` body at once,
            met at the prefill URL's host, and ``render_api_base`` renders (docs/litellm.md).
        sglang: with ``Engine.SGLANG``, the bootstrap port and the workers' stream output.
        render_api_base: the vLLM render worker's URL; required with ``Engine.SGLANG``
            (default: ``api_base``).

    Raises:
        ConfigError: ``params`` is not a ``DecodeParams`` with ``use_openai_format`` false,
            ``prefill_params`` not a ``PrefillParams``, ``prefill_api_base`` or
            ``render_api_base`` not a URL, or SGLang without ``render_api_base``.
    """

    def __init__(  # noqa: PLR0913 - keyword-only settings, each optional
        self,
        *,
        params: DecodeParams | None = None,
        prefill_params: PrefillParams | None = None,
        prefill_api_base: str | None = None,
        timeout: float = _DEFAULT_TIMEOUT,
        http_client: httpx.Client | None = None,
        async_http_client: httpx.AsyncClient | None = None,
        engine: Engine = Engine.VLLM,
        sglang: SglangSettings | None = None,
        render_api_base: str | None = None,
    ) -> None:
        super().__init__()
        if params is None:
            params = DecodeParams(use_openai_format=False, output_mode=OutputMode.AUTO)
        if not isinstance(params, DecodeParams) or params.use_openai_format:
            msg = (
                "VllmGenerateLLM: params must be DecodeParams with use_openai_format false, "
                f"got {params!r}"
            )
            raise ConfigError(msg, param="params")
        prefill: object = (  # a proxy module may hand over anything
            PrefillParams(use_openai_format=False) if prefill_params is None else prefill_params
        )
        if not isinstance(prefill, PrefillParams):
            shown = reprlib.repr(prefill)
            msg = f"VllmGenerateLLM: prefill_params must be PrefillParams, got {shown}"
            raise ConfigError(msg, param="prefill_params")
        self._params = msgspec.structs.replace(params, wrap_chat_completion=True)
        self._pipelines: Mapping[bool, Mapping[Step, StepParams]] = {
            False: {Step.DECODE: self._params},
            True: {Step.PREFILL: prefill, Step.DECODE: self._params},
        }
        self._prefill_base = _checked_url(prefill_api_base, "prefill_api_base")
        self._render_base = _checked_url(render_api_base, "render_api_base")
        if engine is Engine.SGLANG and self._render_base is None:
            msg = "VllmGenerateLLM: SGLang workers do not render: give render_api_base"
            raise ConfigError(msg, param="render_api_base")
        self._settings = ExchangeSettings(engine=engine, sglang=sglang or SglangSettings())
        self._timeout = timeout
        self._lock = threading.Lock()
        self._http = http_client
        self._owns_http = http_client is None
        self._ahttp = async_http_client
        self._owns_ahttp = async_http_client is None
        self._aloop: weakref.ref[asyncio.AbstractEventLoop] | None = None

    @property
    def params(self) -> DecodeParams:
        """The decode step's params (its ``output_mode`` is what the leg asks for)."""
        return self._params

    def close(self) -> None:
        """Close the ``httpx.Client`` this provider opened; a later call opens a new one."""
        with self._lock:
            client = self._http if self._owns_http else None
            if self._owns_http:
                self._http = None
        if client is not None:
            client.close()

    async def aclose(self) -> None:
        """Close the ``httpx.AsyncClient`` (and ``httpx.Client``) this provider opened."""
        client = self._ahttp if self._owns_ahttp else None
        if self._owns_ahttp:
            self._ahttp = self._aloop = None
        self.close()
        if client is not None:
            await client.aclose()

    # -- the steps every call shares ---------------------------------------------------------

    def _client(self) -> httpx.Client:
        with self._lock:
            if self._http is None:
                self._http = httpx.Client(timeout=self._timeout)
            return self._http

    def _async_client(self) -> httpx.AsyncClient:
        if not self._owns_ahttp:
            assert self._ahttp is not None  # noqa: S101 - given at construction
            return self._ahttp
        loop = asyncio.get_running_loop()
        if self._ahttp is None or self._aloop is None or self._aloop() is not loop:
            # Pooled connections belong to the event loop that opened them: a call in another
            # loop (each asyncio.run, LiteLLM's sync wrappers) gets a client of its own.
            self._ahttp = httpx.AsyncClient(timeout=self._timeout)
            self._aloop = weakref.ref(loop)
        return self._ahttp

    def _plan(self, call: _Call, *, stream: bool) -> _Plan:
        base = _base_url(call.api_base, "api_base")
        prefill = _prefill_base(call.litellm_params, self._prefill_base)
        body = _chat_body(call.model, call.messages, call.optional_params, stream=stream)
        urls = {"render": self._render_base or base, "decode": base}
        if prefill is not None:
            urls["prefill"] = prefill
        sglang = self._settings.engine is Engine.SGLANG
        exchange = Exchange(
            self._pipelines[prefill is not None],
            Route.CHAT_COMPLETIONS.value,
            _client_headers(call.headers, call.api_key),
            body,
            settings=self._settings,
            # SGLang's decode reaches its prefill at the prefill URL's host (docs/sglang.md).
            bootstrap_host=urllib.parse.urlsplit(prefill).hostname if prefill and sglang else None,
        )
        return _Plan(exchange, urls, self._timeout if call.timeout is None else call.timeout)

    # -- LiteLLM's entry points ----------------------------------------------------------------
    # Each binds its arguments to _Call, which holds LiteLLM's signature once.

    @override
    def completion(self, *args: Any, **kwargs: Any) -> ModelResponse:
        """Serve one non-streaming chat completion (synchronous)."""
        plan = self._plan(_Call(*args, **kwargs), stream=False)
        return _model_response(b"".join(_exchange_bytes(self._client(), plan)))

    @override
    async def acompletion(self, *args: Any, **kwargs: Any) -> ModelResponse:
        """Serve one non-streaming chat completion."""
        plan = self._plan(_Call(*args, **kwargs), stream=False)
        parts = [part async for part in _aexchange_bytes(self._async_client(), plan)]
        return _model_response(b"".join(parts))

    @override
    def streaming(self, *args: Any, **kwargs: Any) -> Iterator[GenericStreamingChunk]:
        """Serve one streaming chat completion (synchronous)."""
        plan = self._plan(_Call(*args, **kwargs), stream=True)
        chunks = _ChatChunks()
        for data in _exchange_bytes(self._client(), plan):
            yield from chunks.feed(data)
        yield from chunks.close()

    @override
    async def astreaming(  # type: ignore[override]  # LiteLLM types it a coroutine, iterates it
        self, *args: Any, **kwargs: Any
    ) -> AsyncIterator[GenericStreamingChunk]:
        """Serve one streaming chat completion."""
        plan = self._plan(_Call(*args, **kwargs), stream=True)
        chunks = _ChatChunks()
        async for data in _aexchange_bytes(self._async_client(), plan):
            for item in chunks.feed(data):
                yield item
        for item in chunks.close():
            yield item


def _route_for(call_type: object, fixed: Route | None) -> Route | None:
    if fixed is not None:
        return fixed
    name = getattr(call_type, "value", call_type)
    return _CALL_ROUTES.get(name) if isinstance(name, str) else None


def _no_subclass(cls: type) -> NoReturn:
    msg = (
        f"{cls.__name__} must not be subclassed: LiteLLM calls async_pre_call_hook only when the "
        "registered class defines it itself, so a subclass would silently turn it off. Compose: "
        "hold an instance and call its hooks from your own CustomLogger."
    )
    raise TypeError(msg)


@final
class SamplingCapsCallback(CustomLogger):
    """LiteLLM callback: move the request's output cap under ``sampling_params.max_tokens``.

    :func:`~disagg_transforms.apply_sampling_caps` on the request dict, for requests a
    deployment sends to a vLLM generate route (which reads the cap only there). Both hooks
    return a new dict and leave LiteLLM's untouched; a bad cap raises
    :class:`~disagg_transforms.errors.RequestError` (status hint 400).

    Args:
        route: the route whose cap keys the request carries; ``None`` (the default) derives it
            from LiteLLM's call type (chat for ``completion``, completions for
            ``text_completion``, Responses for ``responses``, Messages for
            ``anthropic_messages``) and leaves other calls alone.
    """

    def __init__(self, route: Route | None = None) -> None:
        super().__init__()
        untyped: object = route  # a proxy YAML may hand over anything
        if untyped is not None and not isinstance(untyped, Route):
            msg = f"SamplingCapsCallback: route must be a Route or None, got {reprlib.repr(route)}"
            raise ConfigError(msg, param="route")
        self._route = route

    def __init_subclass__(cls, **kwargs: object) -> None:
        _no_subclass(cls)

    def _apply(self, data: Mapping[str, Any], call_type: object) -> dict[str, Any] | None:
        route = _route_for(call_type, self._route)
        return None if route is None else apply_sampling_caps(data, route)

    @override
    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> dict[str, Any] | None:
        """Proxy hook: the request dict with its cap relocated (``None``: not a call it knows)."""
        return self._apply(data, call_type)

    @override
    async def async_pre_call_deployment_hook(
        self, kwargs: dict[str, Any], call_type: Any
    ) -> dict[str, Any] | None:
        """SDK and proxy hook (async calls): the call's kwargs with the cap relocated."""
        return self._apply(kwargs, call_type)


@final
class StripTransferParamsCallback(CustomLogger):
    """LiteLLM callback: remove client-supplied ``kv_transfer_params`` / ``ec_transfer_params``.

    A client that sets them (top level, ``sampling_params.extra_args`` or ``vllm_xargs``) could
    point a worker at any host; only the router should set them. Both hooks return
    a new dict and leave LiteLLM's untouched.
    """

    def __init_subclass__(cls, **kwargs: object) -> None:
        _no_subclass(cls)

    @override
    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> dict[str, Any]:
        """Proxy hook: the request dict without client transfer params."""
        return strip_transfer_params(data)

    @override
    async def async_pre_call_deployment_hook(
        self, kwargs: dict[str, Any], call_type: Any
    ) -> dict[str, Any]:
        """SDK and proxy hook (async calls): the call's kwargs without client transfer params."""
        return strip_transfer_params(kwargs)


auto_provider: Final = VllmGenerateLLM()
"""The provider to register (``custom_provider_map`` in a proxy YAML): ``output_mode`` auto.

A request with tools gets its tool calls and reasoning (a derender leg), any other text
streamed token by token with no reasoning parsed.
"""
text_provider: Final = VllmGenerateLLM(
    params=DecodeParams(use_openai_format=False, output_mode=OutputMode.TEXT)
)
"""A provider in text mode (vLLM >= 0.32): a request with tools is refused with a 400."""
derender_provider: Final = VllmGenerateLLM(
    params=DecodeParams(use_openai_format=False, output_mode=OutputMode.DERENDER)
)
"""A provider in derender mode (vLLM >= 0.33): tool calls and reasoning parsed by the worker,
every answer in one frame."""
sampling_caps_callback: Final = SamplingCapsCallback()
"""A :class:`SamplingCapsCallback` for ``litellm_settings.callbacks`` in a proxy YAML."""
strip_transfer_params_callback: Final = StripTransferParamsCallback()
"""A :class:`StripTransferParamsCallback` for ``litellm_settings.callbacks`` in a proxy YAML."""

"""The exchange's state machine: worker calls out, worker answers in, the client's reply out.

In the manner of h11: no I/O, no clock of its own but for ``created`` stamps, no threads. The
router asks :meth:`Exchange.next_event` what to do, does it, and feeds what it got back. See
``docs/exchange.md``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Final, Literal, TypeAlias

import msgspec
from msgspec import UNSET

from disagg_transforms._config import (
    DecodeParams,
    EncodeParams,
    PrefillParams,
    Step,
    StepParams,
)
from disagg_transforms._exchange import reply as _reply
from disagg_transforms._exchange.events import (
    NEED_DATA,
    ClientReply,
    ClientStream,
    Event,
    Headers,
    WorkerCall,
)
from disagg_transforms._request.legs import (
    DecodeLeg,
    Leg,
    build_decode_request,
    build_encode_request,
    build_prefill_request,
    check_client_request,
    strip_transfer_params,
)
from disagg_transforms._routes import Route, detect_route, resolve_format
from disagg_transforms._wire import keys as w
from disagg_transforms._wire import limits as _limits
from disagg_transforms._wire import raw as _raw
from disagg_transforms._wire.describe import describe
from disagg_transforms._wire.limits import DEFAULT_LIMITS, Limits
from disagg_transforms._wire.sse import EVENT_END
from disagg_transforms.errors import (
    ConfigError,
    DisaggTransformError,
    RequestError,
    RequestTooLargeError,
    UpstreamContractError,
    error_body,
)
from disagg_transforms.hooks import LegInputs, Pipeline, TransformContext

__all__ = ("Exchange", "ExchangeSettings", "ExchangeStateError", "StreamEnd")

StreamEnd: TypeAlias = Literal["complete", "worker-failed", "contract-broken"]
"""How the client's stream ended (:attr:`Exchange.stream_end`)."""

_LegParams: TypeAlias = EncodeParams | PrefillParams | DecodeParams
_LEG_PARAMS = (EncodeParams, PrefillParams, DecodeParams)
_REQUEST_ID = re.compile(r"[A-Za-z0-9-]{1,128}")
_RENDERED_ROUTES = (Route.CHAT_COMPLETIONS, Route.RESPONSES, Route.MESSAGES)
_ORDER = ("render", "encode", "prefill", "decode")  # the worker calls, each made when needed
# Never forwarded from the client to a worker: hop-by-hop, framing, and what the exchange sets.
_NOT_FORWARDED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "content-type",
        "accept-encoding",
        "x-request-id",
        "x-should-retry",
    }
)
_MAX_ERROR_BYTES = 64 * 1024  # of a worker's error body kept to quote its message
_MAX_QUOTED = 1000  # characters of a worker's message quoted to the client


class ExchangeStateError(DisaggTransformError):
    """The router called the exchange out of order (e.g. ``feed`` with no stream open)."""

    status_hint: ClassVar[int] = 500
    error_type: ClassVar[str] = "InternalServerError"


class _TransferView(msgspec.Struct):
    """The one thing read from an encode or prefill answer."""

    kv_transfer_params: Any = UNSET
    ec_transfer_params: Any = UNSET


def _header_pairs(headers: object) -> list[tuple[str, str]]:
    items: Iterable[Any]
    if isinstance(headers, Mapping):
        items = headers.items()
    elif isinstance(headers, Iterable) and not isinstance(headers, (str, bytes)):
        items = headers
    else:
        msg = f"headers: expected a mapping or (name, value) pairs, got {describe(headers)}"
        raise ExchangeStateError(msg, param="headers")
    pairs = []
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2):
            msg = f"headers: expected (name, value) pairs, got {describe(item)}"
            raise ExchangeStateError(msg, param="headers")
        name, value = (
            part.decode("latin-1") if isinstance(part, bytes) else str(part) for part in item
        )
        pairs.append((name.lower(), value))
    return pairs


def _worker_error(body: bytes) -> tuple[str | None, str | None, str | None]:
    """(message, type, param) of a worker's error body, whatever API shape it came in."""
    try:
        value = msgspec.json.decode(body[:_MAX_ERROR_BYTES])
    except (msgspec.DecodeError, RecursionError):
        return None, None, None
    if not isinstance(value, dict):
        return None, None, None
    error = value.get(w.ERROR)
    if isinstance(error, dict):
        return _text(error.get(w.MESSAGE)), _text(error.get(w.TYPE)), _text(error.get(w.PARAM))
    if isinstance(error, str):
        return error, None, None
    return _text(value.get(w.DETAIL)), None, None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _quote(message: str) -> str:
    return message if len(message) <= _MAX_QUOTED else message[:_MAX_QUOTED] + "…"


class ExchangeSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How a router runs every exchange; frozen, build one at startup and share it."""

    hooks: Pipeline | None = None
    """The host's :class:`~disagg_transforms.Pipeline`: its request transforms run on each
    encode, prefill and decode leg, its response transforms on a JSON reply."""
    new_request_id: Callable[[], str] | None = None
    """Makes a request id when the client sent no usable ``x-request-id`` (default: a uuid4 in
    hex)."""
    limits: Limits = DEFAULT_LIMITS
    """The bounds on the client's body (``docs/security.md``)."""


_DEFAULT_SETTINGS: Final = ExchangeSettings()


class Exchange:
    """One client request through render, encode, prefill and decode and back, without I/O.

    Args:
        config: the parsed pipeline (:func:`~disagg_transforms.parse_pipeline_params`); a
            decode step is required, conditional-decode is refused.
        client_path: the path the client called.
        client_headers: the client's headers (a mapping or ``(name, value)`` pairs).
        client_body: the client's body, as bytes.
        settings: the router's :class:`ExchangeSettings` (hooks, request ids, limits); ``None``
            means the defaults.

    Raises:
        ConfigError: the pipeline has no decode step, or has conditional-decode.
    """

    def __init__(
        self,
        config: Mapping[Step, StepParams],
        client_path: str,
        client_headers: Mapping[str, str] | Iterable[tuple[str | bytes, str | bytes]],
        client_body: bytes,
        *,
        settings: ExchangeSettings | None = None,
    ) -> None:
        settings = _DEFAULT_SETTINGS if settings is None else settings
        new_request_id = settings.new_request_id
        self._params = _checked_config(config)
        untyped_path: object = client_path  # routers hand over whatever their framework has
        if not isinstance(untyped_path, str):
            msg = f"client_path: expected the client's request path, got {describe(client_path)}"
            raise ConfigError(msg, param="client_path")
        self._path = client_path
        self._route = detect_route(client_path)
        headers = _header_pairs(client_headers)
        given = next((v for k, v in headers if k == "x-request-id"), None)
        if given is not None and _REQUEST_ID.fullmatch(given):
            self.request_id = given
        else:
            self.request_id = (new_request_id or (lambda: uuid.uuid4().hex))()
        self._forward: Headers = (
            *((k, v) for k, v in headers if k not in _NOT_FORWARDED),
            ("content-type", _reply.JSON),
            ("x-request-id", self.request_id),
        )
        self._hooks = settings.hooks
        self._limits = settings.limits
        self._rendered: Mapping[str, Any] | None = None
        self._ec: Mapping[str, Any] | None = None
        self._kv: Mapping[str, Any] | None = None
        self._decode: DecodeLeg | None = None
        self._call: WorkerCall | None = None
        self._final: ClientReply | ClientStream | None = None
        self._relay: _reply.Relay | None = None
        self._reading: str | None = None  # the step whose stream is being read
        self._error_status = 0  # a streamed answer's non-2xx status, its body being collected
        self._error_body = bytearray()
        self._done = False
        self._stream_end: StreamEnd | None = None
        self._step = "client"  # the step whose answer is being read, named in errors
        self._members: _raw.RawMembers = _raw.RawMembers(b"{}", RequestError, "", token_ids_key="")
        routes = {
            step: resolve_format(params.use_openai_format, client_path)
            for step, params in self._params.items()
        }
        self._render = self._route in _RENDERED_ROUTES and Route.GENERATE in routes.values()
        try:
            self._members = self._client_members(client_body)
            # Every leg's refusals of the client's own fields come before the first call.
            check_client_request(
                self._members, client_path=client_path, steps=self._params.values()
            )
            self._next("render" if self._render else "encode")
        except DisaggTransformError as error:
            self._fail(error)

    # -- what the router asks -------------------------------------------------------------

    def next_event(self) -> Event:
        """What to do now: a worker call, the client's reply or stream head, or keep feeding.

        Asking again without feeding anything returns the same event.
        """
        if self._final is not None:
            return self._final
        if self._call is not None:
            return self._call
        return NEED_DATA

    @property
    def reply_over(self) -> bool:
        """Whether the client's reply is complete: nothing fed from now on adds a byte to it.

        True once :meth:`next_event` is a :class:`ClientReply`, or once a client stream has
        ended (the worker's stream ended, broke the contract, or failed). A router still
        sends the bytes the last call returned, then closes the worker's stream at once: the
        rest of it would only be dropped.
        """
        return self._done or isinstance(self._final, ClientReply)

    @property
    def stream_end(self) -> StreamEnd | None:
        """How the client's stream ended; ``None`` while it runs, or when there is none.

        ``"complete"``: the worker's stream ended as its API ends one. ``"worker-failed"``:
        the router reported the worker failed (:meth:`worker_failed`), or the worker's stream
        carried its own error event. ``"contract-broken"``: the worker's stream broke
        the contract (cut mid-event, no end, an event that is not JSON) and the client's
        stream ended with the API's error event. A client that went away is the router's to
        know: the exchange never hears of it.
        """
        return self._stream_end

    def receive(self, status: int, headers: object, body: bytes) -> None:
        """Feed the whole answer to the current (non-streamed) worker call."""
        del headers  # nothing in a worker's headers changes the flow
        call = self._take_call(stream=False)
        _check_status(status)
        untyped: object = body
        if not isinstance(untyped, (bytes, bytearray, memoryview)):
            msg = f"body: expected bytes, got {describe(untyped)}"
            raise ExchangeStateError(msg, param="body")
        if not 200 <= status < 300:
            self._fail_worker(call.step, status, bytes(body))
            return
        try:
            self._answered(call.step, bytes(body))
        except DisaggTransformError as error:
            self._fail(error)

    def receive_stream_head(self, status: int, headers: object) -> None:
        """The status and headers of the current streamed worker call's answer."""
        del headers
        call = self._take_call(stream=True)
        _check_status(status)
        self._reading = call.step
        if not 200 <= status < 300:
            self._error_status = status
            return
        leg = self._decode
        assert leg is not None  # noqa: S101 - only the decode leg streams
        try:
            self._relay = _reply.stream_relay(
                self._shape(leg),
                client_route=self._route,
                requested=leg.output_mode,
                client_body=self._members,
                model=None if self._rendered is None else self._rendered.get(w.MODEL),
            )
        except DisaggTransformError as error:
            self._fail(error)
            self._done = True

    def feed(self, data: bytes) -> bytes:
        """Feed the next bytes of the worker's stream (split anywhere); returns client bytes.

        Before the client's stream has started this returns ``b""``: check
        :meth:`next_event`, which turns into a :class:`ClientStream` (carrying the bytes held
        so far) or a :class:`ClientReply` (an error with a clean status).
        """
        if self._done:
            return b""  # the client's reply is over; the rest of the worker's stream is dropped
        self._check_reading()
        untyped: object = data
        if not isinstance(untyped, (bytes, bytearray, memoryview)):
            msg = f"data: expected bytes, got {describe(untyped)}"
            raise ExchangeStateError(msg, param="data")
        if self._relay is None:
            room = _MAX_ERROR_BYTES - len(self._error_body)
            self._error_body += bytes(data[:room])
            return b""
        sent = []
        # Event by event: what the events before a broken one gave the client is not lost.
        for piece in _pieces(bytes(data)):
            try:
                out = self._relay.feed(piece)
            except DisaggTransformError as error:
                sent.append(self._broken(error))
                break
            sent.append(self._emit(out))
        return b"".join(sent)

    def end_of_stream(self) -> bytes:
        """The worker's stream ended; returns the client's last bytes."""
        if self._done:
            return b""
        step = self._check_reading()
        self._done = True
        if self._relay is None:
            self._fail_worker(step, self._error_status, bytes(self._error_body))
            return b""
        try:
            out = self._emit(self._relay.close())
        except DisaggTransformError as error:
            return self._broken(error)
        if self._final is None:
            msg = f"$: {step} ended its stream before sending any event"
            self._fail(UpstreamContractError(msg, param="$"))
        else:
            self._stream_end = "worker-failed" if self._relay.worker_error else "complete"
        return out

    def worker_failed(self, step: str, reason: str, *, timed_out: bool = False) -> bytes:
        """The router could not get the worker's answer (connection, timeout).

        Before the client's reply has started, the reply becomes a retryable 502, or 504 when
        ``timed_out`` (the worker did not answer in time); after, the returned bytes are the
        in-stream error event that ends the client's stream.
        """
        message = f"{step} failed: {reason}"
        status = 504 if timed_out else 502
        if isinstance(self._final, ClientStream):
            if self._done:
                return b""
            self._done = True
            self._stream_end = "worker-failed"
            return self._stream_error(message, status)
        if self._final is not None:
            return b""
        if self._call is None and self._reading is None:
            msg = "worker_failed: no worker call is in flight"
            raise ExchangeStateError(msg)
        self._call = None
        self._done = True
        self._reply_error(status, message, retry=True)
        return b""

    # -- the flow -------------------------------------------------------------------------

    def _client_members(self, body: object) -> _raw.RawMembers:
        if isinstance(body, (bytes, bytearray, memoryview)):
            _limits.check_body_size(bytes(body), self._limits, error=RequestTooLargeError)
        members = _raw.RawMembers(
            body, RequestError, "the client body", token_ids_key=self._token_ids_key()
        )
        _limits.check_client_body(members, self._limits)
        return members

    def _token_ids_key(self) -> str:
        # A host's transforms get plain JSON values (bodies, the client's in their context):
        # no token IDs kept as bytes then.
        hooks = self._hooks
        has_hooks = hooks is not None and bool(hooks.request or hooks.response)
        return "" if has_hooks else w.TOKEN_IDS

    def _next(self, step: str) -> None:
        """Make the call of ``step``, or of the step after it when this request skips it."""
        if step == "encode" and not self._has_features():
            step = "prefill"
        if step == "prefill" and Step.PREFILL not in self._params:
            step = "decode"
        self._call = self._worker_call(step)

    def _after(self, step: str) -> None:
        self._next(_ORDER[_ORDER.index(step) + 1])

    def _has_features(self) -> bool:
        if Step.ENCODE not in self._params:
            return False
        source = self._rendered if self._rendered is not None else self._members
        return source.get(w.FEATURES) is not None

    def _worker_call(self, step: str) -> WorkerCall:
        if step == "render":
            stripped = self._members.encode(strip_transfer_params(self._members))
            path = f"{self._route.value}/render"
            return WorkerCall(
                step=step,
                method="POST",
                path=path,
                headers=self._forward,
                body=stripped,
                stream=False,
            )
        leg = self._build(step)
        stream = isinstance(leg, DecodeLeg) and leg.stream
        if isinstance(leg, DecodeLeg):
            self._decode = leg
        body = self._run_hooks(step, leg.body)
        return WorkerCall(
            step=step,
            method="POST",
            path=leg.path,
            headers=self._forward,
            body=self._members.encode(body),
            stream=stream,
        )

    def _build(self, step: str) -> Leg:
        params = self._params[Step(step)]
        if isinstance(params, EncodeParams):
            return build_encode_request(
                self._members, client_path=self._path, params=params, inputs=self._inputs()
            )
        if isinstance(params, PrefillParams):
            return build_prefill_request(
                self._members,
                client_path=self._path,
                params=params,
                inputs=self._inputs(ec_transfer_params=self._ec),
            )
        assert isinstance(params, DecodeParams)  # noqa: S101 - the config was checked
        return build_decode_request(
            self._members,
            client_path=self._path,
            params=params,
            inputs=self._inputs(kv_transfer_params=self._kv),
        )

    def _inputs(
        self,
        *,
        kv_transfer_params: Mapping[str, Any] | None = None,
        ec_transfer_params: Mapping[str, Any] | None = None,
    ) -> LegInputs:
        # What every leg gets (render's answer, the bounds), and what only its step hands on.
        return LegInputs(
            kv_transfer_params=kv_transfer_params,
            ec_transfer_params=ec_transfer_params,
            rendered=self._rendered,
            limits=self._limits,
        )

    def _context(self, step: Step) -> TransformContext:
        return TransformContext(
            client_path=self._path,
            step=step,
            params=self._params.get(step),
            client_body=self._members,
            inputs=LegInputs(
                kv_transfer_params=self._kv,
                rendered=self._rendered,
                request_id=self.request_id,
            ),
        )

    def _run_hooks(self, step: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._hooks is None or not self._hooks.request:
            return body
        return self._hooks.run_request(body, self._context(Step(step)))

    def _answered(self, step: str, body: bytes) -> None:
        if step == "render":
            self._rendered = _raw.RawMembers(
                body,
                UpstreamContractError,
                "the render answer",
                token_ids_key=self._token_ids_key(),
            )
        elif step in {"encode", "prefill"}:
            self._transfer(step, body)
        else:
            self._whole_reply(body)
            return
        self._after(step)

    def _transfer(self, step: str, body: bytes) -> None:
        try:
            view = msgspec.json.decode(body, type=_TransferView)
        except (msgspec.DecodeError, RecursionError) as error:
            msg = f"$: the {step} answer is not a JSON object: {error}"
            raise UpstreamContractError(msg, param="$") from None
        key = w.KV_TRANSFER_PARAMS if step == "prefill" else w.EC_TRANSFER_PARAMS
        value = view.kv_transfer_params if step == "prefill" else view.ec_transfer_params
        # Decode pulls the prompt's KV with what prefill answered: without it there is nothing
        # to pull. An encode answer may have no encoder cache to hand on.
        if isinstance(value, dict) or (step == "encode" and value in (None, UNSET)):
            if step == "prefill":
                self._kv = value
            else:
                self._ec = value or None
            return
        shown = "nothing" if value is UNSET else describe(value)
        msg = f"$.{key}: the {step} answer must carry an object, got {shown}"
        raise UpstreamContractError(msg, param=f"$.{key}")

    def _shape(self, leg: DecodeLeg) -> _reply.Shape:
        return _reply.reply_shape(self._route, leg.route, wrap=leg.wrap_chat_completion)

    def _whole_reply(self, answer: bytes) -> None:
        leg = self._decode
        assert leg is not None  # noqa: S101 - decode is the last call
        hook = None
        hooks = self._hooks
        if hooks is not None and hooks.response:
            context = self._context(Step.DECODE)

            def hook(body: dict[str, Any]) -> dict[str, Any]:
                return hooks.run_response(body, context)

        body, content_type = _reply.whole_reply(
            self._shape(leg), answer, leg=leg, client_body=self._members, hook=hook
        )
        self._final = ClientReply(status=200, headers=self._reply_headers(content_type), body=body)

    # -- client bytes and failures --------------------------------------------------------

    def _reply_headers(self, content_type: str, *, retry: bool = True) -> Headers:
        headers: Headers = (("content-type", content_type), ("x-request-id", self.request_id))
        if content_type == _reply.SSE:
            headers = (*headers, ("cache-control", "no-cache"))
        if not retry:
            headers = (*headers, ("x-should-retry", "false"))
        return headers

    def _emit(self, out: bytes) -> bytes:
        if self._final is not None or not out:
            return out
        self._final = ClientStream(status=200, headers=self._reply_headers(_reply.SSE), first=out)
        return b""

    def _stream_error(self, message: str, status: int = 502) -> bytes:
        assert self._relay is not None  # noqa: S101 - a started stream has its relay
        return self._relay.error_event(message, status=status)

    def _broken(self, error: DisaggTransformError) -> bytes:
        """A contract break in the worker's stream: an in-stream error, or a clean 502."""
        self._done = True
        if isinstance(self._final, ClientStream):
            self._stream_end = "contract-broken"
            return self._stream_error(f"{self._step} broke the contract: {error.message}")
        self._fail(error)
        return b""

    def _take_call(self, *, stream: bool) -> WorkerCall:
        call = self._call
        if call is None or self._final is not None:
            msg = "no worker call is waiting for an answer"
            raise ExchangeStateError(msg)
        if call.stream is not stream:
            how = "receive_stream_head" if call.stream else "receive"
            msg = f"the {call.step} call's answer is read with {how}"
            raise ExchangeStateError(msg)
        self._call = None
        self._step = call.step
        return call

    def _check_reading(self) -> str:
        if self._reading is None:
            msg = "no worker stream is open (call receive_stream_head first)"
            raise ExchangeStateError(msg)
        return self._reading

    def _fail(self, error: DisaggTransformError) -> None:
        self._call = None
        status = error.status_hint
        step = self._step
        message = error.message
        if isinstance(error, UpstreamContractError):
            message = f"{step} broke the contract: {message}"
        self._reply_error(
            status, message, param=error.param, error_type=error.error_type, retry=False
        )

    def _fail_worker(self, step: str, status: int, body: bytes) -> None:
        message, error_type, param = _worker_error(body)
        said = _quote(message) if message else f"HTTP {status}"
        if 400 <= status < 500:
            text = f"{step} rejected the request: {said}"
            self._reply_error(status, text, param=param, error_type=error_type, retry=False)
        elif 500 <= status < 600:
            self._reply_error(502, f"{step} failed with HTTP {status}: {said}", retry=True)
        else:
            text = f"{step} broke the contract: it answered HTTP {status}"
            self._reply_error(502, text, retry=False)

    def _reply_error(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        error_type: str | None = None,
        retry: bool,
    ) -> None:
        body = _raw.encode(
            error_body(
                self._route, status=status, message=message, param=param, error_type=error_type
            )
        )
        # Only a 4xx says nothing about retrying: the SDKs do not retry those anyway.
        retryable = retry or status < 500
        headers = self._reply_headers(_reply.JSON, retry=retryable)
        self._final = ClientReply(status=status, headers=headers, body=body)


def _pieces(data: bytes) -> list[bytes]:
    """``data`` cut after each SSE event end (a cut inside one only makes a piece shorter)."""
    if data.find(b"\r") < 0:  # vLLM's framing: bytes searches, several times faster than the regex
        ends = []
        at = data.find(b"\n\n")
        while at >= 0:
            ends.append(at + 2)
            at = data.find(b"\n\n", at + 2)
    else:
        ends = [match.end() for match in EVENT_END.finditer(data)]
    return [
        data[start:end]
        for start, end in zip([0, *ends], [*ends, len(data)], strict=True)
        if end > start
    ]


def _check_status(status: object) -> None:
    if isinstance(status, bool) or not isinstance(status, int):
        msg = f"status: expected an HTTP status code, got {describe(status)}"
        raise ExchangeStateError(msg, param="status")


def _checked_config(config: object) -> dict[Step, _LegParams]:
    if not isinstance(config, Mapping):
        msg = f"pipeline: expected parse_pipeline_params(...)'s result, got {describe(config)}"
        raise ConfigError(msg, param="pipeline")
    params: dict[Step, _LegParams] = {}
    for step, value in config.items():
        if step is Step.CONDITIONAL_DECODE:
            msg = (
                "pipeline.conditional-decode: the exchange does not run conditional-decode; "
                "leave it out of the pipeline the exchange is given (docs/exchange.md)"
            )
            raise ConfigError(msg, param="pipeline.conditional-decode")
        if not isinstance(step, Step) or not isinstance(value, _LEG_PARAMS) or value.step != step:
            msg = f"pipeline: expected Step -> its StepParams, got {describe(step)}"
            raise ConfigError(msg, param="pipeline")
        params[step] = value
    if Step.DECODE not in params:
        msg = "pipeline: a decode step is required (it answers the client)"
        raise ConfigError(msg, param="pipeline.decode")
    return params

"""The exchange's state machine: worker calls out, worker answers in, the client's reply out.

In the manner of h11: no I/O, no clock of its own but for ``created`` stamps, no threads. The
router asks :meth:`Exchange.next_event` what to do, does it, and feeds what it got back. See
``docs/exchange.md`` (its "Phases" drawing is this machine).

The rules of the machine:

1. An exchange is in one :class:`Phase` at a time and holds that phase's data (``_at``: the
   call to make, the stream being read, the client's stream, the reply), beside what the
   answers so far hand the legs (``_gathered``). Nothing else says what happens next.
2. The worker calls are the rows of one table, ``Exchange._plan``, in order. A row says when
   its phase runs for this request (``runs``; else the next row is tried), how its call is
   built (``build``) and how its answer is read (``read``). Adding a phase is one row, its
   builder and its reader.
3. A reader returns the phase to go to: ``None`` for the next row that runs, ``REPLIED`` once
   it made the client's reply (the decode row's reader, always), or holds it for the answer of
   a call sent together that the reply needs (``_Awaiting``: SGLang's prompt logprobs).
4. An answer whose status its row does not read, a failure the router reports, or an error
   raised while building or reading ends in ``REPLIED`` with an error in the client API's own
   shape; once the client's stream has started, with its in-stream error event.
5. A streamed answer keeps its phase until its first client bytes are known: then
   ``STREAMING`` (the client's stream started, carrying them all) or ``REPLIED`` (an error, or
   the stream ended at once). ``STREAMING`` ends in ``REPLIED``; ``REPLIED`` is final.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import uuid
from collections.abc import Callable, Container, Iterable, Mapping
from typing import Any, ClassVar, Final, Literal, NamedTuple, TypeAlias

import msgspec
from msgspec import UNSET

from disagg_transforms._config import (
    ConditionalDecodeParams,
    DecodeParams,
    EncodeParams,
    OutputMode,
    PrefillParams,
    Step,
    StepParams,
    validate_vllm_version,
    vllm_honours,
)
from disagg_transforms._coordinator import EcConnector, KvConnector
from disagg_transforms._engines import ENGINES, Engine, Meeting, SglangSettings
from disagg_transforms._exchange import reply as _reply
from disagg_transforms._exchange.check import version_errors
from disagg_transforms._exchange.events import (
    NEED_DATA,
    ClientReply,
    ClientStream,
    Event,
    Headers,
    Phase,
    WorkerCall,
)
from disagg_transforms._request.client import ClientRequest, read_client_request
from disagg_transforms._request.legs import (
    DecodeLeg,
    GenerateDecodeLeg,
    Leg,
    LegInputs,
    decode_leg,
    single_token_leg,
    strip_transfer_params,
)
from disagg_transforms._request.render import RenderAnswer
from disagg_transforms._request.sglang import (
    SglangLeg,
    new_rendezvous,
    prefill_body,
    sglang_client_leg,
    sglang_openai_leg,
    unprompted_sglang_leg,
    with_prompt,
)
from disagg_transforms._response.dispatch import ENVELOPE_ROUTES
from disagg_transforms._response.sglang import SglangFailure
from disagg_transforms._routes import ROUTE_PATH, Route, detect_route, resolve_format
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
from disagg_transforms.hooks import Pipeline, TransformContext

__all__ = (
    "Exchange",
    "ExchangeSettings",
    "ErrorKind",
    "ExchangeStateError",
    "PlanRow",
    "StreamEnd",
    "pipeline_phases",
)

StreamEnd: TypeAlias = Literal["complete", "worker-failed", "contract-broken"]
"""How the client's stream ended (:attr:`Exchange.stream_end`)."""

ErrorKind: TypeAlias = Literal["bad_request", "upstream_4xx", "upstream_5xx", "internal"]
"""Whose fault an error reply is (:attr:`Exchange.error_kind`)."""

_LegParams: TypeAlias = EncodeParams | PrefillParams | DecodeParams
_LEG_PARAMS = (EncodeParams, PrefillParams, DecodeParams)
_STEP_PARAMS = (*_LEG_PARAMS, ConditionalDecodeParams)
# A conditional decode's answer is read as a decode leg on the client's own route.
_CLIENT_ROUTE_DECODE: Final = DecodeParams(use_openai_format=True)
_NOT_HELD = 412  # a conditional decode's "no decode worker holds this prompt's KV"
# What decode gets from a prefill whose KV went to shared storage (it reads it from there).
_SHARED_STORAGE_KV: Final = {w.DO_REMOTE_DECODE: False, w.DO_REMOTE_PREFILL: True}
_REQUEST_ID = re.compile(r"[A-Za-z0-9-]{1,128}")
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
        "epp-profile",  # names a leg's pool in llm-d: the router's to set (docs/llm-d.md)
        # llm-d's picker names the prefill and encode workers and a KV cache's source in these,
        # for the router to read; they name internal hosts (docs/llm-d.md, "The sidecar seat").
        "x-prefiller-host-port",
        "x-encoder-hosts-ports",
        "x-kv-cache-source-host-port",
    }
)
_MAX_ERROR_BYTES = 64 * 1024  # of a worker's error body kept to quote its message
_MAX_QUOTED = 1000  # characters of a worker's message quoted to the client


class ExchangeStateError(DisaggTransformError):
    """The router called the exchange out of order (e.g. ``feed`` with no stream open)."""

    status_hint: ClassVar[int] = 500
    error_type: ClassVar[str] = "InternalServerError"


class _TransferView(msgspec.Struct):
    """What is read from an encode or prefill answer: its transfer params and its usage."""

    kv_transfer_params: Any = UNSET
    ec_transfer_params: Any = UNSET
    usage: Any = None


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
        name, value = item  # no generator per header: a request has a dozen or more
        name = name.decode("latin-1") if isinstance(name, bytes) else str(name)
        value = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        pairs.append((name.lower(), value))
    return pairs


class _Detail(NamedTuple):
    """What an error reply's body names besides its message."""

    error_type: str | None = None
    param: str | None = None


_NO_DETAIL: Final = _Detail()


def _worker_error(body: bytes) -> tuple[str | None, _Detail]:
    """The message, type and param of a worker's error body, whatever API shape it came in."""
    try:
        value = msgspec.json.decode(body[:_MAX_ERROR_BYTES])
    except (msgspec.DecodeError, RecursionError):
        return None, _NO_DETAIL
    if not isinstance(value, dict):
        return None, _NO_DETAIL
    error = value.get(w.ERROR)
    if isinstance(error, dict):
        detail = _Detail(_text(error.get(w.TYPE)), _text(error.get(w.PARAM)))
        return _text(error.get(w.MESSAGE)), detail
    if isinstance(error, str):
        return error, _NO_DETAIL
    # FastAPI's detail; SGLang's HTTP errors are a top-level error object (docs/sglang.md).
    return _text(value.get(w.DETAIL)) or _text(value.get(w.MESSAGE)), _NO_DETAIL


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
    kv_connector: KvConnector = KvConnector.NIXL
    """How prefill hands the prompt's KV to decode: ``NIXL``, decode gets the prefill answer's
    ``kv_transfer_params``; ``SHARED_STORAGE``, decode gets only the two flags and of the
    prefill answer only its usage is read (``docs/exchange.md``, "Connectors"). With
    ``engine=Engine.SGLANG`` the two meet by bootstrap room whatever this says; ``SGLANG``
    (llm-d's ``kv-sglang``) goes with that engine only."""
    ec_connector: EcConnector = EcConnector.NIXL
    """How encode hands its encoder cache to prefill: ``NIXL``, prefill gets the encode
    answer's ``ec_transfer_params``; ``SHARED_STORAGE``, no leg carries any."""
    render_first: bool = False
    """Render before a conditional decode, as a coordinator document that lists render first
    runs them (:attr:`~disagg_transforms.CoordinatorConfig.render_first`); by default the
    conditional decode goes first, so a hit costs no render (``docs/exchange.md``)."""
    vllm_version: str | None = None
    """The workers' vLLM release, as their ``GET /version`` writes it (``"0.32.0"``); ``None``:
    one that honours every mode. On a release without ``derender`` (0.32), a request with tools
    under ``output_mode: auto`` is decoded on the client's own route, and one that a
    ``derender`` step would send is refused before any worker call (``docs/exchange.md``,
    "vLLM versions")."""

    engine: Engine = Engine.VLLM
    """The workers' engine: ``VLLM``, or ``SGLANG``, whose prefill and decode are sent together
    with one ``/generate`` body and met in a bootstrap room (``docs/sglang.md``)."""
    sglang: SglangSettings = SglangSettings()
    """With ``engine=SGLANG``: the bootstrap port, the workers' stream output, the randomness."""

    def __post_init__(self) -> None:
        if self.vllm_version is not None:
            validate_vllm_version(self.vllm_version, "ExchangeSettings.vllm_version")
        engine: object = self.engine
        if not isinstance(engine, Engine):
            msg = f"ExchangeSettings.engine: expected an Engine, got {describe(engine)}"
            raise ConfigError(msg, param="engine")
        if self.kv_connector is KvConnector.SGLANG and engine is not Engine.SGLANG:
            msg = (
                "ExchangeSettings.kv_connector: KvConnector.SGLANG needs engine=Engine.SGLANG "
                "(docs/sglang.md)"
            )
            raise ConfigError(msg, param="kv_connector")


_DEFAULT_SETTINGS: Final = ExchangeSettings()
# The step whose params build each leg phase's call (an enum lookup by value costs more).
_STEP_OF_PHASE: Final = {Phase(step.value): step for step in Step}


# -- the data of each phase --------------------------------------------------------------------


class _Calling:
    """A worker call to make, its answer not read yet."""

    __slots__ = ("call", "leg")

    def __init__(self, call: WorkerCall, leg: DecodeLeg | None = None) -> None:
        self.call = call
        self.leg = leg
        """The decode leg, whose answer makes the client's reply."""


class _Reading:
    """A streamed answer being read before the client's reply is known."""

    __slots__ = ("error_body", "relay", "status")

    def __init__(self, relay: _reply.Relay | None, status: int) -> None:
        self.relay = relay
        """``None``: the worker answered a non-2xx status; its body is kept to quote it."""
        self.status = status
        self.error_body = bytearray()


class _Streaming:
    """The client's stream has started: the worker's is relayed."""

    __slots__ = ("head", "relay", "step")

    def __init__(self, head: ClientStream, relay: _reply.Relay, step: Phase) -> None:
        self.head = head
        self.relay = relay
        self.step = step
        """The call whose stream it is (decode, or a conditional decode)."""


class _Replied(msgspec.Struct, kw_only=True):
    """The client's reply is complete."""

    event: ClientReply | ClientStream
    drops_stream: bool
    """A worker stream was open: what the router feeds of it from now on is dropped."""
    stream_end: StreamEnd | None = None
    """How the client's stream ended; ``None`` for a whole reply."""
    error_kind: ErrorKind | None = None
    """Whose fault an error reply is; ``None`` for a reply that is no error."""


class _Awaiting:
    """The decode's answer, read, waits for a call sent together that the reply needs."""

    __slots__ = ("answer", "leg")

    def __init__(self, answer: dict[str, Any], leg: DecodeLeg) -> None:
        self.answer = answer
        """The generate answer the client's reply is built from, once it is complete."""
        self.leg = leg


_At: TypeAlias = _Calling | _Reading | _Streaming | _Awaiting | _Replied


class PlanRow(NamedTuple):
    """One worker-call phase of the plan: when it runs, how its call is built and answer read."""

    runs: Callable[[Exchange], bool]
    """Whether this request makes the call (else the next row is tried)."""
    build: Callable[[Exchange], _Calling]
    """The call, and the decode leg when the answer makes the client's reply."""
    read: Callable[[Exchange, int, bytes], Phase | None]
    """Reads an answer with one of ``statuses``: the phase to go to next, ``None`` for the next
    row, :attr:`Phase.REPLIED` once the reply is made."""
    statuses: Container[int] = range(200, 300)
    """The statuses the reader reads; any other is the worker failing (an error reply)."""


class Exchange:
    """One client request through render, encode, prefill and decode and back, without I/O.

    Args:
        config: the parsed pipeline (:func:`~disagg_transforms.parse_pipeline_params`); a
            decode step is required.
        client_path: the path the client called.
        client_headers: the client's headers (a mapping or ``(name, value)`` pairs).
        client_body: the client's body, as bytes.
        settings: the router's :class:`ExchangeSettings` (hooks, request ids, limits); ``None``
            means the defaults.
        bootstrap_host: with SGLang workers and a prefill step, the host of the prefill worker
            this request goes to, as its decode worker reaches it (the rendezvous).

    Raises:
        ConfigError: the pipeline has no decode step, or SGLang's prefill has no
            ``bootstrap_host``.
    """

    _phase: Phase
    _at: _At
    """The data of ``_phase`` (rule 1 of the module's docstring)."""
    _client: ClientRequest

    def __init__(  # noqa: PLR0913 - the request, then the router's settings by keyword
        self,
        config: Mapping[Step, StepParams],
        client_path: str,
        client_headers: Mapping[str, str] | Iterable[tuple[str | bytes, str | bytes]],
        client_body: bytes,
        *,
        settings: ExchangeSettings | None = None,
        bootstrap_host: str | None = None,
    ) -> None:
        settings = _DEFAULT_SETTINGS if settings is None else settings
        new_request_id = settings.new_request_id
        self._params = _checked_config(config)
        untyped_path: object = client_path  # routers hand over whatever their framework has
        if not isinstance(untyped_path, str):
            msg = f"client_path: expected the client's request path, got {describe(client_path)}"
            raise ConfigError(msg, param="client_path")
        route = detect_route(client_path)
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
        self._vllm_version = settings.vllm_version  # the envelopes take its layout
        self._render_first = settings.render_first
        self._connectors = (settings.kv_connector, settings.ec_connector)
        self._engine = ENGINES[settings.engine]
        self._sglang = settings.sglang
        self._bootstrap_host = bootstrap_host
        self._sglang_leg: SglangLeg | None = None
        """A rendezvous engine's leg, built with the request; its prompt comes from render."""
        self._together_ended = False
        """A call sent together failed and ended the exchange: the current call's answer, fed
        later, is dropped."""
        self._prompt_logprobs: list[dict[str, Any] | None] | None = None
        """The prompt logprobs the prefill's answer gave, once read (docs/sglang.md)."""
        if self._rendezvous() and Step.PREFILL in self._params and not bootstrap_host:
            msg = "bootstrap_host: SGLang's prefill needs the prefill worker's host"
            raise ConfigError(msg, param="bootstrap_host")
        self._gathered = LegInputs(limits=settings.limits)
        """What the answers so far hand the legs (render's answer, transfer params)."""
        self._prefill_cached: int | None = None
        """The prefill answer's cached-prompt count, the one the client's usage reports."""
        self._client = ClientRequest(body={}, path=client_path, route=route)  # until it is read
        self._client_model: str | None = None
        try:
            members = self._client_members(client_body)
            self._client_model = _text(members.get(w.MODEL))
            # Every leg's refusals of the client's own fields come before the first call.

            def read() -> ClientRequest:
                return read_client_request(
                    members,
                    client_path,
                    limits=settings.limits,
                    steps=self._legs(),
                    every_field=True,
                )

            self._client = read()
            if self._lacks_derender(settings.vllm_version):
                self._client = read()  # decode moved to the client's route: it maps nothing now
            if self._rendezvous():
                self._sglang_leg = self._unprompted_leg()
            self._go(self._order()[0])
        except DisaggTransformError as error:
            self._reply(self._error_reply(error, None), drops_stream=False, error_kind=_kind(error))

    def _lacks_derender(self, vllm_version: str | None) -> bool:
        """Whether decode asks for ``derender`` of a worker without it.

        Then, under ``auto``, decode moves to the client's own route (its worker's tool parser),
        before any call (``docs/exchange.md``, "vLLM versions").

        Raises:
            ConfigError: the decode step asks for ``derender`` itself.
        """
        client = self._client
        if (
            client.output_mode is not OutputMode.DERENDER
            or client.route is Route.GENERATE  # a generate client's own mode: as it asked
            or self._rendezvous()  # SGLang's legs have no derender (docs/sglang.md, "Tools")
            or vllm_honours(OutputMode.DERENDER, vllm_version)
        ):
            return False
        decode = self._params[Step.DECODE]
        assert isinstance(decode, DecodeParams)  # noqa: S101 - _checked_config checked it
        if decode.output_mode is not OutputMode.AUTO:
            assert vllm_version is not None  # noqa: S101 - None honours every mode
            raise version_errors(self._params, vllm_version)[0]
        self._params[Step.DECODE] = msgspec.structs.replace(decode, use_openai_format=True)
        return True

    # -- what the router asks -------------------------------------------------------------

    def next_event(self) -> Event:
        """What to do now: a worker call, the client's reply or stream head, or keep feeding.

        Asking again without feeding anything returns the same event.
        """
        at = self._at
        if isinstance(at, _Calling):
            return at.call
        if isinstance(at, (_Reading, _Awaiting)):
            return NEED_DATA
        if isinstance(at, _Streaming):
            return at.head
        return at.event

    @property
    def phase(self) -> Phase:
        """Where the exchange is: the worker call in flight, ``STREAMING`` or ``REPLIED``."""
        return self._phase

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
        at = self._at
        return at.stream_end if isinstance(at, _Replied) else None

    @property
    def error_kind(self) -> ErrorKind | None:
        """Whose fault the client's error reply is, for a router's metrics; ``None`` otherwise.

        ``"bad_request"``: the client's (its body refused). ``"upstream_4xx"``: a worker
        answered 4xx. ``"upstream_5xx"``: a worker answered 5xx, failed (:meth:`worker_failed`),
        broke the contract, or ended the client's stream otherwise than ``"complete"``.
        ``"internal"``: anything else (a host hook's bug). ``None`` while the exchange runs and
        for a reply that is no error.
        """
        at = self._at
        if not isinstance(at, _Replied):
            return None
        if at.stream_end not in (None, "complete"):
            return "upstream_5xx"
        return at.error_kind

    @property
    def awaits_together(self) -> bool:
        """Whether the client's reply waits for the answer of a call sent together.

        The decode's answer is in, and the reply needs the prefill's too (SGLang's prompt
        logprobs): feed it (:meth:`receive_together` or :meth:`together_failed`), then ask
        :meth:`next_event` again (``docs/exchange.md``, "Calls that go together").
        """
        return isinstance(self._at, _Awaiting)

    @property
    def client_model(self) -> str | None:
        """The client body's ``model``; ``None`` when it has none (or the body is not JSON)."""
        return self._client_model

    @property
    def reply_over(self) -> bool:
        """Whether the client's reply is complete: nothing fed from now on adds a byte to it.

        True once :meth:`next_event` is a :class:`ClientReply`, or once a client stream has
        ended (the worker's stream ended, broke the contract, or failed). A router still
        sends the bytes the last call returned, then closes the worker's stream at once: the
        rest of it would only be dropped.
        """
        return self._phase is Phase.REPLIED

    def receive(self, status: int, headers: object, body: bytes) -> None:
        """Feed the whole answer to the current (non-streamed) worker call."""
        del headers  # nothing in a worker's headers changes the flow
        calling = self._take_call(stream=False)
        if calling is None:
            return  # a call sent together failed first: the reply is over (docs/exchange.md)
        phase = calling.call.step
        _check_status(status)
        untyped: object = body
        if not isinstance(untyped, (bytes, bytearray, memoryview)):
            msg = f"body: expected bytes, got {describe(untyped)}"
            raise ExchangeStateError(msg, param="body")
        if status not in self._plan[phase].statuses:
            self._fail_worker(status, *_worker_error(bytes(body)), drops_stream=False)
            return
        self._read(status, bytes(body))

    def _read(self, status: int, body: bytes) -> None:
        """Read an answer with a status its row reads, and go where its reader says."""
        try:
            following = self._plan[self._phase].read(self, status, body)
            if following is not Phase.REPLIED:
                self._go(following)
        except DisaggTransformError as error:
            self._fail(error)

    def receive_stream_head(self, status: int, headers: object) -> None:
        """The status and headers of the current streamed worker call's answer."""
        del headers
        calling = self._take_call(stream=True)
        if calling is None:
            return  # a call sent together failed first: the reply is over (docs/exchange.md)
        leg = calling.leg
        assert leg is not None  # noqa: S101 - only the decode leg streams
        _check_status(status)
        if not 200 <= status < 300:
            self._at = _Reading(None, status)  # its body is read whole, then judged
            return
        rendered = self._gathered.rendered
        try:
            relay = _reply.stream_relay(
                self._shape(leg),
                client=_reply.envelope_client(self._client, leg),
                requested=leg.output_mode,
                model=None if rendered is None else rendered.get(w.MODEL),
                cached_tokens=self._prefill_cached,
                vllm_version=self._vllm_version,
            )
        except DisaggTransformError as error:
            self._fail(error, drops_stream=True)
            return
        reader = self._engine.stream_reader
        if reader is not None and leg.output_mode is not None:  # read as the generate SSE first
            incremental = self._sglang.stream_output == "incremental"
            engine_stream = reader(
                _reply.DEFAULT_MAX_EVENT_BYTES,
                self._stop_ids(),
                incremental=incremental,
            )
            relay = _reply.EngineRelay(engine_stream, relay)
        self._at = _Reading(relay, status)

    def feed(self, data: bytes) -> bytes:
        """Feed the next bytes of the worker's stream (split anywhere); returns client bytes.

        Before the client's stream has started this returns ``b""``: check
        :meth:`next_event`, which turns into a :class:`ClientStream` (carrying every byte the
        client is owed so far) or a :class:`ClientReply` (an error with a clean status).
        """
        at = self._reading()
        if at is None:
            return b""  # the client's reply is over; the rest of the worker's stream is dropped
        untyped: object = data
        if not isinstance(untyped, (bytes, bytearray, memoryview)):
            msg = f"data: expected bytes, got {describe(untyped)}"
            raise ExchangeStateError(msg, param="data")
        if at.relay is None:
            assert isinstance(at, _Reading)  # noqa: S101 - a started stream has its relay
            room = _MAX_ERROR_BYTES - len(at.error_body)
            at.error_body += bytes(data[:room])
            return b""
        given: list[bytes] = []
        broken = None
        relay = at.relay
        data = data if type(data) is bytes else bytes(data)
        # Event by event: what the events before a broken one gave the client is not lost.
        outputs = (
            relay.feed_each(data)
            if type(relay) is _reply.EngineRelay
            else map(relay.feed, _pieces(data))
        )
        try:
            for out in outputs:
                given.append(out)  # noqa: PERF402 - kept up to an event that raises
        except DisaggTransformError as error:
            broken = error
        return self._relayed(b"".join(given), broken=broken, ended=False)

    def end_of_stream(self) -> bytes:
        """The worker's stream ended; returns the client's last bytes."""
        at = self._reading()
        if at is None:
            return b""
        if at.relay is None:
            assert isinstance(at, _Reading)  # noqa: S101 - a started stream has its relay
            if at.status in self._plan[self._phase].statuses:  # a non-2xx its row reads
                self._read(at.status, bytes(at.error_body))
                return b""
            self._fail_worker(at.status, *_worker_error(bytes(at.error_body)), drops_stream=True)
            return b""
        try:
            out = at.relay.close()
        except DisaggTransformError as error:
            return self._relayed(b"", broken=error, ended=True)
        return self._relayed(out, broken=None, ended=True)

    def worker_failed(self, step: str, reason: str, *, timed_out: bool = False) -> bytes:
        """The router could not get the worker's answer (connection, timeout).

        Before the client's reply has started, the reply becomes a retryable 502, or 504 when
        ``timed_out`` (the worker did not answer in time); after, the returned bytes are the
        in-stream error event that ends the client's stream.
        """
        message = f"{step} failed: {reason}"
        status = 504 if timed_out else 502
        at = self._at
        if isinstance(at, _Streaming):
            self._reply(at.head, drops_stream=True, stream_end="worker-failed")
            return at.relay.error_event(message, status=status)
        if isinstance(at, _Replied):
            return b""
        reply = self._error(status, message, retry=True)
        self._reply(reply, drops_stream=True, error_kind="upstream_5xx")
        return b""

    def receive_together(self, step: str, status: int, headers: object, body: bytes) -> None:
        """Feed the whole answer of a call sent together with the current one (its ``together``).

        Read to its end, it never reaches the client. One that failed before the client's reply
        started ends the exchange with its error as the reply (:attr:`reply_over`, and the call
        in flight is to be cancelled); afterwards it changes nothing. A success gives the
        prompt logprobs the client asked for (SGLang's prefill computes them), and completes a
        reply that waited for them (:attr:`awaits_together`); else it changes nothing.
        """
        del headers
        _check_status(status)
        phase = _together_phase(step)
        if self._phase in (Phase.STREAMING, Phase.REPLIED):
            return
        read = self._engine.peer_failure
        if not 200 <= status < 300:
            message, detail = _worker_error(bytes(body))
        elif (failure := None if read is None else read(bytes(body))) is not None:
            status, message, detail = failure.status, failure.message, _NO_DETAIL
        else:
            self._read_prompt_logprobs(phase, bytes(body))
            return
        self._fail_worker(status, message, detail, drops_stream=True, step=phase)
        self._together_ended = True

    def _read_prompt_logprobs(self, phase: Phase, body: bytes) -> None:
        """Read the prompt logprobs asked for from a call sent together; reply if waiting."""
        asked = self._prompt_count()
        if asked is None:
            return
        try:
            self._prompt_logprobs = self._read_prompt(body, asked)
        except DisaggTransformError as error:
            self._reply(self._error_reply(error, phase), drops_stream=True, error_kind=_kind(error))
            self._together_ended = True
            return
        at = self._at
        if isinstance(at, _Awaiting):
            answer = {**at.answer, w.PROMPT_LOGPROBS: self._prompt_logprobs}
            try:
                self._reply_decode(_raw.encode(answer), at.leg)
            except DisaggTransformError as error:
                self._fail(error)

    def together_failed(self, step: str, reason: str, *, timed_out: bool = False) -> None:
        """A call sent together with the current one got no answer (connection, timeout).

        Before the client's reply started, the reply becomes a retryable 502 (504 when
        ``timed_out``) naming ``step``; afterwards it changes nothing.
        """
        phase = _together_phase(step)
        if self._phase in (Phase.STREAMING, Phase.REPLIED):
            return
        reply = self._error(504 if timed_out else 502, f"{phase} failed: {reason}", retry=True)
        self._reply(reply, drops_stream=True, error_kind="upstream_5xx")
        self._together_ended = True

    # -- the plan -------------------------------------------------------------------------

    def _go(self, phase: Phase | None) -> None:
        """Make the call of the first row from ``phase`` on that this request runs.

        ``None``: from the row after the current one.
        """
        order = self._order()
        start = order.index(self._phase) + 1 if phase is None else order.index(phase)
        for candidate in order[start:]:
            row = self._plan[candidate]
            if row.runs(self):
                self._phase = candidate
                self._at = row.build(self)
                return
        msg = "the plan ran out of phases before the client's reply"  # decode always runs
        raise ExchangeStateError(msg)

    def _order(self) -> list[Phase]:
        """The plan's phases in the order they run."""
        order = list(self._plan)  # a subclass may add rows (docs/exchange.md)
        if self._render_first:  # the two swap places, as a coordinator document lists them
            order.remove(Phase.RENDER)
            order.insert(order.index(Phase.CONDITIONAL_DECODE), Phase.RENDER)
        return order

    def _decodes_if_available(self) -> bool:
        return Step.CONDITIONAL_DECODE in self._params

    def _renders(self) -> bool:
        # vLLM renders the APIs whose envelope is rebuilt, for a generate leg.
        client = self._client
        return client.route in ENVELOPE_ROUTES and client.generate

    def _encodes(self) -> bool:
        if Step.ENCODE not in self._params:
            return False
        rendered = self._gathered.rendered
        source = rendered if rendered is not None else self._client.body
        return source.get(w.FEATURES) is not None

    def _prefills(self) -> bool:
        # Met by rendezvous, the prefill's call goes together with decode's.
        return Step.PREFILL in self._params and not self._rendezvous()

    def _prompt_count(self) -> int | None:
        """The prompt logprobs the SGLang leg asks for (vLLM's ``prompt_logprobs``), or none."""
        leg = self._sglang_leg
        return None if leg is None else leg.prompt_logprobs

    def _read_prompt(self, body: bytes, asked: int) -> list[dict[str, Any] | None]:
        read = self._engine.prompt_logprobs
        assert read is not None  # noqa: S101 - only an SGLang leg asks its prefill for them
        return read(body, asked)

    def _stop_ids(self) -> tuple[int, ...]:
        """The stop tokens the SGLang leg named: its answer's ``stop_reason`` when matched."""
        leg = self._sglang_leg
        return () if leg is None else leg.stop_token_ids

    def _rendezvous(self) -> bool:
        return self._engine.meeting is Meeting.RENDEZVOUS

    def _decodes(self) -> bool:
        return True  # a decode step is required: it answers the client

    def _client_body_as_sent(self, *, trusted: bool = False) -> bytes:
        """The client's body, its transfer params removed unless the step trusts them."""
        body = self._client.body
        assert isinstance(body, _raw.RawMembers)  # noqa: S101 - the exchange parsed it
        return body.encode(dict(body) if trusted else strip_transfer_params(body))

    def _render_call(self) -> _Calling:
        return _Calling(
            WorkerCall(
                step=Phase.RENDER,
                method="POST",
                path=f"{ROUTE_PATH[self._client.route]}/render",
                headers=self._forward,
                body=self._client_body_as_sent(),
                stream=False,
            )
        )

    def _conditional_decode_call(self) -> _Calling:
        # The client's body as it sent it, on its own route: a decode worker that holds the
        # prompt's KV answers it, as one vLLM server would (docs/exchange.md).
        inputs = LegInputs(limits=self._gathered.limits)
        leg = decode_leg(self._client, _CLIENT_ROUTE_DECODE, inputs)
        call = WorkerCall(
            step=Phase.CONDITIONAL_DECODE,
            method="POST",
            path=self._client.route.value,
            headers=(*self._forward, ("prefer", "if-available")),
            body=self._client_body_as_sent(
                trusted=self._params[Step.CONDITIONAL_DECODE].trust_client_transfer_params
            ),
            stream=leg.stream,
        )
        return _Calling(call, leg)

    def _leg_call(self) -> _Calling:
        phase = self._phase
        step = _STEP_OF_PHASE[phase]
        params = self._params[step]
        assert isinstance(params, _LEG_PARAMS)  # noqa: S101 - the leg phases' rows
        gathered = self._gathered
        leg: Leg
        if isinstance(params, DecodeParams) and self._rendezvous():
            return self._rendezvous_call()
        if isinstance(params, DecodeParams):
            # Decode takes prefill's KV params; the encoder cache went to prefill.
            inputs = msgspec.structs.replace(gathered, ec_transfer_params=None)
            leg = decode_leg(self._client, params, inputs)
        else:
            # Encode and prefill take nothing of decode's; prefill takes encode's params.
            leg = single_token_leg(
                self._client, params, msgspec.structs.replace(gathered, kv_transfer_params=None)
            )
        body = self._client.body
        assert isinstance(body, _raw.RawMembers)  # noqa: S101 - the exchange parsed it
        call = WorkerCall(
            step=phase,
            method="POST",
            path=leg.path,
            headers=self._forward,
            body=body.encode(self._run_hooks(step, leg.body)),
            stream=isinstance(leg, DecodeLeg) and leg.stream,
        )
        return _Calling(call, leg if isinstance(leg, DecodeLeg) else None)

    def _unprompted_leg(self) -> SglangLeg:
        """The rendezvous leg, refusing what SGLang has no place for before any call.

        Decode on the client's own route (``use_openai_format``): SGLang's OpenAI server gets
        the client's body with the rendezvous fields (docs/sglang.md, "Tools").
        """
        client = self._client
        sglang = self._sglang
        rendezvous = new_rendezvous(
            self._bootstrap_host or "",
            sglang.bootstrap_port,
            random_bits=sglang.random_bits or secrets.randbits,
        )
        if self._as_written():  # SGLang's own client: its body, the rendezvous ours
            leg = sglang_client_leg(
                client.body, rendezvous=rendezvous, limits=self._gathered.limits
            )
        elif client.generate:
            leg = unprompted_sglang_leg(client, rendezvous)
        else:  # the client's own route, on SGLang's OpenAI server
            body = strip_transfer_params(client.body)
            leg = sglang_openai_leg(body, path=client.route.value, rendezvous=rendezvous)
        if Step.PREFILL not in self._params:  # a decode alone meets nobody
            for key in (w.BOOTSTRAP_HOST, w.BOOTSTRAP_PORT, w.BOOTSTRAP_ROOM):
                del leg.body[key]
        return leg

    def _rendezvous_call(self) -> _Calling:
        """Decode's call, prefill's sent together with it: one body, one room (docs/sglang.md).

        The host's request transforms run once, as the decode step's, on the body both get.
        """
        client = self._client
        leg = self._sglang_leg
        assert leg is not None  # noqa: S101 - built with the request
        route = Route.GENERATE if client.generate else client.route
        if client.generate and not self._as_written():
            leg = with_prompt(leg, _rendered_ids(self._gathered.rendered), self._gathered.limits)
        body = leg.body
        hooked = self._run_hooks(Step.DECODE, body)
        data = prefill_data = _raw.encode(hooked)
        asked = leg.prompt_logprobs
        if asked is not None:  # the prefill computes them; a decode alone, itself
            prefill_data = _raw.encode(prefill_body(hooked, asked))
            if Step.PREFILL not in self._params:
                data = prefill_data
        abort_path = self._engine.abort_path
        assert abort_path is not None  # noqa: S101 - a rendezvous engine aborts by id

        def call(step: Phase, data: bytes, together: tuple[WorkerCall, ...] = ()) -> WorkerCall:
            abort = WorkerCall(
                step=step,
                method="POST",
                path=abort_path,
                headers=self._forward,
                body=_raw.encode({w.RID: leg.rid}),
                stream=False,
            )
            return WorkerCall(
                step=step,
                method="POST",
                path=leg.path,
                headers=self._forward,
                body=data,
                stream=leg.stream,
                together=together,
                abort=abort,
            )

        # What the answer reads as: on the token route a text-mode generate answer (the
        # engine's reader makes it), rebuilt whatever wrap_chat_completion says (the client
        # never spoke SGLang's answer); on the client's own route, the client's API.
        read_as = DecodeLeg(
            path=leg.path,
            route=route,
            body=body,
            stream=leg.stream,
            single_frame=False,
            wrap_chat_completion=False,
            output_mode=None,
            dropped=leg.dropped,
        )
        if route is Route.GENERATE and not self._as_written():
            read_as = GenerateDecodeLeg(
                **msgspec.structs.asdict(read_as)
                | {"wrap_chat_completion": client.route is Route.CHAT_COMPLETIONS}
                | {"output_mode": OutputMode.TEXT}
            )
        together = (call(Phase.PREFILL, prefill_data),) if Step.PREFILL in self._params else ()
        return _Calling(call(Phase.DECODE, data, together), read_as)

    def _read_render(self, status: int, body: bytes) -> Phase | None:
        del status
        # Read through the view of vLLM's GenerateRequest unless a host's transforms read it
        # (plain JSON values then, no token IDs kept as bytes).
        key = self._token_ids_key()
        what = "the render answer"
        rendered = (
            RenderAnswer(body)
            if key
            else _raw.RawMembers(body, UpstreamContractError, what, token_ids_key=key)
        )
        self._gathered = msgspec.structs.replace(self._gathered, rendered=rendered)
        return None

    def _read_encode(self, status: int, body: bytes) -> Phase | None:
        del status
        if self._connectors[1] is EcConnector.SHARED_STORAGE:
            return None  # prefill reads the encoder cache from the storage
        value = _transfer_params(Phase.ENCODE, body).ec_transfer_params
        # An encode answer may have no encoder cache to hand on.
        if isinstance(value, dict) or value in (None, UNSET):
            ec = value or None
            self._gathered = msgspec.structs.replace(self._gathered, ec_transfer_params=ec)
            return None
        raise _no_transfer_object(Phase.ENCODE, value)

    def _read_prefill(self, status: int, body: bytes) -> Phase | None:
        del status
        if self._connectors[0] is KvConnector.SHARED_STORAGE:
            kv = dict(_SHARED_STORAGE_KV)
            self._gathered = msgspec.structs.replace(self._gathered, kv_transfer_params=kv)
            # Decode finds the KV in the storage: the answer is read for its usage alone, and
            # one without it does not stop the request (docs/exchange.md).
            with contextlib.suppress(UpstreamContractError):
                self._read_prefill_cached(_transfer_params(Phase.PREFILL, body))
            return None
        view = _transfer_params(Phase.PREFILL, body)
        value = view.kv_transfer_params
        self._read_prefill_cached(view)
        # Decode pulls the prompt's KV with what prefill answered: without it there is nothing
        # to pull.
        if isinstance(value, dict):
            self._gathered = msgspec.structs.replace(self._gathered, kv_transfer_params=value)
            return None
        raise _no_transfer_object(Phase.PREFILL, value)

    def _read_prefill_cached(self, view: _TransferView) -> None:
        # The prompt was computed here: its cached count is the client's (docs/exchange.md).
        at = self._at
        assert isinstance(at, _Calling)  # noqa: S101 - the reader reads the call's answer
        self._prefill_cached = _reply.cached_tokens_of(view.usage, detect_route(at.call.path))

    def _read_conditional_decode(self, status: int, body: bytes) -> Phase | None:
        if status == _NOT_HELD:
            return None
        return self._read_decode(status, body)

    def _read_decode(self, status: int, body: bytes) -> Phase | None:
        del status
        at = self._at
        assert isinstance(at, _Calling)  # noqa: S101 - the reader reads the call's answer
        leg = at.leg
        assert leg is not None  # noqa: S101 - the decode call carries its leg
        if self._engine.engine is not Engine.VLLM and leg.output_mode is not None:
            read = self._engine.read_answer(
                _reply.decode_object(body, "the decode answer"), self._stop_ids()
            )
            if isinstance(read, SglangFailure):
                self._fail_worker(read.status, read.message, _NO_DETAIL, drops_stream=False)
                return Phase.REPLIED
            asked = self._prompt_count()
            if asked is not None and Step.PREFILL not in self._params:
                self._prompt_logprobs = self._read_prompt(body, asked)  # a decode alone's own
            if asked is not None and self._prompt_logprobs is None:
                self._at = _Awaiting(read, leg)  # the prefill's answer completes the reply
                return Phase.REPLIED
            if asked is not None:
                read[w.PROMPT_LOGPROBS] = self._prompt_logprobs
            body = _raw.encode(read)
        self._reply_decode(body, leg)
        return Phase.REPLIED

    def _reply_decode(self, body: bytes, leg: DecodeLeg) -> None:
        """The client's reply from the decode's whole answer (a generate answer, or the API's)."""
        hook = None
        hooks = self._hooks
        if hooks is not None and hooks.response:
            context = self._context(Step(self._phase.value))

            def hook(body: dict[str, Any]) -> dict[str, Any]:
                return hooks.run_response(body, context)

        reply, content_type = _reply.whole_reply(
            self._shape(leg),
            body,
            leg=leg,
            client=_reply.envelope_client(self._client, leg),
            hook=hook,
            cached_tokens=self._prefill_cached,
            vllm_version=self._vllm_version,
        )
        headers = self._reply_headers(content_type)
        self._reply(ClientReply(status=200, headers=headers, body=reply), drops_stream=False)

    # The plan (rule 2): the worker-call phases in order. Below the methods its rows name.
    _plan: ClassVar[Mapping[Phase, PlanRow]] = {
        Phase.CONDITIONAL_DECODE: PlanRow(
            runs=_decodes_if_available,
            build=_conditional_decode_call,
            read=_read_conditional_decode,
            statuses={*range(200, 300), _NOT_HELD},
        ),
        Phase.RENDER: PlanRow(runs=_renders, build=_render_call, read=_read_render),
        Phase.ENCODE: PlanRow(runs=_encodes, build=_leg_call, read=_read_encode),
        Phase.PREFILL: PlanRow(runs=_prefills, build=_leg_call, read=_read_prefill),
        Phase.DECODE: PlanRow(runs=_decodes, build=_leg_call, read=_read_decode),
    }

    # -- what the phases share ------------------------------------------------------------

    def _legs(self) -> list[_LegParams]:
        legs = [params for params in self._params.values() if isinstance(params, _LEG_PARAMS)]
        if not self._rendezvous():
            return legs
        # SGLang's token legs are text whatever the step says; a tool-using client is refused by
        # the SGLang leg, naming the setting that serves it (docs/sglang.md, "Tools").
        return [
            msgspec.structs.replace(params, output_mode=OutputMode.AUTO)
            if isinstance(params, DecodeParams)
            else params
            for params in legs
        ]

    def _client_members(self, body: object) -> _raw.RawMembers:
        if isinstance(body, (bytes, bytearray, memoryview)):
            _limits.check_body_size(bytes(body), self._gathered.limits, error=RequestTooLargeError)
        return _raw.RawMembers(
            body,
            RequestError,
            "the client body",
            token_ids_key=self._token_ids_key(),
            # Only a generate client sends token IDs: any other's body is decoded whole.
            whole=self._client.route is not Route.GENERATE,
        )

    def _token_ids_key(self) -> str:
        # A host's transforms get plain JSON values (bodies, the client's in their context):
        # no token IDs kept as bytes then.
        hooks = self._hooks
        has_hooks = hooks is not None and bool(hooks.request or hooks.response)
        return "" if has_hooks else w.TOKEN_IDS

    def _context(self, step: Step) -> TransformContext:
        gathered = self._gathered
        return TransformContext(
            client_path=self._client.path,
            step=step,
            params=self._params.get(step),
            client_body=self._client.body,
            inputs=LegInputs(
                kv_transfer_params=gathered.kv_transfer_params,
                rendered=gathered.rendered,
                request_id=self.request_id,
            ),
        )

    def _run_hooks(self, step: Step, body: dict[str, Any]) -> dict[str, Any]:
        if self._hooks is None or not self._hooks.request:
            return body
        return self._hooks.run_request(body, self._context(step))

    def _shape(self, leg: DecodeLeg) -> _reply.Shape:
        if self._as_written():  # SGLang's answer to SGLang's own client, checked as it passes
            return _reply.Shape.PASS
        return _reply.reply_shape(self._client.route, leg.route, wrap=leg.wrap_chat_completion)

    def _as_written(self) -> bool:
        """A client of SGLang's own ``/generate``, on SGLang workers: relayed as SGLang writes."""
        return self._rendezvous() and self._client.path == w.SGLANG_GENERATE_PATH

    # -- client bytes and failures --------------------------------------------------------

    def _reply_headers(self, content_type: str, *, retry: bool = True) -> Headers:
        headers: Headers = (("content-type", content_type), ("x-request-id", self.request_id))
        if content_type == _reply.SSE:
            headers = (*headers, ("cache-control", "no-cache"))
        if not retry:
            headers = (*headers, ("x-should-retry", "false"))
        return headers

    def _reply(
        self,
        event: ClientReply | ClientStream,
        *,
        drops_stream: bool,
        stream_end: StreamEnd | None = None,
        error_kind: ErrorKind | None = None,
    ) -> None:
        self._phase = Phase.REPLIED
        self._at = _Replied(
            event=event, drops_stream=drops_stream, stream_end=stream_end, error_kind=error_kind
        )

    def _relayed(self, out: bytes, *, broken: DisaggTransformError | None, ended: bool) -> bytes:
        """The client bytes a worker stream gave, moving the phase on.

        Before the client's stream started they go into its head, so the router gets them all
        with it.
        """
        at = self._at
        assert isinstance(at, (_Reading, _Streaming))  # noqa: S101 - a stream is read
        assert at.relay is not None  # noqa: S101 - an error status collects, relays nothing
        if isinstance(at, _Reading) and not out:
            if broken is None and ended:
                msg = f"$: {self._streamed_phase()} ended its stream before sending any event"
                broken = UpstreamContractError(msg, param="$")
            if broken is not None:
                self._fail(broken, drops_stream=True)  # a clean error status
            return b""
        if broken is not None:
            message = f"{self._streamed_phase()} broke the contract: {broken.message}"
            out += at.relay.error_event(message, status=502)
        head = at.head if isinstance(at, _Streaming) else None
        if head is None:
            head = ClientStream(status=200, headers=self._reply_headers(_reply.SSE), first=out)
            out = b""
        if broken is not None:
            self._reply(head, drops_stream=True, stream_end="contract-broken")
        elif ended:
            end: StreamEnd = "worker-failed" if at.relay.worker_error else "complete"
            self._reply(head, drops_stream=True, stream_end=end)
        elif not isinstance(at, _Streaming):  # the client's stream starts with this head
            self._at = _Streaming(head, at.relay, self._phase)  # the phase whose stream it is
            self._phase = Phase.STREAMING
        return out

    def _streamed_phase(self) -> Phase:
        at = self._at
        return at.step if isinstance(at, _Streaming) else self._phase

    def _reading(self) -> _Reading | _Streaming | None:
        """The worker stream being read; ``None`` once the reply is over and drops it."""
        at = self._at
        if isinstance(at, (_Reading, _Streaming)):
            return at
        if isinstance(at, _Replied) and at.drops_stream:
            return None
        msg = "no worker stream is open (call receive_stream_head first)"
        raise ExchangeStateError(msg)

    def _take_call(self, *, stream: bool) -> _Calling | None:
        """The call whose answer comes; ``None`` when a call sent together ended the reply."""
        at = self._at
        if isinstance(at, _Replied) and self._together_ended:
            return None
        if not isinstance(at, _Calling):
            msg = "no worker call is waiting for an answer"
            raise ExchangeStateError(msg)
        if at.call.stream is not stream:
            how = "receive_stream_head" if at.call.stream else "receive"
            msg = f"the {at.call.step} call's answer is read with {how}"
            raise ExchangeStateError(msg)
        return at

    def _fail(self, error: DisaggTransformError, *, drops_stream: bool = False) -> None:
        reply = self._error_reply(error, self._streamed_phase())
        self._reply(reply, drops_stream=drops_stream, error_kind=_kind(error))

    def _error_reply(self, error: DisaggTransformError, phase: Phase | None) -> ClientReply:
        message = error.message
        if isinstance(error, UpstreamContractError):
            message = f"{phase} broke the contract: {message}"
        detail = _Detail(error.error_type, error.param)
        return self._error(error.status_hint, message, retry=False, detail=detail)

    def _fail_worker(
        self,
        status: int,
        message: str | None,
        detail: _Detail,
        *,
        drops_stream: bool,
        step: Phase | None = None,
    ) -> None:
        step = step or self._streamed_phase()
        said = _quote(message) if message else f"HTTP {status}"
        kind: ErrorKind = "upstream_5xx"
        if 400 <= status < 500:
            text = f"{step} rejected the request: {said}"
            reply = self._error(status, text, retry=False, detail=detail)
            kind = "upstream_4xx"
        elif 500 <= status < 600:
            reply = self._error(502, f"{step} failed with HTTP {status}: {said}", retry=True)
        else:
            reply = self._error(
                502, f"{step} broke the contract: it answered HTTP {status}", retry=False
            )
        self._reply(reply, drops_stream=drops_stream, error_kind=kind)

    def _error(
        self, status: int, message: str, *, retry: bool, detail: _Detail = _NO_DETAIL
    ) -> ClientReply:
        error_type, param = detail
        body = _raw.encode(
            error_body(
                self._client.route,
                status=status,
                message=message,
                param=param,
                error_type=error_type,
            )
        )
        # Only a 4xx says nothing about retrying: the SDKs do not retry those anyway.
        retryable = retry or status < 500
        headers = self._reply_headers(_reply.JSON, retry=retryable)
        return ClientReply(status=status, headers=headers, body=body)


def _kind(error: DisaggTransformError) -> ErrorKind:
    """Whose fault a library error that ends the exchange is."""
    if isinstance(error, RequestError):
        return "bad_request"
    if isinstance(error, UpstreamContractError):
        return "upstream_5xx"
    return "internal"


def _together_phase(step: object) -> Phase:
    """The phase of a call sent together, as the router names it (``call.step``)."""
    try:
        return Phase(step)
    except ValueError:
        msg = f"step: expected the step of a call sent together, got {describe(step)}"
        raise ExchangeStateError(msg, param="step") from None


def _rendered_ids(rendered: Mapping[str, Any] | None) -> list[int]:
    """The rendered prompt's token IDs as a list (kept as bytes by the fast path)."""
    if rendered is None:
        msg = "$: an SGLang leg is built from the rendered prompt: the pipeline renders it"
        raise RequestError(msg, param="$")
    ids = rendered.get(w.TOKEN_IDS)
    if isinstance(ids, _raw.RawTokenIds):
        decoded: list[int] = msgspec.json.decode(ids.raw, type=list[int])
        return decoded
    if not isinstance(ids, list):
        msg = f"$.{w.TOKEN_IDS}: the render answer must carry the prompt's token IDs"
        raise UpstreamContractError(msg, param=f"$.{w.TOKEN_IDS}")
    return ids


def _transfer_params(phase: Phase, body: bytes) -> _TransferView:
    """What an encode or prefill answer hands on, read in one parse."""
    try:
        return msgspec.json.decode(body, type=_TransferView)
    except (msgspec.DecodeError, RecursionError) as error:
        msg = f"$: the {phase} answer is not a JSON object: {error}"
        raise UpstreamContractError(msg, param="$") from None


def _no_transfer_object(phase: Phase, value: object) -> UpstreamContractError:
    key = w.KV_TRANSFER_PARAMS if phase is Phase.PREFILL else w.EC_TRANSFER_PARAMS
    shown = "nothing" if value is UNSET else describe(value)
    msg = f"$.{key}: the {phase} answer must carry an object, got {shown}"
    return UpstreamContractError(msg, param=f"$.{key}")


def pipeline_phases(config: Mapping[Step, StepParams]) -> dict[Phase, str]:
    """The worker calls a pipeline may make, in order, each with the worker it is sent to.

    Render when a leg speaks the generate route (it renders a chat, Responses or Messages
    client), then each leg the pipeline configures; each call of a request is made when that
    request needs it (``docs/exchange.md``, "The order of the calls"). The worker is named as
    :attr:`WorkerCall.step` names it, the key of a router's table of worker URLs: a conditional
    decode is sent to the decode worker.
    """
    generate = any(
        resolve_format(params.use_openai_format, Route.CHAT_COMPLETIONS.value) is Route.GENERATE
        for params in config.values()
        if isinstance(params, _LEG_PARAMS)
    )
    configured = {Phase(step.value) for step in config}
    if generate:
        configured.add(Phase.RENDER)
    workers = {Phase.CONDITIONAL_DECODE: Phase.DECODE.value}
    return {
        phase: workers.get(phase, phase.value)
        for phase in Exchange._plan  # noqa: SLF001
        if phase in configured
    }


def _pieces(data: bytes) -> list[bytes]:
    """``data`` cut after each SSE event end (a cut inside one only makes a piece shorter)."""
    if data.find(b"\r") < 0:  # vLLM's framing: bytes searches, several times faster than the regex
        ends = []
        # One-byte searches (memchr): a two-byte one scanned an SGLang stream's events of tens
        # of KB several times slower (docs/performance.md).
        at = data.find(b"\n")
        while at >= 0:
            if data[at + 1 : at + 2] == b"\n":  # a one-byte slice is cached
                ends.append(at + 2)
                at += 1
            at = data.find(b"\n", at + 1)
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


def _checked_config(config: object) -> dict[Step, StepParams]:
    if not isinstance(config, Mapping):
        msg = f"pipeline: expected parse_pipeline_params(...)'s result, got {describe(config)}"
        raise ConfigError(msg, param="pipeline")
    params: dict[Step, StepParams] = {}
    for step, value in config.items():
        if not isinstance(step, Step) or not isinstance(value, _STEP_PARAMS) or value.step != step:
            msg = f"pipeline: expected Step -> its StepParams, got {describe(step)}"
            raise ConfigError(msg, param="pipeline")
        params[step] = value
    if Step.DECODE not in params:
        msg = "pipeline: a decode step is required (it answers the client)"
        raise ConfigError(msg, param="pipeline.decode")
    return params

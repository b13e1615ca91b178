"""The simulated SGLang 0.5.23 worker: ``/generate`` in one P/D role, as a raw ASGI 3 app.

Facts from SGLang 0.5.23 (docs/sglang.md, "The simulated worker"); what differs is listed on
:class:`SimulatedSglangWorker`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Mapping
from typing import Any, Final, Literal, TypeAlias

import orjson

from disagg_transforms.testing import _sglang_openai as openai
from disagg_transforms.testing._common import WorkerSettings
from disagg_transforms.testing._generate import cached_prefix
from disagg_transforms.testing._tokenizer import BYTE_OFFSET, IM_END, decode, encode
from disagg_transforms.testing._worker import (
    Receive,
    RecordedCall,
    Scope,
    Send,
    parse_body,
    read_request,
    until_disconnect,
)

SGLANG_VERSION: Final = "0.5.23"
"""The SGLang release the worker simulates."""
DEFAULT_BOOTSTRAP_PORT: Final = 8998
"""SGLang's ``--disaggregation-bootstrap-port`` default."""
JOIN_PATH: Final = "/simulated/join"
"""Where a simulated decode joins its room on the prefill's bootstrap port (the simulated KV
transfer; real SGLang moves KV over its transfer backend)."""
Mode = Literal["prefill", "decode"]
SGLANG_FAULT_MODES: Final = ("http-500", "no-room")
"""Faults the simulated SGLang worker plays on ``/generate`` (see :class:`SimulatedSglangWorker`),
for every request (``fault``) or one (header ``x-simulate-fault``)."""
_FAULT_HEADER: Final = "x-simulate-fault"
CALLS_PATH: Final = "/simulated/calls"
"""What a simulated SGLang worker received: ``{"calls": [{"method", "path", "body"}], "aborted":
[rid, ...]}`` (for a test that runs it as a process)."""

# SGLang's SamplingParams keys in its contract's order: the unknown-field text lists them.
SAMPLING_KEYS: Final = (
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "beam_width",
    "watermark",
    "choice",
)
_DEFAULT_CAP: Final = 128
_LOGPROB: Final = -0.1
_ALTERNATIVE: Final = -2.3
_BYTES: Final = 256  # the toy tokenizer's byte tokens: a prompt position's alternatives
_ABORTED: Final = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
_SSE: Final = "text/event-stream; charset=utf-8"
_SIMULATED_500: Final = openai.error_response("Internal server error (simulated)", "500", 500)
_DONE: Final = b"data: [DONE]\n\n"


class _ContractError(Exception):
    """A body SGLang's contract gate refuses: 400 ``{"error": "<text>"}``."""


class _ValueError(Exception):
    """A request SGLang refuses after the gate: 400 ``{"error": {"message": ...}}``."""


def _unexpected(value: object) -> str:
    """A JSON value as serde describes it, in SGLang's contract texts."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    return "sequence" if isinstance(value, list) else "map"


def _contract(body: Mapping[str, Any]) -> None:
    """The contract gate's checks for what a router sends (a subset of SGLang's)."""
    sampling = body.get("sampling_params")
    if sampling is not None and not isinstance(sampling, dict):
        msg = f"invalid type: {_unexpected(sampling)}, expected a value or an array of values"
        raise _ContractError(msg)
    for key, value in (sampling or {}).items():
        if key not in SAMPLING_KEYS:
            listed = ", ".join(f"`{name}`" for name in SAMPLING_KEYS)
            msg = f"unknown field `{key}`, expected one of {listed}"
            raise _ContractError(msg)
        if key in ("max_new_tokens", "min_new_tokens", "top_k", "n") and value is not None:
            _integer(value, "i64")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        msg = f"invalid type: {_unexpected(stream)}, expected a boolean"
        raise _ContractError(msg)
    for key in ("bootstrap_room", "bootstrap_port"):
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            msg = (
                f"invalid type: {_unexpected(value)}, expected a value or an array of values "
                "for OptionalInt64OrList"
            )
            raise _ContractError(msg)


def _integer(value: object, expected: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"invalid type: {_unexpected(value)}, expected {expected}"
        raise _ContractError(msg)


@dataclasses.dataclass
class _Room:
    """One bootstrap room on a prefill: who has arrived."""

    prefill: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    decode: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    cached_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class _Request:
    rid: str
    prompt: list[int]
    stream: bool
    sampling: dict[str, Any]
    body: dict[str, Any]
    script: list[int] | None = None
    """What the model writes when nothing stops it; ``None``: the settings' answer."""


class _AbortedError(Exception):
    """``/abort_request`` named the request while it waited."""


class SimulatedSglangWorker:
    """A simulated SGLang 0.5.23 server in one P/D role: a raw ASGI 3 application, no GPU.

    Routes: ``POST /generate``, ``POST /abort_request``, ``GET /health``, ``/health_generate``,
    ``/ready``, ``/server_info`` (and ``/get_server_info``), ``/model_info`` (and
    ``/get_model_info``), ``/v1/models``; a prefill also answers its bootstrap routes
    (``GET /route``, and ``POST /simulated/join``, the simulated KV transfer) on the same app, which
    ``simulate`` serves on the API port and on ``--bootstrap-port``.

    A prefill registers the request's ``bootstrap_room``, waits for its decode to join the
    room (at most ``transfer_timeout`` seconds), then answers one token with finish
    ``{"type": "length", "length": 0}``. A decode joins the room on
    ``bootstrap_host:bootstrap_port`` (``null`` port: its own ``bootstrap_port``), waits for the
    prefill's request, then generates; a room that never comes fails as SGLang's does after
    ``transfer_timeout`` (500 ``Decode transfer failed ...``; a stream: an abort event with
    ``status_code`` 500). The model generates :attr:`WorkerSettings.answer` then EOS
    (``<|im_end|>``, 151645) with the toy tokenizer; ``stop`` strings, ``max_new_tokens``
    (absent: 128; null: the rest of the context), ``ignore_eos`` (the answer again until the
    cap) and logprobs are honoured. Unknown sampling keys,
    wrong JSON types and a string room are refused with SGLang's own texts.

    What differs from SGLang: no ZMQ KV transfer (the join is one HTTP call); a dead prefill is
    noticed only at ``transfer_timeout`` (SGLang: its heartbeat, about 10 s); a client that goes
    away is not noticed (send ``/abort_request``); no batches, ``n > 1``, OpenAI routes or prompt
    logprobs; the contract gate checks only what a router sends.

    Faults (``SGLANG_FAULT_MODES``), on ``/generate``: ``http-500`` answers 500 at once in
    SGLang's error shape (a prefill that failed); ``no-room`` takes the request but never
    joins its room, as a prefill that never got it (its decode fails at the timeout).

    Args:
        settings: What the model answers; ``None``: the defaults.
        disaggregation_mode: ``prefill``, ``decode``, or ``None`` (no P/D).
        bootstrap_port: The prefill's bootstrap port (``--disaggregation-bootstrap-port``).
        transfer_timeout: Seconds a leg waits for its peer (SGLang's 300 s, scaled down in tests).
        incremental_streaming_output: Stream deltas (``--incremental-streaming-output``);
            else every event repeats the whole text, as SGLang by default.
        stream_delay: Seconds between the events of a stream.
        prefills: In process, the prefill workers a decode reaches by ``(bootstrap_host,
            bootstrap_port)``; a prefill not listed is reached over the network.
    """

    def __init__(  # noqa: PLR0913 - the worker's settings, all but one by keyword
        self,
        settings: WorkerSettings | None = None,
        *,
        disaggregation_mode: Mode | None = None,
        bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT,
        transfer_timeout: float = 300.0,
        incremental_streaming_output: bool = False,
        stream_delay: float = 0.0,
        prefills: Mapping[tuple[str, int], SimulatedSglangWorker] | None = None,
        fault: str | None = None,
    ) -> None:
        if disaggregation_mode not in (None, "prefill", "decode"):
            msg = (
                f"disaggregation_mode must be prefill, decode or None, got {disaggregation_mode!r}"
            )
            raise ValueError(msg)
        if fault is not None and fault not in SGLANG_FAULT_MODES:
            msg = f"unknown fault {fault!r}; expected one of {', '.join(SGLANG_FAULT_MODES)}"
            raise ValueError(msg)
        if transfer_timeout <= 0 or stream_delay < 0:
            msg = "transfer_timeout must be positive and stream_delay non-negative"
            raise ValueError(msg)
        self.settings = WorkerSettings() if settings is None else settings
        self.mode = disaggregation_mode
        self.bootstrap_port = bootstrap_port
        self.transfer_timeout = transfer_timeout
        self.incremental = incremental_streaming_output
        self.stream_delay = stream_delay
        self.fault = fault
        self._prefills = dict(prefills or {})
        self.calls: list[RecordedCall] = []
        """Every request received, in order."""
        self.aborted: list[str] = []
        """The rids ``/abort_request`` was called with, in order."""
        self._rooms: dict[int, _Room] = {}
        self._running: dict[str, asyncio.Event] = {}

    def calls_to(self, path: str) -> list[RecordedCall]:
        """The recorded calls to one path, in order."""
        return [call for call in self.calls if call.path == path]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection scope."""
        request = await read_request(scope, receive, send)
        if request is None:
            return
        method, path, headers, raw = request
        body = parse_body(raw)
        call = RecordedCall(method, path, headers, body)
        self.calls.append(call)
        fault = headers.get(_FAULT_HEADER) or self.fault
        if path == "/generate" and method in ("POST", "PUT"):
            await self._generate(body, send, fault)
            return
        if path in openai.OPENAI_PATHS and method == "POST":
            await self._openai(path, body, send, fault)
            return
        status, payload = self._route(method, path, body)
        if path == JOIN_PATH and status == 200:
            try:
                status, payload = await _wait(self._join(body), until_disconnect(receive), None)
            except _AbortedError:
                return  # the decode gave up (aborted): nothing waits here for a room
        await _send_json(send, status, payload)

    def _route(self, method: str, path: str, body: object) -> tuple[int, object]:
        info = {
            "/health": None,
            "/health_generate": None,
            "/ready": None,
            "/ping": None,
            "/server_info": self._server_info,
            "/get_server_info": self._server_info,
            "/model_info": self._model_info,
            "/get_model_info": self._model_info,
            "/v1/models": self._models,
            CALLS_PATH: self._recorded,
            "/simulated/aborted": self._aborted,
        }
        if self.mode == "prefill":
            info["/route"] = _layout
        if method == "GET" and path in info:
            answer = info[path]
            return 200, None if answer is None else answer()
        if method == "POST" and path == "/abort_request":
            self._abort(body)
            return 200, None
        if self.mode == "prefill" and method == "POST" and path == JOIN_PATH:
            return 200, None
        return 404, {"detail": "Not Found"}

    def _recorded(self) -> dict[str, Any]:
        calls = [
            {"method": call.method, "path": call.path, "body": call.body}
            for call in self.calls
            if call.path != CALLS_PATH
        ]
        return {"calls": calls, "aborted": list(self.aborted)}

    def _abort(self, body: object) -> None:
        rid = body.get("rid") if isinstance(body, dict) else None
        if isinstance(rid, str) and rid:
            self.aborted.append(rid)
            for running, event in self._running.items():
                if running.startswith(rid):  # SGLang's scheduler matches by prefix
                    event.set()

    # --- /generate ----------------------------------------------------------------------------

    async def _generate(self, body: object, send: Send, fault: str | None) -> None:
        if fault == "http-500":
            await _send_json(send, 500, _SIMULATED_500)
            return
        if not isinstance(body, dict):
            error = {"object": "error", "message": "JSON decode error", "type": "Bad Request"}
            await _send_json(send, 400, {**error, "param": None, "code": 400})
            return
        try:
            _contract(body)
        except _ContractError as error:
            await _send_json(send, 400, {"error": str(error)})
            return
        stream = body.get("stream") is True
        try:
            request = self._admit(body)
        except _ValueError as error:
            if not stream:
                await _send_json(send, 400, {"error": {"message": str(error)}})
                return
            event = {
                "error": {
                    "message": str(error),
                    "type": "invalid_request_error",
                    "code": 400,
                    "retryable": False,
                }
            }
            await _send_events(send, [_event(event), _DONE], 0.0)
            return
        abort = self._running.setdefault(request.rid, asyncio.Event())
        try:
            await self._serve(request, abort, send, joins=fault != "no-room")
        finally:
            self._running.pop(request.rid, None)

    def _admit(self, body: dict[str, Any], script: list[int] | None = None) -> _Request:
        """The request, or the ValueError SGLang answers after its contract gate."""
        rid = body.get("rid")
        rid = rid if isinstance(rid, str) else f"{len(self.calls):032x}"
        prompt = body.get("input_ids")
        if prompt is None and body.get("text") is None:
            msg = "Either text, input_ids or input_embeds should be provided."
            raise _ValueError(msg)
        if prompt is None:
            prompt = encode(str(body["text"]))
        if not prompt:
            msg = "input_ids cannot be empty."
            raise _ValueError(msg)
        if rid in self._running:
            msg = f"Duplicate request ID detected: {rid}"
            raise _ValueError(msg)
        context = self.settings.max_model_len
        if len(prompt) >= context:
            msg = (
                f"The input ({len(prompt)} tokens) is longer than the model's context length "
                f"({context} tokens)."
            )
            raise _ValueError(msg)
        sampling = dict(body.get("sampling_params") or {})
        if sampling.get("top_k") == 0:
            msg = "top_k must be -1 (disable) or at least 1, got 0."
            raise _ValueError(msg)
        cap = sampling.get("max_new_tokens", _DEFAULT_CAP)
        if cap is not None and len(prompt) + cap > context:
            msg = (
                f"Requested token count exceeds the model's maximum context length of {context} "
                f"tokens. You requested a total of {len(prompt) + cap} tokens: {len(prompt)} "
                f"tokens from the input messages and {cap} tokens for the completion. Please "
                "reduce the number of tokens in the input messages or the completion to fit "
                "within the limit."
            )
            raise _ValueError(msg)
        if self.mode is not None and body.get("bootstrap_room") is None:
            msg = (
                "Invalid request: Disaggregated request received without bootstrap room id. "
                f"req.rid='{rid}'"
            )
            raise _ValueError(msg)
        return _Request(
            rid=rid,
            prompt=list(prompt),
            stream=body.get("stream") is True,
            sampling=sampling,
            body=body,
            script=script,
        )

    async def _serve(
        self, request: _Request, abort: asyncio.Event, send: Send, *, joins: bool
    ) -> None:
        started = time.time()
        headers_sent = False
        if request.stream:  # SGLang's stream headers go out at once; events after the KV
            await _start(send, 200, _SSE)
            headers_sent = True
        try:
            cached = await self._meet(request, abort, joins=joins)
        except _AbortedError:
            answer = self._answer(request, [], _ABORTED, 0, started)
            await _finish(send, request, [answer], headers_sent=headers_sent)
            return
        except TimeoutError as timeout:
            message = str(timeout)
            if not request.stream:
                error = {"object": "error", "message": message, "type": "500", "param": None}
                await _send_json(send, 500, {**error, "code": 500})
                return
            finish = {"type": "abort", "message": message, "status_code": 500, "err_type": None}
            answer = self._answer(request, [], finish, 0, started)
            await _finish(send, request, [answer], headers_sent=headers_sent)
            return
        ids, finish = self._output(request)
        steps = range(1, len(ids) + 1) if request.stream else [len(ids)]
        answers = [
            self._answer(request, ids[:step], None if step < len(ids) else finish, cached, started)
            for step in steps
        ]
        answers = _as_sent(answers) if request.stream else answers
        if request.stream and self.incremental:
            answers = _incremental(answers)
        await _finish(send, request, answers, headers_sent=headers_sent, delay=self.stream_delay)

    # --- the OpenAI routes ----------------------------------------------------------------------

    async def _openai(self, path: str, body: object, send: Send, fault: str | None) -> None:
        """``/v1/chat/completions`` or ``/v1/completions`` in the worker's P/D role.

        SGLang's OpenAI layer turns the body into its ``/generate`` request (the rendezvous
        fields and ``rid`` copied) and answers in the API's shape; a stream's headers go out
        with its first chunk, so a refusal before it is an HTTP error.
        """
        if fault == "http-500":
            await _send_json(send, 500, _SIMULATED_500)
            return
        try:
            turn = openai.read_turn(path, body, self.settings)
        except openai.OpenAIRefusalError as error:
            await _send_json(send, 400, error.body)
            return
        generate = {
            **turn.routing,
            "input_ids": turn.prompt,
            "stream": turn.stream,
            "sampling_params": turn.sampling,
        }
        try:
            request = self._admit(
                generate, None if turn.tool is None else openai.tool_script(turn.tool)
            )
        except _ValueError as error:
            await _send_json(send, 400, openai.error_response(str(error), "BadRequest", 400))
            return
        abort = self._running.setdefault(request.rid, asyncio.Event())
        try:
            await self._serve_openai(turn, request, abort, send, joins=fault != "no-room")
        finally:
            self._running.pop(request.rid, None)

    async def _serve_openai(
        self,
        turn: openai.OpenAITurn,
        request: _Request,
        abort: asyncio.Event,
        send: Send,
        *,
        joins: bool,
    ) -> None:
        started = time.time()
        created = self.settings.created or int(started)
        try:
            cached = await self._meet(request, abort, joins=joins)
        except _AbortedError:
            ids: list[int] = []
            finish, cached = _ABORTED, 0
        except TimeoutError as timeout:
            message = str(timeout)
            if turn.stream:
                error = openai.stream_error(message, "INTERNAL_SERVER_ERROR", 500)
                await _send_events(send, [error, _DONE], 0.0)
            else:
                await _send_json(send, 500, openai.error_response(message, "500", 500))
            return
        else:
            ids, finish = self._output(request)
        steps = range(1, len(ids) + 1) if turn.stream and ids else [len(ids)]
        generated = [
            self._answer(request, ids[:step], None if step < len(ids) else finish, cached, started)
            for step in steps
        ]
        if not turn.stream:
            await _send_json(send, 200, openai.answer(turn, generated[-1], created))
            return
        events = [*openai.chunks(turn, _as_sent(generated), created), _DONE]
        await _send_events(send, events, self.stream_delay)

    async def _meet(self, request: _Request, abort: asyncio.Event, *, joins: bool) -> int:
        """Meet the peer of the request's room; the prefill's cached tokens. Raises on failure.

        ``joins`` false: the room is never joined (the ``no-room`` fault).
        """
        room = request.body.get("bootstrap_room")
        if self.mode is None or not isinstance(room, int):
            return 0
        if self.mode == "prefill":
            slot = self._rooms.setdefault(room, _Room()) if joins else _Room()
            earlier = (
                call.body.get("input_ids")
                for call in self.calls[:-1]
                if isinstance(call.body, dict)
            )
            slot.cached_tokens = cached_prefix(request.prompt, earlier)
            start = request.body.get("logprob_start_len")
            if request.body.get("return_logprob") is True and isinstance(start, int) and start >= 0:
                # SGLang reuses no KV past where logprobs start (docs/sglang.md).
                slot.cached_tokens = min(slot.cached_tokens, start)
            slot.prefill.set()
            try:
                await _wait(slot.decode.wait(), abort.wait(), self.transfer_timeout)
            except TimeoutError:
                msg = (
                    f"Prefill bootstrap failed for request rank=0 req.rid='{request.rid}' "
                    f"req.bootstrap_room={room} with exception KVTransferError(bootstrap_room="
                    f"{room}): Request {room} timed out after {self.transfer_timeout}s in "
                    "KVPoll.Bootstrapping"
                )
                raise TimeoutError(msg) from None
            finally:
                self._rooms.pop(room, None)
            return slot.cached_tokens
        try:
            cached: int = await _wait(
                self._join_prefill(request, room), abort.wait(), self.transfer_timeout
            )
        except TimeoutError:
            msg = (
                f"Decode transfer failed for request rank=0 decode_req.req.rid='{request.rid}' "
                f"decode_req.req.bootstrap_room={room} with exception KVTransferError("
                f"bootstrap_room={room}): Request {room} timed out after "
                f"{self.transfer_timeout}s in KVPoll.WaitingForInput"
            )
            raise TimeoutError(msg) from None
        return cached

    async def _join_prefill(self, request: _Request, room: int) -> int:
        host = str(request.body.get("bootstrap_host") or "127.0.0.1")
        port = request.body.get("bootstrap_port") or self.bootstrap_port
        payload = {"room": room, "timeout": self.transfer_timeout}
        while True:  # a prefill not up yet is asked again, as SGLang's decode retries
            peer = self._prefills.get((host, port))
            if peer is not None:
                status, answer = await peer._join(payload)  # noqa: SLF001 - its in-process peer
            else:
                try:
                    status, answer = await _post(host, port, JOIN_PATH, payload)
                except OSError:
                    status, answer = 0, None
            if status == 200:
                cached = answer.get("cached_tokens", 0) if isinstance(answer, dict) else 0
                return cached if isinstance(cached, int) else 0
            await asyncio.sleep(0.05)

    async def _join(self, body: object) -> tuple[int, object]:
        """A decode joins a room: wait for the prefill's request, then hand over the KV."""
        room = body.get("room") if isinstance(body, dict) else None
        timeout = body.get("timeout") if isinstance(body, dict) else None
        if not isinstance(room, int):
            return 400, {"detail": "room must be an integer"}
        slot = self._rooms.setdefault(room, _Room())
        try:
            await asyncio.wait_for(
                slot.prefill.wait(), timeout if isinstance(timeout, (int, float)) else None
            )
        except asyncio.TimeoutError:
            return 408, {"detail": f"room {room} never came"}
        slot.decode.set()
        return 200, {"cached_tokens": slot.cached_tokens}

    # --- answers ------------------------------------------------------------------------------

    def _output(self, request: _Request) -> tuple[list[int], dict[str, Any]]:
        """The output tokens of the request and its finish reason."""
        sampling = request.sampling
        if self.mode == "prefill":
            return encode(self.settings.answer)[:1], {"type": "length", "length": 0}
        text = self.settings.answer
        stops = (sampling.get("stop") or []) if request.script is None else []
        finish: dict[str, Any] = {"type": "stop", "matched": IM_END}
        ids = [*encode(text), IM_END] if request.script is None else list(request.script)
        for stop in [stops] if isinstance(stops, str) else stops:
            at = text.find(stop)
            if stop and at >= 0:
                ids = encode(text[: at + len(stop)])
                finish = {"type": "stop", "matched": stop}
                break
        cap = sampling.get("max_new_tokens", _DEFAULT_CAP)
        if cap is None:
            cap = self.settings.max_model_len - len(request.prompt)
        if sampling.get("ignore_eos") is True and finish["matched"] == IM_END:
            # Past its EOS the model writes its answer again, until the cap stops it.
            once = encode(text)
            ids = (once * (cap // len(once) + 1))[: cap + 1] if once else ids
        if len(ids) > cap:
            ids, finish = ids[:cap], {"type": "length", "length": cap}
        return ids, finish

    def _answer(
        self,
        request: _Request,
        ids: list[int],
        finish: dict[str, Any] | None,
        cached: int,
        started: float,
    ) -> dict[str, Any]:
        text = decode([token for token in ids if token != IM_END])
        if finish is not None and isinstance(finish.get("matched"), str):
            stop = finish["matched"]
            if not request.sampling.get("no_stop_trim") and text.endswith(stop):
                text = text[: -len(stop)]
        meta: dict[str, Any] = {
            "id": request.rid,
            "finish_reason": finish,
            "prompt_tokens": len(request.prompt),
            "weight_version": "default",
            "num_retractions": 0,
        }
        meta.update(self._logprobs(request, ids))
        meta.update(reasoning_tokens=0, completion_tokens=len(ids), cached_tokens=cached)
        if finish is not None:
            meta["e2e_latency"] = round(time.time() - started, 4)
        return {"text": text, "output_ids": ids, "meta_info": meta}

    def _logprobs(self, request: _Request, ids: list[int]) -> dict[str, Any]:
        body = request.body
        if body.get("return_logprob") is not True:
            return {}
        with_text = body.get("return_text_in_logprobs") is True
        top = body.get("top_logprobs_num") or 0

        def triple(logprob: float | None, token: int) -> list[Any]:
            return [logprob, token, decode([token]) if with_text else None]

        start = body.get("logprob_start_len")
        # In P/D the prefill computes the prompt's logprobs; a decode never sends them.
        if self.mode == "decode" or not isinstance(start, int) or start < 0:
            start = len(request.prompt)
        top = top if isinstance(top, int) and top > 0 else 0
        inputs = [
            _prompt_position(request.prompt, at, top) for at in range(start, len(request.prompt))
        ]
        out: dict[str, Any] = {
            "input_token_logprobs": [triple(*position[0]) for position in inputs],
            "output_token_logprobs": [triple(_LOGPROB, token) for token in ids],
            "output_token_logprobs_length": len(ids),
        }
        if top:
            out["input_top_logprobs"] = [
                None if alts is None else [triple(*alt) for alt in alts] for _, alts in inputs
            ]
            out["output_top_logprobs"] = [
                [triple(_LOGPROB, token)]
                + [triple(_ALTERNATIVE - rank, token + 1000 + rank) for rank in range(top - 1)]
                for token in ids
            ]
        return out

    # --- info routes --------------------------------------------------------------------------

    def _aborted(self) -> dict[str, Any]:
        """The rids ``/abort_request`` named, for a test of another process (not SGLang's)."""
        return {"aborted": list(self.aborted)}

    def _server_info(self) -> dict[str, Any]:
        return {
            "model_path": self.settings.model,
            "served_model_name": self.settings.default_model,
            "context_length": self.settings.max_model_len,
            "disaggregation_mode": self.mode or "null",
            "disaggregation_bootstrap_port": self.bootstrap_port,
            "disaggregation_transfer_backend": "fake",
            "incremental_streaming_output": self.incremental,
            "stream_interval": 1,
            "version": SGLANG_VERSION,
            "frontend": "python",
        }

    def _model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.settings.model,
            "served_model_name": self.settings.default_model,
            "tokenizer_path": self.settings.model,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "disaggregation_mode": self.mode or "null",
        }

    def _models(self) -> dict[str, Any]:
        name = self.settings.default_model
        card = {
            "id": name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": name,
            "parent": None,
            "max_model_len": self.settings.max_model_len,
        }
        return {"object": "list", "data": [card]}


_Scored: TypeAlias = tuple[float | None, int]


def _prompt_position(prompt: list[int], at: int, top: int) -> tuple[_Scored, list[_Scored] | None]:
    """The logprob of the prompt's token ``at`` and the ``top`` most likely there (none at 0).

    Scripted by position, so a test knows each rank: the prompt's token is the most likely, the
    second, or less likely than every listed one (``docs/sglang.md``, "Prompt logprobs").
    """
    token = prompt[at]
    if at == 0:
        return (None, token), None
    logprob = {1: -0.25, 2: -0.75}.get(at % 3, -1.5 - top)
    others = (BYTE_OFFSET + (token - BYTE_OFFSET + 1 + rank) % _BYTES for rank in range(top))
    scored: list[_Scored] = [(-0.5 - rank, other) for rank, other in enumerate(others)]
    scored.append((logprob, token))
    scored.sort(key=lambda alt: alt[0] or 0.0, reverse=True)
    return (logprob, token), scored[:top]


def _layout() -> dict[str, Any]:
    """What a prefill's bootstrap server answers a decode's ``GET /route``."""
    return {
        "attn_tp_size": 1,
        "attn_cp_size": 1,
        "dp_size": 1,
        "pp_size": 1,
        "page_size": 16,
        "kv_cache_dtype": "auto",
        "follow_bootstrap_room": True,
    }


async def _wait(work: Any, abort: Awaitable[Any], timeout: float | None) -> Any:  # noqa: ANN401 - the work's result
    """``work``'s result within ``timeout`` seconds, unless ``abort`` is done first."""
    task = asyncio.ensure_future(work)
    aborted = asyncio.ensure_future(abort)
    try:
        done, _ = await asyncio.wait(
            {task, aborted}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for pending in (task, aborted):
            pending.cancel()
    if task in done:
        return task.result()
    if aborted in done:
        raise _AbortedError
    raise TimeoutError


async def _post(host: str, port: int, path: str, payload: object) -> tuple[int, object]:
    """One HTTP/1.1 POST of JSON: the status and JSON answer.

    The testing package's only client call (a decode joining its prefill's room), written on
    asyncio's streams: the testing package imports no HTTP client.
    """
    reader, writer = await asyncio.open_connection(host, port)
    try:
        data = orjson.dumps(payload)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
        )
        writer.write(head.encode() + data)
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    _, _, body = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), parse_body(body)


def _as_sent(answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A stream's texts as SGLang sends them: each the text sent so far plus its new part.

    SGLang's stream text is the sum of its deltas, and a finish's trim of a stop string only
    shortens the last delta: text already sent stays (docs/sglang.md, "The answers").
    """
    sent = ""
    for answer in answers:
        sent += answer["text"][len(sent) :]
        answer["text"] = sent
    return answers


def _incremental(answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The deltas of cumulative answers (``--incremental-streaming-output``)."""
    out, text, ids = [], 0, 0
    for answer in answers:
        out.append(
            {**answer, "text": answer["text"][text:], "output_ids": answer["output_ids"][ids:]}
        )
        text, ids = len(answer["text"]), len(answer["output_ids"])
    return out


def _event(payload: object) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def _start(send: Send, status: int, content_type: str) -> None:
    headers = [(b"content-type", content_type.encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})


async def _send_json(send: Send, status: int, payload: object) -> None:
    body = b"" if payload is None else orjson.dumps(payload)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_events(send: Send, events: list[bytes], delay: float) -> None:
    await _start(send, 200, _SSE)
    await _body(send, events, delay)


async def _body(send: Send, events: list[bytes], delay: float) -> None:
    for index, event in enumerate(events):
        if delay and index:
            await asyncio.sleep(delay)
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _finish(
    send: Send,
    request: _Request,
    answers: list[dict[str, Any]],
    *,
    headers_sent: bool,
    delay: float = 0.0,
) -> None:
    """Send the answer (the last of ``answers``) or the stream of them, then ``[DONE]``."""
    if not request.stream:
        await _send_json(send, 200, answers[-1])
        return
    answers[0]["meta_info"]["response_sent_to_client_ts"] = time.time()
    events = [*(_event(answer) for answer in answers), _DONE]
    if headers_sent:
        await _body(send, events, delay)
    else:
        await _send_events(send, events, delay)

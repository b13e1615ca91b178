"""The simulated worker as a raw ASGI 3 application."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any, Final

import orjson

from disagg_transforms.testing import _generate, _messages, _openai, _render, _responses
from disagg_transforms.testing._common import (
    BadRequestError,
    Issue,
    RequestInvalidError,
    WorkerSettings,
    error_body,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

LOG: Final = logging.getLogger("disagg_transforms.testing")
"""The simulated worker's own events (a client that went away; each call, when asked)."""
FAULT_HEADER: Final = "x-simulate-fault"
"""Request header naming a fault for that one request (overrides the worker's ``fault``)."""
FAULT_MODES: Final = (
    "cut-stream",
    "http-400",
    "http-500",
    "http-503",
    "no-output-mode",
    "not-json",
    "slow-first-byte",
    "stream-error",
)
"""Every fault the worker can play (see :class:`SimulatedWorker`)."""

GENERATE_PATH: Final = "/inference/v1/generate"
_RENDER_PATHS: Final = (
    "/v1/chat/completions/render",
    "/v1/completions/render",
    "/v1/responses/render",
    "/v1/messages/render",
)
_COUPLED: Final = {
    _openai.CHAT_PATH: _openai.chat,
    _openai.COMPLETIONS_PATH: _openai.completions,
    _responses.RESPONSES_PATH: _responses.responses,
    _messages.MESSAGES_PATH: _messages.messages,
}
"""The coupled routes (vLLM serving the client's API itself) and who answers each."""
_NAMED_EVENTS: Final = (_responses.RESPONSES_PATH, _messages.MESSAGES_PATH)
"""The coupled routes whose streams name each event (``event: <type>``) and send no ``[DONE]``."""
VERSION_PATH: Final = "/version"
COUNT_TOKENS_PATH: Final = "/v1/messages/count_tokens"
_ROUTES: Final = {
    GENERATE_PATH: "POST",
    "/health": "GET",
    "/v1/models": "GET",
    VERSION_PATH: "GET",
    "/tokenize": "POST",
    "/detokenize": "POST",
    COUNT_TOKENS_PATH: "POST",
    **dict.fromkeys((*_RENDER_PATHS, *_COUPLED), "POST"),
}
"""Every route the worker serves, and its method."""
MAX_BODY: Final = 64 * 1024 * 1024
_HTML_ERROR: Final = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n"
    b"</body>\r\n</html>\r\n"
)
_INTERNAL_ERROR: Final = error_body("Internal server error", "InternalServerError", None, 500)
_STATUS_FAULTS: Final = {
    "http-400": (400, error_body("Bad request (simulated)", "BadRequestError", None, 400)),
    "http-500": (500, _INTERNAL_ERROR),
    "http-503": (503, error_body("Service unavailable", "ServiceUnavailableError", None, 503)),
}


@dataclasses.dataclass(frozen=True)
class RecordedCall:
    """One request the worker received, in arrival order.

    Attributes:
        method: ``GET``, ``POST``, ...
        path: The request path, without the query string.
        headers: The request headers, names lower-cased (repeated headers joined by ``", "``).
        body: The parsed JSON body; ``None`` when there was none or it was not JSON.
    """

    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclasses.dataclass(frozen=True)
class _Reply:
    status: int
    content_type: str
    body: bytes | None = None
    events: list[bytes] | None = None
    stream_error: bytes | None = None
    """The route's in-stream error event for ``stream-error``; ``None``: vLLM's generate one,
    then ``[DONE]``."""


def _json(status: int, payload: object) -> _Reply:
    return _Reply(status, "application/json", orjson.dumps(payload))


class SimulatedWorker:
    """A simulated vLLM 0.33 worker: a raw ASGI 3 application, no GPU, no model.

    Routes: ``POST /inference/v1/generate``, ``POST /v1/chat/completions/render``,
    ``/v1/completions/render``, ``/v1/responses/render``, ``/v1/messages/render``,
    ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/responses`` and ``/v1/messages``
    (coupled),
    ``POST /tokenize`` and ``/detokenize``, ``GET /version``, ``GET /health`` and
    ``GET /v1/models``; anything else is a 404 in vLLM's error shape. Every
    answer carries ``x-request-id`` (the request's, else a fresh one).

    The "model" always generates the same text (a request for structured output gets a JSON
    value that satisfies its schema instead): ``answer`` followed by ``<|im_end|>``
    (``"Hello!"`` gives the tokens of ``tests/fixtures/generate-decode-response.json``); in
    ``derender`` mode it thinks first (``<think>`` ``reasoning`` ``</think>``) and, when
    ``parse_context`` offers tools and ``tool_choice`` is not ``"none"``, calls the first (or the
    named) tool with sample arguments (``"Paris"`` for a string, ``1`` for an integer, ...),
    except after tool results with ``tool_choice`` ``"auto"``: then it answers ``answer``.
    The cap is ``sampling_params.max_tokens``, or the rest of the context when it is absent or
    null.

    Faults (``FAULT_MODES``), for every request (``fault``) or one request (header
    ``x-simulate-fault: MODE``); ``GET /health`` only plays a fault named in its own header:

    - ``no-output-mode``: a vLLM older than ``output_mode``: generate ignores the key, answers
      tokens only and writes no ``output_mode``, in stream chunks too.
    - ``http-500``: status 500 with vLLM's ``InternalServerError`` body; ``http-503`` and
      ``http-400``: that status, with an error body in vLLM's shape.
    - ``not-json``: status 200, an HTML error page (``text/html``).
    - ``cut-stream``: a stream sends its first chunk, then half of the next event and ends (no
      ``[DONE]``); a non-streaming answer ends halfway through its JSON.
    - ``slow-first-byte``: waits ``first_byte_delay`` seconds before the response starts.
    - ``stream-error``: a stream sends its first chunk, then vLLM's in-stream error event and
      ``[DONE]`` (status 200); a non-streaming generate answers 500.

    Args:
        settings: What the model answers (:class:`WorkerSettings`); ``None``: the defaults.
        fault: A fault for every request, or ``None``.
        first_byte_delay: Seconds ``slow-first-byte`` waits.
        stream_delay: Seconds between the events of a stream (a slow model; ``0``: none).
        fault_calls: ``fault`` plays on this many requests only (``GET /health`` excepted),
            then the worker answers normally; ``None``: on every request.
        log_calls: Log each request received at INFO on ``disagg_transforms.testing``, as
            ``call `` and one JSON object (``method``, ``path``, ``headers``, ``body``): what a
            test reads of a worker run as its own process (``simulate --log-calls``).

    Raises:
        ValueError: An unknown fault, a negative delay or a negative ``fault_calls``.
    """

    def __init__(  # noqa: PLR0913 - the worker's settings, all but one by keyword
        self,
        settings: WorkerSettings | None = None,
        *,
        fault: str | None = None,
        first_byte_delay: float = 0.5,
        stream_delay: float = 0.0,
        fault_calls: int | None = None,
        log_calls: bool = False,
    ) -> None:
        if fault_calls is not None and fault_calls < 0:
            msg = "fault_calls must be 0 or more"
            raise ValueError(msg)
        self._faults_left = fault_calls
        if fault is not None and fault not in FAULT_MODES:
            msg = f"unknown fault {fault!r}; expected one of {', '.join(FAULT_MODES)}"
            raise ValueError(msg)
        if first_byte_delay < 0 or stream_delay < 0:
            msg = "first_byte_delay and stream_delay must be non-negative"
            raise ValueError(msg)
        self.fault = fault
        self.first_byte_delay = first_byte_delay
        self.stream_delay = stream_delay
        self.log_calls = log_calls
        self.settings = WorkerSettings() if settings is None else settings
        self.calls: list[RecordedCall] = []
        """Every request received, in order."""
        self._cache = _generate.PrefixCache()
        self.disconnected: list[RecordedCall] = []
        """The calls whose client closed the connection before the answer started (seen while
        ``slow-first-byte`` waits); each is also logged at INFO."""

    def calls_to(self, path: str) -> list[RecordedCall]:
        """The recorded calls to one path.

        Args:
            path: A request path, such as ``"/inference/v1/generate"``.

        Returns:
            Those calls, in order.
        """
        return [call for call in self.calls if call.path == path]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection scope (``http``, or ``lifespan`` for servers that send it).

        Args:
            scope: The ASGI scope.
            receive: The ASGI receive callable.
            send: The ASGI send callable.
        """
        request = await read_request(scope, receive, send)
        if request is None:
            return
        method, path, headers, raw = request
        body = parse_body(raw)
        call = RecordedCall(method, path, headers, body)
        self.calls.append(call)
        if self.log_calls:
            LOG.info("call %s", orjson.dumps(dataclasses.asdict(call)).decode())
        request_id = headers.get("x-request-id") or uuid.uuid4().hex
        fault = headers.get(FAULT_HEADER)
        if fault is None and path != "/health":
            fault = self._worker_fault()
        if fault is not None and fault not in FAULT_MODES:
            msg = f"unknown {FAULT_HEADER} {fault!r}; expected one of {', '.join(FAULT_MODES)}"
            reply = _json(400, error_body(msg, "BadRequestError", FAULT_HEADER, 400))
        elif fault in _STATUS_FAULTS:
            reply = _json(*_STATUS_FAULTS[fault])
        elif fault == "not-json":
            reply = _Reply(200, "text/html; charset=utf-8", _HTML_ERROR)
        elif raw is None:
            reply = _json(413, error_body("Request body too large", "BadRequestError", None, 413))
        else:
            reply = self._route(call, raw, fault)
        if fault == "slow-first-byte" and await _went_away(receive, self.first_byte_delay):
            # What vLLM does then: abort the request, free its KV blocks, answer nothing.
            self.disconnected.append(call)
            LOG.info("client disconnected, request aborted: %s %s %s", method, path, request_id)
            return
        await _send(send, reply, request_id, fault, self.stream_delay)

    def _worker_fault(self) -> str | None:
        """The worker's own fault for this request, while it has plays left."""
        if self.fault is None or self._faults_left is None:
            return self.fault
        if not self._faults_left:
            return None
        self._faults_left -= 1
        return self.fault

    def _route(  # noqa: PLR0911 - one answer per route
        self, call: RecordedCall, raw: bytes, fault: str | None
    ) -> _Reply:
        method, path, headers, body = call.method, call.path, call.headers, call.body
        allowed = _ROUTES.get(path)
        if allowed is None:
            return _json(404, error_body("Not Found", "NotFoundError", None, 404))
        if method != allowed:
            return _json(405, error_body("Method Not Allowed", "MethodNotAllowed", None, 405))
        if path == "/health":
            return _Reply(200, "application/json", b"")
        if path == "/v1/models":
            return _json(200, self._models())
        if path == VERSION_PATH:
            return _json(200, {"version": self.settings.vllm_version})
        if (raw and body is None) or not _is_json_type(headers):
            # FastAPI reads only a JSON body; anything else fails validation.
            issue = Issue("json_invalid", "body", "JSON decode error", None)
            return _json(400, RequestInvalidError([issue]).body())
        unknown = self.settings.unknown_model(body)
        if unknown is not None:
            message = f"The model `{unknown}` does not exist."
            return _served_error(path, 404, error_body(message, "NotFoundError", "model", 404))
        try:
            return self._answer(path, body, headers.get("x-request-id"), fault)
        except RequestInvalidError as error:
            return _json(400, error.body())
        except BadRequestError as error:
            return _served_error(path, error.status, error.body())

    def _answer(self, path: str, body: object, header_id: str | None, fault: str | None) -> _Reply:
        """The answer of a JSON route, or the error it raises."""
        if path == GENERATE_PATH:
            return self._generate(body, header_id, fault)
        if path in _COUPLED:
            return self._coupled(path, body, header_id, fault)
        if path == "/tokenize":
            return _json(200, _render.tokenize(body, self.settings))
        if path == "/detokenize":
            return _json(200, _render.detokenize(body))
        if path == COUNT_TOKENS_PATH:
            # vLLM's Anthropic count: the rendered prompt's tokens (a count takes no max_tokens,
            # which the render route requires: any cap renders the same prompt).
            asked = {"max_tokens": 1, **body} if isinstance(body, dict) else body
            rendered = _render.render_messages(asked, header_id, self.settings)
            count = len(rendered["token_ids"])
            return _json(
                200, {"input_tokens": count, "context_management": {"original_input_tokens": count}}
            )
        return _json(200, render(path, body, header_id, self.settings))

    def _generate(self, body: object, header_id: str | None, fault: str | None) -> _Reply:
        legacy = fault == "no-output-mode"
        request = _generate.validate(body, legacy=legacy, modes=self.settings.output_modes)
        if legacy:
            request = {key: value for key, value in request.items() if key != "output_mode"}
        _generate.check_request(request, self.settings)
        stream = request.get("stream") is True
        if fault == "stream-error" and not stream:
            return _json(500, _INTERNAL_ERROR)
        answer = _generate.generate(
            request,
            self.settings,
            header_id=header_id,
            legacy=legacy,
            sequence=len(self.calls),
            cached_tokens=self._cache.computed(request["token_ids"]),
        )
        if answer.events is not None:
            return _Reply(200, "text/event-stream; charset=utf-8", events=answer.events)
        return _json(200, answer.body)

    def _coupled(self, path: str, body: object, header_id: str | None, fault: str | None) -> _Reply:
        if fault == "stream-error" and isinstance(body, dict) and body.get("stream") is not True:
            return _served_error(path, 500, _INTERNAL_ERROR)
        call = _generate.Call(header_id, len(self.calls), self._cache)
        answer = _COUPLED[path](body, self.settings, call)
        if isinstance(answer, dict):
            return _json(200, answer)
        content_type = "text/event-stream; charset=utf-8"
        if path not in _NAMED_EVENTS:
            events = [b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in answer]
            return _Reply(200, content_type, events=[*events, b"data: [DONE]\n\n"])
        named = [_named_event(event) for event in answer]
        return _Reply(200, content_type, events=named, stream_error=_stream_error(path))

    def _models(self) -> dict[str, Any]:
        served = self.settings.served_model_names
        names = list(served) if served else list(dict.fromkeys(("simulated", self.settings.model)))
        created = self.settings.created if self.settings.created is not None else int(time.time())
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": created,
                    "owned_by": "vllm",
                    "root": name,
                    "parent": None,
                    "max_model_len": self.settings.max_model_len,
                    "permission": [],
                }
                for name in names
            ],
        }


def _served_error(path: str, status: int, body: dict[str, Any]) -> _Reply:
    """An error the route's serving answers (not request validation, which is app-wide).

    vLLM's Messages router translates those into Anthropic's shape, the status unchanged.
    """
    return _json(
        status, _messages.anthropic_error(body) if path == _messages.MESSAGES_PATH else body
    )


def render(path: str, body: object, header_id: str | None, settings: WorkerSettings) -> object:
    """The answer of one of the four render routes (``path`` is one of them)."""
    if path == "/v1/chat/completions/render":
        return _render.render_chat(body, header_id, settings)
    if path == "/v1/completions/render":
        return _render.render_completions(body, header_id, settings)
    if path == "/v1/responses/render":
        return _render.render_responses(body, settings)
    return _render.render_messages(body, header_id, settings)


def _named_event(event: Mapping[str, Any]) -> bytes:
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def _stream_error(path: str) -> bytes:
    """The in-stream error a Responses or Messages stream ends with after a failed generation.

    Messages: vLLM's converter cannot read the chat stream's error chunk and sends Anthropic's
    ``error`` event (``internal_error``). Responses: vLLM's own code fails to build its event
    there, so the event is the one the library's stream converter writes
    (``responses_error_event``, docs/envelopes.md), numbered after the stream's first event.
    """
    if path == _messages.MESSAGES_PATH:
        error = {"type": "internal_error", "message": "Internal server error"}
        return _named_event({"type": "error", "error": error})
    return _named_event(
        {
            "code": "InternalServerError",
            "message": "Internal server error",
            "param": None,
            "sequence_number": 1,
            "type": "error",
        }
    )


async def read_request(
    scope: Scope, receive: Receive, send: Send
) -> tuple[str, str, dict[str, str], bytes | None] | None:
    """An http scope's method, path, headers and body (``None`` above ``MAX_BODY``).

    ``None`` for any other scope, a ``lifespan`` one answered first.
    """
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return None
    if scope["type"] != "http":
        return None
    headers = _headers(scope)
    raw = await _read_body(receive)
    method = str(scope.get("method", "GET")).upper()
    return method, str(scope.get("path", "/")), headers, raw


def _is_json_type(headers: Mapping[str, str]) -> bool:
    content_type = headers.get("content-type", "application/json").split(";")[0].strip().lower()
    return content_type == "application/json" or content_type.endswith("+json")


def _headers(scope: Scope) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in scope.get("headers", []):
        key = bytes(name).decode("latin-1").lower()
        text = bytes(value).decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return headers


async def _read_body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = bytes(message.get("body", b""))
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def parse_body(raw: bytes | None) -> Any:  # noqa: ANN401 - any JSON value
    """A request or answer body as JSON; ``None`` when empty or not JSON (the routes judge it)."""
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def until_disconnect(receive: Receive) -> None:
    """Returns once the client has gone (its body already read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _went_away(receive: Receive, delay: float) -> bool:
    """Whether the client closed the connection within ``delay`` seconds (else: it waited)."""
    try:
        await asyncio.wait_for(until_disconnect(receive), delay)
    except asyncio.TimeoutError:
        return False
    return True


async def _send(
    send: Send, reply: _Reply, request_id: str, fault: str | None, delay: float
) -> None:
    headers = [
        (b"content-type", reply.content_type.encode()),
        (b"x-request-id", request_id.encode("latin-1")),
    ]
    if reply.events is None:
        body = reply.body or b""
        if fault == "cut-stream" and reply.status == 200 and body:
            body = body[: len(body) // 2]
        else:
            headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
        return
    events = reply.events
    if fault == "cut-stream" and len(events) > 1:
        # One whole event, then the next one stops in the middle of its data line.
        events = [events[0], events[1][: max(len(events[1]) // 2, 8)]]
    elif fault == "stream-error" and reply.stream_error is not None:
        events = [events[0], reply.stream_error]
    elif fault == "stream-error":
        error = b'data: {"error": {"message": "Internal server error", "type": '
        error += b'"InternalServerError", "param": null, "code": 500}}\n\n'
        events = [events[0], error, b"data: [DONE]\n\n"]
    headers.append((b"cache-control", b"no-cache"))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    for index, event in enumerate(events):
        if delay and index:
            await asyncio.sleep(delay)
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})

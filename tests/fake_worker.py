"""A fake vLLM 0.33 worker on 127.0.0.1 for integration tests (stdlib only, no model).

It serves the two routes a disaggregated front end calls:

- ``POST /v1/chat/completions/render``: a chat body → one ``GenerateRequest`` shaped like
  ``fixtures/request-decode-derender.json`` (every field written, nulls included), with token IDs
  derived from the messages and ``output_mode`` left at ``"tokens"`` as vLLM does.
- ``POST /inference/v1/generate``: answers in the requested ``output_mode``: ``text`` (JSON, or
  SSE shaped like ``fixtures/stream-text.sse`` with a usage chunk when
  ``stream_options.include_usage``), ``derender`` (JSON with ``message`` incl. ``reasoning`` and,
  when ``parse_context`` has tools, one ``tool_calls`` entry, like
  ``fixtures/response-derender-tool-call.json``; ``stream: true`` is a 400 as in vLLM), or
  ``tokens``. Every answer echoes ``output_mode``, unless the worker is ``old``: then it ignores
  ``output_mode`` and answers tokens only, without the key (a vLLM older than the field).

Use it as a context manager; it records every body it received::

    with FakeWorker() as worker:
        httpx.post(f"{worker.url}/inference/v1/generate", json=body)
        assert worker.bodies("/inference/v1/generate") == [body]

The server is bounded: request bodies over ``MAX_BODY`` get 413, each connection times out, and
it shuts itself down after ``lifetime`` seconds even if a test forgets to stop it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from typing_extensions import Self

RENDER_PATH = "/v1/chat/completions/render"
GENERATE_PATH = "/inference/v1/generate"
MAX_BODY = 4 * 1024 * 1024
CREATED = 1796000000
_SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
    "ignore_eos",
    "logit_bias",
    "skip_special_tokens",
)


@dataclass
class Received:
    """One request the worker received."""

    path: str
    body: Any
    """The parsed JSON body (``None`` when it was not JSON)."""


@dataclass
class FakeWorker:
    """A fake vLLM worker; configure the answer with the fields, then enter it to start it."""

    old: bool = False
    """Act like a vLLM older than ``output_mode``: ignore it, answer tokens only, no echo."""
    answer: str = "Hello!"
    """The assistant text (split into three stream deltas)."""
    reasoning: str | None = "User wants weather."
    """The derender message's ``reasoning`` (``None``: the key is left out)."""
    tool_arguments: str = '{"city": "Paris"}'
    """Arguments of the tool call a derender answer makes when ``parse_context`` has tools."""
    stream_error: str | None = None
    """When set, a stream sends one chunk, then ``{"error": {...}}`` with this message."""
    lifetime: float = 60.0
    """Seconds after which the server stops itself."""
    received: list[Received] = field(default_factory=list)
    """Every request, in arrival order."""

    _server: _Server | None = field(default=None, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _timer: threading.Timer | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` of the running server."""
        assert self._server is not None, "the worker is not running"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def bodies(self, path: str) -> list[Any]:
        """The JSON bodies received on ``path``, in order."""
        with self._lock:
            return [item.body for item in self.received if item.path == path]

    def start(self) -> Self:
        """Start serving on an ephemeral port of 127.0.0.1."""
        server = _Server(self)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        self._timer = threading.Timer(self.lifetime, self.stop)
        self._timer.daemon = True
        self._timer.start()
        return self

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        server, self._server = self._server, None
        if self._timer is not None:
            self._timer.cancel()
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def record(self, path: str, body: Any) -> None:
        """Keep one received body (called from the server's threads)."""
        with self._lock:
            self.received.append(Received(path, body))


def _error(message: str, code: int) -> dict[str, Any]:
    kind = {400: "BadRequestError", 404: "NotFoundError", 413: "BadRequestError"}[code]
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def render(chat: dict[str, Any], request_number: int) -> dict[str, Any]:
    """What vLLM's ``/v1/chat/completions/render`` answers for ``chat`` (simplified tokenizer)."""
    token_ids: list[int] = []
    for message in chat.get("messages") or []:
        token_ids += [151644, len(str(message.get("role", "")))]
        token_ids += list(_content_text(message.get("content")).encode("utf-8"))
        token_ids += [151645, 198]
    token_ids += [151644, 77091, 198]  # the assistant turn the model continues
    sampling: dict[str, Any] = {k: chat[k] for k in _SAMPLING_KEYS if chat.get(k) is not None}
    cap = chat.get("max_completion_tokens")
    if cap is None:
        cap = chat.get("max_tokens")
    if cap is not None:
        sampling["max_tokens"] = cap
    sampling["output_kind"] = 1 if chat.get("stream") else 2
    tools = chat.get("tools")
    tool_choice = chat.get("tool_choice") or ("auto" if tools else "none")
    stream = bool(chat.get("stream"))
    return {
        "request_id": f"chatcmpl-{chat.get('request_id') or request_number}",
        "token_ids": token_ids,
        "token_offsets": None,
        "features": None,
        "content_parts": None,
        "sampling_params": sampling,
        "model": chat.get("model"),
        "reasoning_ended": None,
        "reasoning_parser_kwargs": None,
        "return_token_ids": chat.get("return_token_ids"),
        "output_mode": "tokens",
        "parse_context": {
            "tools": tools,
            "tool_choice": tool_choice,
            "parallel_tool_calls": chat.get("parallel_tool_calls", True),
            "include_reasoning": chat.get("include_reasoning", True),
            "chat_template_kwargs": chat.get("chat_template_kwargs") or {},
            "history_tool_call_cnt": 0,
        },
        "stream": stream,
        "stream_options": chat.get("stream_options") if stream else None,
        "cache_salt": chat.get("cache_salt"),
        "priority": chat.get("priority", 0),
        "kv_transfer_params": chat.get("kv_transfer_params"),
        "ec_transfer_params": None,
    }


def _pieces(answer: str) -> list[str]:
    third = max(1, len(answer) // 3)
    return [answer[:third], answer[third : 2 * third], answer[2 * third :]]


def _tokens(answer: str) -> list[int]:
    return [1000 + i for i in range(len(_pieces(answer)))]


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }


def _choice_base(index: int, finish_reason: str | None, token_ids: list[int]) -> dict[str, Any]:
    return {
        "index": index,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "token_ids": token_ids,
        "routed_experts": None,
        "sampling_mask": None,
        "weight_versions": [{"version": "v1", "start": 0, "end": len(token_ids)}],
    }


def _derender_message(worker: FakeWorker, parse_context: Any) -> tuple[dict[str, Any], str]:
    context = parse_context if isinstance(parse_context, dict) else {}
    tools = context.get("tools") or []
    calls_tool = bool(tools) and context.get("tool_choice") != "none"
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None if calls_tool else worker.answer,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if calls_tool:
        name = tools[0].get("function", {}).get("name", "tool")
        message["tool_calls"] = [
            {
                "id": "chatcmpl-tool-1",
                "type": "function",
                "function": {"name": name, "arguments": worker.tool_arguments},
            }
        ]
    if worker.reasoning is not None and context.get("include_reasoning", True):
        message["reasoning"] = worker.reasoning
    return message, "tool_calls" if calls_tool else "stop"


def generate(worker: FakeWorker, body: dict[str, Any]) -> dict[str, Any]:
    """The non-streaming generate answer for ``body``."""
    mode = "tokens" if worker.old else body.get("output_mode", "tokens")
    sampling = body.get("sampling_params") or {}
    n = sampling.get("n") or 1
    token_ids = _tokens(worker.answer)
    choices = []
    for index in range(n):
        finish = "stop"
        extra: dict[str, Any] = {}
        if mode == "text":
            extra["text"] = worker.answer
        elif mode == "derender":
            extra["message"], finish = _derender_message(worker, body.get("parse_context"))
        choices.append({**_choice_base(index, finish, token_ids), **extra, "logprobs": None})
    response: dict[str, Any] = {
        "request_id": f"generate-tokens-{body.get('request_id', 'r1')}",
        "model": body.get("model") or "fake-model",
        "created": CREATED,
        "usage": _usage(len(body["token_ids"]), len(token_ids) * n),
        "prompt_logprobs": None,
        "prompt_token_id_logprobs": None,
        "prompt_token_ids": body["token_ids"] if body.get("return_token_ids") else None,
        "mm_placeholders": None,
        "metrics": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "output_mode": mode,
        "choices": choices,
    }
    if worker.old:
        del response["output_mode"]
    return response


def generate_stream(worker: FakeWorker, body: dict[str, Any]) -> Iterator[bytes]:
    """The SSE events of a streaming generate answer (text or tokens mode)."""
    mode = "tokens" if worker.old else body.get("output_mode", "tokens")
    sampling = body.get("sampling_params") or {}
    n = sampling.get("n") or 1
    request_id = f"generate-tokens-{body.get('request_id', 'r1')}"
    pieces = _pieces(worker.answer)
    first = True
    for step, (piece, token) in enumerate(zip(pieces, _tokens(worker.answer), strict=True)):
        last = step == len(pieces) - 1
        for index in range(n):  # n > 1: choices interleave, one per chunk, as in vLLM
            choice = {**_choice_base(index, "stop" if last else None, [token]), "logprobs": None}
            if not last:
                choice["weight_versions"] = None
            if mode == "text":
                choice["text"] = piece
            chunk: dict[str, Any] = {"request_id": request_id, "usage": None}
            if first and body.get("return_token_ids"):
                chunk["prompt_token_ids"] = body["token_ids"]
            first = False
            chunk["output_mode"] = mode
            chunk["choices"] = [choice]
            if worker.old:
                del chunk["output_mode"]
            yield _event(chunk)
            if worker.stream_error is not None:
                yield _event(_error_500(worker.stream_error))
                yield b"data: [DONE]\n\n"
                return
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = _usage(len(body["token_ids"]), len(pieces) * n)
        chunk = {"request_id": request_id, "usage": usage, "output_mode": mode, "choices": []}
        if worker.old:
            del chunk["output_mode"]
        yield _event(chunk)
    yield b"data: [DONE]\n\n"


def _error_500(message: str) -> dict[str, Any]:
    return {
        "error": {"message": message, "type": "InternalServerError", "param": None, "code": 500}
    }


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class _Handler(BaseHTTPRequestHandler):
    timeout = 10  # seconds per connection: a stuck client cannot hold a thread forever

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        """Keep test output quiet."""

    server: _Server

    def do_POST(self) -> None:
        worker = self.server.worker
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._json(413, _error(f"body of {length} bytes is over {MAX_BODY}", 413))
            return
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            worker.record(self.path, None)
            self._json(400, _error("body is not JSON", 400))
            return
        worker.record(self.path, body)
        if self.path == RENDER_PATH:
            self._json(200, render(body, len(worker.received)))
        elif self.path == GENERATE_PATH:
            self._generate(worker, body)
        else:
            self._json(404, _error(f"no route {self.path}", 404))

    def _generate(self, worker: FakeWorker, body: Any) -> None:
        if not isinstance(body, dict) or not body.get("token_ids"):
            self._json(400, _error("token_ids: field required", 400))
            return
        mode = body.get("output_mode", "tokens")
        if not worker.old and mode not in {"tokens", "text", "derender"}:
            self._json(400, _error(f"output_mode: invalid value {mode!r}", 400))
            return
        if not worker.old and mode == "derender" and body.get("stream"):
            message = "output_mode='derender' does not support stream=true."
            self._json(400, _error(message, 400))
            return
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for event in generate_stream(worker, body):
                self.wfile.write(event)
                self.wfile.flush()
            return
        self._json(200, generate(worker, body))

    def _json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, worker: FakeWorker) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.worker = worker

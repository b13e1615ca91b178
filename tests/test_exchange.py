"""The exchange (docs/exchange.md): one client request through its worker calls and back.

Driven sans I/O with the golden vLLM 0.33 bodies and streams; a worker is a plain function
(``exchange_driver.Worker``), so the simulated worker plugs in the same way.
"""

from __future__ import annotations

import json
import re
from typing import Any

import anthropic.types
import openai.types.chat
import openai.types.responses
import pytest
from exchange_driver import Outcome, drive, fixture_bytes, scripted
from golden import load_fixture, load_stream

from disagg_transforms import (
    ConfigError,
    EcConnector,
    KvConnector,
    Limits,
    Pipeline,
    RequestError,
    Step,
    TransformContext,
    parse_pipeline_params,
)
from disagg_transforms.exchange import (
    NEED_DATA,
    ClientReply,
    ClientStream,
    Exchange,
    ExchangeSettings,
    ExchangeStateError,
    WorkerCall,
    pipeline_warnings,
)

GENERATE_PD = parse_pipeline_params(
    {"prefill": {}, "decode": {"wrap_chat_completion": True}}, use_openai_format=False
)
GENERATE_D = parse_pipeline_params(
    {"decode": {"wrap_chat_completion": True}}, use_openai_format=False
)
OPENAI_PD = parse_pipeline_params({"prefill": {}, "decode": {}})
OPENAI_D = parse_pipeline_params({"decode": {}})
GENERATE_ONLY = {"kv_transfer_params", "ec_transfer_params", "token_ids", "request_id"}

CHAT = "/v1/chat/completions"
RENDER = fixture_bytes("render-chat-response.json")
PREFILL = fixture_bytes("generate-prefill-response.json")
DECODE = fixture_bytes("generate-decode-response.json")
STREAM = load_stream("generate-stream-usage.sse")


def _body(name: str, **changes: Any) -> bytes:
    return json.dumps({**load_fixture(name), **changes}).encode()


def _worker(decode_body: Any = DECODE, **answers: Any) -> Any:
    base: dict[str, Any] = {
        "render": (200, {}, RENDER),
        "prefill": (200, {}, PREFILL),
        "decode": (200, {}, decode_body),
    }
    return scripted({**base, **answers})


def _keys(value: Any) -> set[str]:
    """The keys holding a value (vLLM's own chat writes ``token_ids`` null, so does the wrap)."""
    if isinstance(value, dict):
        held = {k for k, v in value.items() if v is not None}
        return held | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def _events(stream: bytes) -> list[Any]:
    return [
        json.loads(line[6:])
        for line in stream.split(b"\n")
        if line.startswith(b"data: ") and line != b"data: [DONE]"
    ]


def _run(path: str, body: bytes, worker: Any, config: Any = GENERATE_PD, **kw: Any) -> Outcome:
    headers = kw.pop("headers", {})
    return drive(Exchange(config, path, headers, body, settings=ExchangeSettings(**kw)), worker)


# ---- the sequence of calls --------------------------------------------------------------


def test_chat_client_render_prefill_decode_one_request_id_and_the_wrapped_reply() -> None:
    body = _body("render-chat-kv-request.json")  # client kv_transfer_params, max_tokens 32
    worker = _worker(render=(200, {}, fixture_bytes("render-chat-kv-response.json")))
    out = _run(CHAT, body, worker, headers={"X-Request-Id": "fx-kv"})
    assert [(c.step, c.path, c.stream) for c in out.calls] == [
        ("render", "/v1/chat/completions/render", False),
        ("prefill", "/inference/v1/generate", False),
        ("decode", "/inference/v1/generate", False),
    ]
    assert {dict(c.headers)["x-request-id"] for c in out.calls} == {"fx-kv"}
    assert out.headers["x-request-id"] == "fx-kv"
    assert "kv_transfer_params" not in json.loads(out.call("render").body)
    prefill, decode = out.leg("prefill"), out.leg("decode")
    assert prefill["sampling_params"]["max_tokens"] == 1
    assert prefill["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False}
    assert (
        decode["kv_transfer_params"]
        == load_fixture("generate-prefill-response.json")["kv_transfer_params"]
    )
    assert decode["sampling_params"]["max_tokens"] == 32
    assert decode["token_ids"] == load_fixture("render-chat-kv-response.json")["token_ids"]
    assert out.status == 200
    completion = openai.types.chat.ChatCompletion.model_validate(out.json())
    assert completion.choices[0].message.content == "Hello!"
    assert not _keys(out.json()) & GENERATE_ONLY


def test_the_render_answer_token_ids_reach_decode_as_their_bytes() -> None:
    out = _run(CHAT, _body("render-chat-request.json"), _worker(), config=GENERATE_D)
    assert [c.step for c in out.calls] == ["render", "decode"]
    raw = re.search(rb'"token_ids": \[[^]]*\]', RENDER)
    assert raw is not None
    assert raw.group(0)[len(b'"token_ids": ') :] in out.call("decode").body


@pytest.mark.parametrize(
    ("path", "request_fixture", "render_fixture", "model"),
    [
        (
            "/v1/responses",
            "render-responses-request.json",
            "render-responses-response.json",
            openai.types.responses.Response,
        ),
        (
            "/v1/messages",
            "render-messages-request.json",
            "render-messages-response.json",
            anthropic.types.Message,
        ),
    ],
)
def test_responses_and_messages_clients_render_on_their_route_and_get_their_envelope(
    path: str, request_fixture: str, render_fixture: str, model: Any
) -> None:
    worker = _worker(render=(200, {}, fixture_bytes(render_fixture)))
    # Without its tools: the decode step is in text mode, which refuses them.
    out = _run(path, _body(request_fixture, stream=False, tools=None), worker)
    assert out.calls[0].path == f"{path}/render"
    assert out.status == 200, out.body
    model.model_validate(out.json())
    assert not _keys(out.json()) & GENERATE_ONLY


def test_completions_client_stays_on_its_route_with_no_render_and_no_transfer_params() -> None:
    config = parse_pipeline_params({"prefill": {}, "decode": {}}, use_openai_format=False)
    body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 5}).encode()
    answer = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "text": "yo", "finish_reason": "stop", "logprobs": None}],
        "kv_transfer_params": {"remote_host": "10.0.0.7"},
    }
    worker = scripted(
        {"/v1/completions": (200, {}, json.dumps(answer).encode())},
    )
    out = _run("/v1/completions", body, worker, config=config)
    assert [c.path for c in out.calls] == ["/v1/completions", "/v1/completions"]
    assert out.leg("prefill")["prompt"] == "hi"
    assert "kv_transfer_params" not in out.json()
    assert out.json()["choices"] == answer["choices"]


def test_a_generate_client_gets_the_generate_envelope_byte_for_byte() -> None:
    body = json.dumps({"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 7}}).encode()
    out = _run("/inference/v1/generate", body, _worker(), config=GENERATE_D)
    assert [c.step for c in out.calls] == ["decode"]
    assert out.leg("decode")["sampling_params"]["max_tokens"] == 7
    assert out.body == DECODE


def test_an_openai_format_leg_passes_the_answer_through_minus_transfer_params() -> None:
    answer = load_fixture("chat-completion-coupled.json")
    answer = {**answer, "kv_transfer_params": {"remote_host": "10.1.2.3"}, "ec_transfer_params": {}}
    worker = scripted({CHAT: (200, {}, json.dumps(answer).encode())})
    out = _run(CHAT, _body("render-chat-request.json"), worker, config=OPENAI_PD)
    assert [(c.step, c.path) for c in out.calls] == [("prefill", CHAT), ("decode", CHAT)]
    assert out.json() == {
        k: v for k, v in answer.items() if k not in {"kv_transfer_params", "ec_transfer_params"}
    }


def test_an_answer_without_transfer_params_passes_through_unchanged() -> None:
    coupled = load_fixture("chat-completion-coupled.json")
    answer = json.dumps({k: v for k, v in coupled.items() if "transfer" not in k}).encode()
    worker = scripted({CHAT: (200, {}, answer)})
    out = _run(CHAT, _body("render-chat-request.json"), worker, config=OPENAI_D)
    assert out.body == answer


def test_an_unwrapped_generate_envelope_never_hands_a_chat_client_generate_only_keys() -> None:
    config = parse_pipeline_params({"decode": {}}, use_openai_format=False)
    out = _run(CHAT, _body("render-chat-request.json"), _worker(), config=config)
    assert out.status == 200
    assert not _keys(out.json()) & GENERATE_ONLY
    assert out.json()["choices"][0]["text"] == "Hello!"
    unwrapped, refuses_tools = pipeline_warnings(config)
    assert "wrap_chat_completion" in unwrapped
    assert refuses_tools.startswith("decode.output_mode: text: ")
    serves_all = {"prefill": {}, "decode": {"wrap_chat_completion": True, "output_mode": "auto"}}
    assert pipeline_warnings(parse_pipeline_params(serves_all, use_openai_format=False)) == []


def test_derender_with_a_streaming_client_is_one_single_frame_reply() -> None:
    config = parse_pipeline_params(
        {"decode": {"output_mode": "derender", "wrap_chat_completion": True}},
        use_openai_format=False,
    )
    out = _run(
        CHAT,
        _body("render-chat-request.json", stream=True),
        _worker(decode_body=fixture_bytes("response-derender-text.json")),
        config=config,
    )
    assert out.calls[-1].stream is False
    assert out.headers["content-type"] == "text/event-stream"
    assert out.body.endswith(b"data: [DONE]\n\n")
    for chunk in _events(out.body):
        openai.types.chat.ChatCompletionChunk.model_validate(chunk)


# ---- request ids ----------------------------------------------------------------------------


@pytest.mark.parametrize("given", [None, "", "a b", "x" * 129, "bad/id"])
def test_an_unusable_client_request_id_is_replaced_by_a_made_one(given: str | None) -> None:
    headers = {} if given is None else {"x-request-id": given}
    out = _run(
        CHAT, _body("render-chat-request.json"), _worker(), headers=headers,
        new_request_id=lambda: "made-1",
    )  # fmt: skip
    assert {dict(c.headers)["x-request-id"] for c in out.calls} == {"made-1"}
    assert out.headers["x-request-id"] == "made-1"


def test_client_headers_are_forwarded_but_not_framing_or_hop_by_hop() -> None:
    headers = [(b"Authorization", b"Bearer k"), ("Content-Length", "9"), ("Connection", "close")]
    out = _run(CHAT, _body("render-chat-request.json"), _worker(), headers=headers)
    sent = dict(out.calls[0].headers)
    assert sent["authorization"] == "Bearer k"
    assert sent["content-type"] == "application/json"
    assert "content-length" not in sent
    assert "connection" not in sent


def test_a_worker_call_carries_one_request_id_and_none_of_the_clients_own_framing() -> None:
    headers = [
        ("X-Request-Id", "client-1"),
        ("Content-Type", "text/plain"),
        ("Accept-Encoding", "gzip"),
        ("X-Should-Retry", "true"),
        ("X-Tenant", "t1"),
    ]
    out = _run(CHAT, _body("render-chat-request.json"), _worker(), headers=headers)
    for call in out.calls:
        assert sorted(call.headers) == [
            ("content-type", "application/json"),
            ("x-request-id", "client-1"),
            ("x-tenant", "t1"),
        ]


@pytest.mark.parametrize(
    "header",
    [
        "EPP-Profile",
        "x-prefiller-host-port",
        "x-encoder-hosts-ports",
        "x-kv-cache-source-host-port",
    ],
)
def test_llm_ds_routing_headers_never_reach_a_worker(header: str) -> None:
    # The picker's headers name internal hosts and pools for the router; llm-d's sidecar
    # consumes and deletes them before any leg (docs/llm-d.md).
    headers = [(header, "10.0.0.5:8000"), ("X-Tenant", "t1")]
    out = _run(CHAT, _body("render-chat-request.json"), _worker(), headers=headers)
    assert len(out.calls) == 3
    for call in out.calls:
        assert [name for name, _ in call.headers if name == header.lower()] == []
        assert ("x-tenant", "t1") in call.headers


# ---- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [b"", b"[1]", b"{", b'{"max_completion_tokens": 0, "messages": []}', b"\xff"],
)
def test_a_bad_client_body_is_a_400_in_openai_shape_and_reaches_no_worker(body: bytes) -> None:
    ex = Exchange(GENERATE_PD, CHAT, {}, body)
    event = ex.next_event()
    assert isinstance(event, ClientReply)
    assert event.status == 400
    error = json.loads(event.body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == 400
    assert dict(event.headers)["content-type"] == "application/json"


def test_a_bad_messages_body_is_a_400_in_anthropic_shape() -> None:
    event = Exchange(GENERATE_PD, "/v1/messages", {}, b"[]").next_event()
    assert isinstance(event, ClientReply)
    assert event.status == 400
    body = json.loads(event.body)
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(("path", "kind"), [(CHAT, "BadRequestError"), ("/v1/messages", "")])
def test_a_body_over_the_limit_is_a_413_in_the_clients_shape(path: str, kind: str) -> None:
    body = b'{"messages": [], "model": "m"}'
    settings = ExchangeSettings(limits=Limits(max_body_bytes=len(body) - 1))
    event = Exchange(GENERATE_PD, path, {}, body, settings=settings).next_event()
    assert isinstance(event, ClientReply)
    assert event.status == 413
    error = json.loads(event.body)["error"]
    assert error["type"] == (kind or "request_too_large")
    assert "Limits.max_body_bytes" in error["message"]


def test_a_workers_4xx_keeps_its_status_and_names_the_step() -> None:
    worker = _worker(prefill=(400, {}, fixture_bytes("error-400.json")))
    out = _run(CHAT, _body("render-chat-request.json"), worker)
    assert out.status == 400
    message = out.json()["error"]["message"]
    assert message.startswith("prefill rejected the request: ")
    assert "does not support stream=true" in message
    assert [c.step for c in out.calls] == ["render", "prefill"]


def test_a_4xx_reply_leaves_retrying_to_the_sdks_and_keeps_the_workers_param() -> None:
    rejected = b'{"error": {"message": "no", "type": "NotFoundError", "param": "$.model"}}'
    out = _run(CHAT, _body("render-chat-request.json"), _worker(render=(404, {}, rejected)))
    assert out.status == 404
    assert "x-should-retry" not in out.headers
    assert (out.json()["error"]["type"], out.json()["error"]["param"]) == (
        "NotFoundError",
        "$.model",
    )
    refused = Exchange(GENERATE_PD, CHAT, {"x-request-id": "bad-1"}, b"[]").next_event()
    assert isinstance(refused, ClientReply)
    assert dict(refused.headers) == {"content-type": "application/json", "x-request-id": "bad-1"}


@pytest.mark.parametrize(
    "answer",
    [
        b'{"error": {"message": "no such model", "type": "NotFoundError"}}',  # vLLM, OpenAI
        b'{"error": "no such model"}',
        b'{"detail": "no such model"}',  # a FastAPI route's own
    ],
)
def test_a_workers_message_is_read_whatever_shape_its_error_came_in(answer: bytes) -> None:
    out = _run(CHAT, _body("render-chat-request.json"), _worker(prefill=(404, {}, answer)))
    assert out.json()["error"]["message"] == "prefill rejected the request: no such model"


@pytest.mark.parametrize("status", [101, 302])
def test_a_workers_1xx_or_3xx_is_a_contract_break(status: int) -> None:
    out = _run(CHAT, _body("render-chat-request.json"), _worker(prefill=(status, {}, b"")))
    assert out.status == 502
    assert out.headers["x-should-retry"] == "false"
    assert (
        out.json()["error"]["message"] == f"prefill broke the contract: it answered HTTP {status}"
    )


def test_a_workers_message_is_quoted_from_the_head_of_its_body_and_bounded() -> None:
    said = "x" * 1500
    long = json.dumps({"error": {"message": said}}).encode()
    out = _run(CHAT, _body("render-chat-request.json"), _worker(render=(400, {}, long)))
    assert out.json()["error"]["message"] == f"render rejected the request: {'x' * 1000}…"
    beyond = json.dumps({"error": {"message": "far"}, "pad": "p" * 64 * 1024}).encode()
    out = _run(CHAT, _body("render-chat-request.json"), _worker(render=(400, {}, beyond)))
    assert out.json()["error"]["message"] == "render rejected the request: HTTP 400"


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (404, "not_found_error"), (413, "request_too_large"),
     (429, "rate_limit_error"), (500, "api_error"), (503, "api_error")],
)  # fmt: skip
def test_anthropic_error_types_follow_anthropics_table(status: int, kind: str) -> None:
    worker = _worker(render=(status, {}, b'{"error": {"message": "no"}}'))
    out = _run("/v1/messages", _body("render-messages-request.json", tools=None), worker)
    assert out.status == (502 if status >= 500 else status)
    assert out.json() == {
        "type": "error",
        "error": {"type": kind, "message": out.json()["error"]["message"]},
    }


@pytest.mark.parametrize("step", ["render", "prefill", "decode"])
def test_a_workers_5xx_is_a_retryable_502(step: str) -> None:
    worker = _worker(**{step: (503, {}, b"upstream overloaded")})
    out = _run(CHAT, _body("render-chat-request.json"), worker)
    assert out.status == 502
    assert "x-should-retry" not in out.headers
    assert out.json()["error"]["message"].startswith(f"{step} failed with HTTP 503")


@pytest.mark.parametrize(
    ("answers", "param"),
    [
        ({"decode": (200, {}, b"<html>oops</html>")}, "$"),
        ({"decode": (200, {}, fixture_bytes("response-tokens.json"))}, None),  # no text mode
        ({"prefill": (200, {}, b'{"kv_transfer_params": null}')}, "$.kv_transfer_params"),
        ({"prefill": (200, {}, b'{"kv_transfer_params": [1]}')}, "$.kv_transfer_params"),
        ({"render": (200, {}, b"[]")}, "$"),
    ],
)
def test_an_answer_breaking_the_contract_is_a_502_the_sdks_will_not_retry(
    answers: dict[str, Any], param: str | None
) -> None:
    out = _run(CHAT, _body("render-chat-request.json"), _worker(**answers))
    assert out.status == 502
    assert out.headers["x-should-retry"] == "false"
    assert "broke the contract" in out.json()["error"]["message"]
    if param is not None:
        assert out.json()["error"]["param"] == param


def test_a_transport_failure_the_router_reports_is_a_retryable_502() -> None:
    ex = Exchange(GENERATE_PD, CHAT, {}, _body("render-chat-request.json"))
    call = ex.next_event()
    assert isinstance(call, WorkerCall)
    assert ex.worker_failed(call.step, "connect timeout") == b""
    reply = ex.next_event()
    assert isinstance(reply, ClientReply)
    assert reply.status == 502
    assert "x-should-retry" not in dict(reply.headers)
    assert json.loads(reply.body)["error"]["message"] == "render failed: connect timeout"


def test_a_pipeline_without_decode_is_refused() -> None:
    with pytest.raises(ConfigError, match="decode step is required"):
        Exchange(parse_pipeline_params({"prefill": {}}), CHAT, {}, b"{}")


def test_out_of_order_calls_are_a_library_error() -> None:
    ex = Exchange(GENERATE_PD, CHAT, {}, _body("render-chat-request.json"))
    with pytest.raises(ExchangeStateError):
        ex.feed(b"data: x\n\n")
    with pytest.raises(ExchangeStateError):
        ex.receive_stream_head(200, {})
    assert ex.next_event() is ex.next_event()


# ---- streams ----------------------------------------------------------------------------


def _stream_run(path: str, body: bytes, stream: Any, **answers: Any) -> Outcome:
    return _run(path, body, _worker(decode_body=stream, **answers))


def test_a_chat_stream_is_relayed_and_parses_with_the_sdk() -> None:
    out = _stream_run(CHAT, _body("render-chat-request.json", stream=True), [STREAM])
    assert out.streamed
    assert out.headers["content-type"] == "text/event-stream"
    assert out.call("decode").stream
    chunks = [openai.types.chat.ChatCompletionChunk.model_validate(c) for c in _events(out.body)]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello!"
    assert out.body.endswith(b"data: [DONE]\n\n")


def test_nothing_reaches_the_client_before_the_first_chunk_passed_its_checks() -> None:
    ex = Exchange(GENERATE_D, CHAT, {}, _body("render-chat-request.json", stream=True))
    ex.receive(200, {}, RENDER)
    assert isinstance(ex.next_event(), WorkerCall)
    ex.receive_stream_head(200, {})
    first, rest = STREAM[:40], STREAM[40:]
    assert ex.feed(first) == b""
    assert ex.next_event() is NEED_DATA
    # The first event completes: the head carries it and every event after it in this feed.
    assert ex.feed(rest) == b""
    head = ex.next_event()
    assert isinstance(head, ClientStream)
    assert head.status == 200
    assert dict(head.headers)["x-request-id"] == ex.request_id
    assert head.first.count(b"\n\n") > 1
    assert head.first.endswith(b"data: [DONE]\n\n")
    assert ex.end_of_stream() == b""


@pytest.mark.parametrize(
    "stream",
    [
        b'data: {"request_id": "r", "choices": []}\n\n',  # no echo: an old worker
        b"data: not json\n\n",
        b"",  # ends with nothing
    ],
)
def test_a_contract_break_before_the_first_token_is_a_clean_502(stream: bytes) -> None:
    out = _stream_run(CHAT, _body("render-chat-request.json", stream=True), [stream])
    assert not out.streamed
    assert out.status == 502
    assert out.headers["x-should-retry"] == "false"


def _after_first(stream: bytes) -> bytes:
    first = stream.split(b"\n\n")[0] + b"\n\n"
    return first + b"data: not json\n\n"


@pytest.mark.parametrize(
    ("path", "request_fixture", "render_fixture"),
    [
        (CHAT, "render-chat-request.json", "render-chat-response.json"),
        ("/v1/responses", "render-responses-request.json", "render-responses-response.json"),
        ("/v1/messages", "render-messages-request.json", "render-messages-response.json"),
    ],
)
def test_a_contract_break_after_the_stream_started_is_the_apis_error_event(
    path: str, request_fixture: str, render_fixture: str
) -> None:
    out = _stream_run(
        path,
        _body(request_fixture, stream=True, tools=None),
        [_after_first(STREAM)],
        render=(200, {}, fixture_bytes(render_fixture)),
    )
    assert out.streamed
    assert out.status == 200
    if path == CHAT:
        assert out.body.endswith(b"data: [DONE]\n\n")
        error = _events(out.body)[-1]["error"]
        assert error["code"] == 502
        assert "broke the contract" in error["message"]
    elif path == "/v1/responses":
        assert b"event: error\n" in out.body
        events = _events(out.body)
        assert events[-1]["type"] == "error"
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
    else:
        assert out.body.split(b"\n\n")[-2].startswith(b"event: error\n")
        assert _events(out.body)[-1]["error"]["type"] == "api_error"


def _over(ex: Exchange) -> bool:
    # A call, not the property: mypy would keep a property's value narrowed between asserts.
    return ex.reply_over


def test_reply_over_says_when_the_rest_of_the_worker_stream_can_be_closed() -> None:
    ex = Exchange(GENERATE_D, CHAT, {}, _body("render-chat-request.json", stream=True))
    assert not _over(ex)
    ex.receive(200, {}, RENDER)
    ex.receive_stream_head(200, {})
    assert not _over(ex)
    ex.feed(STREAM.split(b"\n\n")[0] + b"\n\n")
    assert isinstance(ex.next_event(), ClientStream)
    assert not _over(ex)  # the client's stream is running
    tail = ex.feed(b"data: not json\n\n" + STREAM)
    assert tail.endswith(b"data: [DONE]\n\n")  # the error event ends the client's stream
    assert _over(ex)  # so the router closes the worker's stream now
    assert ex.feed(STREAM) == b""
    assert ex.end_of_stream() == b""


def test_reply_over_once_a_whole_reply_or_an_ended_stream_is_known() -> None:
    whole = Exchange(GENERATE_D, CHAT, {}, _body("render-chat-request.json"))
    whole.receive(200, {}, RENDER)
    assert not _over(whole)
    whole.receive(200, {}, DECODE)
    assert isinstance(whole.next_event(), ClientReply)
    assert _over(whole)
    refused = Exchange(GENERATE_D, CHAT, {}, b"[]")
    assert isinstance(refused.next_event(), ClientReply)
    assert _over(refused)
    streamed = Exchange(GENERATE_D, CHAT, {}, _body("render-chat-request.json", stream=True))
    streamed.receive(200, {}, RENDER)
    streamed.receive_stream_head(200, {})
    streamed.feed(STREAM)
    assert not _over(streamed)  # [DONE] came, but the worker's stream has not ended
    streamed.end_of_stream()
    assert _over(streamed)


def test_a_transport_failure_mid_stream_ends_the_stream_with_an_error_event() -> None:
    ex = Exchange(GENERATE_D, CHAT, {}, _body("render-chat-request.json", stream=True))
    ex.receive(200, {}, RENDER)
    ex.receive_stream_head(200, {})
    ex.feed(STREAM.split(b"\n\n")[0] + b"\n\n")
    assert isinstance(ex.next_event(), ClientStream)
    tail = ex.worker_failed("decode", "connection reset")
    assert tail.endswith(b"data: [DONE]\n\n")
    assert _events(tail)[0]["error"]["message"] == "decode failed: connection reset"
    assert ex.feed(b"data: more\n\n") == b""
    assert ex.end_of_stream() == b""


def test_a_streamed_workers_error_status_is_a_clean_error_reply() -> None:
    error = iter([b'{"error": {"message": "bad', b' thing", "type": "BadRequestError"}}'])
    out = _run(
        CHAT,
        _body("render-chat-request.json", stream=True),
        _worker(decode=(400, {}, error)),
    )
    assert out.call("decode").stream
    assert not out.streamed
    assert out.status == 400
    assert out.json()["error"]["message"] == "decode rejected the request: bad thing"
    assert out.json()["error"]["type"] == "BadRequestError"


def test_the_worker_in_stream_error_is_passed_on() -> None:
    out = _stream_run(
        CHAT,
        _body("render-chat-request.json", stream=True),
        [load_stream("generate-stream-error.sse")],
    )
    assert out.streamed
    assert _events(out.body)[-1]["error"]["message"] == "Internal server error"


# ---- hooks ------------------------------------------------------------------------------


def test_hooks_run_on_each_leg_and_on_the_reply() -> None:
    seen: list[Step] = []

    def stamp(body: Any, context: TransformContext) -> dict[str, Any]:
        seen.append(context.step)
        return {**body, "priority": 3}

    def mark(body: Any, context: TransformContext) -> dict[str, Any]:
        del context
        return {**body, "system_fingerprint": "router"}

    hooks = Pipeline(request=[stamp], response=[mark])
    out = _run(CHAT, _body("render-chat-request.json"), _worker(), hooks=hooks)
    assert seen == [Step.PREFILL, Step.DECODE]
    assert out.leg("prefill")["priority"] == out.leg("decode")["priority"] == 3
    assert out.json()["system_fingerprint"] == "router"
    openai.types.chat.ChatCompletion.model_validate(out.json())


def test_a_hook_that_rejects_the_request_is_a_400() -> None:
    def refuse(body: Any, context: TransformContext) -> dict[str, Any]:
        del body, context
        msg = "$.model: not served here"
        raise RequestError(msg, param="$.model")

    out = _run(CHAT, _body("render-chat-request.json"), _worker(), hooks=Pipeline([refuse]))
    assert out.status == 400
    assert [c.step for c in out.calls] == ["render"]


def test_a_hooks_own_bug_is_its_status_hint_and_not_retried() -> None:
    def broken(body: Any, context: TransformContext) -> dict[str, Any]:
        del context
        return {**body, "tier": body["no-such-key"]}  # the host's bug: a KeyError

    out = _run(CHAT, _body("render-chat-request.json"), _worker(), hooks=Pipeline([broken]))
    assert out.status == 500
    assert out.headers["x-should-retry"] == "false"
    assert out.json()["error"]["type"] == "InternalServerError"
    assert "KeyError" in out.json()["error"]["message"]


def test_created_stamps_aside_a_stream_does_not_depend_on_how_it_was_split() -> None:
    body = _body("render-chat-request.json", stream=True)
    whole = _stream_run(CHAT, body, [STREAM])
    pieces = _stream_run(CHAT, body, [STREAM[i : i + 7] for i in range(0, len(STREAM), 7)])
    strip = re.compile(rb'"created":\d+')
    assert strip.sub(b"", whole.body) == strip.sub(b"", pieces.body)


# ---- encode -----------------------------------------------------------------------------

FEATURES = {
    "mm_hashes": {"image": ["h1"]},
    "mm_placeholders": {"image": [{"offset": 0, "length": 2}]},
    "kwargs_data": {"image": [None]},
}
WITH_ENCODE = parse_pipeline_params(
    {"encode": {}, "prefill": {}, "decode": {"wrap_chat_completion": True}},
    use_openai_format=False,
)


def test_encode_runs_when_the_rendered_prompt_has_features_and_hands_ec_params_to_prefill() -> None:
    rendered = {"token_ids": [1, 2, 3], "features": FEATURES, "sampling_params": {}}
    worker = _worker(render=(200, {}, json.dumps(rendered).encode()))
    answers = {"encode": b'{"ec_transfer_params": {"h1": {"host": "10.0.0.9"}}}'}

    def with_encode(method: str, path: str, headers: Any, body: bytes) -> Any:
        if json.loads(body).get("features") and "kv_transfer_params" not in json.loads(body):
            return (200, {}, answers["encode"])
        return worker(method, path, headers, body)

    out = _run(CHAT, _body("render-chat-request.json"), with_encode, config=WITH_ENCODE)
    assert [c.step for c in out.calls] == ["render", "encode", "prefill", "decode"]
    assert out.leg("encode")["sampling_params"]["max_tokens"] == 1
    assert out.leg("prefill")["ec_transfer_params"] == {"h1": {"host": "10.0.0.9"}}
    assert "ec_transfer_params" not in out.leg("decode")
    assert out.status == 200


@pytest.mark.parametrize("answer", [b"{}", b'{"ec_transfer_params": null}'])
def test_an_encode_answer_without_ec_params_hands_none_to_prefill(answer: bytes) -> None:
    rendered = {"token_ids": [1, 2, 3], "features": FEATURES, "sampling_params": {}}
    worker = _worker(render=(200, {}, json.dumps(rendered).encode()))

    def with_encode(method: str, path: str, headers: Any, body: bytes) -> Any:
        if json.loads(body).get("features") and "kv_transfer_params" not in json.loads(body):
            return (200, {}, answer)
        return worker(method, path, headers, body)

    out = _run(CHAT, _body("render-chat-request.json"), with_encode, config=WITH_ENCODE)
    assert [c.step for c in out.calls] == ["render", "encode", "prefill", "decode"]
    assert "ec_transfer_params" not in out.leg("prefill")
    assert out.status == 200


def test_encode_is_skipped_for_a_prompt_without_features() -> None:
    out = _run(CHAT, _body("render-chat-request.json"), _worker(), config=WITH_ENCODE)
    assert [c.step for c in out.calls] == ["render", "prefill", "decode"]


@pytest.mark.parametrize(
    ("config", "path", "body", "first_event"),
    [
        # A generate client: its own stream, each event checked and sent on.
        (
            GENERATE_D,
            "/inference/v1/generate",
            json.dumps({"token_ids": [1, 2, 3], "stream": True}).encode(),
            STREAM.split(b"\n\n")[0] + b"\n\n",
        ),
        # An OpenAI-format leg: the worker's own chat stream, passed through.
        (
            OPENAI_D,
            CHAT,
            _body("render-chat-request.json", stream=True),
            b"data: " + fixture_bytes("chat-completion-chunk-coupled.json") + b"\n\n",
        ),
    ],
)
def test_a_relayed_stream_ends_with_vllms_error_event_after_a_failure(
    config: Any, path: str, body: bytes, first_event: bytes
) -> None:
    # Streams the exchange relays without a converter end as vLLM ends its own: the OpenAI
    # error body with a 502 code, then [DONE].
    ex = Exchange(config, path, {}, body)
    assert isinstance(ex.next_event(), WorkerCall)
    ex.receive_stream_head(200, {})
    ex.feed(first_event)
    assert isinstance(ex.next_event(), ClientStream)
    tail = ex.worker_failed("decode", "connection reset")
    assert tail.endswith(b"data: [DONE]\n\n")
    error = _events(tail)[0]["error"]
    assert (error["code"], error["type"]) == (502, "BadGatewayError")
    assert error["message"] == "decode failed: connection reset"
    assert ex.reply_over


# ---- connectors --------------------------------------------------------------------------


def test_kv_shared_storage_gives_decode_the_two_flags_and_reads_no_prefill_answer() -> None:
    # Prefill's KV went to the shared storage: decode reads it there, whatever prefill answered.
    worker = _worker(prefill=(200, {}, b"not even JSON"))
    out = _run(
        CHAT,
        _body("render-chat-request.json"),
        worker,
        kv_connector=KvConnector.SHARED_STORAGE,
    )
    assert [c.step for c in out.calls] == ["render", "prefill", "decode"]
    flags = {"do_remote_decode": True, "do_remote_prefill": False}
    assert out.leg("prefill")["kv_transfer_params"] == flags
    shared = {"do_remote_decode": False, "do_remote_prefill": True}
    assert out.leg("decode")["kv_transfer_params"] == shared
    assert out.status == 200


def test_kv_nixl_is_the_default_and_hands_the_prefill_answers_params_to_decode() -> None:
    answer = b'{"kv_transfer_params": {"remote_host": "10.0.0.7"}}'
    for settings in ({}, {"kv_connector": KvConnector.NIXL}):
        out = _run(
            CHAT,
            _body("render-chat-request.json"),
            _worker(prefill=(200, {}, answer)),
            **settings,
        )
        assert out.leg("decode")["kv_transfer_params"] == {"remote_host": "10.0.0.7"}


def test_ec_shared_storage_puts_ec_params_on_no_leg() -> None:
    rendered = {"token_ids": [1, 2, 3], "features": FEATURES, "sampling_params": {}}
    worker = _worker(render=(200, {}, json.dumps(rendered).encode()))

    def with_encode(method: str, path: str, headers: Any, body: bytes) -> Any:
        if json.loads(body).get("features") and "kv_transfer_params" not in json.loads(body):
            return (200, {}, b'{"ec_transfer_params": {"h1": {"host": "10.0.0.9"}}}')
        return worker(method, path, headers, body)

    body = _body("render-chat-request.json")
    out = _run(CHAT, body, with_encode, config=WITH_ENCODE, ec_connector=EcConnector.SHARED_STORAGE)
    assert [c.step for c in out.calls] == ["render", "encode", "prefill", "decode"]
    assert not any("ec_transfer_params" in json.loads(call.body) for call in out.calls)
    assert out.status == 200

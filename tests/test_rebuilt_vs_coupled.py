"""The rebuilt envelope against vLLM's coupled serving: one request, two servers, one answer.

The same client request goes (a) through the exchange, render → prefill → decode on the generate
route with the chat wrap, its envelope rebuilt by the library, and (b) to the same simulated
vLLM 0.33 worker's coupled route (``/v1/chat/completions``, ``/v1/completions``,
``/v1/responses``, ``/v1/messages``), which answers as one vLLM server does (docs/testing.md).
Both are in process: the router through ``tests/simulated_router.py``, the worker through
``httpx.ASGITransport``. A client must not be able to tell the two apart, so the raw JSON body,
the raw SSE events (types in order, every key and value) and what each official SDK's own
accumulator yields are compared.

Only what must differ is normalised, each by a named rule below that says where it is
documented; JSON objects are compared as objects, and a whole chat or Responses answer's keys,
and each Responses event's, in order too, as vLLM dumps its models (``_same_layout``). Both
render the same prompt (``test_both_render_the_same_prompt``), so no token
count is normalised. The SDK objects are compared as a client reads them, an absent field and a
null one alike. Logprobs are compared on chat alone: the simulated coupled completions and Responses
routes write none (docs/testing.md).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, NamedTuple, TypeVar

import anthropic
import httpx
import httpx2
import openai
import pytest
from simulated_router import SimulatedRouter

from disagg_transforms import parse_pipeline_params
from disagg_transforms.testing import SimulatedWorker, WorkerSettings

CREATED: Final = 1796000000
REQUEST_ID: Final = "fid-1"
HEADERS: Final = {"x-request-id": REQUEST_ID}
MESSAGES: Final[list[Any]] = [{"role": "user", "content": "Hi"}]
CHAT: Final = "/v1/chat/completions"
COMPLETIONS: Final = "/v1/completions"
RESPONSES: Final = "/v1/responses"
MESSAGES_PATH: Final = "/v1/messages"
T = TypeVar("T")


ANSWER: Final = "Hello!"


def _settings(answer: str = ANSWER) -> WorkerSettings:
    return WorkerSettings(created=CREATED, answer=answer)


def _router(answer: str = ANSWER) -> SimulatedRouter:
    """The default pipeline: render, prefill, decode on the generate route, the chat wrap."""
    config = parse_pipeline_params(
        {"prefill": {}, "decode": {"wrap_chat_completion": True}}, use_openai_format=False
    )
    return SimulatedRouter(config, SimulatedWorker(_settings(answer)))


# ------------------------------------------------------------------ the two servers, raw


class Answer(NamedTuple):
    status: int
    content_type: str
    body: bytes


def _rebuilt(path: str, body: Mapping[str, Any], answer: str = ANSWER) -> Answer:
    router = _router(answer)
    with httpx.Client(transport=httpx.MockTransport(router), base_url="http://router") as http:
        reply = http.post(path, json=body, headers=HEADERS)
    return Answer(reply.status_code, reply.headers["content-type"], reply.content)


def _coupled(path: str, body: Mapping[str, Any], answer: str = ANSWER) -> Answer:
    async def post() -> Answer:
        transport = httpx.ASGITransport(app=SimulatedWorker(_settings(answer)))
        async with httpx.AsyncClient(transport=transport, base_url="http://worker") as http:
            reply = await http.post(path, json=body, headers=HEADERS)
            return Answer(reply.status_code, reply.headers["content-type"], reply.content)

    return asyncio.run(post())


def _data_events(sse: bytes) -> list[Any]:
    """A chat or completions stream: each ``data:`` JSON, then the ``[DONE]`` marker."""
    events: list[Any] = []
    for block in sse.decode().split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def _named_events(sse: bytes) -> list[Any]:
    """A Responses or Messages stream: each event's data, its ``event:`` line naming its type."""
    events: list[Any] = []
    for block in sse.decode().split("\n\n"):
        if not block:
            continue
        name, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        events.append(event)
    return events


def _parsed(path: str, answer: Answer, stream: bool) -> Any:
    assert answer.status == 200, answer.body
    if not stream:
        assert answer.content_type.startswith("application/json")
        return json.loads(answer.body)
    assert answer.content_type.startswith("text/event-stream")
    named = path in {RESPONSES, MESSAGES_PATH}
    return _named_events(answer.body) if named else _data_events(answer.body)


# ------------------------------------------------------------------ the named normalisations

ID_KEYS: Final = frozenset({"id", "item_id"})


def ids(value: Any) -> Any:
    """IDS: each server makes its own ids.

    vLLM's Responses ids are random (``resp_`` + ``random_uuid()``, its streamed items a bare
    ``random_uuid()`` unlike the final response's ``msg_`` items); the library derives every id
    from the request id (docs/envelopes.md, "Ids"), and its Messages id is ``msg_<base>`` where
    vLLM answers the chat id (pinned in ``test_the_ids_each_side_writes``).
    """
    if isinstance(value, dict):
        return {k: "<id>" if k in ID_KEYS else ids(v) for k, v in value.items()}
    if isinstance(value, list):
        return [ids(item) for item in value]
    return value


CREATED_KEYS: Final = frozenset({"created", "created_at"})


def created(value: Any) -> Any:
    """CREATED: a streamed generate leg carries no time; the converters read the router's clock.

    (docs/envelopes.md, "created"; a whole answer keeps the worker's and is not normalised.)
    """
    if isinstance(value, dict):
        return {k: 0 if k in CREATED_KEYS else created(v) for k, v in value.items()}
    if isinstance(value, list):
        return [created(item) for item in value]
    return value


def transfer_params(answer: Mapping[str, Any]) -> dict[str, Any]:
    """TRANSFER PARAMS: no client of the exchange sees ``kv_transfer_params``, null or not.

    They name internal hosts: the exchange removes them from an answer on the client's own route,
    and a rebuilt envelope never has them (docs/exchange.md, "Which reply"). vLLM's
    completions and Responses answers write ``kv_transfer_params: null``.
    """
    assert answer.get("kv_transfer_params") is None
    return {k: v for k, v in answer.items() if k not in TRANSFER_KEYS}


TRANSFER_KEYS: Final = frozenset({"kv_transfer_params", "ec_transfer_params"})


def response_objects(value: Any, rule: Callable[[Any], Any]) -> Any:
    """``rule`` applied to a Responses ``response`` (whole, or in each event that carries one)."""
    if isinstance(value, list):
        return [response_objects(event, rule) for event in value]
    if value.get("object") == "response":
        return rule(value)
    if isinstance(value.get("response"), dict):
        return {**value, "response": rule(value["response"])}
    return value


def stop_sequence(message: Mapping[str, Any]) -> dict[str, Any]:
    """STOP SEQUENCE: the rebuilt message reports a stop on a client's stop sequence as such.

    ``stop_reason: "stop_sequence"`` and the sequence (docs/envelopes.md, the ``stop_sequence``
    row); vLLM maps the finish reason alone (``stop_reason_map``: ``stop`` is ``end_turn``) and
    writes no ``stop_sequence``. Read back here as vLLM writes it. A message or a
    ``message_delta`` event.
    """
    holder = message.get("delta", message)
    if holder.get("stop_reason") != "stop_sequence":
        return dict(message)
    assert isinstance(holder.get("stop_sequence"), str)
    read = {**holder, "stop_reason": "end_turn"}
    if "delta" in message:
        return {**message, "delta": {**read, "stop_sequence": None}}
    del read["stop_sequence"]
    return read


def _same(rebuilt: Any, coupled: Any) -> None:
    """The two JSON values are equal; on failure the diff names the first differing path."""
    assert rebuilt == coupled, _first_difference(rebuilt, coupled, "$")


def _same_layout(rebuilt: Any, coupled: Any, path: str = "$") -> None:
    """Every object's keys in the same order: vLLM dumps its models in field order."""
    if isinstance(rebuilt, dict) and isinstance(coupled, dict):
        assert list(rebuilt) == list(coupled), path
        for key, value in rebuilt.items():
            _same_layout(value, coupled[key], f"{path}.{key}")
    elif isinstance(rebuilt, list) and isinstance(coupled, list):
        for index, (x, y) in enumerate(zip(rebuilt, coupled, strict=True)):
            _same_layout(x, y, f"{path}[{index}]")


def _first_difference(a: Any, b: Any, path: str) -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(a.keys() | b.keys()):
            if key not in a:
                return f"{path}.{key}: only coupled has it: {b[key]!r}"
            if key not in b:
                return f"{path}.{key}: only rebuilt has it: {a[key]!r}"
            if a[key] != b[key]:
                return _first_difference(a[key], b[key], f"{path}.{key}")
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items rebuilt, {len(b)} coupled"
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return _first_difference(x, y, f"{path}[{index}]")
    return f"{path}: rebuilt {a!r} != coupled {b!r}"


def _types(events: list[Any]) -> list[str]:
    return [event if isinstance(event, str) else event.get("type", "chunk") for event in events]


# ------------------------------------------------------------------ the cases

CAP = 3


class Case(NamedTuple):
    name: str
    body: dict[str, Any]


CHAT_CASES: Final = [
    Case("plain", {"model": "m", "messages": MESSAGES}),
    Case("cap", {"model": "m", "messages": MESSAGES, "max_tokens": CAP}),
    Case(
        "max_completion_tokens", {"model": "m", "messages": MESSAGES, "max_completion_tokens": CAP}
    ),
    Case("stop", {"model": "m", "messages": MESSAGES, "stop": ["l"]}),
    Case("stop-string", {"model": "m", "messages": MESSAGES, "stop": "lo"}),
    Case(
        "logprobs",
        {
            "model": "m",
            "messages": MESSAGES,
            "max_tokens": CAP,
            "logprobs": True,
            "top_logprobs": 2,
        },
    ),
    Case("logprobs-only", {"model": "m", "messages": MESSAGES, "logprobs": True}),
]
COMPLETION_CASES: Final = [
    Case("plain", {"model": "m", "prompt": "Hi"}),
    Case("cap", {"model": "m", "prompt": "Hi", "max_tokens": CAP}),
    Case("stop", {"model": "m", "prompt": "Hi", "stop": ["l"]}),
]
RESPONSES_CASES: Final = [
    Case("plain", {"model": "m", "input": "Hi"}),
    Case("cap", {"model": "m", "input": "Hi", "max_output_tokens": CAP}),
    # vLLM's Responses request takes ``stop`` (an extension); the openai SDK sends it as extra.
    Case("stop", {"model": "m", "input": "Hi", "stop": ["l"]}),
    Case("stop-held-back", {"model": "m", "input": "Hi", "stop": ["lo"]}),
    # Greedy: vLLM reports top_p 1.0, whatever the client sent.
    Case("greedy", {"model": "m", "input": "Hi", "temperature": 0, "top_p": 0.5}),
    Case(
        "settings",
        {
            "model": "m",
            "input": "Hi",
            "instructions": "Be brief.",
            "temperature": 0.5,
            "top_p": 0.9,
            "metadata": {"k": "v"},
            "user": "u1",
            "truncation": "auto",
            "service_tier": "default",
            "max_output_tokens": 64,
        },
    ),
]
MESSAGES_CASES: Final = [
    Case("plain", {"model": "m", "max_tokens": 64, "messages": MESSAGES}),
    Case("cap", {"model": "m", "max_tokens": CAP, "messages": MESSAGES}),
    Case("stop", {"model": "m", "max_tokens": 64, "messages": MESSAGES, "stop_sequences": ["l"]}),
    Case(
        "stop-held-back",
        {"model": "m", "max_tokens": 64, "messages": MESSAGES, "stop_sequences": ["lo"]},
    ),
]


def _cases(cases: list[Case]) -> list[Any]:
    return [
        pytest.param(case.body, stream, id=f"{case.name}-{'stream' if stream else 'whole'}")
        for case in cases
        for stream in (False, True)
    ]


def _both(
    path: str, body: Mapping[str, Any], stream: bool, answer: str = ANSWER
) -> tuple[Any, Any]:
    sent = {**body, "stream": True} if stream else dict(body)
    return (
        _parsed(path, _rebuilt(path, sent, answer), stream),
        _parsed(path, _coupled(path, sent, answer), stream),
    )


# ------------------------------------------------------------------ raw bodies and events


def test_both_render_the_same_prompt() -> None:
    # The prompt counts are compared as they are: the exchange renders on the worker's own
    # render route, the coupled route renders inside; the two prompts must be the same tokens.
    router = _router()
    with httpx.Client(transport=httpx.MockTransport(router), base_url="http://router") as http:
        http.post(CHAT, json={"model": "m", "messages": MESSAGES}, headers=HEADERS)
    decode = router.worker.calls_to("/inference/v1/generate")[-1].body
    coupled = json.loads(_coupled(CHAT, {"model": "m", "messages": MESSAGES}).body)
    assert len(decode["token_ids"]) == coupled["usage"]["prompt_tokens"] == 21


@pytest.mark.parametrize(("body", "stream"), _cases(CHAT_CASES))
def test_chat(body: dict[str, Any], stream: bool) -> None:
    if stream:
        body = {**body, "stream_options": {"include_usage": True}}
    rebuilt, coupled = _both(CHAT, body, stream)
    if not stream:
        coupled = transfer_params(coupled)
        _same(rebuilt, coupled)
        _same_layout(rebuilt, coupled)
        return
    assert _types(rebuilt) == _types(coupled)
    _same(created(rebuilt), created(coupled))


@pytest.mark.parametrize(("body", "stream"), _cases(COMPLETION_CASES))
def test_completions(body: dict[str, Any], stream: bool) -> None:
    # A completions client stays on /v1/completions (routes-and-config.md): its answer, relayed.
    rebuilt, coupled = _both(COMPLETIONS, body, stream)
    if not stream:
        _same(rebuilt, transfer_params(coupled))
        return
    assert _types(rebuilt) == _types(coupled)
    _same(rebuilt, coupled)


@pytest.mark.parametrize(("body", "stream"), _cases(RESPONSES_CASES))
def test_responses(body: dict[str, Any], stream: bool) -> None:
    rebuilt, coupled = _both(RESPONSES, body, stream)
    coupled = response_objects(coupled, transfer_params)
    if not stream:
        _same(ids(rebuilt), ids(coupled))
        _same_layout(rebuilt, coupled)
        return
    assert _types(rebuilt) == _types(coupled)
    _same(created(ids(rebuilt)), created(ids(coupled)))
    _same_layout(rebuilt, coupled)


@pytest.mark.parametrize(("body", "stream"), _cases(MESSAGES_CASES))
def test_messages(body: dict[str, Any], stream: bool) -> None:
    rebuilt, coupled = _both(MESSAGES_PATH, body, stream)
    if not stream:
        _same(ids(stop_sequence(rebuilt)), ids(coupled))
        return
    assert _types(rebuilt) == _types(coupled)
    _same(ids([stop_sequence(event) for event in rebuilt]), ids(coupled))


EMPTY: Final = [
    (CHAT, {"model": "m", "messages": MESSAGES}),
    (RESPONSES, {"model": "m", "input": "Hi"}),
    (MESSAGES_PATH, {"model": "m", "max_tokens": 64, "messages": MESSAGES}),
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(("path", "body"), EMPTY, ids=["chat", "responses", "messages"])
def test_an_empty_answer(path: str, body: dict[str, Any], stream: bool) -> None:
    # The model ends its turn at once: vLLM's Responses message item has no part (its stream
    # no item events), its Anthropic message no text block, its chat content "".
    rebuilt, coupled = _both(path, body, stream, answer="")
    if path == CHAT and not stream:
        coupled = transfer_params(coupled)
    if path == RESPONSES:
        coupled = response_objects(coupled, transfer_params)
    if stream:
        assert _types(rebuilt) == _types(coupled)
    _same(created(ids(rebuilt)), created(ids(coupled)))


def test_the_stop_sequence_each_side_reports() -> None:
    # What STOP SEQUENCE normalises, stated.
    body = {"model": "m", "max_tokens": 64, "messages": MESSAGES, "stop_sequences": ["l"]}
    rebuilt = json.loads(_rebuilt(MESSAGES_PATH, body).body)
    coupled = json.loads(_coupled(MESSAGES_PATH, body).body)
    assert (rebuilt["stop_reason"], rebuilt["stop_sequence"]) == ("stop_sequence", "l")
    assert coupled["stop_reason"] == "end_turn"
    assert "stop_sequence" not in coupled
    assert rebuilt["content"] == coupled["content"] == [{"type": "text", "text": "He"}]


def test_the_ids_each_side_writes() -> None:
    # What IDS normalises, stated: the rebuilt ids come from the request id by the wraps' rules
    # (docs/envelopes.md); vLLM's Responses ids are random and its Messages id is the chat id.
    body = {"model": "m", "max_tokens": 64, "messages": MESSAGES}
    assert json.loads(_rebuilt(MESSAGES_PATH, body).body)["id"] == f"msg_{REQUEST_ID}"
    assert json.loads(_coupled(MESSAGES_PATH, body).body)["id"] == f"chatcmpl-{REQUEST_ID}"
    rebuilt = json.loads(_rebuilt(RESPONSES, {"model": "m", "input": "Hi"}).body)
    coupled = json.loads(_coupled(RESPONSES, {"model": "m", "input": "Hi"}).body)
    assert (rebuilt["id"], rebuilt["output"][0]["id"]) == (
        f"resp_{REQUEST_ID}",
        f"msg_{REQUEST_ID}",
    )
    assert coupled["id"].startswith("resp_")
    assert coupled["output"][0]["id"].startswith("msg_")


# ------------------------------------------------------------------ the SDKs' own view


def _rebuilt_openai() -> openai.OpenAI:
    http = httpx2.Client(transport=httpx2.MockTransport(_router()))
    return openai.OpenAI(base_url="http://router/v1", api_key="k", http_client=http, max_retries=0)


def _rebuilt_anthropic() -> anthropic.Anthropic:
    http = httpx2.Client(transport=httpx2.MockTransport(_router()))
    return anthropic.Anthropic(
        base_url="http://router", api_key="k", http_client=http, max_retries=0
    )


def _coupled_sdk(call: Callable[[openai.AsyncOpenAI, anthropic.AsyncAnthropic], Awaitable[T]]) -> T:
    async def run() -> T:
        transport = httpx2.ASGITransport(app=SimulatedWorker(_settings()))
        async with httpx2.AsyncClient(transport=transport, base_url="http://worker") as http:
            oai = openai.AsyncOpenAI(
                base_url="http://worker/v1", api_key="k", http_client=http, max_retries=0
            )
            ant = anthropic.AsyncAnthropic(
                base_url="http://worker", api_key="k", http_client=http, max_retries=0
            )
            return await call(oai, ant)

    return asyncio.run(run())


def _sdk_view(model: Any) -> Any:
    """SDK VIEW: what a client reads through the SDK's model: an absent field reads as null."""
    return created(ids(model.model_dump(exclude_none=True)))


@pytest.mark.parametrize("case", CHAT_CASES, ids=[case.name for case in CHAT_CASES])
def test_chat_sdk_objects(case: Case) -> None:
    body = case.body
    whole = _rebuilt_openai().chat.completions.create(**body, extra_headers=HEADERS)
    final: Any
    with _rebuilt_openai().chat.completions.stream(**body, extra_headers=HEADERS) as stream:
        try:
            final = stream.get_final_completion()
        except openai.LengthFinishReasonError as cut:
            final = cut.completion  # the helper refuses to parse a cut answer, on both sides

    async def coupled(client: openai.AsyncOpenAI, _: anthropic.AsyncAnthropic) -> tuple[Any, Any]:
        whole = await client.chat.completions.create(**body, extra_headers=HEADERS)
        async with client.chat.completions.stream(**body, extra_headers=HEADERS) as stream:
            try:
                return whole, await stream.get_final_completion()
            except openai.LengthFinishReasonError as cut:
                return whole, cut.completion

    coupled_whole, coupled_final = _coupled_sdk(coupled)
    _same(_sdk_view(whole), _sdk_view(coupled_whole))
    _same(_sdk_view(final), _sdk_view(coupled_final))


@pytest.mark.parametrize("case", COMPLETION_CASES, ids=[case.name for case in COMPLETION_CASES])
def test_completions_sdk_chunks(case: Case) -> None:
    body = case.body
    chunks = list(_rebuilt_openai().completions.create(**body, stream=True, extra_headers=HEADERS))

    async def coupled(client: openai.AsyncOpenAI, _: anthropic.AsyncAnthropic) -> list[Any]:
        stream = await client.completions.create(**body, stream=True, extra_headers=HEADERS)
        return [chunk async for chunk in stream]

    _same([_sdk_view(c) for c in chunks], [_sdk_view(c) for c in _coupled_sdk(coupled)])
    text = "".join(choice.text for chunk in chunks for choice in chunk.choices)
    assert text in {"Hello!", "Hel", "He"}


@pytest.mark.parametrize("case", RESPONSES_CASES, ids=[case.name for case in RESPONSES_CASES])
def test_responses_sdk_objects(case: Case) -> None:
    body = dict(case.body)
    extra = {"stop": body.pop("stop")} if "stop" in body else None
    whole = _rebuilt_openai().responses.create(**body, extra_body=extra, extra_headers=HEADERS)
    # The terminal event's response: the SDK's get_final_response() reads response.completed
    # alone, and vLLM 0.33 ends an incomplete response with response.incomplete.
    with _rebuilt_openai().responses.stream(
        **body, extra_body=extra, extra_headers=HEADERS
    ) as stream:
        final = list(stream)[-1].response  # type: ignore[union-attr]

    async def coupled(client: openai.AsyncOpenAI, _: anthropic.AsyncAnthropic) -> tuple[Any, Any]:
        whole = await client.responses.create(**body, extra_body=extra, extra_headers=HEADERS)
        async with client.responses.stream(
            **body, extra_body=extra, extra_headers=HEADERS
        ) as stream:
            events = [event async for event in stream]
            return whole, events[-1].response  # type: ignore[union-attr]

    coupled_whole, coupled_final = _coupled_sdk(coupled)
    for rebuilt, vllm in ((whole, coupled_whole), (final, coupled_final)):
        _same(_sdk_view(rebuilt), _sdk_view(vllm))
    assert whole.output_text == final.output_text == coupled_final.output_text


@pytest.mark.parametrize("case", MESSAGES_CASES, ids=[case.name for case in MESSAGES_CASES])
def test_messages_sdk_objects(case: Case) -> None:
    body = case.body
    whole = _rebuilt_anthropic().messages.create(**body, extra_headers=HEADERS)
    with _rebuilt_anthropic().messages.stream(**body, extra_headers=HEADERS) as stream:
        final = stream.get_final_message()

    async def coupled(_: openai.AsyncOpenAI, client: anthropic.AsyncAnthropic) -> tuple[Any, Any]:
        whole = await client.messages.create(**body, extra_headers=HEADERS)
        async with client.messages.stream(**body, extra_headers=HEADERS) as stream:
            return whole, await stream.get_final_message()

    coupled_whole, coupled_final = _coupled_sdk(coupled)
    for rebuilt, vllm in ((whole, coupled_whole), (final, coupled_final)):
        _same(stop_sequence(_sdk_view(rebuilt)), _sdk_view(vllm))

"""The LiteLLM provider driving the exchange, through real ``litellm`` against simulated workers.

The workers are ``disagg_transforms.testing.SimulatedWorker`` apps served in process: a prefill
worker and a decode worker (which also renders), picked by the request's host. Async calls use
``httpx.ASGITransport``; sync calls a ``MockTransport`` that runs the app in a thread of its own.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import re
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import LITELLM_WARNINGS, TIMEOUT, WEATHER_TOOLS
from helpers import run_bounded as run

# LiteLLM fetches its model-cost map at import time unless told not to; there is no network.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
litellm = pytest.importorskip("litellm")
yaml = pytest.importorskip("yaml")

from litellm.llms.custom_llm import CustomLLMError  # noqa: E402

from disagg_transforms import DecodeParams, OutputMode  # noqa: E402
from disagg_transforms.integrations.litellm import (  # noqa: E402
    VllmGenerateLLM,
    auto_provider,
    text_provider,
)
from disagg_transforms.testing import SimulatedWorker, WorkerSettings  # noqa: E402

pytestmark = LITELLM_WARNINGS

DECODE = "http://decode.test"
PREFILL = "http://prefill.test"
GENERATE = "/inference/v1/generate"
RENDER = "/v1/chat/completions/render"
MESSAGES = [{"role": "user", "content": "Hi"}]
KV_REQUEST = {"do_remote_decode": True, "do_remote_prefill": False}
# The real classes: a test below replaces the module's names to count the clients opened.
REAL_CLIENT, REAL_ASYNC_CLIENT = httpx.Client, httpx.AsyncClient
DOCS = Path(__file__).resolve().parent.parent / "docs" / "litellm.md"


class Workers:
    """A decode and a prefill worker, reachable as ``DECODE`` and ``PREFILL``."""

    def __init__(self) -> None:
        self.decode = SimulatedWorker(WorkerSettings(model="qwen"))
        self.prefill = SimulatedWorker(WorkerSettings(model="qwen", engine_id="prefill-engine"))
        self._apps = {"decode.test": self.decode, "prefill.test": self.prefill}

    def async_transport(self) -> httpx.AsyncBaseTransport:
        apps = {host: httpx.ASGITransport(app=app) for host, app in self._apps.items()}

        class ByHost(httpx.AsyncBaseTransport):
            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                return await apps[request.url.host].handle_async_request(request)

        return ByHost()

    def sync_transport(self) -> httpx.BaseTransport:
        transport = self.async_transport()

        async def answer(request: httpx.Request) -> tuple[int, Any, bytes]:
            async with REAL_ASYNC_CLIENT(transport=transport) as http:
                sent = http.build_request(
                    request.method, request.url, headers=request.headers, content=request.content
                )
                got = await http.send(sent)
                return got.status_code, got.headers.raw, got.content

        def handle(request: httpx.Request) -> httpx.Response:
            request.read()
            # Its own thread, so it runs whether or not the caller has an event loop running.
            with ThreadPoolExecutor(1) as pool:
                status, headers, body = pool.submit(asyncio.run, answer(request)).result()
            return httpx.Response(status, headers=headers, content=body)

        return httpx.MockTransport(handle)

    def provider(self, **kwargs: Any) -> VllmGenerateLLM:
        return VllmGenerateLLM(
            http_client=REAL_CLIENT(transport=self.sync_transport()),
            async_http_client=REAL_ASYNC_CLIENT(transport=self.async_transport()),
            **kwargs,
        )


DERENDER = DecodeParams(use_openai_format=False, output_mode=OutputMode.DERENDER)
TEXT = DecodeParams(use_openai_format=False, output_mode=OutputMode.TEXT)


@pytest.fixture
def workers(monkeypatch: pytest.MonkeyPatch) -> Iterator[Workers]:
    pool = Workers()
    handlers = {
        "pd-text": pool.provider(prefill_api_base=PREFILL, params=TEXT),
        "pd-derender": pool.provider(prefill_api_base=PREFILL, params=DERENDER),
        "pd-auto": pool.provider(prefill_api_base=PREFILL, params=auto_provider.params),
        "text": pool.provider(params=TEXT),
    }
    monkeypatch.setattr(
        litellm,
        "custom_provider_map",
        [{"provider": name, "custom_handler": h} for name, h in handlers.items()],
    )
    monkeypatch.setattr(litellm, "callbacks", [])
    yield pool
    for handler in handlers.values():
        handler.close()


def complete(model: str, **kwargs: Any) -> Any:
    kwargs = {"messages": MESSAGES, "api_base": DECODE, "timeout": TIMEOUT, **kwargs}
    return run(litellm.acompletion(model=model, **kwargs))


def stream(model: str, **kwargs: Any) -> list[Any]:
    async def go() -> list[Any]:
        chunks = await litellm.acompletion(
            model=model, messages=MESSAGES, api_base=DECODE, timeout=TIMEOUT, stream=True, **kwargs
        )
        return [chunk async for chunk in chunks]

    return run(go())


def assert_prefill_then_decode(workers: Workers, *, cap: int, stream: bool) -> None:
    """Render once, prefill with one token and the kv flags, decode with the cap and its kv."""
    decode_calls = workers.decode.calls
    prefill_calls = workers.prefill.calls
    assert [call.path for call in decode_calls] == [RENDER, GENERATE]
    assert [call.path for call in prefill_calls] == [GENERATE]
    [prefill] = prefill_calls
    decode = decode_calls[1]
    assert prefill.body["sampling_params"]["max_tokens"] == 1
    assert prefill.body["kv_transfer_params"] == KV_REQUEST
    assert prefill.body["stream"] is False
    assert decode.body["sampling_params"]["max_tokens"] == cap
    assert decode.body["stream"] is stream
    kv = decode.body["kv_transfer_params"]
    assert kv["do_remote_prefill"] is True
    assert kv["remote_engine_id"] == "prefill-engine"  # what the prefill worker answered
    [request_id] = {call.headers["x-request-id"] for call in [*decode_calls, *prefill_calls]}
    assert request_id in kv["remote_request_id"]


def test_prefill_then_decode_in_text_mode() -> None:
    pool = Workers()
    with pytest.MonkeyPatch.context() as patch:
        provider = pool.provider(prefill_api_base=PREFILL, params=TEXT)
        patch.setattr(
            litellm, "custom_provider_map", [{"provider": "pd", "custom_handler": provider}]
        )
        response = complete("pd/qwen", max_tokens=40, extra_headers={"x-request-id": "req-7"})
    assert response.choices[0].message.content == "Hello!"
    assert response.choices[0].finish_reason == "stop"
    assert response.usage.completion_tokens > 0
    assert_prefill_then_decode(pool, cap=40, stream=False)
    assert pool.decode.calls[0].headers["x-request-id"] == "req-7"
    assert pool.decode.calls[1].body["output_mode"] == "text"


def test_derender_answers_tool_calls_reasoning_and_usage(workers: Workers) -> None:
    response = complete("pd-derender/qwen", tools=WEATHER_TOOLS, max_completion_tokens=400)
    message = response.choices[0].message
    assert response.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls[0].function.name == "get_weather"
    assert message.reasoning_content == "The user greets me."
    assert response.usage.prompt_tokens > 0
    assert response.usage.completion_tokens > 0
    assert_prefill_then_decode(workers, cap=400, stream=False)
    assert workers.decode.calls[1].body["output_mode"] == "derender"


def test_text_stream_with_usage(workers: Workers) -> None:
    chunks = stream("pd-text/qwen", max_tokens=30, stream_options={"include_usage": True})
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == "Hello!"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    usage = [chunk.usage for chunk in chunks if getattr(chunk, "usage", None)]
    assert usage
    assert usage[-1].completion_tokens > 0
    assert_prefill_then_decode(workers, cap=30, stream=True)


def test_derender_stream_is_one_single_frame(workers: Workers) -> None:
    chunks = stream("pd-derender/qwen", tools=WEATHER_TOOLS, max_tokens=400)
    calls = [
        c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or []
    ]
    assert [call.function.name for call in calls if call.function.name] == ["get_weather"]
    # A GenericStreamingChunk has no reasoning field: it travels in provider_specific_fields.
    reasoning = [
        (chunk.choices[0].delta.provider_specific_fields or {}).get("reasoning_content")
        for chunk in chunks
        if chunk.choices
    ]
    assert "The user greets me." in reasoning
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert_prefill_then_decode(workers, cap=400, stream=False)  # vLLM 0.33: no derender stream


def test_the_default_provider_is_auto_and_text_provider_stays_text() -> None:
    assert VllmGenerateLLM().params.output_mode is OutputMode.AUTO
    assert auto_provider.params.output_mode is OutputMode.AUTO
    assert text_provider.params.output_mode is OutputMode.TEXT


def test_auto_streams_text_token_by_token_without_reasoning(workers: Workers) -> None:
    chunks = stream("pd-auto/qwen", max_tokens=30)
    deltas = [chunk.choices[0].delta.content for chunk in chunks if chunk.choices]
    assert "".join(delta or "" for delta in deltas) == "Hello!"
    assert len([delta for delta in deltas if delta]) == len("Hello!")  # one per token
    assert not [
        chunk
        for chunk in chunks
        if chunk.choices and (chunk.choices[0].delta.provider_specific_fields or {})
    ]
    assert_prefill_then_decode(workers, cap=30, stream=True)
    assert workers.decode.calls[1].body["output_mode"] == "text"
    message = complete("pd-auto/qwen", max_tokens=30).choices[0].message
    assert message.content == "Hello!"
    assert getattr(message, "reasoning_content", None) is None


def test_auto_answers_tool_calls_plain_and_streamed(workers: Workers) -> None:
    response = complete("pd-auto/qwen", tools=WEATHER_TOOLS, max_tokens=400)
    assert response.choices[0].finish_reason == "tool_calls"
    assert response.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert workers.decode.calls[1].body["output_mode"] == "derender"
    chunks = stream("pd-auto/qwen", tools=WEATHER_TOOLS, max_tokens=400)
    calls = [
        c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or []
    ]
    assert [call.function.name for call in calls if call.function.name] == ["get_weather"]


@pytest.mark.usefixtures("workers")
def test_auto_anthropic_messages_get_no_thinking_block() -> None:
    message = run(
        litellm.anthropic_messages(
            model="pd-auto/qwen", messages=MESSAGES, max_tokens=50, api_base=DECODE
        )
    )
    assert [block["type"] for block in message["content"]] == ["text"]
    assert message["content"][0]["text"] == "Hello!"


def test_sync_completion_and_streaming(workers: Workers) -> None:
    response = litellm.completion(
        model="pd-text/qwen", messages=MESSAGES, api_base=DECODE, timeout=TIMEOUT, max_tokens=20
    )
    assert response.choices[0].message.content == "Hello!"
    assert_prefill_then_decode(workers, cap=20, stream=False)
    chunks = litellm.completion(
        model="text/qwen", messages=MESSAGES, api_base=DECODE, timeout=TIMEOUT, stream=True
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == "Hello!"


@pytest.mark.usefixtures("workers")
@pytest.mark.parametrize("streamed", [False, True])
def test_a_worker_without_the_echo_is_a_502(streamed: bool) -> None:
    call = stream if streamed else complete
    with pytest.raises(Exception) as caught:  # noqa: PT011 - LiteLLM picks the class
        call("pd-text/qwen", extra_headers={"x-simulate-fault": "no-output-mode"})
    assert getattr(caught.value, "status_code", None) == 502
    message = str(caught.value)
    assert "decode broke the contract" in message
    assert 'requested "text"' in message
    assert "vLLM >= 0.32.0" in message


@pytest.mark.parametrize(
    ("fault", "status", "says"),
    [
        ("http-500", 502, "render failed with HTTP 500"),
        ("not-json", 502, "render broke the contract"),
    ],
)
@pytest.mark.usefixtures("workers")
def test_worker_faults_keep_the_exchange_status(fault: str, status: int, says: str) -> None:
    with pytest.raises(Exception) as caught:  # noqa: PT011 - LiteLLM picks the class
        complete("pd-text/qwen", extra_headers={"x-simulate-fault": fault}, num_retries=0)
    assert getattr(caught.value, "status_code", None) == status
    assert says in str(caught.value)


@pytest.mark.usefixtures("workers")
def test_an_error_after_the_stream_started_ends_it() -> None:
    with pytest.raises(Exception) as caught:  # noqa: PT011 - LiteLLM picks the class
        stream("text/qwen", extra_headers={"x-simulate-fault": "stream-error"})
    # vLLM's own in-stream error event, relayed by the exchange: its code is the status.
    assert getattr(caught.value, "status_code", None) == 500
    assert "Internal server error" in str(caught.value)


def test_a_bad_cap_is_a_400_and_no_worker_is_called(workers: Workers) -> None:
    with pytest.raises(Exception) as caught:  # noqa: PT011 - LiteLLM picks the class
        complete("pd-text/qwen", max_tokens=0)
    assert getattr(caught.value, "status_code", None) == 400
    assert "max_tokens" in str(caught.value)
    assert workers.decode.calls == workers.prefill.calls == []


def test_tools_on_a_text_provider_are_a_400_and_no_worker_is_called(workers: Workers) -> None:
    # Text mode cannot return tool calls: refused before any call (docs/litellm.md).
    with pytest.raises(Exception) as caught:  # noqa: PT011 - LiteLLM picks the class
        complete("pd-text/qwen", tools=WEATHER_TOOLS)
    assert getattr(caught.value, "status_code", None) == 400
    assert "output_mode: auto (or derender)" in str(caught.value)
    assert workers.decode.calls == workers.prefill.calls == []


def test_the_prefill_url_never_comes_from_the_request(workers: Workers) -> None:
    with pytest.raises(Exception) as caught:  # noqa: PT011 - LiteLLM picks the class
        complete("text/qwen", prefill_api_base="http://evil.test")
    assert getattr(caught.value, "status_code", None) == 400
    assert "prefill_api_base" in str(caught.value)
    assert workers.decode.calls == []


def test_the_deployment_model_info_names_the_prefill_worker(workers: Workers) -> None:
    router = litellm.Router(
        model_list=[
            {
                "model_name": "qwen",
                "litellm_params": {"model": "text/qwen", "api_base": DECODE},
                "model_info": {"prefill_api_base": PREFILL},
            }
        ]
    )
    response = run(router.acompletion(model="qwen", messages=MESSAGES, max_tokens=12))
    assert response.choices[0].message.content == "Hello!"
    assert_prefill_then_decode(workers, cap=12, stream=False)


def test_litellm_responses_reach_the_provider_as_chat(workers: Workers) -> None:
    response = litellm.responses(
        model="pd-text/qwen", input="Hi", api_base=DECODE, max_output_tokens=25, timeout=TIMEOUT
    )
    texts = [
        part.text for item in response.output if item.type == "message" for part in item.content
    ]
    assert texts == ["Hello!"]
    assert_prefill_then_decode(workers, cap=25, stream=False)
    # LiteLLM called the provider with a chat body: the chat render, never the Responses one.
    assert workers.decode.calls[0].body["messages"] == [{"role": "user", "content": "Hi"}]


def test_litellm_anthropic_messages_reach_the_provider_as_chat(workers: Workers) -> None:
    message = run(
        litellm.anthropic_messages(
            model="pd-derender/qwen", messages=MESSAGES, max_tokens=50, api_base=DECODE
        )
    )
    kinds = [block["type"] for block in message["content"]]
    assert kinds == ["thinking", "text"]
    assert message["content"][1]["text"] == "Hello!"
    assert message["stop_reason"] == "end_turn"
    assert_prefill_then_decode(workers, cap=50, stream=False)


# --- LiteLLM's call signature ---------------------------------------------------------------

ENTRY_POINTS = ["completion", "acompletion", "streaming", "astreaming"]


def answer_of(result: Any) -> Any:
    """An entry point's result, awaited or iterated to its end as LiteLLM does."""
    if inspect.isawaitable(result):
        return run(result)
    if isinstance(result, AsyncIterator):
        stream = result

        async def drain() -> list[Any]:
            return [item async for item in stream]

        return run(drain())
    return list(result) if isinstance(result, Iterator) else result


def text_of(answer: Any) -> str:
    if isinstance(answer, list):  # GenericStreamingChunks
        return "".join(chunk["text"] for chunk in answer)
    return str(answer.choices[0].message.content)


def call_kwargs(**kwargs: Any) -> dict[str, Any]:
    """An entry point's arguments, by keyword as LiteLLM passes them."""
    return {
        "model": "qwen",
        "messages": MESSAGES,
        "api_base": DECODE,
        "custom_prompt_dict": {},
        "model_response": litellm.ModelResponse(),
        "print_verbose": print,
        "encoding": None,
        "api_key": None,
        "logging_obj": None,
        "optional_params": {},
        "timeout": TIMEOUT,
        **kwargs,
    }


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_an_entry_point_called_positionally_binds_customllm_order(entry: str) -> None:
    pool = Workers()
    provider = pool.provider()
    args = [
        "qwen",  # model
        MESSAGES,  # messages
        DECODE,  # api_base
        {},  # custom_prompt_dict
        litellm.ModelResponse(),  # model_response
        print,  # print_verbose
        None,  # encoding
        None,  # api_key
        None,  # logging_obj
        {"max_tokens": 21},  # optional_params
        None,  # acompletion
        {},  # litellm_params
        None,  # logger_fn
        {"x-request-id": "req-p"},  # headers
        TIMEOUT,  # timeout
        None,  # client
    ]
    assert text_of(answer_of(getattr(provider, entry)(*args))) == "Hello!"
    render, generate = pool.decode.calls
    assert render.headers["x-request-id"] == "req-p"
    assert generate.body["sampling_params"]["max_tokens"] == 21
    assert generate.body["stream"] is entry.endswith("streaming")
    provider.close()


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize(
    ("missing", "extra", "says"),
    [
        ("optional_params", {}, "missing 1 required positional argument: 'optional_params'"),
        ("model", {}, "missing 1 required positional argument: 'model'"),
        (None, {"stream": True}, "unexpected keyword argument 'stream'"),
    ],
)
def test_a_missing_or_unknown_argument_is_a_type_error(
    entry: str, missing: str | None, extra: dict[str, Any], says: str
) -> None:
    pool = Workers()
    provider = pool.provider()
    kwargs = {k: v for k, v in call_kwargs(**extra).items() if k != missing}
    with pytest.raises(TypeError, match=re.escape(says)):
        answer_of(getattr(provider, entry)(**kwargs))
    assert pool.decode.calls == []
    provider.close()


# --- transport failures -------------------------------------------------------------------


def refused(request: httpx.Request) -> httpx.Response:
    msg = "refused"
    raise httpx.ConnectError(msg, request=request)


def timed_out(request: httpx.Request) -> httpx.Response:
    msg = "no answer in time"
    raise httpx.ReadTimeout(msg, request=request)


class AsyncFailing(httpx.AsyncBaseTransport):
    def __init__(self, fail: Callable[[httpx.Request], httpx.Response]) -> None:
        self._fail = fail

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return self._fail(request)


@pytest.mark.parametrize(
    ("fail", "status", "says"),
    [
        (refused, 502, "render failed: could not connect to the worker"),
        (timed_out, 504, "render failed: no answer within the timeout"),  # a retryable 504
    ],
)
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_an_unreachable_or_timed_out_worker_is_a_5xx_naming_the_step(
    entry: str, fail: Callable[[httpx.Request], httpx.Response], status: int, says: str
) -> None:
    provider = VllmGenerateLLM(
        http_client=REAL_CLIENT(transport=httpx.MockTransport(fail)),
        async_http_client=REAL_ASYNC_CLIENT(transport=AsyncFailing(fail)),
    )
    with pytest.raises(CustomLLMError) as caught:
        answer_of(getattr(provider, entry)(**call_kwargs()))
    assert caught.value.status_code == status
    assert str(caught.value) == says


def test_a_transport_failure_names_no_address_to_the_client_and_logs_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def unreachable(request: httpx.Request) -> httpx.Response:
        msg = "Cannot connect to host 10.1.2.3:8206 ssl:default [Connection refused]"
        raise httpx.ConnectError(msg, request=request)

    provider = VllmGenerateLLM(http_client=REAL_CLIENT(transport=httpx.MockTransport(unreachable)))
    with (
        caplog.at_level("WARNING", logger="disagg_transforms.litellm"),
        pytest.raises(CustomLLMError) as caught,
    ):
        answer_of(provider.completion(**call_kwargs()))
    assert str(caught.value) == "render failed: could not connect to the worker"
    assert "10.1.2.3" in caplog.text
    assert "ConnectError" in caplog.text


class BrokenStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """The first ``keep`` bytes of a worker's stream, then a reset connection."""

    def __init__(self, body: bytes, keep: int) -> None:
        self._head = body[:keep]

    def __iter__(self) -> Iterator[bytes]:
        yield self._head
        msg = "reset"
        raise httpx.ReadError(msg)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._head
        msg = "reset"
        raise httpx.ReadError(msg)


def breaking_streams(pool: Workers, *, first_event: bool) -> VllmGenerateLLM:
    """A provider whose workers' streams break at once, or after their first event."""
    sync, async_ = pool.sync_transport(), pool.async_transport()

    def broken(answer: httpx.Response, body: bytes) -> httpx.Response:
        if not answer.headers["content-type"].startswith("text/event-stream"):
            return answer
        keep = body.index(b"\n\n") + 2 if first_event else 0
        headers = [(k, v) for k, v in answer.headers.items() if k != "content-length"]
        return httpx.Response(answer.status_code, headers=headers, stream=BrokenStream(body, keep))

    def handle(request: httpx.Request) -> httpx.Response:
        answer = sync.handle_request(request)
        return broken(answer, answer.read())

    class Async(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            answer = await async_.handle_async_request(request)
            return broken(answer, await answer.aread())

    return VllmGenerateLLM(
        http_client=REAL_CLIENT(transport=httpx.MockTransport(handle)),
        async_http_client=REAL_ASYNC_CLIENT(transport=Async()),
    )


def chunks_until_error(chunks: Any) -> tuple[list[Any], CustomLLMError]:
    """A streaming entry point's chunks up to the error that ended them, and that error."""
    got: list[Any] = []

    async def collect() -> None:
        async for chunk in chunks:
            got.append(chunk)  # noqa: PERF401 - the chunks before the error are the point

    try:
        if isinstance(chunks, AsyncIterator):
            run(collect())
        else:
            for chunk in chunks:
                got.append(chunk)  # noqa: PERF402 - as above
    except CustomLLMError as error:
        return got, error
    pytest.fail("the stream ended without an error")


@pytest.mark.parametrize("entry", ["streaming", "astreaming"])
# With the first event: the choice's opening chunk (empty text, as vLLM opens it), then "H".
@pytest.mark.parametrize(("first_event", "texts"), [(False, []), (True, ["", "H"])])
def test_a_decode_stream_broken_midway_is_a_502(
    entry: str, first_event: bool, texts: list[str]
) -> None:
    provider = breaking_streams(Workers(), first_event=first_event)
    got, error = chunks_until_error(getattr(provider, entry)(**call_kwargs()))
    assert [chunk["text"] for chunk in got] == texts  # the first event is relayed once it passed
    assert error.status_code == 502
    assert str(error) == "decode failed: connection reset"


# --- the shared client -----------------------------------------------------------------------


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every httpx client the provider opens on its own, over the simulated workers."""
    pool = Workers()
    made: list[Any] = []

    class Sync(httpx.Client):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(transport=pool.sync_transport(), **kwargs)
            made.append(self)

    class Async(httpx.AsyncClient):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(transport=pool.async_transport(), **kwargs)
            made.append(self)

    # The provider opens its clients through the httpx module: replace its classes there.
    monkeypatch.setattr(httpx, "Client", Sync)
    monkeypatch.setattr(httpx, "AsyncClient", Async)
    return made


def test_one_pooled_client_per_provider_and_close(
    opened: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = VllmGenerateLLM(prefill_api_base=PREFILL)
    monkeypatch.setattr(
        litellm, "custom_provider_map", [{"provider": "pd", "custom_handler": provider}]
    )

    async def three_calls() -> None:
        for _ in range(2):
            await litellm.acompletion(model="pd/qwen", messages=MESSAGES, api_base=DECODE)
        chunks = await litellm.acompletion(
            model="pd/qwen", messages=MESSAGES, api_base=DECODE, stream=True
        )
        assert [chunk async for chunk in chunks]
        await provider.aclose()

    run(three_calls())
    [async_client] = opened
    assert async_client.is_closed
    for _ in range(2):
        litellm.completion(model="pd/qwen", messages=MESSAGES, api_base=DECODE)
    assert len(opened) == 2
    sync_client = opened[1]
    provider.close()
    assert sync_client.is_closed
    litellm.completion(model="pd/qwen", messages=MESSAGES, api_base=DECODE)
    assert len(opened) == 3  # a call after close opens a new one
    provider.close()


def test_an_injected_client_is_used_and_left_open() -> None:
    pool = Workers()
    given = httpx.AsyncClient(transport=pool.async_transport())
    provider = VllmGenerateLLM(async_http_client=given)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            litellm, "custom_provider_map", [{"provider": "x", "custom_handler": provider}]
        )
        complete("x/qwen")
        run(provider.aclose())
    assert not given.is_closed
    assert [call.path for call in pool.decode.calls] == [RENDER, GENERATE]
    run(given.aclose())


# --- the proxy config of docs/litellm.md --------------------------------------------------------


def _doc_yaml() -> dict[str, Any]:
    [block] = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.DOTALL)
    config: dict[str, Any] = yaml.safe_load(block)
    return config


def _import(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_the_documented_proxy_config_names_importable_objects() -> None:
    config = _doc_yaml()
    settings = config["litellm_settings"]
    [entry] = settings["custom_provider_map"]
    assert isinstance(_import(entry["custom_handler"]), VllmGenerateLLM)
    for callback in settings["callbacks"]:
        assert isinstance(_import(callback), litellm.integrations.custom_logger.CustomLogger)
    for deployment in config["model_list"]:
        params = deployment["litellm_params"]
        assert params["model"].startswith(entry["provider"] + "/")
        assert params["api_base"].startswith("http")
        assert deployment["model_info"]["prefill_api_base"].startswith("http")


def test_the_documented_proxy_config_routes_through_a_litellm_router(
    workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _doc_yaml()
    [entry] = config["litellm_settings"]["custom_provider_map"]
    provider = workers.provider(params=_import(entry["custom_handler"]).params)
    monkeypatch.setattr(
        litellm,
        "custom_provider_map",
        [{"provider": entry["provider"], "custom_handler": provider}],
    )
    model_list = [
        {
            **deployment,
            "litellm_params": {**deployment["litellm_params"], "api_base": DECODE},
            "model_info": {"prefill_api_base": PREFILL},
        }
        for deployment in config["model_list"]
    ]
    router = litellm.Router(model_list=model_list)
    name = model_list[0]["model_name"]
    response = run(router.acompletion(model=name, messages=MESSAGES, max_tokens=9))
    assert response.choices[0].message.content == "Hello!"
    assert_prefill_then_decode(workers, cap=9, stream=False)
    # The recommended provider serves tools and streams text as it comes.
    tools = run(router.acompletion(model=name, messages=MESSAGES, tools=WEATHER_TOOLS))
    assert tools.choices[0].message.tool_calls[0].function.name == "get_weather"

    async def streamed() -> list[Any]:
        chunks = await router.acompletion(model=name, messages=MESSAGES, stream=True)
        return [chunk async for chunk in chunks]

    deltas = [chunk.choices[0].delta.content for chunk in run(streamed()) if chunk.choices]
    assert len([delta for delta in deltas if delta]) > 1
    provider.close()

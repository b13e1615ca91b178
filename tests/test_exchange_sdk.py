"""The official SDKs as clients of a router that runs the exchange (over httpx.MockTransport).

The router is a transport handler driving the exchange synchronously; workers are scripted
from the golden fixtures (a pluggable function, so the simulated worker drops in later).
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from exchange_driver import Worker, drive, fixture_bytes, scripted
from golden import load_stream

from disagg_transforms import parse_pipeline_params
from disagg_transforms.exchange import Exchange

CONFIG = parse_pipeline_params(
    {"prefill": {}, "decode": {"wrap_chat_completion": True}}, use_openai_format=False
)
STREAM = load_stream("generate-stream-usage.sse")


def _worker(render: str = "render-chat-response.json", **answers: Any) -> Worker:
    base: dict[str, Any] = {
        "render": (200, {}, fixture_bytes(render)),
        "prefill": (200, {}, fixture_bytes("generate-prefill-response.json")),
    }
    return scripted({**base, **answers})


class Router:
    """A transport handler running one exchange per request; counts what it served."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.requests = 0

    def __call__(self, request: Any) -> Any:
        self.requests += 1
        ex = Exchange(CONFIG, request.url.path, request.headers.raw, request.content)
        out = drive(ex, self.worker)
        http = httpx2 if isinstance(request, httpx2.Request) else httpx
        return http.Response(out.status, headers=out.headers, content=out.body)


def _decode(stream_or_whole: str) -> Any:
    if stream_or_whole == "stream":
        return (200, {}, [STREAM[i : i + 50] for i in range(0, len(STREAM), 50)])
    return (200, {}, fixture_bytes("generate-decode-response.json"))


def _openai(router: Router, retries: int = 0) -> openai.OpenAI:
    # The openai SDK speaks HTTP through httpx2, as the anthropic SDK does.
    http = httpx2.Client(transport=httpx2.MockTransport(router))
    return openai.OpenAI(
        base_url="http://router/v1", api_key="k", http_client=http, max_retries=retries
    )


def _anthropic(router: Router) -> anthropic.Anthropic:
    # The anthropic SDK speaks HTTP through httpx2.
    http = httpx2.Client(transport=httpx2.MockTransport(router))
    return anthropic.Anthropic(
        base_url="http://router", api_key="k", http_client=http, max_retries=0
    )


MESSAGES = [{"role": "user", "content": "Hi"}]


def test_openai_chat_completion() -> None:
    client = _openai(Router(_worker(decode=_decode("whole"))))
    completion = client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert completion.choices[0].message.content == "Hello!"
    assert completion.usage is not None


def test_openai_chat_stream_helper_accumulates_the_answer() -> None:
    client = _openai(Router(_worker(decode=_decode("stream"))))
    with client.chat.completions.stream(model="m", messages=MESSAGES) as stream:  # type: ignore[arg-type]
        final = stream.get_final_completion()
    assert final.choices[0].message.content == "Hello!"


def test_openai_responses_create_and_stream() -> None:
    router = Router(_worker(render="render-responses-response.json", decode=_decode("whole")))
    response = _openai(router).responses.create(model="m", input="Hi")
    assert response.output_text == "Hello!"
    router = Router(_worker(render="render-responses-response.json", decode=_decode("stream")))
    with _openai(router).responses.stream(model="m", input="Hi") as stream:
        final = stream.get_final_response()
    assert final.output_text == "Hello!"


def test_anthropic_messages_create_and_stream() -> None:
    router = Router(_worker(render="render-messages-response.json", decode=_decode("whole")))
    message = _anthropic(router).messages.create(model="m", max_tokens=64, messages=MESSAGES)  # type: ignore[arg-type]
    assert message.content[0].type == "text"
    assert message.content[0].text == "Hello!"
    router = Router(_worker(render="render-messages-response.json", decode=_decode("stream")))
    with _anthropic(router).messages.stream(
        model="m",
        max_tokens=64,
        messages=MESSAGES,  # type: ignore[arg-type]
    ) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "text"
    assert final.content[0].text == "Hello!"


def test_a_broken_worker_is_a_502_the_openai_sdk_does_not_retry() -> None:
    router = Router(_worker(decode=(200, {}, b"not json")))
    with pytest.raises(openai.APIStatusError) as caught:
        _openai(router, retries=2).chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert caught.value.status_code == 502
    assert router.requests == 1


def test_a_workers_5xx_is_a_502_the_openai_sdk_retries() -> None:
    router = Router(_worker(decode=(503, {}, b"")))
    with pytest.raises(openai.InternalServerError):
        _openai(router, retries=1).chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert router.requests == 2


def test_a_workers_400_reaches_the_anthropic_sdk_as_its_bad_request() -> None:
    error = b'{"error": {"message": "max_tokens too large", "type": "BadRequestError"}}'
    router = Router(_worker(render="render-messages-response.json", prefill=(400, {}, error)))
    with pytest.raises(anthropic.BadRequestError) as caught:
        _anthropic(router).messages.create(model="m", max_tokens=64, messages=MESSAGES)  # type: ignore[arg-type]
    assert "prefill rejected the request: max_tokens too large" in str(caught.value)
    assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]

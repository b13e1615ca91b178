"""What ``serve`` promises around a prefill: the client's cached-token count is the prefill's.

Workers are ``disagg-transforms simulate`` processes (with vLLM's
``--enable-prompt-tokens-details``: a prefill reports its prefix-cache hit, a decode that pulls
the prompt's KV reports 0, as a P/D decode does), the proxy a ``serve`` process, the clients
the official SDKs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest
from proxy_helpers import Server, running

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

# Long enough for a whole block of the prefix cache (16 tokens) in every API's render.
TEXT = "Tell me, in a few words, what the weather is like in Paris in the spring of the year."
CHAT: Any = [{"role": "user", "content": TEXT}]
BLOCK = 16


@dataclass
class PD:
    proxy: Server
    prefill: Server
    decode: Server


@pytest.fixture(scope="module")
def pd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PD]:
    logs = tmp_path_factory.mktemp("pd")
    simulate = ["simulate", "--port", "0", "--enable-prompt-tokens-details"]
    with running((simulate, logs / "prefill.log"), (simulate, logs / "decode.log")) as (
        prefill,
        decode,
    ):
        serve = ["serve", "--port", "0", "--prefill-url", prefill.url, "--decode-url", decode.url]
        with running((serve, logs / "proxy.log")) as (proxy,):
            yield PD(proxy, prefill, decode)


def _warm(prompt_tokens: int) -> int:
    """What the simulated prefill reports for a prompt it computed before: its whole blocks."""
    return (prompt_tokens - 1) // BLOCK * BLOCK


def test_chat_usage_reports_the_prefills_cached_tokens(pd: PD) -> None:
    client = openai.OpenAI(base_url=pd.proxy.url + "/v1", api_key="unused")
    with client:
        cold = client.chat.completions.create(model="m", messages=CHAT, max_tokens=8)
        warm = client.chat.completions.create(model="m", messages=CHAT, max_tokens=8)
    for completion, expected in ((cold, 0), (warm, None)):
        usage = completion.usage
        assert usage is not None
        assert usage.prompt_tokens_details is not None
        want = _warm(usage.prompt_tokens) if expected is None else expected
        assert want > 0 or expected == 0
        assert usage.prompt_tokens_details.cached_tokens == want


def test_chat_stream_usage_chunk_reports_the_prefills_cached_tokens(pd: PD) -> None:
    client = openai.OpenAI(base_url=pd.proxy.url + "/v1", api_key="unused")
    text = TEXT + " Streamed."
    messages: Any = [{"role": "user", "content": text}]
    with client:
        client.chat.completions.create(model="m", messages=messages, max_tokens=8)  # warms it
        stream = client.chat.completions.create(
            model="m",
            messages=messages,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
        usages = [chunk.usage for chunk in stream if chunk.usage is not None]
    assert len(usages) == 1
    usage = usages[0]
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == _warm(usage.prompt_tokens) > 0


def test_responses_usage_reports_the_prefills_cached_tokens(pd: PD) -> None:
    client = openai.OpenAI(base_url=pd.proxy.url + "/v1", api_key="unused")
    text = TEXT + " As a Responses request."
    with client:
        client.responses.create(model="m", input=text, max_output_tokens=8)
        whole = client.responses.create(model="m", input=text, max_output_tokens=8)
        with client.responses.stream(model="m", input=text, max_output_tokens=8) as stream:
            streamed = stream.get_final_response()
    for response in (whole, streamed):
        usage = response.usage
        assert usage is not None
        assert usage.input_tokens_details.cached_tokens == _warm(usage.input_tokens) > 0


def test_messages_usage_reports_the_prefills_cached_tokens(pd: PD) -> None:
    client = anthropic.Anthropic(base_url=pd.proxy.url, api_key="unused")
    text = TEXT + " As a Messages request."
    messages: Any = [{"role": "user", "content": text}]
    with client:
        client.messages.create(model="m", messages=messages, max_tokens=8)
        whole = client.messages.create(model="m", messages=messages, max_tokens=8)
        with client.messages.stream(model="m", messages=messages, max_tokens=8) as stream:
            streamed = stream.get_final_message()
    for message in (whole, streamed):
        usage = message.usage
        cached = usage.cache_read_input_tokens
        assert cached is not None
        # Anthropic's input_tokens leaves the cached ones out; the two add up to the prompt.
        assert cached == _warm(usage.input_tokens + cached) > 0


def test_a_decode_worker_alone_reports_none_of_the_prefills_cache(pd: PD) -> None:
    """What the tests above rely on: the decode answer's own count is 0 after prefill."""
    body = {
        "token_ids": list(range(1, 40)),
        "sampling_params": {"max_tokens": 2},
        "kv_transfer_params": {"do_remote_prefill": True, "do_remote_decode": False},
    }
    answer = httpx.post(pd.decode.url + "/inference/v1/generate", json=body).json()
    assert answer["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


# -- a failed prefill: retried only when asked and only when the worker was unavailable -------


@dataclass
class Retries:
    flaky: Server  # prefill 503 once, then fine; --prefill-max-retries 1
    refused: Server  # prefill always 400; --prefill-max-retries 3
    down: Server  # prefill always 503; no retries


@pytest.fixture(scope="module")
def retries(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Retries]:
    logs = tmp_path_factory.mktemp("retries")
    simulate = ["simulate", "--port", "0"]
    with running(
        ([*simulate, "--fault", "http-503", "--fault-calls", "1"], logs / "flaky.log"),
        ([*simulate, "--fault", "http-400"], logs / "refusing.log"),
        ([*simulate, "--fault", "http-503"], logs / "down.log"),
        (simulate, logs / "decode.log"),
    ) as (flaky, refusing, down, decode):
        serve = ["serve", "--port", "0", "--decode-url", decode.url]
        with running(
            ([*serve, "--prefill-url", flaky.url, "--prefill-max-retries", "1"], logs / "f.log"),
            ([*serve, "--prefill-url", refusing.url, "--prefill-max-retries", "3"], logs / "r.log"),
            ([*serve, "--prefill-url", down.url], logs / "d.log"),
        ) as proxies:
            yield Retries(*proxies)


def _chat(proxy: Server, request_id: str) -> Any:
    # No SDK retries: the proxy's own are what is judged.
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
    with client:
        return client.chat.completions.create(
            model="m", messages=CHAT, max_tokens=8, extra_headers={"x-request-id": request_id}
        )


def _legs(proxy: Server, line_start: str) -> list[str]:
    """The worker calls of one access-log line: ``step=outcome`` each, in order."""
    line = next(x for x in proxy.wait_for_log(line_start).splitlines() if line_start in x)
    return [leg.split("/")[0] for leg in line.split() if "=" in leg and "/" in leg]


def test_a_prefill_503_is_retried_when_asked(retries: Retries) -> None:
    completion = _chat(retries.flaky, "retry-1")
    assert completion.choices[0].message.content == "Hello!"
    assert _legs(retries.flaky, "retry-1 POST /v1/chat/completions 200") == [
        "render=200",
        "prefill=503",
        "prefill=200",
        "decode=200",
    ]


def test_a_prefill_400_is_never_retried_and_no_decode_follows(retries: Retries) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        _chat(retries.refused, "retry-2")
    assert "prefill rejected the request" in str(raised.value)
    assert _legs(retries.refused, "retry-2 POST /v1/chat/completions 400") == [
        "render=200",
        "prefill=400",
    ]


def test_without_retries_a_failed_prefill_is_a_502_and_no_decode_follows(
    retries: Retries,
) -> None:
    with pytest.raises(openai.InternalServerError) as raised:
        _chat(retries.down, "retry-3")
    assert raised.value.status_code == 502
    assert "prefill failed with HTTP 503" in str(raised.value)
    assert _legs(retries.down, "retry-3 POST /v1/chat/completions 502") == [
        "render=200",
        "prefill=503",
    ]

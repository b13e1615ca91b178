"""The reference proxy as people run it: ``serve`` and ``simulate`` subprocesses, real SDKs.

Workers are ``disagg-transforms simulate`` processes; the proxies are ``disagg-transforms serve``
processes pointed at them (and one ``serve --simulate``). The official openai and anthropic
SDKs talk to the proxies over real sockets with their default retries, so a contract error
that they retried would show in the time it took.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest
from golden import load_stream
from proxy_helpers import (
    Server,
    command,
    environment,
    read_stream,
    running,
    served,
    start,
    wait_ready,
)

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

# Sent through both SDKs, whose TypedDicts for a message or a tool differ: typed as JSON.
CHAT: Any = [{"role": "user", "content": "Hi"}]
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
SLOW = "0.4"  # seconds between the slow worker's stream events: a stream lasts about 3 s
# What must time out waits 3 times the timeout, what must not has 2 s for a first byte: a
# loaded machine only makes the waits longer (the stream's 0.4 s gaps against 0.1 s idle).
SLOW_FIRST_BYTE = "6"
SHORT_TIMEOUTS = ("--first-byte-timeout", "2", "--idle-timeout", "0.1")


@dataclass
class Fleet:
    proxy: Server  # prefill and decode workers, text mode
    simulated: Server  # serve --simulate, derender mode (tool calls)
    slow: Server  # a decode worker streaming slowly
    timeouts: Server  # the slow worker, with short timeouts


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    logs = tmp_path_factory.mktemp("proxy")
    derender = logs / "derender.json"
    derender.write_text(
        json.dumps(
            {
                "use_openai_format": False,
                "steps": {
                    "prefill": {},
                    "decode": {"output_mode": "derender", "wrap_chat_completion": True},
                },
            }
        )
    )
    simulate = ["simulate", "--port", "0"]
    with running(
        (simulate, logs / "prefill-worker.log"),
        (simulate, logs / "decode-worker.log"),
        (
            [*simulate, "--stream-delay", SLOW, "--first-byte-delay", SLOW_FIRST_BYTE],
            logs / "slow-worker.log",
        ),
    ) as (prefill, decode, slow):
        serve = ["serve", "--port", "0"]
        with running(
            ([*serve, "--prefill-url", prefill.url, "--decode-url", decode.url], logs / "p.log"),
            ([*serve, "--simulate", "--config", str(derender)], logs / "simulated.log"),
            ([*serve, "--decode-url", slow.url], logs / "slow.log"),
            ([*serve, "--decode-url", slow.url, *SHORT_TIMEOUTS], logs / "timeouts.log"),
        ) as proxies:
            yield Fleet(*proxies)


# The SDK clients a test made, closed when it ends: a pooled socket left to the garbage
# collector is a ResourceWarning (an error here) in whichever test happens to run then.
_CLIENTS: list[openai.OpenAI | anthropic.Anthropic] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _CLIENTS:
        _CLIENTS.pop().close()


def openai_client(server: Server) -> openai.OpenAI:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    _CLIENTS.append(client)
    return client


def anthropic_client(server: Server) -> anthropic.Anthropic:
    client = anthropic.Anthropic(base_url=server.url, api_key="unused")
    _CLIENTS.append(client)
    return client


# -- every client API, streaming and not ------------------------------------------------------


def test_chat_completion_and_its_usage(fleet: Fleet) -> None:
    raw = openai_client(fleet.proxy).chat.completions.with_raw_response.create(
        model="m", messages=CHAT, max_tokens=32, extra_headers={"x-request-id": "chat-1"}
    )
    completion = raw.parse()
    assert raw.headers["x-request-id"] == "chat-1"
    assert completion.choices[0].message.content == "Hello!"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert (completion.usage.completion_tokens, completion.usage.prompt_tokens) == (7, 21)
    log = fleet.proxy.wait_for_log("chat-1 POST /v1/chat/completions 200")
    assert "render=200/" in log
    assert "prefill=200/" in log
    assert "decode=200/" in log


def test_chat_stream_with_the_sdks_stream_helper(fleet: Fleet) -> None:
    with openai_client(fleet.proxy).chat.completions.stream(
        model="m", messages=CHAT, stream_options={"include_usage": True}
    ) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.content == "Hello!"
    assert final.usage is not None
    assert final.usage.completion_tokens == 7


def test_responses_api_whole_and_streamed(fleet: Fleet) -> None:
    client = openai_client(fleet.proxy)
    response = client.responses.create(model="m", input="Hi")
    assert response.output_text == "Hello!"
    assert response.usage is not None
    assert response.usage.output_tokens == 7
    with client.responses.stream(model="m", input="Hi") as stream:
        final = stream.get_final_response()
    assert final.output_text == "Hello!"


def test_anthropic_messages_whole_and_streamed(fleet: Fleet) -> None:
    client = anthropic_client(fleet.proxy)
    message = client.messages.create(model="m", max_tokens=64, messages=CHAT)
    assert message.content[0].type == "text"
    assert message.content[0].text == "Hello!"
    assert message.usage.output_tokens == 7
    with client.messages.stream(model="m", max_tokens=64, messages=CHAT) as stream:
        final = stream.get_final_message()
    assert [block.type for block in final.content] == ["text"]
    assert final.stop_reason == "end_turn"


def test_generate_client_gets_the_generate_envelope(fleet: Fleet) -> None:
    body = {"model": "m", "token_ids": [1072, 1105], "sampling_params": {"max_tokens": 3}}
    url = fleet.proxy.url + "/inference/v1/generate"
    answer = httpx.post(url, json=body, headers={"x-request-id": "gen-1"}, timeout=10)
    assert answer.status_code == 200
    assert answer.json()["request_id"] == "generate-tokens-gen-1"
    assert answer.json()["choices"][0]["text"] == "Hel"
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=10) as stream:
        events = [line for line in stream.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1]) == "Hel"


def test_completions_client_reaches_the_workers_own_route(fleet: Fleet) -> None:
    # A completions client stays on /v1/completions (never rendered), prefill and decode alike.
    completion = openai_client(fleet.proxy).completions.create(model="m", prompt="Hi", max_tokens=5)
    assert completion.object == "text_completion"
    assert completion.choices[0].text
    assert completion.usage is not None
    assert completion.usage.completion_tokens <= 5


def test_tool_calls_on_a_derender_pipeline_served_with_simulate(fleet: Fleet) -> None:
    client = openai_client(fleet.simulated)
    completion = client.chat.completions.create(
        model="m", messages=CHAT, tools=[WEATHER_TOOL], max_tokens=200
    )
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls is not None
    call = message.tool_calls[0]
    assert call.type == "function"
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Paris"},
    )
    with client.chat.completions.stream(
        model="m", messages=CHAT, tools=[WEATHER_TOOL], max_tokens=200
    ) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.tool_calls is not None
    assert final.choices[0].message.tool_calls[0].function.name == "get_weather"
    tool: anthropic.types.ToolParam = {
        "name": "get_weather",
        "description": "The weather in a city",
        "input_schema": WEATHER_TOOL["function"]["parameters"],
    }
    message2 = anthropic_client(fleet.simulated).messages.create(
        model="m", max_tokens=200, messages=CHAT, tools=[tool]
    )
    assert message2.stop_reason == "tool_use"
    assert [block.type for block in message2.content][-1] == "tool_use"


def test_health_and_models(fleet: Fleet) -> None:
    health = httpx.get(fleet.proxy.url + "/health", timeout=10)
    assert health.status_code == 200
    models = openai_client(fleet.proxy).models.list()
    assert "simulated" in [model.id for model in models.data]
    assert "simulated" in [m.id for m in openai_client(fleet.simulated).models.list().data]


# -- faults, per request through the client's own headers -------------------------------------


def fault(mode: str) -> dict[str, str]:
    return {"x-simulate-fault": mode}


@pytest.mark.parametrize("mode", ["not-json", "no-output-mode"])
def test_contract_breaks_are_not_retried_by_the_sdk(fleet: Fleet, mode: str) -> None:
    request_id = f"no-retry-{mode}"
    with pytest.raises(openai.InternalServerError) as caught:
        openai_client(fleet.proxy).chat.completions.create(
            model="m", messages=CHAT, extra_headers={**fault(mode), "x-request-id": request_id}
        )
    assert _attempts(fleet.proxy, request_id) == 1
    assert caught.value.status_code == 502
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert "broke the contract" in caught.value.message


def _attempts(proxy: Server, request_id: str) -> int:
    """How many requests with ``request_id`` the proxy logged (each before its answer left)."""
    return sum(line.startswith(f"{request_id} ") for line in _access_lines(proxy))


def _access_lines(proxy: Server) -> list[str]:
    marker = " disagg_transforms.proxy: "
    return [line.split(marker, 1)[1] for line in proxy.log().splitlines() if marker in line]


def test_a_worker_5xx_is_a_retryable_502(fleet: Fleet) -> None:
    with pytest.raises(anthropic.InternalServerError) as caught:
        anthropic_client(fleet.proxy).messages.create(
            model="m",
            max_tokens=8,
            messages=CHAT,
            extra_headers={**fault("http-500"), "x-request-id": "retried-1"},
        )
    assert _attempts(fleet.proxy, "retried-1") == 3  # the SDK's default: two retries
    assert caught.value.status_code == 502
    assert "x-should-retry" not in caught.value.response.headers
    assert caught.value.body["error"]["type"] == "api_error"  # type: ignore[index]


@pytest.mark.parametrize("mode", ["cut-stream", "stream-error"])
def test_a_stream_that_breaks_after_it_started_ends_with_an_error_event(
    fleet: Fleet, mode: str
) -> None:
    # The fault header reaches every call of the request; only a generate client on a
    # decode-only pipeline makes no call before the stream (no render, no prefill).
    body = {"token_ids": [1072], "stream": True, "sampling_params": {"max_tokens": 4}}
    url = fleet.slow.url + "/inference/v1/generate"
    with httpx.stream("POST", url, json=body, headers=fault(mode), timeout=10) as stream:
        assert stream.status_code == 200
        events = [line for line in stream.iter_lines() if line.startswith("data: ")]
    assert json.loads(events[0][6:])["choices"][0]["text"] == "H"
    assert "error" in json.loads(events[-2][6:])
    assert events[-1] == "data: [DONE]"


def test_slow_first_byte_is_waited_for(fleet: Fleet) -> None:
    completion = openai_client(fleet.proxy).chat.completions.create(
        model="m", messages=CHAT, extra_headers=fault("slow-first-byte")
    )
    assert completion.choices[0].message.content == "Hello!"


def test_timeouts_end_as_failed_worker_calls(fleet: Fleet) -> None:
    url = fleet.timeouts.url + "/v1/chat/completions"
    body = {"model": "m", "messages": CHAT}
    slow = httpx.post(url, json=body, headers=fault("slow-first-byte"), timeout=10)
    assert slow.status_code == 504
    assert "x-should-retry" not in slow.headers
    assert slow.json()["error"]["message"].startswith("render failed: no answer within")
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=10) as stream:
        assert stream.status_code == 200
        events = [line for line in stream.iter_lines() if line.startswith("data: ")]
    assert "decode failed: no answer within" in events[-2]
    assert events[-1] == "data: [DONE]"
    fleet.timeouts.wait_for_log("stream=worker-failed")


# -- concurrency, disconnects, draining -------------------------------------------------------


def test_fifty_concurrent_requests_each_get_their_own_answer(fleet: Fleet) -> None:
    async def one(client: openai.AsyncOpenAI, index: int) -> tuple[str, str, str | None]:
        raw = await client.chat.completions.with_raw_response.create(
            model="m",
            messages=CHAT,
            max_tokens=1 + index % 6,
            extra_headers={"x-request-id": f"many-{index}"},
        )
        completion = raw.parse()
        return raw.headers["x-request-id"], completion.id, completion.choices[0].message.content

    async def run() -> list[tuple[str, str, str | None]]:
        async with openai.AsyncOpenAI(base_url=fleet.proxy.url + "/v1", api_key="x") as client:
            return await asyncio.gather(*(one(client, index) for index in range(50)))

    answers = asyncio.run(run())
    for index, (request_id, completion_id, content) in enumerate(answers):
        assert request_id == f"many-{index}"
        assert completion_id.endswith(f"many-{index}")
        assert content == "Hello!"[: 1 + index % 6]


def _serve_generate_leg(worker_url: str, tmp_path: pathlib.Path, name: str) -> Server:
    """``serve`` with one decode leg on the generate route, calling ``worker_url``."""
    config = tmp_path / "generate.json"
    config.write_text(json.dumps({"use_openai_format": False, "steps": {"decode": {}}}))
    args = ["serve", "--port", "0", "--config", str(config), "--decode-url", worker_url]
    return wait_ready(start(args, tmp_path / f"{name}.log"))


def test_a_client_disconnect_closes_the_worker_stream(tmp_path: pathlib.Path) -> None:
    worker = _BreakingWorker(broken=False)
    with served(worker) as worker_url:
        server = _serve_generate_leg(worker_url, tmp_path, "gone")
        try:
            body = {"token_ids": [1072], "stream": True, "output_mode": "text"}
            url = server.url + "/inference/v1/generate"
            headers = {"x-request-id": "gone-1"}
            with httpx.stream("POST", url, json=body, headers=headers, timeout=10) as stream:
                assert next(stream.iter_bytes()).startswith(b"data: ")
            # Set only when the proxy closed the stream before the worker's MORE events.
            assert worker.closed.wait(30)
            log = server.wait_for_log("gone-1 POST")
        finally:
            server.stop()
    line = next(line for line in log.splitlines() if "gone-1 POST" in line)
    assert line.endswith("stream=client-disconnected")


class _BreakingWorker:
    """A generate worker whose stream breaks the contract after its first event, then goes on.

    It would stream ``MORE`` more events, ``SLOW`` seconds apart (20 s: far longer than the
    proxy takes to close it, however loaded the machine); ``closed`` is set when the proxy
    closes the connection before that. ``broken=False``: a good stream, as slow.
    """

    MORE = 50

    def __init__(self, *, broken: bool = True) -> None:
        self.closed = threading.Event()
        self.broken = broken

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.ensure_future(watch())
        good = load_stream("generate-stream-usage.sse").split(b"\n\n")[0] + b"\n\n"
        second = b"data: not json\n\n" if self.broken else good
        events = [good, second, *[good] * self.MORE]
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for event in events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(gone.wait(), float(SLOW))
            if gone.is_set():
                self.closed.set()
                return
        watcher.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def test_a_contract_break_mid_stream_closes_the_worker_stream_at_once(
    tmp_path: pathlib.Path,
) -> None:
    worker = _BreakingWorker()
    with served(worker) as worker_url:
        server = _serve_generate_leg(worker_url, tmp_path, "broken")
        try:
            body = {"token_ids": [1072], "stream": True, "output_mode": "text"}
            url = server.url + "/inference/v1/generate"
            headers = {"x-request-id": "broken-1"}
            with httpx.stream("POST", url, json=body, headers=headers, timeout=10) as stream:
                events = [line for line in stream.iter_lines() if line.startswith("data: ")]
            # Set only when the proxy closed the stream before the worker's MORE events.
            assert worker.closed.wait(30)
            log = server.wait_for_log("broken-1 POST")
        finally:
            server.stop()
    assert "broke the contract" in json.loads(events[-2][6:])["error"]["message"]
    assert events[-1] == "data: [DONE]"
    line = next(line for line in log.splitlines() if "broken-1 POST" in line)
    assert line.endswith("stream=contract-broken")


def test_sigterm_drains_a_stream_in_flight_then_exits_0(
    fleet: Fleet, tmp_path: pathlib.Path
) -> None:
    slow_url = _decode_url_of(fleet)
    server = wait_ready(start(["serve", "--port", "0", "--decode-url", slow_url], tmp_path / "t"))
    try:
        body = {"model": "m", "messages": CHAT}
        reader = read_stream(server.url + "/v1/chat/completions", body, timeout=20)
        assert reader.first.wait(10)
        server.process.send_signal(signal.SIGTERM)
        reader.thread.join(20)
        assert not reader.thread.is_alive()
        assert server.process.wait(timeout=20) == 0
    finally:
        server.stop()
    text = reader.text()
    assert text.endswith("data: [DONE]\n\n")
    assert '"finish_reason":"stop"' in text
    log = server.log()
    assert log.index("Shutting down") < log.index("stream=complete")


def test_sigterm_cuts_a_stream_that_outlasts_the_drain_timeout(
    fleet: Fleet, tmp_path: pathlib.Path
) -> None:
    args = ["serve", "--port", "0", "--decode-url", _decode_url_of(fleet), "--drain-timeout", "1"]
    server = wait_ready(start(args, tmp_path / "cut"))
    try:
        body = {"model": "m", "messages": CHAT, "stream": True}
        url = server.url + "/v1/chat/completions"
        with httpx.stream("POST", url, json=body, timeout=20) as stream:
            chunks = stream.iter_bytes()
            assert next(chunks).startswith(b"data: ")
            server.process.send_signal(signal.SIGTERM)
            # The slow worker's stream lasts about 3 s; the drain gives it 1, then cuts it.
            with pytest.raises(httpx.RemoteProtocolError):
                for _ in chunks:
                    pass
        assert server.process.wait(timeout=20) == 0
    finally:
        server.stop()


def _decode_url_of(fleet: Fleet) -> str:
    args = fleet.slow.process.args
    assert isinstance(args, list)
    return str(args[args.index("--decode-url") + 1])


def test_serve_with_two_worker_processes(tmp_path: pathlib.Path) -> None:
    server = wait_ready(
        start(["serve", "--simulate", "--workers", "2", "--port", "0"], tmp_path / "w")
    )
    try:
        client = openai_client(server)
        contents = [
            client.chat.completions.create(model="m", messages=CHAT).choices[0].message.content
            for _ in range(3)
        ]
        assert contents == ["Hello!"] * 3
    finally:
        assert server.stop() == 0


# -- startup errors -----------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - our own interpreter and command
        command(*args), capture_output=True, text=True, timeout=60, env=environment(), check=False
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--decode-url", "http://d", "--encode-url", "http://e"],
            "--encode-url: the pipeline has no encode step to send there",
        ),
        (["--simulate", "--decode-url", "http://d"], "--simulate calls its own simulated worker"),
    ],
)
def test_serve_refuses_a_url_without_its_step(args: list[str], line: str) -> None:
    result = run_cli("serve", *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert line in result.stderr


@pytest.mark.parametrize(
    ("flag", "url", "why"),
    [
        ("--decode-url", "127.0.0.1:8103", "expected http:// or https://"),
        ("--decode-url", "localhost:8103", "expected http:// or https://"),
        ("--decode-url", "ftp://127.0.0.1:8103", "expected http:// or https://"),
        ("--decode-url", "http://:8103", "no host"),
        ("--decode-url", "http://127.0.0.1:81030", "port"),
        ("--decode-url", "http://127.0.0.1:port", "port"),
        ("--prefill-url", "127.0.0.1:8104", "expected http:// or https://"),
    ],
)
def test_serve_refuses_a_worker_url_it_cannot_call(flag: str, url: str, why: str) -> None:
    urls = {"--decode-url": "http://127.0.0.1:8103", flag: url}
    result = run_cli("serve", *(item for pair in urls.items() for item in pair))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"disagg-transforms: error: {flag}: {url!r} ")
    assert result.stderr.count("\n") == 1
    assert why in result.stderr


def test_serve_prints_the_check_config_lines_for_a_bad_config(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "bad.json"
    config.write_text(json.dumps({"steps": {"decode": {"output_mode": "tokens", "typo": 1}}}))
    result = run_cli("serve", "--config", str(config), "--decode-url", "http://d")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == run_cli("check-config", str(config)).stderr
    assert result.stderr.count("\n") == 2


def test_serve_refuses_a_step_without_its_url(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "prefill.json"
    config.write_text(json.dumps({"steps": {"prefill": {}, "decode": {}}}))
    result = run_cli("serve", "--config", str(config), "--decode-url", "http://d")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "disagg-transforms: error: prefill: the pipeline has a prefill step but no --prefill-url\n"
    )


def test_simulate_refuses_an_unknown_fault() -> None:
    result = run_cli("simulate", "--fault", "bogus")
    assert result.returncode == 2
    assert "--fault: unknown fault 'bogus'" in result.stderr

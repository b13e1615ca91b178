"""``serve`` relays a worker's own answer only when it keeps the contract; a slow worker is a 504.

``serve`` and ``simulate`` run as their own processes (a worker that must outwait the proxy's
timeout runs in this process, so that the test can end its wait); the official openai SDK is
the client.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from proxy_helpers import Server, running, served

from disagg_transforms.testing import SimulatedWorker

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

CHAT: Any = [{"role": "user", "content": "Hi"}]
FIRST_BYTE_TIMEOUT = "0.5"  # the proxy's, against a worker that would wait 30 s


@dataclass
class Proxies:
    completions: Server  # a decode-only pipeline: a completions client's leg is relayed
    openai_format: Server  # every leg on the client's own route: a chat client's is relayed


@pytest.fixture(scope="module")
def proxies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxies]:
    logs = tmp_path_factory.mktemp("relay")
    config = logs / "openai.json"
    config.write_text(json.dumps({"use_openai_format": True, "steps": {"decode": {}}}))
    with running((["simulate", "--port", "0"], logs / "worker.log")) as (worker,):
        serve = ["serve", "--port", "0", "--decode-url", worker.url]
        with running(
            (serve, logs / "completions.log"),
            ([*serve, "--config", str(config)], logs / "openai.log"),
        ) as servers:
            yield Proxies(*servers)


Sdk = Callable[..., openai.OpenAI]


@pytest.fixture
def sdk() -> Iterator[Sdk]:
    """Makes an openai client for a server (``sdk(server, max_retries=0)``); closes them all."""
    made: list[openai.OpenAI] = []

    def make(server: Server, **kw: Any) -> openai.OpenAI:
        made.append(openai.OpenAI(base_url=server.url + "/v1", api_key="unused", **kw))
        return made[-1]

    yield make
    for client in made:
        client.close()


def _fault(mode: str, request_id: str) -> dict[str, str]:
    return {"x-simulate-fault": mode, "x-request-id": request_id}


def _log_line(server: Server, request_id: str) -> str:
    log = server.wait_for_log(f"{request_id} POST")
    return next(line for line in log.splitlines() if f"{request_id} POST" in line)


@pytest.mark.parametrize("stream", [False, True])
def test_a_relayed_html_200_is_a_502_the_sdk_does_not_retry(
    proxies: Proxies, sdk: Sdk, *, stream: bool
) -> None:
    request_id = f"html-{stream}"
    with pytest.raises(openai.APIStatusError) as caught:
        sdk(proxies.completions).completions.create(
            model="m",
            prompt="Hi",
            stream=stream,
            extra_headers=_fault("not-json", request_id),
        )
    # The SDK numbers its attempts: the one that failed was the first, none followed.
    assert caught.value.response.request.headers["x-stainless-retry-count"] == "0"
    assert caught.value.status_code == 502
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert "decode broke the contract" in caught.value.message
    assert " 502 decode=200/" in _log_line(proxies.completions, request_id)


def test_a_relayed_completions_stream_cut_mid_event_ends_with_an_error_event(
    proxies: Proxies, sdk: Sdk
) -> None:
    stream = sdk(proxies.completions).completions.create(
        model="m", prompt="Hi", stream=True, extra_headers=_fault("cut-stream", "cut-1")
    )
    texts: list[str] = []
    with stream, pytest.raises(openai.APIError) as caught:
        texts.extend(chunk.choices[0].text for chunk in stream)
    assert texts  # the first event was relayed before the cut
    assert "decode broke the contract" in caught.value.message
    assert "in the middle of an event" in caught.value.message
    assert _log_line(proxies.completions, "cut-1").endswith(" stream=contract-broken")


def test_a_relayed_openai_format_chat_stream_cut_mid_event_ends_with_an_error_event(
    proxies: Proxies, sdk: Sdk
) -> None:
    stream = sdk(proxies.openai_format).chat.completions.create(
        model="m", messages=CHAT, stream=True, extra_headers=_fault("cut-stream", "cut-2")
    )
    with stream, pytest.raises(openai.APIError) as caught:
        for _ in stream:
            pass
    assert "decode broke the contract" in caught.value.message
    assert _log_line(proxies.openai_format, "cut-2").endswith(" stream=contract-broken")


def test_a_relayed_stream_that_ends_well_is_logged_complete(proxies: Proxies, sdk: Sdk) -> None:
    stream = sdk(proxies.completions).completions.create(
        model="m", prompt="Hi", stream=True, extra_headers={"x-request-id": "whole-1"}
    )
    with stream:
        assert "".join(chunk.choices[0].text for chunk in stream)
    assert _log_line(proxies.completions, "whole-1").endswith(" stream=complete")


def test_a_workers_own_error_event_is_logged_worker_failed(proxies: Proxies, sdk: Sdk) -> None:
    stream = sdk(proxies.completions).completions.create(
        model="m", prompt="Hi", stream=True, extra_headers=_fault("stream-error", "own-1")
    )
    with stream, pytest.raises(openai.APIError) as caught:
        for _ in stream:
            pass
    assert caught.value.message == "Internal server error"
    assert _log_line(proxies.completions, "own-1").endswith(" stream=worker-failed")


# ---- timeouts ---------------------------------------------------------------------------


class _Outwaited:
    """The simulated worker answering ``slow-first-byte`` after 30 s, unless ``release`` is set.

    ``calls`` counts the requests it got (the SDK's retries among them).
    """

    def __init__(self) -> None:
        self.worker = SimulatedWorker(first_byte_delay=30)
        self.release = threading.Event()
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += scope["type"] == "http"
        task = asyncio.ensure_future(self.worker(scope, receive, send))
        released = asyncio.ensure_future(asyncio.to_thread(self.release.wait))
        await asyncio.wait({task, released}, return_when=asyncio.FIRST_COMPLETED)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.fixture(scope="module")
def outwaited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[_Outwaited, Server]]:
    logs = tmp_path_factory.mktemp("timeout")
    worker = _Outwaited()
    with served(worker) as url:
        try:
            args = ["serve", "--port", "0", "--decode-url", url]
            args += ["--first-byte-timeout", FIRST_BYTE_TIMEOUT]
            with running((args, logs / "proxy.log")) as (proxy,):
                yield worker, proxy
        finally:
            worker.release.set()


def test_a_worker_that_does_not_answer_in_time_is_a_504_the_sdk_retries(
    outwaited: tuple[_Outwaited, Server], sdk: Sdk
) -> None:
    worker, proxy = outwaited
    before = worker.calls
    with pytest.raises(openai.InternalServerError) as caught:
        sdk(proxy, max_retries=0).completions.create(
            model="m", prompt="Hi", extra_headers=_fault("slow-first-byte", "slow-1")
        )
    assert caught.value.status_code == 504
    assert "x-should-retry" not in caught.value.response.headers
    assert "decode failed: no answer within the timeout" in caught.value.message
    assert worker.calls == before + 1
    assert " 504 decode=failed/" in _log_line(proxy, "slow-1")
    # Retryable: the SDK's default retries try again.
    with pytest.raises(openai.InternalServerError):
        sdk(proxy, max_retries=1).completions.create(
            model="m", prompt="Hi", extra_headers=_fault("slow-first-byte", "slow-2")
        )
    assert worker.calls == before + 3

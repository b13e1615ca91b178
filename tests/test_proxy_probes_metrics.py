"""Probes, metrics and the access log's durations of ``serve`` (docs/proxy.md).

``/healthz`` and ``/readyz`` as llm-d probes them (``/readyz`` never 200 again once SIGTERM
came); ``/metrics`` in the Prometheus text format with the coordinator's names, summed over
every process of ``--workers N``; each leg's log entry timed to its first byte and its end.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import re
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from proxy_helpers import Server, running, start, wait_ready

from disagg_transforms import parse_pipeline_params
from disagg_transforms.integrations.proxy import create_app

CHAT: Any = [{"role": "user", "content": "Hi"}]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _samples(text: str, suffix: str) -> Samples:
    """Every sample whose name ends with ``suffix``, by name and labels."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.endswith(suffix)
    }


def _of(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: value for (sample, labels), value in samples.items() if sample == name}


def _labels(**labels: str) -> frozenset[tuple[str, str]]:
    return frozenset(labels.items())


# -- /metrics after a known mix of requests ----------------------------------------------------


def _known_mix(url: str) -> None:
    """Six requests, each counted as the test below says; no SDK retries (one call each)."""
    chat = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    messages = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    try:
        assert chat.chat.completions.create(model="chat-m", messages=CHAT).choices
        with chat.chat.completions.create(model="chat-m", messages=CHAT, stream=True) as stream:
            assert list(stream)
        # No model (the SDK requires one), and a cap the exchange refuses: 400.
        refused = {"messages": CHAT, "max_tokens": -1}
        assert httpx.post(url + "/v1/chat/completions", json=refused, timeout=30).status_code == 400
        assert chat.completions.create(model="cmpl-m", prompt="Hi", max_tokens=4).choices
        assert messages.messages.create(model="msg-m", max_tokens=8, messages=CHAT).content
        with pytest.raises(openai.InternalServerError):  # the render worker's 500: a 502
            chat.chat.completions.create(
                model="fault-m", messages=CHAT, extra_headers={"x-simulate-fault": "http-500"}
            )
    finally:
        chat.close()
        messages.close()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_metrics_count_a_known_mix_of_requests_exactly(
    workers: str, tmp_path: pathlib.Path
) -> None:
    args = ["serve", "--simulate", "--port", "0", "--workers", workers]
    with running((args, tmp_path / "serve.log")) as (proxy,):
        _known_mix(proxy.url)
        answer = httpx.get(proxy.url + "/metrics", timeout=30)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    totals = _samples(answer.text, "_total")
    assert _of(totals, "llm_d_coordinator_request_total") == {
        _labels(model_name="chat-m"): 2,
        _labels(model_name="unknown"): 1,
        _labels(model_name="cmpl-m"): 1,
        _labels(model_name="msg-m"): 1,
        _labels(model_name="fault-m"): 1,
    }
    assert _of(totals, "llm_d_coordinator_request_error_total") == {
        _labels(model_name="unknown", error_code="bad_request"): 1,
        _labels(model_name="fault-m", error_code="upstream_5xx"): 1,
    }
    # The simulated pipeline prefills; completions is never rendered; the fault ends at render.
    assert _of(totals, "llm_d_coordinator_upstream_request_total") == {
        _labels(phase="render"): 4,
        _labels(phase="prefill"): 4,
        _labels(phase="decode"): 4,
    }
    assert _of(totals, "llm_d_coordinator_disagg_decision_total") == {
        _labels(model_name="chat-m", decision_type="prefill-decode"): 2,
        _labels(model_name="cmpl-m", decision_type="prefill-decode"): 1,
        _labels(model_name="msg-m", decision_type="prefill-decode"): 1,
    }
    assert _of(totals, "llm_d_coordinator_decode_cache_lookups_total") == {}
    counts = _samples(answer.text, "_count")
    assert _of(counts, "llm_d_coordinator_request_duration_seconds_count") == {
        _labels(model_name=model): n
        for model, n in {"chat-m": 2, "unknown": 1, "cmpl-m": 1, "msg-m": 1, "fault-m": 1}.items()
    }
    assert _of(counts, "llm_d_coordinator_pipeline_step_duration_seconds_count") == {
        _labels(step=step): 4 for step in ("render", "prefill", "decode")
    }
    assert _of(counts, "disagg_transforms_time_to_first_token_seconds_count") == {
        _labels(model_name="chat-m"): 1
    }
    running_now = _of(_samples(answer.text, "_running"), "llm_d_coordinator_request_running")
    assert set(running_now.values()) == {0}
    assert len(running_now) == 5  # every model seen, none in flight


# -- /metrics in gateway mode: conditional decode hits and misses ------------------------------

COLD_WARM_CONFIG = {
    "use_openai_format": False,
    "steps": {"conditional-decode": {}, "prefill": {}, "decode": {"wrap_chat_completion": True}},
}


def _cold_and_warm_mix(url: str) -> None:
    """Each prompt cold (412: a miss, then the legs), then warm (2xx: a hit, no other leg);
    a warm prompt whose conditional decode fails (500, 400) counts neither."""
    chat = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    messages = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    streamed: Any = [{"role": "user", "content": "A streamed prompt"}]
    other: Any = [{"role": "user", "content": "A Messages prompt"}]
    try:
        for _ in ("cold", "warm"):
            assert chat.chat.completions.create(model="chat-m", messages=CHAT).choices
            with chat.chat.completions.create(
                model="stream-m", messages=streamed, stream=True
            ) as stream:
                assert list(stream)
        assert messages.messages.create(model="msg-m", max_tokens=8, messages=other).content
        with pytest.raises(openai.InternalServerError):  # the decode worker's 500: a 502
            chat.chat.completions.create(
                model="fault-m", messages=CHAT, extra_headers={"x-simulate-fault": "http-500"}
            )
        with pytest.raises(openai.BadRequestError):  # its 400, as that status
            chat.chat.completions.create(
                model="fault-m", messages=CHAT, extra_headers={"x-simulate-fault": "http-400"}
            )
    finally:
        chat.close()
        messages.close()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_metrics_count_conditional_decode_hits_and_misses_exactly(
    workers: str, tmp_path: pathlib.Path
) -> None:
    config = tmp_path / "pipeline.json"
    config.write_text(json.dumps(COLD_WARM_CONFIG))
    simulate = ["simulate", "--port", "0"]
    with running(
        ([*simulate, "--gateway"], tmp_path / "gateway.log"),
        (simulate, tmp_path / "render.log"),
    ) as (gateway, render):
        args = ["serve", "--port", "0", "--workers", workers, "--config", str(config)]
        args += ["--gateway-url", gateway.url, "--render-url", render.url]
        with running((args, tmp_path / "serve.log")) as (proxy,):
            _cold_and_warm_mix(proxy.url)
            answer = httpx.get(proxy.url + "/metrics", timeout=30)
    assert answer.status_code == 200
    totals = _samples(answer.text, "_total")
    assert _of(totals, "llm_d_coordinator_request_total") == {
        _labels(model_name="chat-m"): 2,
        _labels(model_name="stream-m"): 2,
        _labels(model_name="msg-m"): 1,
        _labels(model_name="fault-m"): 2,
    }
    assert _of(totals, "llm_d_coordinator_request_error_total") == {
        _labels(model_name="fault-m", error_code="upstream_5xx"): 1,
        _labels(model_name="fault-m", error_code="upstream_4xx"): 1,
    }
    # Every request asks the decode pool first; the three cold ones then run their legs.
    assert _of(totals, "llm_d_coordinator_upstream_request_total") == {
        _labels(phase="conditional-decode"): 7,
        _labels(phase="render"): 3,
        _labels(phase="prefill"): 3,
        _labels(phase="decode"): 3,
    }
    assert _of(totals, "llm_d_coordinator_decode_cache_lookups_total") == {
        _labels(result="miss"): 3,
        _labels(result="hit"): 2,
    }
    # A hit is decode-only; a conditional decode that failed chose no legs.
    assert _of(totals, "llm_d_coordinator_disagg_decision_total") == {
        _labels(model_name="chat-m", decision_type="prefill-decode"): 1,
        _labels(model_name="chat-m", decision_type="decode-only"): 1,
        _labels(model_name="stream-m", decision_type="prefill-decode"): 1,
        _labels(model_name="stream-m", decision_type="decode-only"): 1,
        _labels(model_name="msg-m", decision_type="prefill-decode"): 1,
    }
    counts = _samples(answer.text, "_count")
    assert _of(counts, "llm_d_coordinator_pipeline_step_duration_seconds_count") == {
        _labels(step="conditional-decode"): 7,
        **{_labels(step=step): 3 for step in ("render", "prefill", "decode")},
    }
    assert _of(counts, "disagg_transforms_time_to_first_token_seconds_count") == {
        _labels(model_name="stream-m"): 2
    }


def test_serve_removes_the_metrics_directory_it_made_and_keeps_the_users(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # serve's own temporary directory, where no other process on the machine makes one.
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    mine = tmp_path / "metrics"
    mine.mkdir()
    args = ["serve", "--simulate", "--port", "0"]
    with running((args, tmp_path / "a.log")) as (proxy,):
        made = set(temporary.glob("disagg-transforms-metrics-*"))
        assert len(made) == 1
        httpx.get(proxy.url + "/metrics", timeout=30)
    assert not any(path.exists() for path in made)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(mine))
    server = start(args, tmp_path / "b.log")
    try:
        wait_ready(server)
        openai.OpenAI(base_url=server.url + "/v1", api_key="unused").chat.completions.create(
            model="m", messages=CHAT
        )
    finally:
        assert server.stop() == 0
    assert list(mine.iterdir())  # the process's files, left for the user


# -- /healthz and /readyz ----------------------------------------------------------------------


def test_readyz_answers_503_once_sigterm_came_and_the_server_still_gets_it() -> None:
    heard: list[int] = []

    def server_handler(signum: int, frame: FrameType | None) -> None:
        del frame
        heard.append(signum)

    config = parse_pipeline_params({"decode": {}})
    app = create_app(config, decode_url="http://127.0.0.1:9")

    async def probe() -> list[int]:
        statuses = []
        async with app.router.lifespan_context(app):
            assert signal.getsignal(signal.SIGTERM) is not server_handler  # chained before it
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
                statuses += [
                    (await client.get(path)).status_code for path in ("/readyz", "/healthz")
                ]
                signal.raise_signal(signal.SIGTERM)
                after = ("/readyz", "/readyz", "/healthz")
                statuses += [(await client.get(path)).status_code for path in after]
        assert signal.getsignal(signal.SIGTERM) is server_handler  # restored at the app's end
        return statuses

    previous = signal.signal(signal.SIGTERM, server_handler)
    try:
        assert asyncio.run(probe()) == [200, 200, 503, 503, 200]
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert heard == [signal.SIGTERM]


def test_a_signal_the_server_does_not_handle_is_left_alone() -> None:
    app = create_app(parse_pipeline_params({"decode": {}}), decode_url="http://127.0.0.1:9")

    async def during() -> object:
        async with app.router.lifespan_context(app):
            return signal.getsignal(signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        assert asyncio.run(during()) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture(scope="module")
def slow_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    logs = tmp_path_factory.mktemp("slow")
    args = ["simulate", "--port", "0", "--stream-delay", "0.3"]
    with running((args, logs / "worker.log")) as (worker,):
        yield worker


@pytest.mark.parametrize(
    "workers",
    [
        "1",
        "2",
    ],
)
def test_readyz_is_never_200_after_sigterm_while_a_stream_drains(
    slow_worker: Server, workers: str, tmp_path: pathlib.Path
) -> None:
    args = ["serve", "--port", "0", "--decode-url", slow_worker.url, "--workers", workers]
    server = wait_ready(start(args, tmp_path / "serve.log"))
    try:
        # Keep-alive connections opened before the signal: a new one is refused after it.
        with httpx.Client(base_url=server.url, timeout=10) as probes:
            assert [probes.get("/readyz").status_code for _ in range(4)] == [200] * 4
            first = threading.Event()
            done = threading.Event()
            got: list[bytes] = []

            def read() -> None:
                body = {"model": "m", "messages": CHAT, "stream": True}
                with httpx.stream(
                    "POST", server.url + "/v1/chat/completions", json=body, timeout=30
                ) as stream:
                    for chunk in stream.iter_bytes():
                        got.append(chunk)
                        first.set()
                done.set()

            reader = threading.Thread(target=read)
            reader.start()
            assert first.wait(20)
            server.process.send_signal(signal.SIGTERM)
            after: list[int | str] = []
            while not done.is_set() or not after:
                after.append(_readyz(probes))
            reader.join(30)
        assert server.process.wait(timeout=30) == 0
    finally:
        server.stop()
    # The signal reaches a serving process a moment after it is sent (under --workers N, through
    # the parent), and a loaded machine can stretch that moment: judged by order, the process
    # turns not ready while the stream drains and never answers ready again.
    assert any(status != 200 for status in after), after
    turned = next(i for i, status in enumerate(after) if status != 200)
    assert 200 not in after[turned:], after
    assert b"".join(got).endswith(b"data: [DONE]\n\n")  # the stream in flight was served


def _readyz(probes: httpx.Client) -> int | str:
    """The status ``/readyz`` answers, or the transport error that came instead."""
    try:
        return probes.get("/readyz").status_code
    except httpx.TransportError as error:
        return type(error).__name__


# -- the access log's durations ----------------------------------------------------------------


def test_a_streamed_legs_logged_end_is_at_least_the_streams_length(
    slow_worker: Server, tmp_path: pathlib.Path
) -> None:
    args = ["serve", "--port", "0", "--decode-url", slow_worker.url]
    with running((args, tmp_path / "serve.log")) as (proxy,):
        # A generate client's stream is the worker's, event for event.
        body = {"token_ids": [1, 2, 3], "stream": True, "sampling_params": {"max_tokens": 6}}
        headers = {"x-request-id": "slow-1"}
        url = proxy.url + "/inference/v1/generate"
        with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as stream:
            text = b"".join(stream.iter_bytes()).decode()
        log = proxy.wait_for_log("slow-1 POST")
    events = text.count("data: ")
    assert events >= 3
    line = next(line for line in log.splitlines() if "slow-1 POST" in line)
    match = re.search(r" decode=200/(\d+)ms/(\d+)ms ", line)
    assert match is not None, line
    first, end = int(match[1]), int(match[2])
    # The worker waits 0.3 s before each event after the first: a lower bound, never an upper.
    assert end >= (events - 1) * 300
    assert first <= end
    assert line.endswith(" stream=complete")


def test_a_whole_answers_leg_and_a_failed_call_are_logged_with_their_end(
    tmp_path: pathlib.Path,
) -> None:
    args = ["serve", "--port", "0", "--decode-url", "http://127.0.0.1:9"]  # nothing listens
    with running(
        (["serve", "--simulate", "--port", "0"], tmp_path / "sim.log"),
        (args, tmp_path / "dead.log"),
    ) as (simulated, dead):
        for proxy in (simulated, dead):
            httpx.post(
                proxy.url + "/v1/completions",
                json={"model": "m", "prompt": "Hi"},
                headers={"x-request-id": "whole-1"},
                timeout=30,
            )
        whole = simulated.wait_for_log("whole-1 POST")
        failed = dead.wait_for_log("whole-1 POST")
    assert re.search(r" prefill=200/\d+ms/\d+ms decode=200/\d+ms/\d+ms total=\d+ms$", whole.strip())
    assert re.search(r" 502 decode=failed/-/\d+ms total=\d+ms$", failed.strip())

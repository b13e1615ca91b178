"""The fake vLLM worker the LiteLLM integration tests run against, checked against the fixtures."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fake_worker import GENERATE_PATH, RENDER_PATH, FakeWorker
from golden import load_fixture, load_stream

CHAT = {
    "model": "Qwen/Qwen3-0.6B",
    "messages": [{"role": "user", "content": "Weather in Paris?"}],
    "max_completion_tokens": 64,
    "temperature": 0.7,
    "tools": [
        {
            "type": "function",
            "function": {"name": "get_weather", "parameters": {"type": "object"}},
        }
    ],
}


@pytest.fixture
def worker() -> Iterator[FakeWorker]:
    with FakeWorker() as running:
        yield running


def _events(text: str) -> list[Any]:
    data = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert data[-1] == "[DONE]"
    return [json.loads(item) for item in data[:-1]]


def test_render_answers_a_generate_request_shaped_like_vllms(worker: FakeWorker) -> None:
    rendered = httpx.post(worker.url + RENDER_PATH, json=CHAT).json()
    golden = load_fixture("request-decode-derender.json")
    assert rendered.keys() == golden.keys()
    assert rendered["parse_context"].keys() == golden["parse_context"].keys()
    assert rendered["output_mode"] == "tokens"  # picking a mode is the caller's job
    assert rendered["sampling_params"]["max_tokens"] == 64
    assert rendered["parse_context"]["tool_choice"] == "auto"
    assert all(isinstance(t, int) for t in rendered["token_ids"])
    other = httpx.post(
        worker.url + RENDER_PATH, json={**CHAT, "messages": [{"role": "user", "content": "Hi"}]}
    )
    assert other.json()["token_ids"] != rendered["token_ids"]
    assert worker.bodies(RENDER_PATH)[0] == CHAT


def test_generate_text_mode_matches_the_golden_shape(worker: FakeWorker) -> None:
    rendered = httpx.post(worker.url + RENDER_PATH, json=CHAT).json()
    leg = {**rendered, "output_mode": "text"}
    answer = httpx.post(worker.url + GENERATE_PATH, json=leg).json()
    golden = load_fixture("response-text.json")
    assert answer.keys() == golden.keys()
    assert answer["choices"][0].keys() == golden["choices"][0].keys()
    assert answer["output_mode"] == "text"
    assert answer["choices"][0]["text"] == "Hello!"
    assert worker.bodies(GENERATE_PATH) == [leg]


def test_generate_derender_mode_makes_the_tool_call(worker: FakeWorker) -> None:
    rendered = httpx.post(worker.url + RENDER_PATH, json=CHAT).json()
    answer = httpx.post(
        worker.url + GENERATE_PATH, json={**rendered, "output_mode": "derender"}
    ).json()
    golden = load_fixture("response-derender-tool-call.json")
    assert answer.keys() == golden.keys()
    assert answer["output_mode"] == "derender"
    assert answer["choices"][0]["finish_reason"] == "tool_calls"
    assert answer["choices"][0]["message"] == golden["choices"][0]["message"]


def test_derender_without_tools_answers_text_and_refuses_streaming(worker: FakeWorker) -> None:
    leg = {"token_ids": [1, 2], "output_mode": "derender", "sampling_params": {"n": 2}}
    answer = httpx.post(worker.url + GENERATE_PATH, json=leg).json()
    assert [c["message"]["content"] for c in answer["choices"]] == ["Hello!", "Hello!"]
    refused = httpx.post(worker.url + GENERATE_PATH, json={**leg, "stream": True})
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == (
        "output_mode='derender' does not support stream=true."
    )


@pytest.mark.parametrize("include_usage", [True, False])
def test_text_streaming_is_shaped_like_the_golden_stream(
    worker: FakeWorker, include_usage: bool
) -> None:
    leg = {
        "token_ids": [1, 2, 3],
        "output_mode": "text",
        "stream": True,
        "stream_options": {"include_usage": include_usage},
        "return_token_ids": True,
    }
    with httpx.stream("POST", worker.url + GENERATE_PATH, json=leg) as response:
        assert response.headers["content-type"] == "text/event-stream"
        events = _events(response.read().decode())
    golden = _events(load_stream("stream-text.sse").decode())
    assert [e.keys() for e in events[:3]] == [e.keys() for e in golden[:3]]
    assert [e["choices"][0].keys() for e in events[:3]] == [
        e["choices"][0].keys() for e in golden[:3]
    ]
    assert "".join(e["choices"][0]["text"] for e in events[:3]) == "Hello!"
    assert all(e["output_mode"] == "text" for e in events)
    if include_usage:
        assert events[3].keys() == golden[3].keys()
        assert events[3]["usage"]["completion_tokens"] == 3
    else:
        assert len(events) == 3


def test_an_old_worker_ignores_output_mode_and_does_not_echo() -> None:
    with FakeWorker(old=True) as old:
        leg = {"token_ids": [1, 2], "output_mode": "text"}
        answer = httpx.post(old.url + GENERATE_PATH, json=leg).json()
        assert "output_mode" not in answer
        assert "text" not in answer["choices"][0]
        assert answer["choices"][0]["token_ids"]
        stream = httpx.post(old.url + GENERATE_PATH, json={**leg, "stream": True})
        events = _events(stream.text)
        assert all("output_mode" not in e and "text" not in e["choices"][0] for e in events)
        # An old worker knows nothing of derender either, so it does not refuse streaming it.
        derender = {**leg, "output_mode": "derender", "stream": True}
        assert httpx.post(old.url + GENERATE_PATH, json=derender).status_code == 200


def test_an_in_stream_error_is_sent_like_vllm() -> None:
    with FakeWorker(stream_error="engine died") as failing:
        leg = {"token_ids": [1], "output_mode": "text", "stream": True}
        events = _events(httpx.post(failing.url + GENERATE_PATH, json=leg).text)
    golden = _events(load_stream("stream-text-error.sse").decode())
    assert events[1] == golden[1]
    assert len(events) == 2


def test_bad_requests_get_vllm_style_errors(worker: FakeWorker) -> None:
    missing = httpx.post(worker.url + GENERATE_PATH, json={"output_mode": "text"})
    assert missing.status_code == 400
    assert set(missing.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.post(worker.url + GENERATE_PATH, content=b"{").status_code == 400
    assert httpx.post(worker.url + "/nope", json={}).status_code == 404
    bad_mode = {"token_ids": [1], "output_mode": "pictures"}
    assert httpx.post(worker.url + GENERATE_PATH, json=bad_mode).status_code == 400
    assert [r.path for r in worker.received] == [
        GENERATE_PATH,
        GENERATE_PATH,
        "/nope",
        GENERATE_PATH,
    ]
    assert worker.received[1].body is None


def test_the_worker_stops_itself() -> None:
    worker = FakeWorker(lifetime=0.2).start()
    url = worker.url
    assert worker._thread is not None
    worker._thread.join(timeout=5)
    assert not worker._thread.is_alive()
    with pytest.raises(httpx.TransportError):
        httpx.post(url + GENERATE_PATH, json={}, timeout=1)
    worker.stop()  # idempotent

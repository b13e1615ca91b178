"""``serve --engine sglang`` in front of simulated SGLang workers, each a separate process.

A vLLM render worker, an SGLang prefill and decode (and a failing prefill), and two proxies;
the official openai and anthropic SDKs as clients, their stream helpers too.
"""

from __future__ import annotations

import pathlib
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest
from proxy_helpers import refused, running

from disagg_transforms import Engine
from disagg_transforms._cli.config import config_errors, engine_settings

SGLANG = ["simulate", "--engine", "sglang", "--port", "0"]
_TRANSFER_TIMEOUT = 30.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class _Fleet:
    proxy: str
    faulty: str
    stalled: str
    decode: str


def _serve(render: str, prefill: str, decode: str, port: int) -> list[str]:
    return [
        "serve",
        "--engine",
        "sglang",
        "--sglang-bootstrap-port",
        str(port),
        "--render-url",
        render,
        "--prefill-url",
        prefill,
        "--decode-url",
        decode,
        "--port",
        "0",
    ]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Fleet]:
    logs = tmp_path_factory.mktemp("sglang-serve")
    good, bad, stalled = _free_port(), _free_port(), _free_port()
    prefill_args = [*SGLANG, "--disaggregation-mode", "prefill", "--bootstrap-port"]
    decode_args = [*SGLANG, "--disaggregation-mode", "decode", "--stream-delay", "0.2"]
    workers: list[tuple[list[str], pathlib.Path]] = [
        (["simulate", "--port", "0"], logs / "render.log"),
        ([*prefill_args, str(good)], logs / "prefill.log"),
        ([*prefill_args, str(bad), "--fault", "http-500"], logs / "faulty.log"),
        # Takes the request but never its room: it fails after its own 1 s, the decode would
        # wait its 30 s.
        (
            [*prefill_args, str(stalled), "--fault", "no-room", "--transfer-timeout", "1"],
            logs / "stalled.log",
        ),
        ([*decode_args, "--transfer-timeout", str(_TRANSFER_TIMEOUT)], logs / "decode.log"),
    ]
    with running(*workers) as (render, prefill, faulty, no_room, decode):
        proxies = [
            (_serve(render.url, prefill.url, decode.url, good), logs / "proxy.log"),
            (_serve(render.url, faulty.url, decode.url, bad), logs / "faulty-proxy.log"),
            (_serve(render.url, no_room.url, decode.url, stalled), logs / "stalled-proxy.log"),
        ]
        with running(*proxies) as (proxy, faulty_proxy, stalled_proxy):
            yield _Fleet(proxy.url, faulty_proxy.url, stalled_proxy.url, decode.url)


def _openai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def _anthropic(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="none", max_retries=0)


_MESSAGES: Any = [{"role": "user", "content": "Hi"}]


def test_chat_plain_and_streamed(fleet: _Fleet) -> None:
    with _openai(fleet.proxy) as client:
        completion = client.chat.completions.create(model="m", messages=_MESSAGES, max_tokens=32)
        with client.chat.completions.stream(model="m", messages=_MESSAGES, max_tokens=32) as stream:
            final = stream.get_final_completion()
    assert completion.choices[0].message.content == "Hello!"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.completion_tokens > 0
    assert final.choices[0].message.content == "Hello!"


def test_chat_logprobs(fleet: _Fleet) -> None:
    with _openai(fleet.proxy) as client:
        completion = client.chat.completions.create(
            model="m", messages=_MESSAGES, max_tokens=32, logprobs=True, top_logprobs=2
        )
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.content
    assert "".join(token.token for token in logprobs.content).startswith("Hello!")
    assert all(len(token.top_logprobs) == 2 for token in logprobs.content)


def test_responses_plain_and_streamed(fleet: _Fleet) -> None:
    with _openai(fleet.proxy) as client:
        response = client.responses.create(model="m", input="Hi", max_output_tokens=32)
        with client.responses.stream(model="m", input="Hi", max_output_tokens=32) as stream:
            final = stream.get_final_response()
    assert response.output_text == "Hello!"
    assert final.output_text == "Hello!"


def test_messages_plain_and_streamed(fleet: _Fleet) -> None:
    with _anthropic(fleet.proxy) as client:
        message = client.messages.create(model="m", messages=_MESSAGES, max_tokens=32)
        with client.messages.stream(model="m", messages=_MESSAGES, max_tokens=32) as stream:
            final = stream.get_final_message()
    assert message.content[0].type == "text"
    assert message.content[0].text == "Hello!"
    assert message.stop_reason == "end_turn"
    assert final.content[0].type == "text"
    assert final.content[0].text == "Hello!"


def test_a_field_sglang_has_no_place_for_is_refused_naming_it(fleet: _Fleet) -> None:
    with _openai(fleet.proxy) as client, pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="m", messages=_MESSAGES, max_tokens=32, n=2)
    assert "n" in str(refused.value.body)


def _aborted(decode: str, before: set[str], timeout: float = 5.0) -> set[str]:
    """The rids the decode was told to abort since ``before``, once there is one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        aborted = set(httpx.get(f"{decode}/simulated/aborted").json()["aborted"]) - before
        if aborted:
            return aborted
        time.sleep(0.05)
    return set()


def test_a_failed_prefill_ends_the_request_at_once_and_aborts_the_decode(fleet: _Fleet) -> None:
    before = set(httpx.get(f"{fleet.decode}/simulated/aborted").json()["aborted"])
    started = time.monotonic()
    with _openai(fleet.faulty) as client, pytest.raises(openai.InternalServerError) as failed:
        client.chat.completions.create(model="m", messages=_MESSAGES, max_tokens=32)
    took = time.monotonic() - started
    assert failed.value.status_code == 502
    message = str(failed.value.body)
    assert "prefill failed with HTTP 500" in message
    assert "127.0.0.1" not in message
    assert took < _TRANSFER_TIMEOUT / 10
    assert len(_aborted(fleet.decode, before)) == 1


def test_a_prefill_that_never_meets_its_decode_ends_a_stream_before_its_timeout(
    fleet: _Fleet,
) -> None:
    before = set(httpx.get(f"{fleet.decode}/simulated/aborted").json()["aborted"])
    started = time.monotonic()
    with (
        _openai(fleet.stalled) as client,
        pytest.raises(openai.InternalServerError) as failed,
        client.chat.completions.stream(model="m", messages=_MESSAGES, max_tokens=32),
    ):
        pass  # the stream's head is the error
    assert failed.value.status_code == 502
    assert "prefill failed with HTTP 500: Prefill bootstrap failed" in str(failed.value.body)
    assert time.monotonic() - started < _TRANSFER_TIMEOUT / 6
    assert len(_aborted(fleet.decode, before)) == 1


def test_a_failed_prefill_in_anthropic_shape(fleet: _Fleet) -> None:
    with _anthropic(fleet.faulty) as client, pytest.raises(anthropic.APIStatusError) as failed:
        client.messages.create(model="m", messages=_MESSAGES, max_tokens=32)
    assert failed.value.status_code == 502
    body: Any = failed.value.body
    assert body["type"] == "error"
    assert body["error"]["type"] == "api_error"
    assert body["error"]["message"].startswith("prefill failed with HTTP 500")


def test_a_client_that_leaves_aborts_the_decode(fleet: _Fleet) -> None:
    before = set(httpx.get(f"{fleet.decode}/simulated/aborted").json()["aborted"])
    body = {"model": "m", "messages": _MESSAGES, "max_tokens": 200, "stream": True}
    with httpx.stream("POST", f"{fleet.proxy}/v1/chat/completions", json=body) as stream:
        for chunk in stream.iter_bytes():
            assert chunk
            break  # the client leaves after its first bytes
    assert len(_aborted(fleet.decode, before)) == 1


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--decode-url", "http://d:1", "--sglang-bootstrap-port", "9"], "needs --engine sglang"),
        (
            ["--engine", "sglang", "--prefill-url", "http://p:1", "--decode-url", "http://d:1"],
            "--render-url: SGLang workers do not render",
        ),
    ],
)
def test_serve_refuses_an_sglang_command_it_cannot_run(args: list[str], line: str) -> None:
    assert line in refused(*args)


@pytest.mark.parametrize(
    ("document", "param"),
    [
        ({"engine": "tgi"}, "engine"),
        ({"sglang": {"stream_output": "incremental"}}, "sglang"),
        ({"engine": "sglang", "sglang": {"stream": "incremental"}}, "sglang.stream"),
        ({"engine": "sglang", "sglang": {"stream_output": "deltas"}}, "sglang.stream_output"),
        ({"engine": "sglang", "sglang": {"bootstrap_port": 0}}, "sglang.bootstrap_port"),
    ],
)
def test_a_documents_engine_settings_are_checked(document: dict[str, Any], param: str) -> None:
    errors = config_errors({**document, "steps": {"prefill": {}, "decode": {}}})
    assert [error.param for error in errors] == [param]


def test_a_documents_engine_settings_are_read() -> None:
    document = {"engine": "sglang", "sglang": {"stream_output": "incremental"}}
    engine, sglang = engine_settings(document)
    assert engine is Engine.SGLANG
    assert (sglang.stream_output, sglang.bootstrap_port) == ("incremental", 8998)

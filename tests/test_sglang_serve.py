"""``serve --engine sglang`` in front of simulated SGLang workers, each a separate process.

A vLLM render worker, an SGLang prefill and decode (and a failing prefill), and two proxies;
the official openai and anthropic SDKs as clients, their stream helpers too.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest
from helpers import LITELLM_WARNINGS
from proxy_helpers import by_host, held_back, refused, running, served
from starlette.testclient import TestClient

from disagg_transforms import Engine, SglangSettings, parse_pipeline_params
from disagg_transforms._cli.config import config_errors, engine_settings
from disagg_transforms.integrations.proxy import create_app
from disagg_transforms.testing import SimulatedSglangWorker, SimulatedWorker

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
    render: str
    prefill: str
    faulty_prefill: str
    ports: tuple[int, int]
    stalled_prefill: str


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
            yield _Fleet(
                proxy.url,
                faulty_proxy.url,
                stalled_proxy.url,
                decode.url,
                render.url,
                prefill.url,
                faulty.url,
                (good, bad),
                no_room.url,
            )


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


def test_chat_prompt_logprobs_come_from_the_prefill(fleet: _Fleet) -> None:
    with _openai(fleet.proxy) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="m",
            messages=_MESSAGES,
            max_tokens=32,
            logprobs=True,
            top_logprobs=1,
            extra_body={"prompt_logprobs": 2},
        )
    completion = raw.parse()
    assert completion.choices[0].message.content == "Hello!"
    assert completion.choices[0].logprobs is not None
    prompt = json.loads(raw.text)["prompt_logprobs"]
    assert completion.usage is not None
    assert len(prompt) == completion.usage.prompt_tokens
    assert prompt[0] is None
    # vLLM's shape: the prompt's token first, then the top 2; a rank where SGLang proves it.
    assert all(set(entry) == {"logprob", "rank", "decoded_token"} for entry in prompt[1].values())
    assert [next(iter(position.values()))["rank"] for position in prompt[1:4]] == [1, 2, None]
    assert all(len(position) in (2, 3) for position in prompt[1:])


def test_the_proxy_waits_for_a_prefill_that_answers_after_the_decode() -> None:
    # In process: the prefill's answer held back past the decode's, as with a one-token cap.
    prefill = SimulatedSglangWorker(disaggregation_mode="prefill", transfer_timeout=5)
    decode = SimulatedSglangWorker(
        disaggregation_mode="decode", transfer_timeout=5, prefills={("127.0.0.1", 8998): prefill}
    )

    workers = by_host({"127.0.0.1": held_back(prefill, 0.3), "localhost": decode})

    with served(SimulatedWorker()) as render, served(workers) as url:
        app = create_app(
            parse_pipeline_params({"prefill": {}, "decode": {}}, use_openai_format=False),
            render_url=render,
            prefill_url=url,
            decode_url=url.replace("127.0.0.1", "localhost"),
            engine=Engine.SGLANG,
            sglang=SglangSettings(bootstrap_port=8998),
        )
        with (
            TestClient(app) as http,
            openai.OpenAI(
                base_url="http://testserver/v1", api_key="none", http_client=http
            ) as client,
        ):
            raw = client.chat.completions.with_raw_response.create(
                model="m", messages=_MESSAGES, max_tokens=4, extra_body={"prompt_logprobs": 1}
            )
    assert raw.parse().choices[0].message.content == "Hell"
    assert json.loads(raw.text)["prompt_logprobs"][1] is not None


def test_prompt_logprobs_streamed_or_on_sglangs_openai_route_are_refused(fleet: _Fleet) -> None:
    with _openai(fleet.proxy) as client:
        with pytest.raises(openai.BadRequestError) as streamed:
            client.chat.completions.create(
                model="m",
                messages=_MESSAGES,
                max_tokens=32,
                stream=True,
                extra_body={"prompt_logprobs": 2},
            )
        # A completions client keeps SGLang's OpenAI route, which has no prompt logprobs.
        with pytest.raises(openai.BadRequestError) as completions:
            client.completions.create(
                model="m", prompt="Hi", max_tokens=8, extra_body={"prompt_logprobs": 2}
            )
    for caught in (streamed, completions):
        assert isinstance(caught.value.body, dict)
        assert caught.value.body["param"] == "$.prompt_logprobs"


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
        (
            ["--decode-url", "http://d:1", "--kv-connector", "sglang"],
            "--kv-connector: requests name no worker without --prefill-from-header",
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


def _with_litellm_warnings(test: Callable[..., None]) -> Callable[..., None]:
    for mark in LITELLM_WARNINGS:
        test = mark(test)
    return test


@contextlib.contextmanager
def _litellm_provider(
    fleet: _Fleet, prefill: str, port: int, http_client: httpx.Client | None = None
) -> Iterator[Any]:
    litellm = pytest.importorskip("litellm")
    from disagg_transforms.integrations.litellm import VllmGenerateLLM  # noqa: PLC0415

    provider = VllmGenerateLLM(
        engine=Engine.SGLANG,
        sglang=SglangSettings(bootstrap_port=port),
        prefill_api_base=prefill,
        render_api_base=fleet.render,
        http_client=http_client,
    )
    litellm.custom_provider_map = [{"provider": "sglang-pd", "custom_handler": provider}]
    try:
        yield litellm
    finally:
        litellm.custom_provider_map = []
        provider.close()


@_with_litellm_warnings
def test_litellm_sync_calls_drive_sglang_workers(fleet: _Fleet) -> None:
    call = {"model": "sglang-pd/m", "messages": _MESSAGES, "api_base": fleet.decode}
    with _litellm_provider(fleet, fleet.prefill, fleet.ports[0]) as litellm:
        response = litellm.completion(**call, max_tokens=32)
        chunks = litellm.completion(**call, max_tokens=32, stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert response.choices[0].message.content == "Hello!"
    assert text == "Hello!"


@_with_litellm_warnings
def test_litellm_sync_call_with_a_failed_prefill_aborts_the_decode(fleet: _Fleet) -> None:
    before = set(httpx.get(f"{fleet.decode}/simulated/aborted").json()["aborted"])
    with _litellm_provider(fleet, fleet.faulty_prefill, fleet.ports[1]) as litellm:
        # Timed from the call: setting the provider up (litellm's import) is not the request.
        started = time.monotonic()
        with pytest.raises(litellm.exceptions.BadGatewayError, match="prefill failed"):
            litellm.completion(
                model="sglang-pd/m", messages=_MESSAGES, api_base=fleet.decode, max_tokens=32
            )
        took = time.monotonic() - started
    assert took < _TRANSFER_TIMEOUT / 6
    assert len(_aborted(fleet.decode, before)) == 1


class _LateDecode(httpx.BaseTransport):
    """Real HTTP, but the decode's ``/generate`` leaves late: the prefill fails before it."""

    def __init__(self, decode: str) -> None:
        self._inner = httpx.HTTPTransport()
        self._late = f"{decode}/generate"

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if str(request.url) == self._late:
            time.sleep(0.5)
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


@_with_litellm_warnings
def test_a_sync_call_aborts_a_decode_that_arrives_after_the_prefill_failed(fleet: _Fleet) -> None:
    # The first abort reaches the decode before the decode's call does and finds nothing to
    # abort (SGLang's too); the abort is sent again until the decode answers (docs/litellm.md).
    before = set(httpx.get(f"{fleet.decode}/simulated/aborted").json()["aborted"])
    with (
        httpx.Client(transport=_LateDecode(fleet.decode)) as http,
        _litellm_provider(fleet, fleet.faulty_prefill, fleet.ports[1], http) as litellm,
    ):
        started = time.monotonic()
        with pytest.raises(litellm.exceptions.BadGatewayError, match="prefill failed"):
            litellm.completion(
                model="sglang-pd/m", messages=_MESSAGES, api_base=fleet.decode, max_tokens=32
            )
        took = time.monotonic() - started
    assert took < _TRANSFER_TIMEOUT / 6
    assert len(_aborted(fleet.decode, before)) == 1


def test_the_sidecar_seat_meets_the_prefill_its_header_names(
    fleet: _Fleet, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # llm-d's sidecar: the prefill from x-prefiller-host-port, its bootstrap port from the
    # seat's SGLANG_BOOTSTRAP_PORT; render and decode on the token route.
    document = tmp_path / "pipeline.json"
    document.write_text('{"use_openai_format": false, "steps": {"prefill": {}, "decode": {}}}')
    monkeypatch.setenv("SGLANG_BOOTSTRAP_PORT", str(fleet.ports[0]))
    seat = [
        "serve",
        "--prefill-from-header",
        "--kv-connector",
        "sglang",
        "--config",
        str(document),
        "--render-url",
        fleet.render,
        "--decode-url",
        fleet.decode,
        "--port",
        "0",
    ]
    prefill = fleet.prefill.removeprefix("http://")
    with running((seat, tmp_path / "seat.log")) as (sidecar,), _openai(sidecar.url) as client:
        completion = client.chat.completions.create(
            model="m",
            messages=_MESSAGES,
            max_tokens=32,
            extra_headers={"x-prefiller-host-port": prefill},
        )
    # The decode answered: it met its prefill in the room (else a 502 after its 30 s).
    assert completion.choices[0].message.content == "Hello!"


def test_sglangs_own_client_is_relayed_through_serve(fleet: _Fleet) -> None:
    body = {"input_ids": [1072, 1105], "sampling_params": {"max_new_tokens": 8}}
    answer = httpx.post(f"{fleet.proxy}/generate", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["meta_info"]["finish_reason"]["type"] in {"stop", "length"}
    with httpx.stream(
        "POST", f"{fleet.proxy}/generate", json={**body, "stream": True}, timeout=30
    ) as stream:
        text = b"".join(stream.iter_bytes())
    assert text.endswith(b"data: [DONE]\n\n")


def test_metrics_count_both_legs_as_for_vllm(fleet: _Fleet) -> None:
    with _openai(fleet.proxy) as client:
        client.chat.completions.create(model="m", messages=_MESSAGES, max_tokens=32)
    text = httpx.get(f"{fleet.proxy}/metrics").text
    for line in (
        'llm_d_coordinator_upstream_request_total{phase="prefill"}',
        'llm_d_coordinator_upstream_request_total{phase="decode"}',
        'llm_d_coordinator_disagg_decision_total{decision_type="prefill-decode",model_name="m"}',
    ):
        assert line in text, text


def test_a_client_that_leaves_before_any_answer_aborts_both(fleet: _Fleet) -> None:
    # The stalled prefill holds the request for 1 s: the client leaves before that.
    before = {
        url: set(httpx.get(f"{url}/simulated/aborted").json()["aborted"])
        for url in (fleet.decode, fleet.stalled_prefill)
    }
    body = {"model": "m", "messages": _MESSAGES, "max_tokens": 32, "stream": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{fleet.stalled}/v1/chat/completions", json=body, timeout=0.3)
    for url, seen in before.items():
        assert len(_aborted(url, seen)) == 1, url


def _coordinator_document(path: pathlib.Path, render: str, **sections: Any) -> str:
    # llm-d's coordinator YAML, as JSON (YAML's subset): render, prefill and decode with kv-sglang.
    steps = [{"type": "render", "params": {"address": render}}, {"type": "prefill"}]
    document = {
        "pipeline": {
            "kv_connector": "kv-sglang",
            "use_openai_format": False,
            "steps": [*steps, {"type": "decode"}],
        },
        **sections,
    }
    path.write_text(json.dumps(document))
    return str(path)


def test_a_coordinator_document_with_kv_sglang_runs_the_rendezvous(
    fleet: _Fleet, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bootstrap port from SGLANG_BOOTSTRAP_PORT, as llm-d's coordinator reads it.
    monkeypatch.setenv("SGLANG_BOOTSTRAP_PORT", str(fleet.ports[0]))
    document = _coordinator_document(tmp_path / "coordinator.yaml", fleet.render)
    args = ["serve", "--config", document]
    args += ["--prefill-url", fleet.prefill, "--decode-url", fleet.decode, "--port", "0"]
    before = set(httpx.get(f"{fleet.decode}/simulated/aborted").json()["aborted"])
    with running((args, tmp_path / "serve.log")) as (proxy,), _openai(proxy.url) as client:
        completion = client.chat.completions.create(model="m", messages=_MESSAGES, max_tokens=32)
        # The decode met its prefill in the room (else a 502 after its 30 s), nothing aborted.
        assert completion.choices[0].message.content == "Hello!"
        assert _aborted(fleet.decode, before, timeout=0.5) == set()


def test_a_coordinator_document_with_kv_sglang_and_a_gateway_is_refused(
    tmp_path: pathlib.Path,
) -> None:
    document = _coordinator_document(
        tmp_path / "coordinator.yaml", "http://r:1", gateway={"address": "http://gateway:8000"}
    )
    line = refused("--config", document)
    assert "kv-sglang needs each prefill worker's host" in line

"""``serve --prefill-from-header``: llm-d's sidecar seat (docs/llm-d.md, "The sidecar seat").

Every process is its own: a decode worker and two prefill workers (``simulate --log-calls``: each
call they get is a line of their log, read here), and the proxy in the seat, driven with the
official openai and anthropic SDKs as llm-d's gateway would hand it a request: with the picker's
``x-prefiller-host-port`` header, or without.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("uvicorn")
import anthropic
import httpx
import openai
from proxy_helpers import Server, refused, running

MESSAGES: list[Any] = [{"role": "user", "content": "Hi"}]
PREFILL, ENCODE = "x-prefiller-host-port", "x-encoder-hosts-ports"
CHAT = "/v1/chat/completions"
GENERATE = "/inference/v1/generate"


@dataclass
class Seat:
    decode: Server
    prefill_a: Server
    prefill_b: Server
    client_route: Server
    """Without --config (prefill and decode on the client's route); allows 127.0.0.0/8 and
    the name localhost."""
    generate: Server
    """With a generate pipeline (--config); allows 127.0.0.1 alone."""
    sampling: Server
    """Without --config, with --enable-prefiller-sampling and no allow-list."""

    @property
    def workers(self) -> tuple[Server, ...]:
        return (self.decode, self.prefill_a, self.prefill_b)


def _host_port(server: Server) -> str:
    return server.url.removeprefix("http://")


@pytest.fixture(scope="module")
def seat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seat]:
    logs = tmp_path_factory.mktemp("sidecar")
    worker = ["simulate", "--port", "0", "--log-calls"]
    with running(*((worker, logs / f"{name}.log") for name in ("d", "a", "b"))) as workers:
        decode, prefill_a, prefill_b = workers
        pipeline = logs / "generate.json"
        steps = {"prefill": {}, "decode": {"wrap_chat_completion": True}}
        pipeline.write_text(json.dumps({"use_openai_format": False, "steps": steps}))
        sidecar = ["serve", "--port", "0", "--prefill-from-header", "--decode-url", decode.url]
        client_route = [*sidecar, "--allowed-worker-hosts", "127.0.0.0/8, LocalHost"]
        generate = [*sidecar, "--allowed-worker-hosts", "127.0.0.1", "--config", str(pipeline)]
        sampling = [*sidecar, "--enable-prefiller-sampling"]
        with running(
            (client_route, logs / "serve-client-route.log"),
            (generate, logs / "serve-generate.log"),
            (sampling, logs / "serve-sampling.log"),
        ) as proxies:
            yield Seat(decode, prefill_a, prefill_b, *proxies)


def _calls(worker: Server, request_id: str | None = None) -> list[dict[str, Any]]:
    """The calls ``worker`` logged (``simulate --log-calls``), those of one request id."""
    found = []
    for line in worker.log().splitlines():
        _, marker, payload = line.partition(" disagg_transforms.testing: call ")
        if marker:
            call = json.loads(payload)
            if request_id is None or call["headers"].get("x-request-id") == request_id:
                found.append(call)
    return found


def _legs(seat: Seat, request_id: str) -> dict[str, list[str]]:
    """Each worker's calls of one request, by path."""
    named = {"decode": seat.decode, "a": seat.prefill_a, "b": seat.prefill_b}
    return {name: [call["path"] for call in _calls(w, request_id)] for name, w in named.items()}


def _openai(proxy: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)


def _anthropic(proxy: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0)


def _chat(client: openai.OpenAI, headers: dict[str, str], *, stream: bool = False) -> str:
    """The reply's text to a chat request carrying ``headers``, plain or streamed."""
    if not stream:
        reply = client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=8, extra_headers=headers
        )
        return reply.choices[0].message.content or ""
    chunks = client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=8, stream=True, extra_headers=headers
    )
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def _id() -> str:
    return uuid.uuid4().hex


def _no_routing_header_reached_a_worker(seat: Seat) -> None:
    for worker in seat.workers:
        for call in _calls(worker):
            assert PREFILL not in call["headers"]
            assert ENCODE not in call["headers"]


def test_the_header_names_the_prefill_worker_on_the_clients_route(seat: Seat) -> None:
    a, b = _host_port(seat.prefill_a), _host_port(seat.prefill_b)
    plain, streamed, comma, named = _id(), _id(), _id(), _id()
    with _openai(seat.client_route) as client:
        reply = _chat(client, {"x-request-id": plain, PREFILL: a, ENCODE: b})
        streamed_text = _chat(client, {"x-request-id": streamed, PREFILL: a}, stream=True)
        # A comma list: its first entry (spaces around an entry ignored).
        _chat(client, {"x-request-id": comma, PREFILL: f"{b} , {a}"})
        # A host name the allow-list names as written (never resolved to check it).
        port = a.rpartition(":")[2]
        completion = client.completions.create(
            model="m",
            prompt="Hi",
            max_tokens=8,
            extra_headers={"x-request-id": named, PREFILL: f"localhost:{port}"},
        )
    assert reply == streamed_text == "Hello!"
    assert completion.choices[0].text
    assert _legs(seat, plain) == {"decode": [CHAT], "a": [CHAT], "b": []}
    assert _legs(seat, streamed) == {"decode": [CHAT], "a": [CHAT], "b": []}
    assert _legs(seat, comma) == {"decode": [CHAT], "a": [], "b": [CHAT]}
    completions = "/v1/completions"
    assert _legs(seat, named) == {"decode": [completions], "a": [completions], "b": []}
    # As llm-d's sidecar: prefill of one token, whole; decode pulls the KV prefill answered.
    [prefill] = _calls(seat.prefill_a, streamed)
    assert prefill["body"]["stream"] is False
    assert prefill["body"]["max_tokens"] == 1
    assert prefill["body"]["kv_transfer_params"]["do_remote_decode"] is True
    [decode] = _calls(seat.decode, streamed)
    assert decode["body"]["stream"] is True
    assert decode["body"]["max_tokens"] == 8
    assert decode["body"]["kv_transfer_params"]["do_remote_prefill"] is True
    _no_routing_header_reached_a_worker(seat)


def test_responses_and_messages_clients_are_served_on_their_own_route(seat: Seat) -> None:
    """The simulated workers answer ``/v1/responses`` and ``/v1/messages`` as vLLM 0.33 does."""
    a = _host_port(seat.prefill_a)
    ids = {name: _id() for name in ("responses", "responses-stream", "messages", "stream")}
    with _openai(seat.client_route) as client:
        response = client.responses.create(
            model="m",
            input="Hi",
            max_output_tokens=8,
            extra_headers={"x-request-id": ids["responses"], PREFILL: a},
        )
        with client.responses.stream(
            model="m",
            input="Hi",
            max_output_tokens=8,
            extra_headers={"x-request-id": ids["responses-stream"], PREFILL: a},
        ) as events:
            deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            final = events.get_final_response()
    with _anthropic(seat.client_route) as messages:
        message = messages.messages.create(
            model="m",
            messages=MESSAGES,
            max_tokens=8,
            extra_headers={"x-request-id": ids["messages"], PREFILL: a},
        )
        with messages.messages.stream(
            model="m",
            messages=MESSAGES,
            max_tokens=8,
            extra_headers={"x-request-id": ids["stream"], PREFILL: a},
        ) as stream:
            text = "".join(stream.text_stream)
            streamed = stream.get_final_message()
    assert response.output_text == deltas == final.output_text == "Hello!"
    assert message.content[0].type == "text"
    assert message.content[0].text == text == "Hello!"
    assert (message.stop_reason, streamed.stop_reason) == ("end_turn", "end_turn")
    assert final.usage is not None
    assert (final.usage.input_tokens, message.usage.output_tokens) == (21, 7)
    routes = {"responses": "/v1/responses", "responses-stream": "/v1/responses"}
    for name, request_id in ids.items():
        route = routes.get(name, "/v1/messages")
        assert _legs(seat, request_id) == {"decode": [route], "a": [route], "b": []}
        [prefill] = _calls(seat.prefill_a, request_id)
        assert prefill["body"]["kv_transfer_params"]["do_remote_decode"] is True
        [decode] = _calls(seat.decode, request_id)
        assert decode["body"]["kv_transfer_params"]["do_remote_prefill"] is True
    _no_routing_header_reached_a_worker(seat)


def _decisions(proxy: Server, model: str) -> dict[str, float]:
    text = httpx.get(proxy.url + "/metrics", timeout=30).text
    pattern = (
        r'llm_d_coordinator_disagg_decision_total\{decision_type="([a-z-]+)",'
        rf'model_name="{model}"\}} ([0-9.]+)'
    )
    return {kind: float(count) for kind, count in re.findall(pattern, text)}


def test_no_header_is_decode_only(seat: Seat) -> None:
    alone, paired = _id(), _id()
    with _openai(seat.client_route) as client:
        reply = client.chat.completions.create(
            model="sidecar-decode-only",
            messages=MESSAGES,
            max_tokens=8,
            extra_headers={"x-request-id": alone, ENCODE: _host_port(seat.prefill_b)},
        )
        client.chat.completions.create(
            model="sidecar-prefill-decode",
            messages=MESSAGES,
            max_tokens=8,
            extra_headers={"x-request-id": paired, PREFILL: _host_port(seat.prefill_a)},
        )
    assert reply.choices[0].message.content == "Hello!"
    assert _legs(seat, alone) == {"decode": [CHAT], "a": [], "b": []}
    [decode] = _calls(seat.decode, alone)
    assert "kv_transfer_params" not in decode["body"]
    assert _decisions(seat.client_route, "sidecar-decode-only") == {"decode-only": 1.0}
    assert _decisions(seat.client_route, "sidecar-prefill-decode") == {"prefill-decode": 1.0}
    _no_routing_header_reached_a_worker(seat)


def test_with_a_config_its_pipeline_runs_with_the_headers_prefill(seat: Seat) -> None:
    a = _host_port(seat.prefill_a)
    plain, streamed, chat = _id(), _id(), _id()
    with _anthropic(seat.generate) as client:
        message = client.messages.create(
            model="m",
            messages=MESSAGES,
            max_tokens=8,
            extra_headers={"x-request-id": plain, PREFILL: a},
        )
        with client.messages.stream(
            model="m",
            messages=MESSAGES,
            max_tokens=8,
            extra_headers={"x-request-id": streamed, PREFILL: a},
        ) as stream:
            text = "".join(stream.text_stream)
    with _openai(seat.generate) as openai_client:
        chat_text = _chat(openai_client, {"x-request-id": chat, PREFILL: a}, stream=True)
    assert message.content[0].type == "text"
    assert message.content[0].text == text == chat_text == "Hello!"
    # Render on the decode worker (the render URL's default), then prefill, then decode.
    for request_id, route in ((plain, "/v1/messages"), (streamed, "/v1/messages"), (chat, CHAT)):
        assert _legs(seat, request_id) == {
            "decode": [f"{route}/render", GENERATE],
            "a": [GENERATE],
            "b": [],
        }
    [prefill] = _calls(seat.prefill_a, plain)
    assert prefill["body"]["kv_transfer_params"]["do_remote_decode"] is True
    _no_routing_header_reached_a_worker(seat)


def _call_count(seat: Seat) -> int:
    return sum(len(_calls(worker)) for worker in seat.workers)


def _refused(proxy: Server) -> float:
    """The proxy's count of requests refused as the client's fault, model ``m``."""
    text = httpx.get(proxy.url + "/metrics", timeout=30).text
    pattern = (
        r'llm_d_coordinator_request_error_total\{error_code="bad_request",model_name="m"\} (\S+)'
    )
    found = re.search(pattern, text)
    return float(found[1]) if found else 0.0


def test_a_host_off_the_list_is_refused_with_403_before_any_call(seat: Seat) -> None:
    before = _call_count(seat)
    refused_before = _refused(seat.generate)
    a = _host_port(seat.prefill_a)
    port = a.rpartition(":")[2]
    with _openai(seat.generate) as client:
        with pytest.raises(openai.PermissionDeniedError) as plain:
            client.chat.completions.create(
                model="m", messages=MESSAGES, max_tokens=8, extra_headers={PREFILL: "10.1.2.3:80"}
            )
        # This seat allows 127.0.0.1 only: the name localhost is not resolved to match it.
        with pytest.raises(openai.PermissionDeniedError):
            client.chat.completions.create(
                model="m",
                messages=MESSAGES,
                max_tokens=8,
                stream=True,
                extra_headers={PREFILL: f"localhost:{port}"},
            )
    with _anthropic(seat.generate) as messages:
        with pytest.raises(anthropic.PermissionDeniedError) as refused_message:
            messages.messages.create(
                model="m", messages=MESSAGES, max_tokens=8, extra_headers={PREFILL: "10.1.2.3:80"}
            )
        # An encoder off the list refuses the request too, its prefill allowed.
        with pytest.raises(anthropic.PermissionDeniedError) as refused_stream:  # noqa: SIM117
            with messages.messages.stream(
                model="m",
                messages=MESSAGES,
                max_tokens=8,
                extra_headers={PREFILL: a, ENCODE: f"{a},10.0.0.9:9000"},
            ) as stream:
                list(stream.text_stream)
    assert plain.value.status_code == 403
    error = plain.value.body
    assert isinstance(error, dict)
    assert (error["type"], error["param"]) == ("PermissionDeniedError", PREFILL)
    assert "10.1.2.3:80" in error["message"]
    for caught in (refused_message, refused_stream):
        body = caught.value.body
        assert isinstance(body, dict)
        assert body["type"] == "error"
        assert body["error"]["type"] == "permission_error"
    assert "10.0.0.9:9000" in refused_stream.value.message
    assert _call_count(seat) == before  # no worker was called
    # Counted under the body's model, as every refused request whose body was read.
    assert _refused(seat.generate) == refused_before + 4


@pytest.mark.parametrize("value", ["http://127.0.0.1:8000", "127.0.0.1", "127.0.0.1:0"])
def test_a_malformed_header_is_400_before_any_call(seat: Seat, value: str) -> None:
    before = _call_count(seat)
    with _openai(seat.client_route) as client, pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=8, extra_headers={PREFILL: value}
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert (error["type"], error["param"], error["code"]) == ("BadRequestError", PREFILL, 400)
    with _anthropic(seat.client_route) as messages, pytest.raises(anthropic.BadRequestError) as bad:
        messages.messages.create(
            model="m", messages=MESSAGES, max_tokens=8, extra_headers={ENCODE: value}
        )
    body = bad.value.body
    assert isinstance(body, dict)
    assert body["error"]["type"] == "invalid_request_error"
    assert ENCODE in body["error"]["message"]
    assert _call_count(seat) == before


def test_with_prefiller_sampling_any_entry_of_the_list_may_get_the_prefill(seat: Seat) -> None:
    # As llm-d's --enable-prefiller-sampling: a random entry, not the first. Sixteen requests
    # all on one worker would happen once in 2**15 runs.
    a, b = _host_port(seat.prefill_a), _host_port(seat.prefill_b)
    ids = [_id() for _ in range(16)]
    with _openai(seat.sampling) as client:
        replies = {_chat(client, {"x-request-id": i, PREFILL: f"{a},{b}"}) for i in ids}
    assert replies == {"Hello!"}
    legs = [_legs(seat, i) for i in ids]
    assert all(leg["decode"] == [CHAT] for leg in legs)
    assert all(sorted([*leg["a"], *leg["b"]]) == [CHAT] for leg in legs)  # one prefill each
    assert {"a", "b"} == {"a" if leg["a"] else "b" for leg in legs}


def test_a_combination_without_sense_stops_at_startup(tmp_path: Path) -> None:
    sidecar = ("--prefill-from-header", "--decode-url", "http://127.0.0.1:8200")
    line = refused(*sidecar, "--prefill-url", "http://p:80")
    assert "--prefill-from-header: give no --prefill-url with it" in line
    line = refused(*sidecar, "--gateway-url", "http://g:80")
    assert "--prefill-from-header: give no --gateway-url with it" in line
    line = refused("--decode-url", "http://d:80", "--allowed-worker-hosts", "10.0.0.0/8")
    assert "--allowed-worker-hosts: requests name no worker without --prefill-from-header" in line
    line = refused("--decode-url", "http://d:80", "--enable-prefiller-sampling")
    assert line.endswith(
        "--enable-prefiller-sampling: requests name no worker without --prefill-from-header"
    )
    line = refused(*sidecar, "--allowed-worker-hosts", "10.0.0.1/8")
    assert line.startswith("disagg-transforms: error: --allowed-worker-hosts: ")
    assert "'10.0.0.1/8' is not an IP address, a CIDR or a host name" in line
    decode_only = tmp_path / "decode-only.json"
    decode_only.write_text(json.dumps({"steps": {"decode": {}}}))
    line = refused(*sidecar, "--config", str(decode_only))
    assert "--prefill-from-header: the pipeline has no prefill step" in line
    with_gateway = tmp_path / "coordinator.yaml"
    with_gateway.write_text(
        'gateway:\n  address: "http://g:80"\npipeline:\n  steps:\n    - type: prefill\n'
        "    - type: decode\n"
    )
    line = refused(*sidecar, "--config", str(with_gateway))
    assert line == (
        f"{with_gateway}: gateway.address: the sidecar seat takes no gateway (the headers name "
        "the workers)"
    )


@pytest.mark.parametrize("stream", [False, True])
def test_a_generate_clients_own_output_mode_reaches_decode(seat: Seat, stream: bool) -> None:
    # docs/llm-d.md: decode gets the client's body; a generate client's mode is its own.
    request_id = _id()
    body = {"model": "m", "token_ids": [5, 6, 7], "output_mode": "tokens", "stream": stream}
    body["sampling_params"] = {"max_tokens": 3}
    headers = {"x-request-id": request_id, PREFILL: _host_port(seat.prefill_a)}
    answer = httpx.post(seat.client_route.url + GENERATE, json=body, headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    assert '"output_mode":"tokens"' in answer.text.replace(" ", "")
    [decode] = _calls(seat.decode, request_id)
    assert decode["body"]["output_mode"] == "tokens"
    for call in _calls(seat.prefill_a, request_id):
        assert call["body"].get("output_mode") in (None, "tokens")
